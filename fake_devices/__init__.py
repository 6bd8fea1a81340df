"""The fake hardware: devices a plugin under test can find, watch, and lose.

- `model`: `Device` and `Inventory`, loaded from and saved to YAML;
- `generate`: seeded inventories (`generate(seed)`);
- `materialize`: the sysfs/dev-like tree plugins read ("neutral", "drm", "nvml", "drm+nvml" skins);
- `backend`: `DeviceBackend`, live devices whose changes reach the tree and the timeline;
- `scripts`: seeded fault scripts and `run_script`;
- `access`: `AccessTrace`, which files of the tree a plugin reads (inotify), so coverage is a fact;
- `control`, `cli`: the unix-socket control API and `fakelet devices`.
"""
