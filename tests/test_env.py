"""harness/world/env.py at unit level: what a check may hold a plugin to (declared, or inferred), and the plugin's
last output a failure's detail carries."""

from __future__ import annotations

import time

import pytest

from fake_devices.access import AccessTrace
from harness.instruments.timeline import WaitTimeout
from harness.spec.profiles import FAST
from harness.spec.subjects import SubjectSpec, default_backend
from harness.world.env import LAST_OUTPUT_BYTES, LAST_OUTPUT_LINES, OUTPUT_LINE_CHARS, DPEnv

DECLARED_AT = "gpu.yaml:9: backend.observes"


def backend_env(observes: list[str] | None = None) -> DPEnv:
    spec = SubjectSpec(name="t", kind="device-plugin", command=["/bin/true"], resource="example.com/t",
                       backend=default_backend())
    if observes is not None:
        spec.observes, spec.observes_from = observes, DECLARED_AT
    env = DPEnv(spec, FAST)
    assert env.devices is not None
    env.access = AccessTrace(env.devices.root, env.timeline).start()  # what start_subject does
    return env


def read_the_tree(env: DPEnv) -> None:
    """What any plugin does at start: read its devices' files (as inferred, a plugin that watches hotplug)."""
    assert env.devices is not None
    next(env.devices.root.glob("sys/class/*/*/health")).read_text()
    assert env.await_read("hotplug") == "sysfs"


def test_a_declared_observes_wins_over_what_the_plugin_read() -> None:
    env = backend_env(["health"])
    try:
        read_the_tree(env)
        assert env.drives("health") and not env.drives("hotplug")
        began = time.monotonic()
        with pytest.raises(pytest.skip.Exception) as verdict:  # not_exercised: a skip with its marker
            env.require_drive("hotplug")
        assert time.monotonic() - began < 1.0  # nothing to wait for: the subject said so
        assert f"the subject declares it does not watch hotplug ({DECLARED_AT}: [health])" in str(verdict.value)
    finally:
        env.close()


def test_an_empty_declaration_is_a_declaration_too() -> None:
    env = backend_env([])
    try:
        read_the_tree(env)
        with pytest.raises(pytest.skip.Exception) as verdict:
            env.require_drive("health")
        assert f"does not watch health ({DECLARED_AT}: [nothing])" in str(verdict.value)
    finally:
        env.close()


def test_without_a_declaration_what_the_plugin_read_holds_it() -> None:
    env = backend_env()
    try:
        read_the_tree(env)
        env.require_drive("hotplug")  # inferred from the trace: held to it
    finally:
        env.close()



def said_at_start(env: DPEnv, *starts: str) -> None:
    """The plugin's log as the launcher writes it: each start's header, then what it said (stdout and stderr)."""
    env.subject.log_path.parent.mkdir(parents=True, exist_ok=True)
    env.subject.log_path.write_text("".join(f"--- start {n}: wrapper.sh\n{said}"
                                            for n, said in enumerate(starts, 1)))


def test_an_exit_quotes_what_the_plugin_said_though_its_last_start_said_nothing() -> None:
    """Defect 9 of issue 39: a wrapper failed with "Directory nonexistent" on stderr, the detail's last output
    was empty: it was only the current start's."""
    env = backend_env()
    try:
        said_at_start(env, "sh: 1: cannot create /tmp/x/state: Directory nonexistent\n", "")
        env.timeline.record("process.exit", env.spec.name, pid=4242, returncode=0)
        detail = env.failure_output(AssertionError("expected a Register call"))
        assert detail.startswith("the plugin exited with code 0 at +"), detail
        assert "its last output:\n" in detail and "    sh: 1: cannot create /tmp/x/state: Directory nonexistent" \
            in detail and "--- start 2: wrapper.sh" in detail, detail
    finally:
        env.close()


def test_a_wait_in_vain_quotes_what_the_running_plugin_said() -> None:
    """Defect 9 of issue 39: DP-REG-07 "saw instead: nothing", without the plugin's own "Retrying in 30s"."""
    env = backend_env()
    try:
        said_at_start(env, "registering\nregistration failed; Retrying in 30s\n")
        never = WaitTimeout("another Register", 30, [], env.timeline.origin_ns)
        detail = env.failure_output(never)
        assert detail == ("the plugin's last output:\n    --- start 1: wrapper.sh\n    registering\n"
                          "    registration failed; Retrying in 30s"), detail
        try:  # a check that re-words the wait keeps it as the cause
            raise AssertionError("expected gpu-0 Unhealthy") from never
        except AssertionError as reworded:
            assert "Retrying in 30s" in env.failure_output(reworded)
        assert env.failure_output(AssertionError("expected 4 devices; saw 3")) == ""  # no wait, no exit
    finally:
        env.close()


def test_the_last_output_is_bounded() -> None:
    env = backend_env()
    try:
        said_at_start(env, "".join(f"line {n} {'x' * 500}\n" for n in range(400)))
        quoted = env.last_output()
        assert len(quoted) <= LAST_OUTPUT_BYTES + LAST_OUTPUT_LINES * 8
        assert len(quoted.splitlines()) <= LAST_OUTPUT_LINES and "line 399 " in quoted
        assert all(len(line) <= OUTPUT_LINE_CHARS + 4 for line in quoted.splitlines())
    finally:
        env.close()
