"""Extended resources backed by DRA (KEP-5004) in the reference DRA driver: nothing of its own to do.

kube-scheduler makes one ResourceClaim for a pod's extended resources (harness/controlplane/extended.py): no
ResourceClaimTemplate, no pod claim entry naming it (no `resource.kubernetes.io/pod-claim-name`), requests named
`container-<i>-request-<j>`, no config. The good driver prepares it like any other claim and names each device's
own request back (kubelet pkg/apis/dra/v1 Device.request_names), which is how the kubelet hands each container
the device allocated for it. Two habits of real drivers break that, each a mutant:

- refuses-generated-claims: the driver finds the pod claim entry a claim serves (to read its per-pod settings)
  and refuses a pod-owned claim that no entry names;
- one-request-name: the driver, written for its own one-request claims, names every device with the claim's
  first request, so the kubelet hands every device to the first container and none to the others.
"""

from __future__ import annotations

from typing import Any

from harness.controlplane.extended import POD_CLAIM_ANNOTATION
from harness.spec import composition


def refusal(claim: dict[str, Any], defect: str | None) -> str | None:
    """Why refuses-generated-claims refuses the claim, or None."""
    if not composition.has(defect, "refuses-generated-claims"):
        return None
    meta = claim.get("metadata") or {}
    pods = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == "Pod"]
    if pods and POD_CLAIM_ANNOTATION not in (meta.get("annotations") or {}):
        return (f"claim {meta.get('namespace')}/{meta.get('name')} is owned by pod {pods[0].get('name')} but names "
                f"none of its claims ({POD_CLAIM_ANNOTATION} missing): no settings for it")
    return None


def request_name(claim: dict[str, Any], result: dict[str, Any], defect: str | None) -> str:
    """The request a prepared device names: its allocation result's, without a subrequest (the helper's
    stripSubrequestNames)."""
    if composition.has(defect, "one-request-name"):
        requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
        if requests:
            return str(requests[0].get("name", ""))
    return str(result.get("request", "")).split("/")[0]
