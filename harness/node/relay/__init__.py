"""The relay ("wire tap"): fakelet between a kubelet and a plugin, forwarding every call and recording both
sides with the fake kubelet's event kinds (dp.py for device plugins, dra.py for DRA drivers)."""
