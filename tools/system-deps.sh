#!/usr/bin/env bash
# System packages fakelet's tests and conformance runs use, installed once (Debian):
# - etcd-server: etcd for the local kube-apiserver the DRA checks run against
#   (kube-apiserver itself is built from the Go module proxy);
# - containerd, runc, busybox-static: the real kubelet's node (--node real, fakelet
#   fidelity, tox -e real-kubelet): the container runtime, and the static busybox the
#   locally built pod image holds (no registry is reachable);
# - docker.io: the Docker engine for the container launcher's tests (tox -e containers), started
#   privately by the tests (vfs, no iptables, no bridge); its containerd and runc are the same packages.
set -euo pipefail
wanted=()
command -v etcd >/dev/null || wanted+=(etcd-server)
command -v containerd >/dev/null || wanted+=(containerd)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || wanted+=(runc)
[ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q static || \
    dpkg -s busybox-static >/dev/null 2>&1 || wanted+=(busybox-static)
command -v dockerd >/dev/null || wanted+=(docker.io)
# - gcc: compiles fakelet's own NVML-compatible library (fake_devices/nvml/libnvml.c) on first use.
command -v cc >/dev/null || wanted+=(gcc)
if [ ${#wanted[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "fakelet: missing ${wanted[*]} and cannot install Debian's packages here (needs root and apt-get);" \
         "checks that need them will skip" >&2
    exit 0
fi
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${wanted[@]}" >/dev/null
