"""The fake hardware's steps of a scenario: device controls, fault scripts, and DeviceTaintRules, with
devices named by inventory ID, `@N` or `@pod:NAME`."""

from __future__ import annotations

from typing import Any

from fake_devices.scripts import ecc_burst, flap, run_script, temperature_ramp, unplug_replug
from harness.scenarios.outcomes import Inconclusive
from harness.scenarios.state import StageState
from harness.scenarios.step import Step
from harness.scenarios.vocabulary import DEVICE_OPS, SCRIPTS, chosen, duration_s


class DeviceSteps(StageState):
    def device(self, ref: str) -> str:
        """An inventory device ID from DEV: an ID, @N, or @pod:NAME."""
        env = self.env
        ids = [d.id for d in env.devices.devices()] if env.devices is not None else \
            [d["id"] for d in env.inventory or []]
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
        env = self._dra()
        device = self.device(step.arg["device"])
        assert env.taint_rules is not None
        pool = self._pool_of(device)
        effect = step.arg.get("effect", "NoExecute")
        key = step.arg.get("key", "fakelet.example.com/scenario")
        rule = env.taint_rules.add(f"{env.node_name}-{device}", {"key": key, "effect": effect},
                                   driver=env.driver, pool=pool, device=device)
        self.tell(f"DeviceTaintRule {rule['metadata']['name']} taints {device} {key}:{effect}")

    def _do_untaint(self, step: Step) -> None:
        env = self._dra()
        device = self.device(step.arg["device"])
        assert env.taint_rules is not None
        env.taint_rules.remove(f"{env.node_name}-{device}")
        self.tell(f"DeviceTaintRule on {device} removed")

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
