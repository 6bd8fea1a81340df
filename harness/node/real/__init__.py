"""The real kubelet as a Node: kubelet v1.36 and containerd 2 from the Go module proxy (runtime.py), Debian's runc.

`LocalNode` (localnode.py) runs both in a private mount and PID namespace of
their own (namespace.py), so the host's /var/lib/kubelet, /var/lib/containerd
and /run/containerd are never touched and everything dies with the run. Pods
run a locally built image (image.py): no registry is reachable here.
"""
