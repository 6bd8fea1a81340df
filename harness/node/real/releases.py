"""Which kubelet releases the real node can build: one wrapper module each (tests/go/kubernetes*).

Each module pins k8s.io/kubernetes and its staging modules at one release; the
real node builds its kubelet from the module of the release asked for
(`--node real --kubelet-version`). The control plane always comes from the
default module.
"""

from __future__ import annotations

REAL_KUBELET_MODULES = {
    "1.36": "tests/go/kubernetes",  # k8s.io/kubernetes v1.36.3
    "1.37": "tests/go/kubernetes-1.37",  # k8s.io/kubernetes v1.37.2
}
