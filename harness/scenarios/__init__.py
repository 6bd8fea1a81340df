"""Stories that reproduce a fault end to end, narrated step by step (`fakelet scenario NAME`)."""
