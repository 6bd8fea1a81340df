#!/usr/bin/env bash
# fakelet's image, built on this machine without a registry: Debian bookworm from debootstrap, the
# Debian packages `fakelet run` needs, fakelet in a venv at /opt/fakelet (on PATH), and the kube
# binaries of the default release already in fakelet's cache (/root/.cache/fakelet/bin), so that
#     docker run --privileged --rm -v "$PWD:/work" fakelet:0.1.0 fakelet run --subject-file my-plugin.yaml
# builds nothing on its first run (docs/image.md).
#
#   tools/build-image.sh [--wheel PATH] [--tag fakelet:VERSION] [--save FILE] [--refresh-base] [--print-mirror]
#
# --wheel     fakelet's wheel (default: `pip wheel --no-deps` of this checkout)
# --tag       the image's tag (default: fakelet:<the wheel's version>)
# --save      also write the image as a `docker load` archive; with no engine answering, the image is
#             built in a private engine (tools/build_image.py engine) for this alone
# --refresh-base  debootstrap again even if the base for this package list is cached
# --print-mirror  print the Debian mirror the build would use (apt's own, from /etc/apt) and exit
#
# The engine is the one DOCKER_HOST names, else the client's default socket. The debootstrapped base
# (packages installed) is cached as a tarball keyed by the package list, the mirrors and the
# architecture under $FAKELET_CACHE/image (default ~/.cache/fakelet/image): a rebuild only
# installs the wheel, copies the binaries and imports. The Debian mirror is the one apt uses here
# (FAKELET_DEBIAN_MIRROR and FAKELET_DEBIAN_SECURITY override it); the Python that runs the helper is
# FAKELET_PYTHON, else the one of the `fakelet` on PATH. Needs root (debootstrap, chroot).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HELPER=$REPO/tools/build_image.py
SUITE=bookworm
VARIANT=minbase
BASE_FORMAT=1  # bump when what the base stage does changes: a new key, so no stale base is reused
# What `fakelet run` needs in the image (tools/system-deps.sh says why for most):
# - python3, python3-venv: fakelet itself, in /opt/fakelet;
# - etcd-server: etcd of the local control plane the DRA checks run against;
# - containerd, runc, busybox-static, iproute2, util-linux: the real kubelet's node (--node real),
#   and util-linux's unshare, nsenter and setpriv for the sandboxes;
# - gcc, libc6-dev: the fake NVML library (built into the image below, so the compiler is for a
#   changed source only); procps: ps and kill for the harness and a person in the container;
# - ca-certificates, openssl: the service-account signing key of the local control plane, and TLS.
PACKAGES=(python3 python3-venv etcd-server containerd runc busybox-static gcc libc6-dev iproute2 util-linux
          procps ca-certificates openssl)
IMAGE_PATH=/opt/fakelet/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENGINE_PING_S=10      # `docker version` against an engine that answers at all: under a second
ENGINE_START_S=120    # the private engine's start: about a second here, a loaded machine's longer
TICK_S=60             # a CI log hears that a long stage is still at work this often

say() { echo "fakelet image: $*" >&2; }
die() { say "error: $*"; exit 1; }

wheel=""
tag=""
save=""
refresh=0
print_mirror=0
while [ $# -gt 0 ]; do
    case $1 in
        --wheel) wheel=${2:?--wheel needs a path}; shift 2 ;;
        --tag) tag=${2:?--tag needs a name}; shift 2 ;;
        --save) save=${2:?--save needs a file}; shift 2 ;;
        --refresh-base) refresh=1; shift ;;
        --print-mirror) print_mirror=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

# The same mirrors apt uses here: one-line sources (sources.list, *.list) and deb822 (*.sources).
apt_sources() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '$1 == "deb" { sub(/\[[^]]*\] */, ""); print $2, $3 }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk 'function flush(  n, i, s, u) {
                 if (types ~ /(^| )deb( |$)/ && enabled != "no") {
                     n = split(suites, s, " "); split(uris, u, " ")
                     for (i = 1; i <= n; i++) print u[1], s[i]
                 }
                 types = uris = suites = enabled = ""
             }
             /^[ \t]*$/ { flush(); next }
             /^[ \t]*#/ { next }
             { key = tolower($1); $1 = "" }
             key == "types:" { types = $0 } key == "uris:" { uris = $0 }
             key == "suites:" { suites = $0 } key == "enabled:" { enabled = tolower($2) }
             END { flush() }' "$f"
    done
}
first_uri() { apt_sources | awk -v s="$1" '$2 == s { print $1; exit }'; }
mirror=${FAKELET_DEBIAN_MIRROR:-}
[ -n "$mirror" ] || mirror=$(first_uri "$SUITE")
security=${FAKELET_DEBIAN_SECURITY:-}
[ -n "$security" ] || security=$(first_uri "$SUITE-security")
if [ -z "$mirror" ]; then
    mirror=http://deb.debian.org/debian
    say "apt here names no $SUITE mirror: using $mirror"
