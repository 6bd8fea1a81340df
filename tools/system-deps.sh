#!/usr/bin/env bash
# System packages fakelet's tests and conformance runs use, installed once:
# etcd for the local kube-apiserver the DRA checks run against (Debian's
# etcd-server; kube-apiserver itself is built from the Go module proxy).
set -euo pipefail
if command -v etcd >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "fakelet: etcd not found and cannot install Debian's etcd-server here (needs root and apt-get);" \
         "DRA checks that need an API server will skip" >&2
    exit 0
fi
apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null
