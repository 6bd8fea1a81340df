"""Fabric-attached devices: what an inventory's `fabric` key makes of a device (device binding conditions,
KEP-5007, and device status on the claim, KEP-4817).

A fabric-attached device (a NIC or an accelerator behind a PCIe/CXL switch, composable hardware) is not
usable on a node the moment it is allocated: it must first be attached there, which takes time and can
fail. Its driver publishes it with `bindingConditions`, and the scheduler binds the pod only once the driver
has set them True on the claim's status.devices entry. The fake hardware's side of that:

    fabric:
      interface: fab0               # the network interface the device shows up as once attached
      mac: 02:fa:b0:00:00:01        # its hardware address
      ips: [10.77.0.11/24]          # optional: addresses in CIDR form, as networkData holds them
      attach_ms: 200                # optional: how long an attach takes (default ATTACH_MS_DEFAULT)
      attach_error: ""              # optional: non-empty, every attach fails with this message

That is the truth the DRA-BND checks hold a driver's device status to. The device dir shows it as
`fabric/{interface,mac,ips,attach_ms,attach_error}`, one value per line; `attach_error` is what a driver reads
at the end of an attach (the harness's fault: DeviceBackend.fabric_fault). Opt-in: an inventory without the
key has no fabric-attached device, and nothing about its devices changes.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

FABRIC_KEYS = ("interface", "mac", "ips", "attach_ms", "attach_error")
REQUIRED_KEYS = ("interface", "mac")
ATTACH_MS_DEFAULT = 200
MAX_ATTACH_MS = 10_000  # an attach past this would outlast the checks' reaction bound; a typo, not hardware
# Linux IFNAMSIZ is 16 bytes with the NUL: 15 characters; no '/' or whitespace (dev_valid_name).
INTERFACE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
# k8s.io/api resource/v1 types.go NetworkDeviceDataMaxIPs: networkData holds at most this many.
MAX_IPS = 16
MAX_ERROR = 256  # a condition message is at most 32768 bytes (metav1 validation); a fault's is one line


def canonical_cidr(value: str) -> str | None:
    """The canonical form of an address in CIDR form ("10.9.8.7/24"), as apimachinery IsValidInterfaceAddress
    wants it, or None when it is not one."""
    if not isinstance(value, str) or "/" not in value:
        return None
    try:
        iface = ipaddress.ip_interface(value)
    except ValueError:
        return None
    return f"{iface.ip}/{iface.network.prefixlen}"


def check_fabric(label: str, value: Any) -> dict[str, Any]:
    """The `fabric` value of an inventory device, normalized, or a ValueError naming what is wrong."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{label}: field 'fabric': {what}")

    if not isinstance(value, Mapping):
        raise bad(f"expected a mapping with {list(REQUIRED_KEYS)} (and optionally ips, attach_ms, attach_error), "
                  f"got {value!r}")
    unknown = sorted(str(k) for k in value if k not in FABRIC_KEYS)
    if unknown:
        raise bad(f"unknown key(s) {unknown}; known: {list(FABRIC_KEYS)}")
    missing = [k for k in REQUIRED_KEYS if k not in value]
    if missing:
        raise bad(f"missing {missing}")
    interface, mac = value["interface"], value["mac"]
    if not isinstance(interface, str) or not INTERFACE_RE.match(interface):
        raise bad(f"interface {interface!r}: 1 to 15 letters, digits, '.', '_' or '-' (a Linux interface name)")
    if not isinstance(mac, str) or not MAC_RE.match(mac.lower()):
        raise bad(f"mac {mac!r}: six hex octets separated by ':'")
    ips = value.get("ips") or []
    if not isinstance(ips, list) or len(ips) > MAX_IPS:
        raise bad(f"ips: a list of at most {MAX_IPS} addresses in CIDR form, got {ips!r}")
    for ip in ips:
        if canonical_cidr(ip) != ip:
            raise bad(f"ips: {ip!r} is not an address in canonical CIDR form (e.g. 10.9.8.7/24)")
    if len(set(ips)) != len(ips):
        raise bad("ips: an address is listed twice")
    attach_ms = value.get("attach_ms", ATTACH_MS_DEFAULT)
    if isinstance(attach_ms, bool) or not isinstance(attach_ms, int) or not 0 <= attach_ms <= MAX_ATTACH_MS:
        raise bad(f"attach_ms {attach_ms!r}: an integer from 0 to {MAX_ATTACH_MS}")
    error = value.get("attach_error", "")
    if not isinstance(error, str) or "\n" in error or len(error) > MAX_ERROR:
        raise bad(f"attach_error: one line of at most {MAX_ERROR} characters")
    return {"interface": interface, "mac": mac.lower(), "ips": list(ips), "attach_ms": attach_ms,
            "attach_error": error}


def fabric_files(fabric: Mapping[str, Any]) -> dict[str, str]:
    """fabric/{interface,mac,ips,attach_ms,attach_error}: one value a line (a materializer Spec)."""
    return {"fabric/": "",
            "fabric/interface": f"{fabric['interface']}\n",
            "fabric/mac": f"{fabric['mac']}\n",
            "fabric/ips": "".join(f"{ip}\n" for ip in fabric.get("ips") or []),
            "fabric/attach_ms": f"{fabric.get('attach_ms', ATTACH_MS_DEFAULT)}\n",
            "fabric/attach_error": f"{fabric.get('attach_error', '')}\n"}