fi
if [ "$print_mirror" = 1 ]; then
    echo "$mirror"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "needs root (debootstrap and chroot)"
command -v docker >/dev/null || die "no docker client (Debian package docker.io, or docker-ce-cli)"

# A Python that can import fakelet's harness: the test's own, the `fakelet` on PATH's, else python3.
pick_python() {
    if [ -n "${FAKELET_PYTHON:-}" ]; then echo "$FAKELET_PYTHON"; return; fi
    local found
    found=$(command -v fakelet || true)
    if [ -n "$found" ] && head -c2 "$found" | grep -q '#!'; then
        head -1 "$found" | sed 's/^#! *//; s/ .*//'
        return
    fi
    command -v python3
}
py=$(pick_python)
"$py" -c 'import sys; sys.path.insert(0, sys.argv[1]); import harness.controlplane.local' "$REPO" 2>/dev/null ||
    die "$py cannot import fakelet's harness with its dependencies: set FAKELET_PYTHON to a Python" \
        "with fakelet installed (a tox env's, or the dev venv's)"

cache_root=${FAKELET_CACHE:-$HOME/.cache/fakelet}
cache=$cache_root/image
mkdir -p "$cache"

rootfs=""
work=""
partial=""  # the base tarball while it is written
engine_pid=""
engine_in=""
ticker=""
stage_name=""
stage_start=0
timings=()
total_start=$(date +%s)

stop_engine() {
    if [ -n "$engine_in" ]; then
        eval "exec $engine_in>&-"  # EOF on the helper's stdin: it stops the engine and exits
        engine_in=""
    fi
    if [ -n "$engine_pid" ]; then
        wait "$engine_pid" 2>/dev/null || true
        engine_pid=""
    fi
}

