"""A second instance of the subject beside the first: the new pod of a DaemonSet rolling update with surge
(maxSurge above 0), which starts and registers while the old pod still serves.

The scenario runner's `plugin: rolling-update` step (harness/scenarios/plugin_steps.py) and the DRA-UPG checks
(suites/dra/test_upgrade.py) start one here. Each says in its own terms what an update that failed means: an
update that could not happen (`CannotStart`, `ExitedEarly`) never put the driver to the test, a new instance that
runs and is never registered (`NotRegistered`) is what it shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.instruments.timeline import Event, WaitTimeout
from harness.launch.process import LaunchError
from harness.world.socket_paths import dirs_under, overflows

if TYPE_CHECKING:
    from harness.world.env import DPEnv

EXIT_WAIT_S = 30.0  # a new instance that exited: its launcher records the exit, then its code
EXIT_TAIL_LINES = 12  # of a new instance's output, when it exited before it registered


class SurgeError(Exception):
    """A second instance that did not come up registered."""


class CannotStart(SurgeError):
    """The update cannot happen: no second instance for this launcher, a socket path no address holds, a command
    that does not start. `arg` is the index in `args` of the argument at fault, when one is."""

    def __init__(self, message: str, arg: int | None = None) -> None:
        super().__init__(message)
        self.arg = arg


class ExitedEarly(SurgeError):
    """The new instance exited (with `code`) before it registered; `output` is its last lines, indented."""

    def __init__(self, code: int, output: str) -> None:
        super().__init__(f"the new instance exited with code {code} before it registered; its last output:\n"
                         f"{output or '    (none)'}")
        self.code, self.output = code, output


class NotRegistered(SurgeError):
    """The new instance runs and the wait for its registration ended without one."""


def second_instance(env: DPEnv) -> Any:
    """A new launcher for the subject beside the running one (not started), or CannotStart."""
    twin = getattr(env.subject, "twin", None)
    if twin is None:
        raise CannotStart(f"a rolling update needs a second instance; the {type(env.subject).__name__} has none")
    return twin()


def too_long(env: DPEnv, args: list[str]) -> None:
    """CannotStart when a socket path `args` make would not fit in a unix socket address."""
    found = overflows(env.spec, args, dirs_under(env.sandbox.path, env.spec))
    if found:
        raise CannotStart(f"the new instance cannot start: {found[0].describe()}", found[0].index)


def start_beside(env: DPEnv, command: list[str], args: list[str], wait: Callable[[int, Any], Event], *,
                 extra_env: dict[str, str] | None = None, on_started: Callable[[], None] | None = None) -> Any:
    """Start `command` plus `args` (its env the old instance's plus `extra_env`) beside the running subject and
    wait for its registration with `wait(since_ns, instance)`. While it starts the new instance is the
    environment's subject, so that its exit, not the old one's, ends the waits at once; it stays the subject
    once registered. The old instance keeps running: the caller stops it. Raises a SurgeError (the new instance
    stopped, the old one the subject again)."""
    old = env.subject
    new = second_instance(env)
    too_long(env, args)
    since = env.now()
    new.argv = [*command, *args]
    if extra_env:
        new.env = {**new.env, **extra_env}  # the twin shares the old instance's dict
    try:
        new.start()
    except LaunchError as err:
        raise CannotStart(f"the new instance cannot start: {err}") from None
    if on_started is not None:
        on_started()
    # The new instance's exit, not the old one's, ends the waits for its start-up and registration
    # (env._exit_abort): at once rather than at the bound.
    env.subject = new
    try:
        wait(since, new)
    except WaitTimeout as err:
        env.subject = old
        # Exited: its launcher records the exit, then its code (a bounded wait for that moment, not a timer).
        code = None if new.running else new.wait_exit(EXIT_WAIT_S)
        said = "\n".join("    " + line[:300] for line in new.log_tail(EXIT_TAIL_LINES).splitlines())
        new.stop()
        if code is not None:
            raise ExitedEarly(code, said) from None
        raise NotRegistered(str(err)) from None
    except BaseException:
        env.subject = old
        new.stop()
        raise
    return new
