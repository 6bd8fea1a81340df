"""What each kubelet release speaks to a DRA kubelet plugin.

Every entry was read from the k8s.io/kubernetes module of that release
(`go mod download k8s.io/kubernetes@vX.Y.Z`), pkg/kubelet/cm/dra/plugin and
pkg/features/kube_features.go; service name strings from k8s.io/kubelet
pkg/apis/dra*/*/types.go. The evidence sits next to each field below.

Service names (advertised in PluginInfo.supported_versions):
  "v1.DRAPlugin"               k8s.io/kubelet pkg/apis/dra/v1 types.go DRAPluginService
  "v1beta1.DRAPlugin"          k8s.io/kubelet pkg/apis/dra/v1beta1 types.go DRAPluginService
  "v1alpha3.NodeService"       k8s.io/kubelet@v0.32.9 pkg/apis/dra/v1alpha4 types.go NodeService
  "v1.DRAResourceHealth"       k8s.io/kubelet@v0.37.2 pkg/apis/dra-health/v1 types.go DRAResourceHealthService
  "v1alpha1.DRAResourceHealth" k8s.io/kubelet@v0.37.2 pkg/apis/dra-health/v1alpha1 types.go DRAResourceHealthService
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

DRA_V1 = "v1.DRAPlugin"
DRA_V1BETA1 = "v1beta1.DRAPlugin"
DRA_V1ALPHA4 = "v1alpha3.NodeService"  # the v1alpha4 API's proto package is v1alpha3, service Node
HEALTH_V1 = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"

# Short names used in events and on DRAPluginConn.
SERVICE_SHORT = {DRA_V1: "v1", DRA_V1BETA1: "v1beta1", DRA_V1ALPHA4: "v1alpha3"}
HEALTH_SHORT = {HEALTH_V1: "v1", HEALTH_V1ALPHA1: "v1alpha1"}

# How a release picks the DRA service.
PICK_KUBELET_ORDER = "kubelet"  # first of the kubelet's list that the plugin advertises
PICK_PLUGIN_ORDER = "plugin"  # first of the plugin's list that the kubelet supports


@dataclass(frozen=True)
class KubeletVersion:
    name: str  # "1.32" ... "1.37"; on the real node any release asked for ("1.35.4", for_release)
    # Accepted DRA services, the kubelet's preference first.
    dra_services: tuple[str, ...]
    # DRAResourceHealth versions the kubelet calls with its default feature gates,
    # preferred first; () = none.
    health_versions: tuple[str, ...]
    # Whose order decides when the plugin advertises several services.
    dra_pick: str = PICK_PLUGIN_ORDER
    # Service assumed when the plugin advertises none the kubelet knows (None: reject).
    dra_fallback: str | None = None
    # Health versions the kubelet calls with ResourceHealthStatus force-enabled (alpha releases).
    gated_health_versions: tuple[str, ...] = ()
    # True: the stream is opened only when the plugin advertises a health service;
    # False: it is attempted on every plugin (and retried while Unimplemented).
    health_needs_advertising: bool = False
    # True: an Unimplemented NodeWatchResources stops the retry loop.
    health_stop_on_unimplemented: bool = False
    # 1.32 replaces an already registered plugin of the same driver; later releases
    # keep a list per driver and refuse a second registration of the same endpoint.
    replace_on_reregister: bool = False
    # allocatedResourcesStatus carries the plugin's health message (ResourceHealthStatusMessage).
    health_message: bool = False
    # Device-plugin clients kept per socket (plugin/v1beta1 handler.go getClient(name, socketPath),
    # manager.go endpointStore; kubernetes#135437): a stream that ends disconnects its own socket's
    # client only. Before, runClient disconnected whichever client was current for the resource
    # (kubernetes#121994: a surge rolling update leaves the kubelet with no plugin).
    dp_endpoints_per_socket: bool = False
    # A claim prepared again replaces the driver's devices (manager.go resetDevices before addDevice;
    # kubernetes#140274). Before, addDevice appended and the checkpoint doubled (kubernetes#140471).
    prepare_resets_devices: bool = False

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "dra_services": list(self.dra_services),
                "health_versions": list(self.health_versions)}


_V1_V1BETA1 = (DRA_V1, DRA_V1BETA1)

KUBELET_VERSIONS: dict[str, KubeletVersion] = {v.name: v for v in (
    # v1.32.9 pkg/kubelet/cm/dra/plugin/registration.go validateSupportedServices: loops over
    # [drapbv1beta1.DRAPluginService, drapbv1alpha4.NodeService] (kubelet order) and falls back
    # to NodeService when the plugin lists neither; only an empty list is an error.
    # plugins_store.go add(): a second registration replaces the first. No dra-health import
    # anywhere in pkg/kubelet/cm/dra (no health stream).
    KubeletVersion("1.32", (DRA_V1BETA1, DRA_V1ALPHA4), (), dra_pick=PICK_KUBELET_ORDER,
                   dra_fallback=DRA_V1ALPHA4, replace_on_reregister=True),
    # v1.33.5 registration.go: same service list, order and fallback as 1.32; plugins_store.go
    # add(): "endpoint %s already registered for plugin %s". No dra-health import.
    KubeletVersion("1.33", (DRA_V1BETA1, DRA_V1ALPHA4), (), dra_pick=PICK_KUBELET_ORDER,
                   dra_fallback=DRA_V1ALPHA4),
    # v1.34.2 plugin/dra_plugin.go servicesSupportedByKubelet = [v1, v1beta1];
    # dra_plugin_manager.go validateSupportedServices loops over the plugin's list. Health:
    # dra-health/v1alpha1 behind ResourceHealthStatus, kube_features.go: 1.31 Alpha, default false.
    KubeletVersion("1.34", _V1_V1BETA1, (), gated_health_versions=(HEALTH_V1ALPHA1,)),
    # v1.35.4: identical to 1.34 (ResourceHealthStatus still Alpha, default false).
    KubeletVersion("1.35", _V1_V1BETA1, (), gated_health_versions=(HEALTH_V1ALPHA1,)),
    # v1.36.3: as 1.35; kube_features.go ResourceHealthStatus 1.36 Beta, default true, and
    # dra_plugin_manager.go add() starts the v1alpha1 stream for every plugin (advertised or not).
    # ResourceHealthStatusMessage: 1.36 Beta, default true (manager.go buildResourceHealth).
    KubeletVersion("1.36", _V1_V1BETA1, (HEALTH_V1ALPHA1,), gated_health_versions=(HEALTH_V1ALPHA1,),
                   health_message=True),
    # v1.37.0 dra_plugin.go healthServicesSupportedByKubelet = [v1, v1alpha1]; RegisterPlugin ->
    # pickHealthService (kubelet order, only advertised services); add() starts the stream only
    # when chosenHealthService != "" and stops it on codes.Unimplemented.
    # v1.37.2 devicemanager plugin/v1beta1 handler.go runClient: getClient(name, c.SocketPath());
    # manager.go PluginDisconnected promotes a remaining endpoint; cm/dra manager.go calls
    # info.resetDevices before addDevice. v1.36.3 has neither (getClient(name); addDevice only).
    KubeletVersion("1.37", _V1_V1BETA1, (HEALTH_V1, HEALTH_V1ALPHA1),
                   gated_health_versions=(HEALTH_V1, HEALTH_V1ALPHA1), health_needs_advertising=True,
                   health_stop_on_unimplemented=True, health_message=True, dp_endpoints_per_socket=True,
                   prepare_resets_devices=True),
)}

DEFAULT_KUBELET_VERSION = "1.36"
NEWEST = max(KUBELET_VERSIONS, key=lambda n: tuple(int(p) for p in n.split(".")))
ALIASES = {"newest": NEWEST, "default": DEFAULT_KUBELET_VERSION}


def get(name: str) -> KubeletVersion:
    """A release by name ("1.36", "v1.36", "newest"); ValueError naming the choices."""
    key = ALIASES.get(name, name.removeprefix("v"))
    try:
        return KUBELET_VERSIONS[key]
    except KeyError:
        choices = ", ".join([*KUBELET_VERSIONS, *ALIASES])
        raise ValueError(f"unknown kubelet version {name!r}; the fake kubelet models {choices}; --node real "
                         f"builds any release from {FLOOR} on that the Go module proxy serves "
                         "(1.35 or 1.35.4)") from None


# The oldest release either node runs: the fake's oldest model, and the real node's floor.
FLOOR = min(KUBELET_VERSIONS, key=lambda n: tuple(int(p) for p in n.split(".")))
# A real release as a person writes it: a minor ("1.35", its newest patch) or one release ("v1.35.4",
# pre-releases included: the proxy serves them too).
RELEASE = re.compile(r"v?(1)\.(0|[1-9]\d*)(?:\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?)?")


def parse_release(name: str) -> tuple[int, int, int | None, str]:
    """(major, minor, patch or None for a minor, pre-release suffix or ""); ValueError naming the forms."""
    match = RELEASE.fullmatch(name)
    if match is None:
        raise ValueError(f"kubelet version {name!r}: not a release; write a minor (1.35) or a release "
                         "(1.35.4, v1.35.4)")
    major, minor, patch, pre = match.groups()
    return int(major), int(minor), int(patch) if patch is not None else None, pre or ""


def minor_of(name: str) -> str:
    """The minor a release belongs to ("v1.35.4" -> "1.35"); aliases and model names stay as they are."""
    if name in ALIASES or name.removeprefix("v") in KUBELET_VERSIONS:
        return name
    major, minor, _patch, _pre = parse_release(name)
    return f"{major}.{minor}"


def for_release(name: str) -> KubeletVersion:
    """The model for a real node's release, named after the release ("1.35.4": 1.35's model, name
    "1.35.4"), so that the name reaches the real node's build and the report; ValueError below the floor.

    A minor newer than every model gets the newest model: on the real node the model only names the
    release (the real kubelet does the kubelet's part)."""
    if name in ALIASES or name.removeprefix("v") in KUBELET_VERSIONS:
        return get(name)
    major, minor, patch, pre = parse_release(name)
    if (major, minor) < tuple(int(p) for p in FLOOR.split(".")):
        raise ValueError(f"kubelet version {name!r}: older than {FLOOR}, the oldest release fakelet runs")
    model = KUBELET_VERSIONS.get(f"{major}.{minor}", KUBELET_VERSIONS[NEWEST])
    release = f"{major}.{minor}" + (f".{patch}{pre}" if patch is not None else "")
    return dataclasses.replace(model, name=release)


def default() -> KubeletVersion:
    return KUBELET_VERSIONS[DEFAULT_KUBELET_VERSION]
