"""The kind tier: plugins as they ship, deployed as DaemonSets on a kind cluster (pytest-kind)."""