stop_ticker() {
    if [ -n "$ticker" ]; then
        kill "$ticker" 2>/dev/null || true
        wait "$ticker" 2>/dev/null || true
        ticker=""
    fi
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_ticker
    # Nothing is mounted in the root (apt and pip need no /proc there); --one-file-system all the same,
    # so that a mount someone made inside it is never followed into the host.
    [ -z "$rootfs" ] || rm -rf --one-file-system "$rootfs"
    [ -z "$work" ] || rm -rf "$work"
    [ -z "$partial" ] || rm -f "$partial"
    stop_engine
    [ "$rc" = 0 ] || say "failed after $(( $(date +%s) - total_start ))s; nothing left behind"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

stage() {
    stage_name=$1
    stage_start=$(date +%s)
    say "$1 ..."
    # Its sleep is killed with it (TERM trap), so no process outlives the stage; and it ends at its next
    # tick when the script is gone (SIGKILL: no trap ran). It lets go of the base's lock and the private
    # engine's stdin at once, so that neither waits for it.
    (
        exec 8<&-
        [ -z "$engine_in" ] || eval "exec $engine_in>&-"
        trap 'kill "$nap" 2>/dev/null; exit 0' TERM
        while kill -0 "$$" 2>/dev/null; do
            sleep "$TICK_S" & nap=$!
            wait "$nap"
            say "... still $stage_name, $(( $(date +%s) - stage_start ))s"
        done
    ) &
    ticker=$!
}

done_stage() {
    stop_ticker
    local took=$(( $(date +%s) - stage_start ))
    timings+=("$1 ${took}s")
    say "$1: done in ${took}s"
}

# Failed step: its log's tail, then out (the EXIT trap cleans up).
run_logged() {
    local log=$1
    shift
    if ! "$@" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        die "$stage_name failed ($*)"
    fi
}

# The engine first: with none to import into, say so before minutes of building.
engine_answers() { timeout "$ENGINE_PING_S" docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }
if engine_answers; then
    say "engine: ${DOCKER_HOST:-the default socket}"
elif [ -n "$save" ]; then
    say "no Docker engine answers at ${DOCKER_HOST:-the default socket}: a private one for this build (--save)"
    coproc ENGINE { exec "$py" "$HELPER" engine; }
    # shellcheck disable=SC2153  # bash sets ENGINE_PID for the coproc
    engine_pid=$ENGINE_PID
    engine_in=${ENGINE[1]}
    host=""
    read -r -t "$ENGINE_START_S" host <&"${ENGINE[0]}" || true
    [ -n "$host" ] || die "the private Docker engine did not start (its reason is above)"
    export DOCKER_HOST=$host
else
    die "no Docker engine answers at ${DOCKER_HOST:-the default socket}: start dockerd (Debian: docker.io)," \
        "set DOCKER_HOST, or pass --save FILE to build in a private engine and save the image for docker load"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/fakelet-image-work.XXXXXX")

if ! command -v debootstrap >/dev/null; then
    stage "installing debootstrap (Debian package)"
    # The package index may be older than the mirror's: update only when the install alone fails.
    run_logged "$work/debootstrap-install.log" sh -c 'export DEBIAN_FRONTEND=noninteractive;
        apt-get install -y -qq debootstrap || { apt-get update -qq && apt-get install -y -qq debootstrap; }'
    done_stage "debootstrap install"
fi

if [ -z "$wheel" ]; then
    stage "building fakelet's wheel from $REPO"
    run_logged "$work/wheel.log" "$py" -m pip wheel -q --no-deps -w "$work/wheel" "$REPO"
    wheel=$(ls "$work"/wheel/fakelet-*.whl)
    done_stage "wheel"
fi
[ -f "$wheel" ] || die "no wheel at $wheel"
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
version=$(basename "$wheel" | cut -d- -f2)
tag=${tag:-fakelet:$version}
digest=$("$py" "$HELPER" digest "$wheel")
say "wheel $(basename "$wheel") (content sha256 ${digest:0:16}), tag $tag"

arch=$(dpkg --print-architecture)

base_key=$(printf '%s\n' "$BASE_FORMAT" "$SUITE" "$VARIANT" "$arch" "$mirror" "$security" "${PACKAGES[@]}" |
           sha256sum | cut -c1-16)
base=$cache/base-$SUITE-$arch-$base_key.tar

# A rootfs left by a build killed outright (SIGKILL: no trap ran) goes now.
for dead in "$cache"/rootfs.*; do
    [ -d "$dead" ] || continue
    pid=${dead##*/rootfs.}
    pid=${pid%%.*}
    kill -0 "$pid" 2>/dev/null || rm -rf --one-file-system "$dead"
done
# Under the cache, not TMPDIR: a tmpfs or nodev TMPDIR could not hold the root's device nodes.
rootfs=$(mktemp -d "$cache/rootfs.$$.XXXXXX")
chmod 0755 "$rootfs"

in_root() {
    chroot "$rootfs" /usr/bin/env -i HOME=/root PATH="$IMAGE_PATH" LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}

# One base build at a time per cache: a second builder waits, then finds the tarball (the lock is
# on the directory itself, so nothing is left behind).
exec 8<"$cache"
flock 8
if [ "$refresh" = 1 ] || [ ! -f "$base" ]; then
    stage "debootstrap $SUITE ($VARIANT, $arch) from $mirror"
    run_logged "$work/debootstrap.log" debootstrap --variant="$VARIANT" --arch="$arch" "$SUITE" "$rootfs" "$mirror"
    done_stage "debootstrap"

    stage "apt-get install in the root: ${PACKAGES[*]}"
    {
        echo "deb $mirror $SUITE main"
        echo "deb $mirror $SUITE-updates main"
        [ -z "$security" ] || echo "deb $security $SUITE-security main"
    } >"$rootfs/etc/apt/sources.list"
    # No daemon starts in the root (containerd's postinst would try): invoke-rc.d asks this first.
    printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
    chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
    # Docs, man pages and translations are most of a minimal root's size and no run reads them.
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/fakelet-nodoc" <<'EOF'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
EOF
    run_logged "$work/apt.log" in_root sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends ${PACKAGES[*]} && apt-get clean"
    rm -f "$rootfs/usr/sbin/policy-rc.d"
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/apt/* "$rootfs/var/log/dpkg.log"
    done_stage "apt"

    stage "caching the base as $base"
    rm -f "$cache"/base-"$SUITE"-"$arch"-*.tar  # one base per machine: an older package list's is stale
    partial=$base.tmp$$
    tar -C "$rootfs" --numeric-owner -cpf "$partial" .
    mv "$partial" "$base"
    partial=""
    done_stage "base cached"
else
    stage "unpacking the cached base $base"
    tar -C "$rootfs" --numeric-owner -xpf "$base"
    done_stage "base unpacked"
fi
flock -u 8
exec 8<&-

stage "fakelet in a venv at /opt/fakelet ($(basename "$wheel"), its dependencies from PyPI)"
# The root's pip reaches PyPI as this machine's does: its resolver, its CA bundle (a TLS-inspecting
# egress proxy's CA is in it, not in Debian's), and its index and proxy settings. The bundle is removed
# again below: the image trusts Debian's CAs only.
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
cp "$wheel" "$rootfs/tmp/"
# No pip cache: it would ship in the image's /root/.cache.
pip_env=(PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-120}")
ca=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
if [ -f "$ca" ]; then
    cp "$ca" "$rootfs/tmp/host-ca.crt"
    pip_env+=(PIP_CERT=/tmp/host-ca.crt)
fi
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST http_proxy https_proxy HTTP_PROXY HTTPS_PROXY \
           no_proxy NO_PROXY; do
    [ -z "${!var:-}" ] || pip_env+=("$var=${!var}")
done
run_logged "$work/pip.log" in_root "${pip_env[@]}" sh -c \
    "python3 -m venv /opt/fakelet && /opt/fakelet/bin/pip install -q /tmp/$(basename "$wheel")"
done_stage "pip"

stage "the default release's kube binaries (fakelet's cache $cache_root/bin; built there first if missing)"
# Built from the wheel's own Go modules, so the names (gobuild's hash of those files) are the image's;
# a build's progress lines (minutes each, first time only) reach the terminal.
"$py" "$HELPER" kube-binaries "$wheel" >"$work/kube.txt"
mkdir -p "$rootfs/root/.cache/fakelet/bin"
while read -r name path; do
    say "  $name: $(basename "$path") ($(( $(stat -c %s "$path") / 1048576 )) MB)"
    cp "$path" "$rootfs/root/.cache/fakelet/bin/"
done <"$work/kube.txt"
# The image's own fakelet looks each one up as a run would, and builds the NVML library with its gcc.
run_logged "$work/verify.log" in_root /opt/fakelet/bin/python - verify <"$HELPER"
say "  $(tail -n 1 "$work/verify.log")"
done_stage "kube binaries"

# What the image must not carry: this machine's resolver, CA bundle and hostname, and the wheel.
rm -rf "${rootfs:?}"/tmp/* "${rootfs:?}"/tmp/.[!.]* 2>/dev/null || true
: >"$rootfs/etc/resolv.conf"
echo fakelet >"$rootfs/etc/hostname"
mkdir -p "$rootfs/work"

stage "docker import as $tag"
old=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
tar -C "$rootfs" --numeric-owner -c . |
    docker import \
        --change "ENV PATH=$IMAGE_PATH" \
        --change 'ENV LANG=C.UTF-8' \
        --change 'WORKDIR /work' \
        --change 'CMD ["fakelet", "--help"]' \
        --change "LABEL fakelet.version=$version fakelet.wheel-digest=$digest fakelet.base=$base_key" \
        --message "fakelet $version (tools/build-image.sh)" - "$tag" >/dev/null
new=$(docker image inspect --format '{{.Id}}' "$tag")
# The tag's previous image would stay behind untagged: remove it unless a container still uses it.
if [ -n "$old" ] && [ "$old" != "$new" ]; then
    docker image rm "$old" >/dev/null 2>&1 || true
fi
size=$(docker image inspect --format '{{.Size}}' "$tag")
done_stage "import"

if [ -n "$save" ]; then
    stage "docker save to $save"
    docker save -o "$save" "$tag"
    done_stage "save"
fi

joined=$(printf '%s, ' "${timings[@]}")
say "built $tag ($(( size / 1048576 )) MB) in $(( $(date +%s) - total_start ))s: ${joined%, }"
echo "$tag"
