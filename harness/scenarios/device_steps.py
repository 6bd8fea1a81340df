"""The fake hardware's steps of a scenario: device controls, fault scripts, and DeviceTaintRules, with
devices named by inventory ID, `@N` or `@pod:NAME`."""

from __future__ import annotations

from typing import Any

from fake_devices.scripts import ecc_burst, flap, run_script, temperature_ramp, unplug_replug
from harness.controlplane.client import ApiError
from harness.controlplane.taints import NONE, NONE_SINCE
from harness.scenarios.outcomes import Inconclusive
from harness.scenarios.state import StageState
from harness.scenarios.step import Step, flow
from harness.scenarios.vocabulary import DEFAULT_TAINT_KEY, DEVICE_OPS, SCRIPTS, SELECTOR_WORDS, chosen, duration_s


class DeviceSteps(StageState):
    def device(self, ref: str) -> str:
        """An inventory device ID from DEV: an ID, @N, or @pod:NAME."""
        ids = self._inventory_ids()
        if ref.startswith("@pod:"):
            return self._pod_device(ref[5:])
        if ref.startswith("@"):
            n = int(ref[1:])
            if n >= len(ids):
                raise Inconclusive(f"{ref}: the inventory has {len(ids)} device(s)")
            return ids[n]
        if ref not in ids:
            raise Inconclusive(f"no device {ref} in the inventory ({', '.join(ids)})")
        return ref

    def _pod_device(self, name: str) -> str:
        pod = self._pod(name)
        if self.is_dra:
            from harness.world.draenv import DRAEnv

            assert isinstance(self.env, DRAEnv)
            for claim in pod.claims:
                for _, device in self.env.allocated_devices(claim, self.env.driver):
                    return device
            raise Inconclusive(f"pod {name} holds no device")
        devices = [d for ds in self.env.node.pod_devices(pod.key).values() for d in ds]
        if not devices:
            raise Inconclusive(f"pod {name} holds no device")
        pairs = self.env.mapping.pairs
        return pairs.get(devices[0], devices[0])

    def _backend(self) -> Any:
        if self.env.devices is None:
            raise Inconclusive("this subject has no fake hardware (give it an inventory with a backend)")
        return self.env.devices

    def _do_device(self, step: Step) -> None:
        arg = dict(step.arg)
        backend = self._backend()
        op = chosen(arg, DEVICE_OPS)
        if op in ("nvml-init-error", "nvml-wait-error"):
            code = int(arg[op])
            try:
                getattr(backend, op.replace("-", "_"))(code)
            except ValueError as err:
                raise Inconclusive(str(err)) from None
            self.tell(f"NVML {op[5:]} now answers {code}{' (works again)' if code == 0 else ''}")
            return
        device = self.device(arg[op])
        value = arg.get("to", arg.get("count", arg.get("code")))
        try:
            backend.apply(op, device, value)
        except ValueError as err:
            raise Inconclusive(f"device {op} {device}: {err}") from None
        self.tell(f"device {device}: {op}{f' {value:g}' if isinstance(value, int | float) else ''}")

    def _do_script(self, step: Step) -> None:
        arg = step.arg
        name = chosen(arg, SCRIPTS)
        device = self.device(arg[name])
        if name == "flap":
            steps = flap(device, duration_s(arg["period"]) or 0, arg["cycles"])
        elif name == "ramp":
            steps = temperature_ramp(device, arg["from"], arg["to"], arg["step"], duration_s(arg["period"]) or 0)
        elif name == "unplug-replug":
            steps = unplug_replug(device, duration_s(arg["down"]) or 0)
        else:
            steps = ecc_burst(device, arg["count"], duration_s(arg["period"]) or 0)
        self.tell(f"fault script {name} on {device}: {len(steps)} change(s) over {steps[-1].at_s:g}s")
        run_script(self._backend(), steps, self.env.stop_scripts)
        self.tell(f"fault script {name} done")

    def _do_taint(self, step: Step) -> None:
        """A DeviceTaintRule: for one device (its driver, pool and name), or with the step's own selector."""
        env = self._dra()
        arg = step.arg
        effect = arg.get("effect", "NoExecute")
        key = arg.get("key", DEFAULT_TAINT_KEY)
        device = self.device(arg["device"]) if "device" in arg else None
        if device is not None:
            selector = {"driver": env.driver, "pool": self._pool_of(device), "device": device}
            default = f"{env.node_name}-{device}"
        else:
            selector = self._selector(arg["selector"])
            default = f"{env.node_name}-step-{step.index}"  # unique in the run; untaint finds it by its selector
        name = f"{env.node_name}-{arg['name']}" if "name" in arg else default
        assert env.taint_rules is not None
        try:
            rule = env.taint_rules.add(name, {"key": key, "effect": effect}, **selector)
        except ApiError as err:
            # Before 1.35 no API server knows the None effect (controlplane/taints.py NONE): a run against one
            # (--control-plane kubeconfig:PATH, a kube-apiserver from PATH) cannot make the rule.
            older = f" (effect None needs an API server of {NONE_SINCE} or newer)" \
                if effect == NONE and err.status == 422 else ""
            raise Inconclusive(f"the API server refused DeviceTaintRule {name}: {err}{older}") from None
        self.rules[name] = {"selector": selector, "device": device}
        spec = rule.get("spec") or {}
        stored = spec.get("deviceSelector")  # as the API server keeps it: what the eviction controller reads
        # The same event as a live session's taint (harness/run/sessionops.py), with the stored selector.
        env.timeline.record("fault.taint_added", "harness", device=device, effect=effect, key=key,
                            rule=rule["metadata"]["name"], selector=stored, version=env.taint_rules.version,
                            time_added=(spec.get("taint") or {}).get("timeAdded"))
        what = device if device is not None else f"what deviceSelector {_flow(stored)} selects"
        if stored == {}:
            what += " (the empty selector: every device of every driver in the cluster)"
        self.tell(f"DeviceTaintRule {rule['metadata']['name']} ({env.taint_rules.version}) taints {what} "
                  f"{key}:{effect}")
        if effect == NONE:
            self._tell_no_effect(rule)

    def _tell_no_effect(self, rule: dict[str, Any]) -> None:
        """What the device-taint eviction controller posts on a None rule as soon as it sees it: that it has no
        effect, and what a NoExecute one would evict (the pods it did not evict). Evidence that the controller saw
        the rule, for the steps after it; a controller that says nothing is narrated, never a failure here."""
        env = self._dra()
        plane = env.control_plane
        absent = getattr(plane, "controllers_error", "") if plane is not None else "no control plane"
        if absent:
            self.tell(f"no device-taint eviction controller runs here to read the None rule: {absent}")
            return
        bound = env.profile.reaction_s
        try:
            cond = env.taint_rules.condition(rule, bound)
        except ApiError as err:
            self.tell(f"the rule's status could not be read: {err}")
            return
        if cond is None:
            self.tell(f"the device-taint eviction controller posted no condition on the rule within {bound:g}s")
            return
        self.tell(f"the device-taint eviction controller: {cond.get('type')}={cond.get('status')} "
                  f"{cond.get('reason')}: {str(cond.get('message') or '').strip()}")
        env.timeline.record("api.taint_rule_status", "api", rule=rule["metadata"]["name"], type=cond.get("type"),
                            status=cond.get("status"), reason=cond.get("reason"), message=cond.get("message"))

    def _selector(self, given: dict[str, Any]) -> dict[str, str]:
        """A step's selector with its words and device references resolved: what the rule's deviceSelector holds."""
        env = self._dra()
        out: dict[str, str] = {}
        for key, value in given.items():
            if value == SELECTOR_WORDS.get(key):
                out[key] = env.driver if key == "driver" else env.node_name
            elif key == "device":
                # An inventory ID, @N or @pod:NAME names the device as the driver publishes it.
                out[key] = self.device(value) if value.startswith("@") or value in self._inventory_ids() else value
            else:
                out[key] = str(value)
        return out

    def _inventory_ids(self) -> list[str]:
        env = self.env
        return [d.id for d in env.devices.devices()] if env.devices is not None else \
            [d["id"] for d in env.inventory or []]

    def _do_untaint(self, step: Step) -> None:
        """Remove what an earlier taint step made: the rules made for a device, the rule of a name, or those with
        the same selector."""
        env = self._dra()
        arg = step.arg
        assert env.taint_rules is not None
        device = self.device(arg["device"]) if "device" in arg else None
        if device is not None:
            names = [n for n, made in self.rules.items() if made["device"] == device]
            what = f"on {device}"
        elif "rule" in arg:
            names, what = [f"{env.node_name}-{arg['rule']}"], f"named {arg['rule']}"
        else:
            wanted = self._selector(arg["selector"])
            names = [n for n, made in self.rules.items() if made["device"] is None and made["selector"] == wanted]
            what = f"with deviceSelector {_flow(wanted)}"
        if not names:
            raise Inconclusive(f"no DeviceTaintRule of this scenario {what}: nothing to remove")
        for name in names:
            try:
                env.taint_rules.remove(name)
            except ApiError as err:
                why = "no such rule" if err.status == 404 else str(err)
                raise Inconclusive(f"DeviceTaintRule {name} ({what}) not removed: {why}") from None
            self.rules.pop(name, None)
        env.timeline.record("fault.taint_removed", "harness", device=device, rules=names)
        self.tell(f"DeviceTaintRule {', '.join(names)} ({what}) removed")

    def _dra(self) -> Any:
        from harness.world.draenv import DRAEnv

        env = self.env
        if not isinstance(env, DRAEnv) or env.taint_rules is None:
            raise Inconclusive("taints need a DRA driver and an API server")
        return env

    def _pool_of(self, device: str) -> str:
        env = self._dra()
        for s in env.slices():
            for d in (s.get("spec") or {}).get("devices") or []:
                if d.get("name") == device:
                    return str(((s.get("spec") or {}).get("pool") or {}).get("name", ""))
        return env.node_name


def _flow(selector: Any) -> str:
    """A deviceSelector as a scenario file writes it: {} is the empty one, never nothing."""
    return "{" + flow(selector) + "}" if isinstance(selector, dict) else "(none)"
