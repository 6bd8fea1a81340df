#!/usr/bin/env bash
# System packages fakelet's tests and conformance runs use, installed once (Debian), and the inotify limit
# they need (below):
# - etcd-server: etcd for the local kube-apiserver the DRA checks run against
#   (kube-apiserver itself is built from the Go module proxy);
# - containerd, runc, busybox-static: the real kubelet's node (--node real, fakelet
#   fidelity, tox -e real-kubelet): the container runtime, and the static busybox the
#   locally built pod image holds (no registry is reachable);
# - docker.io: the Docker engine for the container launcher's tests (tox -e containers), started
#   privately by the tests (vfs, no iptables, no bridge); its containerd and runc are the same packages.
# - gcc: compiles fakelet's own NVML-compatible library (fake_devices/nvml/libnvml.c) on first use.
# An install takes minutes on a fresh machine: it says what it installs and why, and how long it took.
set -euo pipefail
# tox runs envs side by side (tox p): one install at a time, and a second caller finds the first's packages.
# The lock is on this script itself, so nothing is left behind.
exec 9<"${BASH_SOURCE[0]}"
flock 9
declare -A why=(
    [etcd-server]="etcd for the local API server of the DRA checks"
    [containerd]="the real kubelet's container runtime"
    [runc]="the real kubelet's container runtime"
    [busybox-static]="the real node's pod image"
    [docker.io]="the container launcher's tests"
    [gcc]="the fake NVML library"
)
# Each real-node check holds about 15 inotify instances (harness/instruments/inotify_budget.py); the default of
# 128 per user runs out when test workers run fidelity jobs side by side, and every process that then watches a
# file (kubelet, containerd, a plugin) exits with 'Too many open files'. Raised, never lowered, as root only.
inotify_wanted=1024
inotify_file=/proc/sys/fs/inotify/max_user_instances
if [ "$(id -u)" = 0 ] && [ -w "$inotify_file" ] && [ "$(cat "$inotify_file")" -lt "$inotify_wanted" ]; then
    echo "fakelet: raising fs.inotify.max_user_instances from $(cat "$inotify_file") to $inotify_wanted" \
         "(real-node checks side by side)" >&2
    echo "$inotify_wanted" > "$inotify_file"
fi
wanted=()
command -v etcd >/dev/null || wanted+=(etcd-server)
command -v containerd >/dev/null || wanted+=(containerd)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || wanted+=(runc)
[ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q static || \
    dpkg -s busybox-static >/dev/null 2>&1 || wanted+=(busybox-static)
command -v dockerd >/dev/null || wanted+=(docker.io)
command -v cc >/dev/null || wanted+=(gcc)
if [ ${#wanted[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "fakelet: missing ${wanted[*]} and cannot install Debian's packages here (needs root and apt-get);" \
         "checks that need them will skip" >&2
    exit 0
fi
reasons=()
for package in "${wanted[@]}"; do
    reasons+=("$package (${why[$package]})")
done
joined=$(printf '%s, ' "${reasons[@]}")
echo "fakelet: installing Debian packages (first run only): ${joined%, } ..." >&2
SECONDS=0
elapsed() { echo "$((SECONDS / 60))m$(printf %02d $((SECONDS % 60)))s"; }
# A CI log hears every 30 s that apt is still at work; the ticker ends with the install.
# Its sleep is killed with it, so no process outlives the script.
(
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    while :; do
        sleep 30 & nap=$!
        wait "$nap"
        echo "fakelet: ... still installing ${wanted[*]}, $(elapsed)" >&2
    done
) &
ticker=$!
trap 'kill "$ticker" 2>/dev/null || true' EXIT
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${wanted[@]}" >/dev/null
echo "fakelet: installed ${wanted[*]} in $(elapsed)" >&2
