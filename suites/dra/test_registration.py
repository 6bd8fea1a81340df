"""DRA-REG: how a DRA driver registers through plugins_registry."""

from __future__ import annotations

from pathlib import Path

import grpc

from harness.kubelet.pluginwatcher import DRA_PLUGIN, GETINFO_TIMEOUT_S
from harness.kubelet.versions import KUBELET_VERSIONS
from harness.launch.sandbox import SOCKET_PATH_MAX
from harness.spec.checks import MUST, SHOULD, check, expect, not_applicable
from harness.spec.names import is_dns1123_subdomain
from harness.world.draenv import HOST_KUBELET_DIR, DRAEnv
from harness.world.draprobe import HEALTH, SERVICES, DRAProbe
from suites.dra.common import health_started, is_socket, registered

# Every GetInfo version string some kubelet we model understands: DRA and health services.
HEALTH_SERVICES = {f"{version}.DRAResourceHealth": version for version in HEALTH}
KNOWN_VERSIONS = sorted({s for v in KUBELET_VERSIONS.values() for s in v.dra_services} | set(HEALTH_SERVICES))
# The paths a driver's sockets conventionally take (k8s.io/dynamic-resource-allocation kubeletplugin
# defaults: <registrar dir>/<driver>-reg.sock and <plugins dir>/<driver>/dra.sock).
CONVENTIONAL_SOCKETS = (f"{HOST_KUBELET_DIR}/plugins_registry/{{}}-reg.sock",
                        f"{HOST_KUBELET_DIR}/plugins/{{}}/dra.sock")


# Status codes that mean the plugin never handled a call (gRPC itself produced them).
UNANSWERED = ("UNIMPLEMENTED", "DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED")


@check("DRA-REG-01", MUST,
       "GetInfo answers within 1 s with DRAPlugin, the driver name, a live endpoint and known versions")
def test_getinfo(dra_env: DRAEnv) -> None:
    env = dra_env.start()
    info = env.wait_getinfo()
    expect(info.get("outcome") == "OK", f"GetInfo answered within {GETINFO_TIMEOUT_S:g}s (the kubelet's timeout)",
           f"{info.get('outcome')} at {env.at(info)}")
    expect(info.get("type") == DRA_PLUGIN, f"type {DRA_PLUGIN!r}", repr(info.get("type")))
    expect(info.get("name") == env.driver, f"name {env.driver!r}", repr(info.get("name")))
    endpoint = info.get("endpoint") or info.get("socket")
    ok, why = is_socket(env.host_path(endpoint))
    expect(ok, f"a socket at the endpoint {endpoint!r}", why)
    versions = info.get("versions") or []
    expect(versions, "a non-empty supported_versions", "[]")
    unknown = [v for v in versions if v not in KNOWN_VERSIONS]
    expect(not unknown, f"versions among {KNOWN_VERSIONS}", f"unknown {unknown}")


@check("DRA-REG-02", MUST, "every advertised version is served at its fully qualified service name")
def test_versions_served(dra_env: DRAEnv) -> None:
    env = dra_env
    reg = registered(env)
    missing = []
    with env.probe(reg) as probe:
        for version in reg.get("versions"):
            if version in HEALTH_SERVICES:
                module = HEALTH[HEALTH_SERVICES[version]][0]
                if not probe.serves(f"/{module.DESCRIPTOR.package}.DRAResourceHealth/NodeWatchResources"):
                    missing.append(f"{version}: NodeWatchResources unimplemented")
                continue
            if version not in SERVICES:
                missing.append(f"{version} (not a service fakelet knows)")
                continue
            try:
                probe.prepare(version, [])
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    missing.append(f"{version}: {err.details()}")
    expect(not missing, f"every advertised version of {reg.get('versions')} to answer NodePrepareResources",
           "; ".join(missing))


@check("DRA-REG-03", MUST, "NotifyRegistrationStatus is answered; after registered=false the plugin recovers")
def test_rejection_survived(dra_env: DRAEnv) -> None:
    env = dra_env
    env.start_kubelet()
    env.fake_dra().reject_next_registration(env.driver)  # a real kubelet: not exercised (NotOnRealKubelet)
    env.start_subject()
    rejected = env.timeline.wait_for(
        lambda e: e.kind == "pluginwatcher.notify" and not e.get("registered"),
        env.profile.reaction_s, "a registration the kubelet refused with registered=false",
        abort=env._exit_abort, relevant=("pluginwatcher.notify", "pluginwatcher.getinfo", "process.exit"))
    # The plugin's handler must run and reply. An error reply counts: upstream's
    # kubeletplugin helper answers registered=false with one, and the kubelet ignores it.
    code = rejected.get("code")
    expect(code not in UNANSWERED, "NotifyRegistrationStatus(registered=false) answered",
           f"{code}: {rejected.get('details')} at {env.at(rejected)}")
    reg = env.wait_dra_registered(rejected.t_ns)
    expect(env.subject.running, "the plugin still running after the refusal", "it exited")
    expect(reg.t_ns > rejected.t_ns, "a registration after the refusal", "none")


def other_health_sockets(env: DRAEnv, endpoint: str) -> list[str]:
    """Sockets of the plugin, other than its registered endpoint, that serve DRAResourceHealth."""
    found = []
    roots = [env.sandbox.plugins_dir, env.sandbox.registry_dir]
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            if str(path) == endpoint or not is_socket(str(path))[0]:
                continue
            with DRAProbe(str(path), env.timeline) as probe:
                for version, (module, _) in HEALTH.items():
                    method = f"/{module.DESCRIPTOR.package}.DRAResourceHealth/NodeWatchResources"
                    if probe.serves(method, timeout_s=1.0):
                        found.append(f"{path.name} ({version})")
    return found


@check("DRA-REG-04", SHOULD, "the DRA service and the health service answer on one connection")
def test_one_connection(dra_env: DRAEnv) -> None:
    env = dra_env
    if not env.kubelet_version.health_versions:
        not_applicable(f"kubelet {env.kubelet_version.name} does not call DRAResourceHealth")
    reg = registered(env)
    seen = health_started(env, reg.t_ns)
    if seen is not None:
        env.conn().node_prepare([], timeout_s=env.profile.dra_call_timeout_s)  # and the DRA service, same channel
        return
    endpoint = env.host_path(reg.get("endpoint"))
    elsewhere = other_health_sockets(env, endpoint)
    expect(not elsewhere, f"DRAResourceHealth on the registered endpoint {reg.get('endpoint')}",
           f"it served only on other sockets: {', '.join(elsewhere)} (the kubelet uses one connection)")
    expect("health" not in env.spec.observes, "a health stream (the subject profile says it reports health)",
           "no DRAResourceHealth on the registered endpoint")
    not_applicable("the plugin serves no DRAResourceHealth")


@check("DRA-REG-05", MUST, "the driver name is a DNS subdomain that fits the socket-path limits")
def test_driver_name(dra_env: DRAEnv) -> None:
    env = dra_env.start()
    info = env.wait_getinfo()
    name = info.get("name") or ""
    expect(is_dns1123_subdomain(name),
           "a lowercase RFC 1123 DNS subdomain", repr(name))
    too_long = [p.format(name) for p in CONVENTIONAL_SOCKETS if len(p.format(name)) > SOCKET_PATH_MAX]
    expect(not too_long, f"socket paths built from the name within {SOCKET_PATH_MAX} bytes",
           ", ".join(f"{p} ({len(p)} bytes)" for p in too_long))
