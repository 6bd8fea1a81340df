"""DP-REG: how a device plugin registers with the kubelet."""

from __future__ import annotations

import os
import stat

from harness.kubelet.devicemanager import SUPPORTED_VERSIONS, go_join
from harness.spec.checks import MUST, SHOULD, check, expect
from harness.spec.names import endpoint_errors, is_extended_resource_name, qualified_name_errors
from harness.spec.profiles import DIAL_TIMEOUT_S, REGISTER_RETRY_S
from harness.world.env import DPEnv

# DP-REG-06: how long the kubelet stays away while the plugin starts. Longer than a 10 s
# dial timeout (the kubelet's own, and what plugins copy), the same in every profile: a
# plugin that gives up after its dial timeout must be caught under `fast` too.
KUBELET_ABSENT_S = DIAL_TIMEOUT_S + 2.0


@check("DP-REG-01", MUST, "serves its DevicePlugin service before it calls Register")
def test_serves_before_register(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg = env.wait_register_call()
    probe = reg.get("probe")
    expect(probe["ok"], "the endpoint to accept connections when Register arrived",
           f"{probe.get('error')} at {env.at(reg)}")
    # A socket that accepts connections but speaks no gRPC is not serving: the kubelet's own
    # GetDevicePluginOptions, made inside Register, must have answered.
    call = reg.get("options_call")
    if call is not None:
        expect(call["ok"], "GetDevicePluginOptions on the endpoint to answer when Register arrived",
               f"{call.get('error')} at {env.at(reg)}")


@check("DP-REG-02", MUST, "RegisterRequest.version is v1beta1")
def test_version(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg = env.wait_register_call()
    expect(reg.get("version") in SUPPORTED_VERSIONS, f"version in {list(SUPPORTED_VERSIONS)}",
           f"version {reg.get('version')!r} at {env.at(reg)}")


@check("DP-REG-03", MUST, "resource_name is a valid extended resource name")
def test_resource_name(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg = env.wait_register_call()
    name = reg.get("resource")
    why = "; ".join(qualified_name_errors("requests." + name)) or "it is a native (kubernetes.io or domain-less) name"
    expect(is_extended_resource_name(name), "an extended resource name 'domain/name' outside kubernetes.io",
           f"{name!r} ({why}) at {env.at(reg)}")


@check("DP-REG-04", MUST, "endpoint is a bare file name in the device-plugins directory, and a socket is there")
def test_endpoint(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg = env.wait_register_call()
    endpoint = reg.get("endpoint")
    errors = endpoint_errors(endpoint)
    expect(not errors, "a bare file name", f"{'; '.join(errors)} at {env.at(reg)}")
    path = go_join(env.sandbox.plugin_dir, endpoint)
    try:
        is_socket = stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError as err:
        is_socket, err_text = False, str(err)
    else:
        err_text = "not a socket"
    expect(is_socket, f"a socket at {path}", err_text)


@check("DP-REG-05", MUST, "options in RegisterRequest match GetDevicePluginOptions")
def test_options_match(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg = env.wait_registered()
    defaults = {"pre_start_required": False, "get_preferred_allocation_available": False}
    sent = {**defaults, **(reg.get("options") or {})}
    served = {**defaults, **(reg.get("served_options") or {})}
    expect(sent == served, f"the registered options to equal the served ones {served}",
           f"registered {sent} at {env.at(reg)}")


@check("DP-REG-06", MUST, "started before the kubelet, it registers once kubelet.sock appears")
def test_registers_when_kubelet_appears(dp_env: DPEnv) -> None:
    env = dp_env
    t0 = env.now()
    env.start_subject()
    # Keep the kubelet away long enough for the plugin to find no kubelet and
    # outlast a dial timeout of its own; a plugin that exits here has failed.
    # Judged by the process that serves the socket: a wrapper that daemonizes it may exit 0 here.
    exited = env.timeline.wait_quiet(lambda e: env.plugin_exit(e) is not None, KUBELET_ABSENT_S, t0)
    said = env.plugin_exit(exited) if exited is not None else None
    expect(said is None, "the plugin to wait for the kubelet",
           f"{said[1] if said else ''} before kubelet.sock existed")
    t1 = env.now()
    env.start_kubelet()
    env.wait_registered(since_ns=t1)


@check("DP-REG-07", SHOULD, "after a rejected Register it retries within 60 s (REGISTER_RETRY_S) or exits non-zero")
def test_retries_after_reject(dp_env: DPEnv) -> None:
    env = dp_env
    env.node.start_kubelet(arm=lambda m: m.faults.reject("Register", count=1, message="fakelet: rejected once"))
    env.start_subject()
    rejected = env.timeline.wait_for(
        lambda e: e.kind == "grpc.call" and e.get("method") == "Register" and e.get("outcome") != "OK",
        env.profile.reaction_s, "a Register call (to reject)", abort=lambda e: e.kind == "process.exit")
    # The exit judged is that of the process serving the socket, not of a wrapper that started it and exited 0.
    reaction = env.timeline.wait_for(
        lambda e: (e.kind == "grpc.call" and e.get("method") == "Register" and e.get("side") == "server")
        or (env.plugin_exit(e) or (0, ""))[0] != 0,
        max(REGISTER_RETRY_S, env.profile.reaction_s),
        "another Register, or an exit with a non-zero code, after the rejection",
        since_ns=rejected.t_ns + 1,
        relevant=("grpc.call", "process.main_exit", "process.orphan_exit", "process.exit", "subject.server"))
    said = env.plugin_exit(reaction)
    if said is not None:
        env.note(said[1])


@check("DP-REG-08", SHOULD, "registers once per kubelet instance (no registration storm)")
def test_no_registration_storm(dp_env: DPEnv) -> None:
    env = dp_env.start()
    reg = env.wait_registered()
    again = env.timeline.wait_quiet(lambda e: e.kind == "kubelet.register", env.profile.quiet_window_s, reg.t_ns + 1)
    expect(again is None, f"no second Register within {env.profile.quiet_window_s:g}s of an accepted one",
           f"another Register at {env.at(again) if again else ''}")
