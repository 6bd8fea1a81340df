"""Device taints: an admin's DeviceTaintRules, and the taints drivers publish in their ResourceSlices.

DeviceTaintRule is `resource.k8s.io/v1beta2` from Kubernetes 1.36 (v1alpha3
from 1.33, still served in 1.36); which version a server serves is probed, not assumed. A rule
selects devices by driver, pool and device name (the DeviceClass selector was
tombstoned in 1.35: the eviction controller cannot evaluate it); a rule
without a selector matches nothing.
"""

from __future__ import annotations

import calendar
import time
from typing import Any

from harness.controlplane.client import ApiError, KubeClient

GROUP = "resource.k8s.io"
RULE_VERSIONS = ("v1beta2", "v1alpha3")  # newest first: v1beta2 from 1.36 (DRADeviceTaintRules beta)
RULE_RESOURCE = "devicetaintrules"
NO_EXECUTE, NO_SCHEDULE = "NoExecute", "NoSchedule"  # k8s.io/api resource/v1 DeviceTaintEffect values
# DeviceTaintEffectNone ("purely informational"): new in k8s.io/api v0.35 (v0.34.1 has only the two above), and
# accepted by the API server's validation.go validDeviceTaintEffects from 1.35 on, in every served version.
NONE = "None"
NONE_SINCE = "1.35"
BLOCKING = (NO_SCHEDULE, NO_EXECUTE)
# The condition the device-taint eviction controller posts on a rule (k8s.io/api resource/v1beta2 types.go
# DeviceTaintConditionEvictionInProgress): for a None rule at once, reason NoEffect, with what a NoExecute one
# would evict (devicetainteviction device_taint_eviction.go handleRuleChange, then its rule work item).
EVICTION_CONDITION = "EvictionInProgress"


class TaintRulesUnavailable(RuntimeError):
    """The API server serves no DeviceTaintRule version fakelet knows; str(err) says what it serves."""


def rule_version(client: KubeClient) -> str:
    """The newest served API version of DeviceTaintRule."""
    served = []
    for version in RULE_VERSIONS:
        try:
            resources = client.get(f"/apis/{GROUP}/{version}").get("resources") or []
        except ApiError as err:
            if err.status == 404:
                continue
            raise
        served.append(version)
        if any(r.get("name") == RULE_RESOURCE for r in resources):
            return version
    raise TaintRulesUnavailable(
        f"the API server serves no {RULE_RESOURCE} in {GROUP} {'/'.join(RULE_VERSIONS)} "
        f"(served of these: {', '.join(served) or 'none'}; needs the DRADeviceTaintRules feature gate)")


def rule_body(name: str, version: str, taint: dict[str, Any], driver: str | None = None,
              pool: str | None = None, device: str | None = None) -> dict[str, Any]:
    selector = {k: v for k, v in (("driver", driver), ("pool", pool), ("device", device)) if v is not None}
    return {"apiVersion": f"{GROUP}/{version}", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": {"deviceSelector": selector, "taint": taint}}


class TaintRules:
    """Creates DeviceTaintRules and removes every one it created."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._version: str | None = None
        self.created: list[str] = []

    @property
    def version(self) -> str:
        if self._version is None:
            self._version = rule_version(self.client)
        return self._version

    def path(self, name: str = "") -> str:
        base = f"/apis/{GROUP}/{self.version}/{RULE_RESOURCE}"
        return f"{base}/{name}" if name else base

    def add(self, name: str, taint: dict[str, Any], driver: str | None = None, pool: str | None = None,
            device: str | None = None) -> dict[str, Any]:
        """The rule as stored (its taint's timeAdded set by the server)."""
        rule = self.client.create(self.path(), rule_body(name, self.version, taint, driver, pool, device))
        self.created.append(name)
        return rule

    def in_cluster(self) -> list[dict[str, Any]]:
        """Every DeviceTaintRule in the cluster, whoever made it (as the eviction controller sees them); none
        where the server serves no version of them."""
        try:
            return self.client.list(self.path())
        except TaintRulesUnavailable:
            return []

    def condition(self, rule: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The eviction controller's condition on `rule` for its current generation, waited for (a bounded watch);
        None if none came within `timeout_s`."""
        meta = rule["metadata"]
        selector = f"{self.path()}?fieldSelector=metadata.name={meta['name']}"
        deadline = time.monotonic() + timeout_s
        while True:
            items, version = self.client.list_with_version(selector)
            found = _condition_of(items[0], meta.get("uid")) if items else None
            remaining = deadline - time.monotonic()
            if found is not None or remaining <= 0:
                return found
            for event in self.client.watch(selector, version, remaining):
                found = _condition_of(event.get("object") or {}, meta.get("uid"))
                if found is not None:
                    return found

    def remove(self, name: str) -> None:
        self.client.delete(self.path(name))
        if name in self.created:
            self.created.remove(name)

    def close(self) -> None:
        for name in list(self.created):
            try:
                self.remove(name)
            except (ApiError, OSError):
                pass


def _condition_of(rule: dict[str, Any], uid: str | None) -> dict[str, Any] | None:
    meta = rule.get("metadata") or {}
    if meta.get("uid") != uid:
        return None  # replaced by a rule of the same name
    for cond in (rule.get("status") or {}).get("conditions") or []:
        if cond.get("type") == EVICTION_CONDITION and cond.get("observedGeneration") == meta.get("generation"):
            return dict(cond)
    return None


def rule_matches(rule: dict[str, Any], driver: str, pool: str, device: str) -> bool:
    """Whether a DeviceTaintRule selects this device (devicetainteviction ruleMatchesDevice): only driver,
    pool and device select, and a rule without a selector matches nothing."""
    spec = rule.get("spec") or {}
    sel = spec.get("deviceSelector")
    if sel is None or not spec.get("taint"):
        return False
    return sel.get("driver") in (None, driver) and sel.get("pool") in (None, pool) and \
        sel.get("device") in (None, device)


def device_taints(slices: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Device name -> the taints its driver publishes on it (ResourceSlice spec.devices[].taints)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for s in slices:
        for d in (s.get("spec") or {}).get("devices") or []:
            out[d.get("name", "")] = list(d.get("taints") or [])
    return out


def blocking(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in taints if t.get("effect") in BLOCKING]


def time_added(taint: dict[str, Any]) -> float:
    """A taint's timeAdded (RFC 3339, whole seconds as the server stores it) as a Unix time."""
    return float(calendar.timegm(time.strptime(str(taint["timeAdded"]), "%Y-%m-%dT%H:%M:%SZ")))


def describe_taint(taint: dict[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"
