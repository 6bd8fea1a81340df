"""The front doors: the `fakelet` command, the pytest plugin, live sessions (`up`, `devices`), fidelity.

The top room: it may import every room below; nothing imports it.
"""
