"""What a check holds while it runs: the DP and DRA environments, the direct plugin clients (probes),
the settled listing, device mapping, CDI specs.
"""
