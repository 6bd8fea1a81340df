"""The fake hardware. Issue 3 fills this in (inventory model, materializer,
fault scripts); for now inventories are plain YAML under fixtures/inventories/."""
