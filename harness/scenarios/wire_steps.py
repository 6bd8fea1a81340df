"""The wire's steps of a scenario: a call the kubelet holds in flight while a fault happens (`hold: {call:
Register}`, `release`), and a manual `rm` of a plugin's socket (`socket: {delete: ...}`): in the device-plugins
directory, or a DRA driver's in plugins_registry or plugins/<driver>.

Both run on the fake kubelet and on the real one. A held call is the kubelet's FaultPlan on the fake kubelet
(DeviceManager.faults, as DP-RST-02 holds it, which its DRA manager's client consults too) and the relay's in
front of a real kubelet (its registration socket's plan, armed for the next instance through
LocalNode.start_kubelet(arm=...) -> RelayArm.faults, which the DP relay's endpoints and the DRA relay consult
too). The Register the kubelet serves is held before the kubelet answers it; a call the kubelet makes (Allocate,
NodePrepareResources, NodeUnprepareResources) once the plugin's answer is back, which is held from the kubelet
(instruments/faults.py FaultPlan.hold_answer). A
deleted socket is deleted where its owner made it: kubelet.sock in the kubelet's directory, a plugin's or a
DRA driver's socket in its own; on the real node the relay (the DP relay, or the DRA relay for a driver's
registration socket and endpoint) mirrors the deletion to the other side, as one directory would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.instruments.faults import KUBELET_STOPPED, Fault, FaultPlan
from harness.instruments.timeline import Event, WaitTimeout
from harness.kubelet.devicemanager import KUBELET_SOCKET
from harness.node.real.localnode import LocalNode
from harness.scenarios.outcomes import Inconclusive
from harness.scenarios.state import StageState
from harness.scenarios.step import Step
from harness.scenarios.vocabulary import SERVED_CALLS


@dataclass
class HeldCall:
    """A call `hold` armed: on each kubelet instance in turn until one receives it, then spent."""

    method: str
    faults: list[tuple[int | None, Fault]] = field(default_factory=list)  # (kubelet instance, its fault)
    released: bool = False

    def in_flight(self) -> tuple[int | None, Fault] | None:
        """The kubelet instance and fault holding the call now: received, not yet released or ended."""
        return next(((n, f) for n, f in self.faults if f.reached.is_set() and not f.release.is_set()), None)

    def received(self) -> bool:
        return any(f.reached.is_set() for _, f in self.faults)

    def ended(self) -> str:
        """How a received call's hold ended before its release: its kubelet stopped, or (a call the kubelet
        makes) its own deadline passed or its connection closed."""
        why = next((f.ended for _, f in reversed(self.faults) if f.reached.is_set() and f.ended), "")
        return why or KUBELET_STOPPED


# What a rejected Register answers: an error with gRPC's UNKNOWN code, as a Go kubelet's Register returning an
# error does (a refused version or resource name), never UNAVAILABLE, which says no kubelet is there.
REJECTED = "fakelet scenario: the kubelet rejects this {method}"
EXIT_JOIN_S = 30.0  # what is left of a plugin that exited after a rejection, gone before its DaemonSet starts it


class WireSteps(StageState):
    held_calls: dict[str, HeldCall]
    rejects: list[str]
    armed_rejects: list[Fault]  # rejections armed on the kubelet being started: followed up once it runs

    # -- hold and release -------------------------------------------------------------------------------

    def _hold_call(self, step: Step) -> None:
        method = step.arg["call"]
        if method in self.held_calls and not self.held_calls[method].released:
            raise Inconclusive(f"a {method} is held already: release it first")
        hold = self.held_calls[method] = HeldCall(method)
        node = self.env.node
        if node.running:
            plan = self._running_plan()
            hold.faults.append((node.instance, plan.hold(method)))
            where = f"the running kubelet (instance {node.instance})"
        else:
            where = "the next kubelet to start"
        if method in SERVED_CALLS:
            self.tell(f"armed: {where} holds the next {method} it receives in flight, unanswered, until released "
                      "or until that kubelet stops")
        else:
            self.tell(f"armed: {where} holds the plugin's answer to the next {method} it makes, until released or "
                      f"until that kubelet stops{' or its deadline on the call passes' if self.is_dra else ''}")

    def _running_plan(self) -> FaultPlan:
        """The running kubelet instance's fault plan: the fake kubelet's own (its registration service's, which its
        device manager's and DRA manager's clients consult too), or the relay's in front of a real one (which the
        DP relay's endpoints and the DRA relay consult too)."""
        fake, node = self.fake, self.env.node
        if fake is not None and fake.manager is not None:
            return fake.manager.faults
        relay = getattr(getattr(node, "shell", None), "relay", None) if isinstance(node, LocalNode) else None
        if relay is None:
            raise Inconclusive(f"a call held in flight needs the fake kubelet or the relay in front of a real one; "
                               f"the {type(node).__name__} has neither")
        return relay.faults

    def kubelet_arm(self) -> Callable[[Any], object] | None:
        """What a starting kubelet arms before it serves: every hold not yet received (a hold armed on a kubelet
        that stopped without receiving its call moves on to the next one), and the rejections armed while no
        kubelet ran."""
        waiting = [h for h in self.held_calls.values() if not h.released and not h.received()]
        rejects, self.rejects = self.rejects, []
        if not waiting and not rejects:
            return None
        node = self.env.node
        if self.fake is None and not isinstance(node, LocalNode):
            raise Inconclusive(f"a call held in flight or rejected needs the fake kubelet or a local real one, not "
                               f"the {type(node).__name__}")

        def arm(manager: Any) -> None:
            # The instance is known once it has started (start_kubelet fills it in).
            for hold in waiting:
                hold.faults.append((None, manager.faults.hold(hold.method)))
            for method in rejects:
                fault = manager.faults.reject(method, count=1, message=REJECTED.format(method=method))
                self.armed_rejects.append(fault)

        return arm

    def _after_rejection(self) -> None:
        """What follows a Register the starting kubelet rejected, as on a node with a DaemonSet: the plugin retries
        (the next Register), or exits non-zero and its DaemonSet starts it again (DP-REG-07: either is correct).
        Waits are event-driven under the reaction bound; a plugin that does neither is left as it is, for the
        scenario's next expect to judge."""
        armed, self.armed_rejects = self.armed_rejects, []
        env, bound = self.env, self.env.profile.reaction_s
        for method in dict.fromkeys(f.method for f in armed):
            try:
                rejected, reaction = self._rejected_and_reaction(method, bound)
            except WaitTimeout as err:
                self.tell(f"after arming the rejection: {str(err).splitlines()[0]}")
                continue
            said = env.plugin_exit(reaction)
            if said is None:
                self.tell(f"the plugin sent {method} again {(reaction.t_ns - rejected.t_ns) / 1e9:.3f}s after the "
                          "rejection")
            elif said[0] != 0:
                env.subject.wait_exit(EXIT_JOIN_S)
                env.subject.start()
                self.tell(f"{said[1]} after the rejection; started again (its DaemonSet restarts it)")
            else:
                self.tell(f"{said[1]} after the rejection: a DaemonSet does not restart it for that (exit 0)")

    def _rejected_and_reaction(self, method: str, bound: float) -> tuple[Event, Event]:
        """The rejected call on the wire, then the plugin's next call of it or its exit (DP-REG-07's judgement), both
        within one `bound`: the step that starts the kubelet waits no longer than any other step does."""
        env = self.env
        deadline = time.monotonic() + bound
        rejected = env.timeline.wait_for(
            lambda e: e.kind == "grpc.call" and e.get("method") == method and e.get("outcome") != "OK", bound,
            f"a {method} call (to reject)", since_ns=self.step_began_ns, abort=lambda e: env.plugin_exit(e) is not None)
        reaction = env.timeline.wait_for(
            lambda e: (e.kind == "grpc.call" and e.get("method") == method and e.get("side") == "server")
            or env.plugin_exit(e) is not None, max(0.0, deadline - time.monotonic()),
            f"another {method}, or the plugin's exit, after the rejection", since_ns=rejected.t_ns + 1,
            relevant=("grpc.call", "process.main_exit", "process.orphan_exit", "process.exit", "subject.server"))
        return rejected, reaction

    def _do_reject(self, step: Step) -> None:
        """The kubelet refuses the next `call` it receives: the running one's, else the next one started."""
        method = step.arg["call"]
        node = self.env.node
        if node.running:
            self._running_plan().reject(method, count=1, message=REJECTED.format(method=method))
            where = f"the running kubelet (instance {node.instance})"
        else:
            self.rejects.append(method)
            where = "the next kubelet to start"
        self.tell(f"armed: {where} rejects the next {method} it receives")

    def start_kubelet(self, keep_sockets: bool = False) -> None:
        """Start the kubelet with what must be armed before it serves: the holds waiting for a call, and (the fake
        kubelet's own) keeping the plugin sockets."""
        # An admission the stopped fake kubelet was in has given its pod back (pod_steps.py): the new one admits it.
        self.join_admissions()
        node, hold = self.env.node, self.kubelet_arm()
        if keep_sockets:
            if self.fake is None:
                raise Inconclusive("a kubelet that keeps the plugin sockets needs the fake kubelet")

            def arm(manager: Any) -> None:
                manager.keep_sockets = True
                if hold is not None:
                    hold(manager)

            self.fake.start_kubelet(arm=arm)
        elif hold is not None:
            node.start_kubelet(arm=hold)
        else:
            node.start_kubelet()
        for held in self.held_calls.values():
            held.faults = [(node.instance if n is None else n, f) for n, f in held.faults]
        if self.armed_rejects and self.env.subject.running:
            self._after_rejection()  # else the plugin's start follows it up: nothing can call before it runs

    def _do_release(self, step: Step) -> None:
        method = step.arg["call"]
        hold = self.held_calls.get(method)
        if hold is None or hold.released:
            raise Inconclusive(f"no {method} is held: arm one with hold: {{call: {method}}} first")
        hold.released = True
        holding = hold.in_flight()
        for _, fault in hold.faults:
            fault.release.set()
        self.env.timeline.record("fault.released", "harness", method=method, in_flight=holding is not None)
        if holding is not None and method in SERVED_CALLS:
            self.tell(f"released: kubelet instance {holding[0]} answers the {method} it held")
        elif holding is not None:
            self.tell(f"released: the plugin's answer to the {method} reaches kubelet instance {holding[0]}")
        elif hold.received():
            self.tell(f"released: the held {method} had already ended: {hold.ended()}")
        else:
            self.tell(f"released: no {method} had arrived; the hold is disarmed")

    def release_all(self) -> None:
        """At the end of a run: nothing stays held (a held handler thread would outlive its kubelet)."""
        for hold in self.held_calls.values():
            for _, fault in hold.faults:
                fault.release.set()

    # -- a socket deleted by hand -----------------------------------------------------------------------

    def _do_socket(self, step: Step) -> None:
        target = step.arg["delete"]
        path, whose = self._socket_path(target)
        try:
            path.unlink()
        except FileNotFoundError:
            raise Inconclusive(f"no socket to delete at {path} ({whose})") from None
        self.env.timeline.record("fault.socket_deleted", "harness", socket=str(path), name=path.name, whose=whose)
        mirrored = "; the relay mirrors it to the other side" if isinstance(self.env.node, LocalNode) else ""
        self.tell(f"deleted {path.name}, {whose} (an rm: whoever serves it keeps serving an unreachable path"
                  f"{mirrored})")

    def _socket_path(self, target: str) -> tuple[Path, str]:
        """The socket a scenario deletes, where its owner made it, and whose it is; never outside the sandbox."""
        node, sandbox = self.env.node, self.env.sandbox
        if self.is_dra:
            path, whose = self._dra_socket_path(target)
        elif target in ("kubelet", KUBELET_SOCKET):
            if self.fake is None and not isinstance(node, LocalNode):
                raise Inconclusive(f"the {type(node).__name__}'s kubelet.sock is out of fakelet's reach")
            path, whose = Path(node.kubelet_socket), "the kubelet's registration socket"  # type: ignore[union-attr]
        elif target == "plugin":
            path, whose = sandbox.plugin_dir / self._registered_endpoint(), "the plugin's registered endpoint"
        else:
            path, whose = sandbox.plugin_dir / target, "a socket in the plugin's device-plugins directory"
        if not path.resolve().is_relative_to(sandbox.path.resolve()):
            raise Inconclusive(f"{path} is outside the run's sandbox: fakelet deletes nothing there")
        return path, whose

    def _dra_socket_path(self, target: str) -> tuple[Path, str]:
        """A DRA driver's socket, in the driver's own directories (the sandbox's plugins_registry and
        plugins/<driver>; on the real node the DRA relay joins them to the kubelet's)."""
        env: Any = self.env
        if target in ("registration", "service"):
            registered = self._dra_registration()
            socket, endpoint = str(registered.get("socket") or ""), str(registered.get("endpoint") or "")
            if target == "registration":
                return Path(socket), "the driver's registration socket in plugins_registry"
            if not endpoint or endpoint == socket:
                raise Inconclusive("socket: {delete: service}: the driver registered no endpoint of its own (it serves "
                                   "its DRA service on its registration socket: delete registration)")
            # The endpoint as the driver named it: in its mount namespace's view when it runs in one.
            return Path(env.host_path(endpoint)), "the driver's registered endpoint (its DRA service)"
        places = [(env.sandbox.registry_dir / target, "a socket in plugins_registry"),
                  (env.sandbox.plugins_dir / env.driver / target, f"a socket in plugins/{env.driver}")]
        found = [(p, w) for p, w in places if os.path.lexists(p)]
        if len(found) > 1:
            raise Inconclusive(f"socket: {{delete: {target}}}: there is one in plugins_registry and one in "
                               f"plugins/{env.driver}: name the one meant by its role, registration or service")
        if not found:
            raise Inconclusive(f"no socket to delete at {places[0][0]} or {places[1][0]} (a file named {target} in "
                               f"plugins_registry or plugins/{env.driver})")
        return found[0]

    def _dra_registration(self) -> Event:
        """The driver's last registration the plugin watcher completed (the fake kubelet's own, or the relay's
        record of a real one): its socket in plugins_registry and the endpoint it named."""
        driver = getattr(self.env, "driver", "")
        done = [e for e in self.env.timeline.events(self.began_ns, "pluginwatcher.registered")
                if e.get("name") == driver]
        if not done:
            raise Inconclusive(f"a socket of driver {driver} named by its role needs a registration first: the driver "
                               "named no socket yet")
        return done[-1]

    def _registered_endpoint(self) -> str:
        accepted = [e for e in self.env.timeline.events(self.began_ns, "kubelet.register") if e.get("accepted")]
        if not accepted:
            raise Inconclusive("socket: {delete: plugin} needs a registration first: the plugin named no endpoint")
        endpoint = str(accepted[-1].get("endpoint") or "")
        if not endpoint or "/" in endpoint or endpoint in (".", ".."):
            raise Inconclusive(f"the plugin registered the endpoint {endpoint!r}, not a socket name in the "
                               "device-plugins directory: name the file to delete")
        return endpoint
