"""The kind tier: a kind cluster made through pytest-kind's `KindCluster`, and its node's shell.

`KindTier` creates (or, with --keep-cluster, reuses) one single-node kind
cluster on the Docker engine fakelet uses (harness/launch/containers/engine.py), loads
the subject's image and the pods' image into it, and gives the checks a
`ClusterNode` whose shell is `docker exec` into the kind node (`KindShell`):
restarting the kubelet is `systemctl restart kubelet` there, which deletes the
sockets for real; a container's OCI spec comes from `crictl inspect`; the
node's PodResources directory is bound out to this machine (manifests.py).

kind itself is the `kind` on PATH, else built from the Go module proxy
(fixtures/go/kind). A kind node image comes from a registry: where none is in the
engine and none can be pulled, the tier is unavailable and says so in one line.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pytest_kind import KindCluster

from harness.controlplane.client import KubeClient
from harness.instruments.progress import Progress
from harness.instruments.timeline import Timeline
from harness.launch import gobuild
from harness.launch.containers import engine, images
from harness.launch.owners import PREFIX, claim
from harness.node.kind import manifests
from harness.node.real.cluster import NotOnRealKubelet
from harness.spec import bundled

KIND_MODULE = "kind"  # fixtures/go/kind
KIND_PACKAGE = "sigs.k8s.io/kind"
KUBECTL_PACKAGE = "k8s.io/kubernetes/cmd/kubectl"  # built from fixtures/go/kubernetes, like kube-apiserver
DEFAULT_NODE_IMAGE = "kindest/node:v1.37.0"  # sigs.k8s.io/kind v0.33.0 pkg/apis/config/defaults/image.go
DEFAULT_CLUSTER = "fakelet"
CREATE_TIMEOUT_S = 600.0  # `kind create cluster` on 2 cores: a minute or two once the node image is there
QUIET_S = 2.0  # a kept cluster is reused and an image already loaded is skipped in about this long
EXEC_TIMEOUT_S = 60.0  # one `docker exec` into the node


class KindUnavailable(RuntimeError):
    """No kind cluster can be had here; the one-line reason says what is missing."""


def node_container(cluster: str) -> str:
    return f"{cluster}-control-plane"  # kind's name for a single node's container


def unavailable(node_image: str | None) -> str | None:
    """Why the kind tier cannot run here, in one line, or None (it may pull the node image)."""
    why = engine.unavailable()
    if why is not None:
        return why
    wanted = node_image or DEFAULT_NODE_IMAGE
    try:
        images.ensure_present(wanted)
    except images.ImageError as err:
        return f"no kind node image: {err}; give --kind-image with one the engine has"
    return None


def kind_binary() -> Path:
    found = shutil.which("kind")
    if found:
        return Path(found)
    try:
        return gobuild.build(bundled.go_module(KIND_MODULE), KIND_PACKAGE, "kind", why="for the kind tier")
    except (gobuild.GoUnavailable, RuntimeError) as err:
        raise KindUnavailable(f"no kind on PATH and it cannot be built: {str(err).splitlines()[-1][:300]}") from None


def kubectl_binary() -> Path:
    found = shutil.which("kubectl")
    if found:
        return Path(found)
    try:
        return gobuild.build(bundled.go_module("kubernetes"), KUBECTL_PACKAGE, "kubectl",
                             why="for the kind tier")
    except (gobuild.GoUnavailable, RuntimeError) as err:
        raise KindUnavailable(f"no kubectl on PATH and it cannot be built: {str(err).splitlines()[-1][:300]}") \
            from None


class _Cluster(KindCluster):
    """pytest-kind's cluster, kept in fakelet's own directory (its default is ./.pytest-kind in the cwd)."""

    def __init__(self, name: str, workdir: Path, image: str | None, kind: Path, kubectl: Path) -> None:
        self.name, self.image, self.path = name, image, workdir
        self.kubeconfig_path = workdir / "kubeconfig"
        self.kind_path, self.kubectl_path = kind, kubectl
        self.platform = "linux"


class KindTier:
    """One kind cluster for a run: created (or reused), fed the images, deleted unless kept."""

    def __init__(self, node_image: str | None = None, keep: bool = False, name: str = DEFAULT_CLUSTER) -> None:
        self.node_image, self.keep, self.name = node_image, keep, name
        self.workdir: Path | None = None
        self.cluster: _Cluster | None = None

    @property
    def pod_resources_dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "pod-resources"

    @property
    def kubeconfig(self) -> Path:
        assert self.cluster is not None
        return Path(self.cluster.kubeconfig_path)

    def start(self) -> KindTier:
        why = unavailable(self.node_image)
        if why is not None:
            raise KindUnavailable(why)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}kind-"))
        claim(self.workdir)
        self.pod_resources_dir.mkdir(mode=0o750)
        config = self.workdir / "cluster.yaml"
        config.write_text(yaml.safe_dump(manifests.cluster_config(str(self.pod_resources_dir)), sort_keys=False))
        self.cluster = _Cluster(self.name, self.workdir, self.node_image, kind_binary(), kubectl_binary())
        with Progress(f"kind cluster {self.name}", doing="creating", done="created", quiet_s=QUIET_S,
                      detail=f" from node image {self.node_image or DEFAULT_NODE_IMAGE} for the kind tier"):
            self._bounded(lambda: self.cluster.create(config), CREATE_TIMEOUT_S,  # type: ignore[union-attr]
                          "kind create cluster")
        return self

    def _bounded(self, call: Any, timeout_s: float, what: str) -> None:
        """pytest-kind runs kind without a bound: run it in a thread, and delete the cluster if it hangs."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                call()
            except BaseException as err:  # handed to the caller
                errors.append(err)
        thread = threading.Thread(target=run, daemon=True, name=f"kind-{what}")
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            self.stop(force=True)
            raise KindUnavailable(f"{what} did not finish within {timeout_s:g}s")
        if errors:
            raise KindUnavailable(f"{what} failed: {errors[0]}")

    def load(self, image: str) -> None:
        assert self.cluster is not None
        with Progress(image, doing="loading image", done="loaded image", detail=f" into kind cluster {self.name}",
                      quiet_s=QUIET_S):
            self._bounded(lambda: self.cluster.load_docker_image(image),  # type: ignore[union-attr]
                          CREATE_TIMEOUT_S, f"kind load docker-image {image}")

    def stop(self, force: bool = False) -> None:
        cluster, self.cluster = self.cluster, None
        if cluster is not None and (force or not self.keep):
            try:
                cluster.delete()
            except Exception:  # best effort: `kind delete` of a half-made cluster
                pass
        if self.workdir is not None and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> KindTier:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class KindAccess:
    """What a check needs of the run's kind cluster: the tier, a client on it, the pods' image there."""

    tier: KindTier
    client: KubeClient
    pod_image: str

    @property
    def node_name(self) -> str:
        return node_container(self.tier.name)  # kind names the Node after its container


class KindShell:
    """cluster.py's NodeShell for a kind node: `docker exec` into its container."""

    def __init__(self, tier: KindTier, timeline: Timeline, pod_image: str) -> None:
        self.tier, self.timeline, self.pod_image = tier, timeline, pod_image
        self.node = node_container(tier.name)
        self.pod_resources_socket = tier.pod_resources_dir / "kubelet.sock"
        self.starts = 1  # kind's kubelet is up when the cluster is

    def exec(self, *cmd: str) -> str:
        found = engine.client(EXEC_TIMEOUT_S)
        try:
            code, out = found.containers.get(self.node).exec_run(list(cmd))
        finally:
            found.close()
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        if code != 0:
            raise KindUnavailable(f"docker exec {self.node} {' '.join(cmd)}: exit {code}: {text.strip()[-300:]}")
        return text

    @property
    def running(self) -> bool:
        try:
            return self.exec("systemctl", "is-active", "kubelet").strip() == "active"
        except KindUnavailable:
            return False

    def prepare(self) -> None:
        """The cluster is the tier's: nothing to start here."""

    def start_kubelet(self) -> None:
        self.starts += 1
        self.exec("systemctl", "start", "kubelet")
        self.timeline.record("kubelet.start", "kubelet", instance=self.starts, real=True, kind=True)

    def stop_kubelet(self, remove_socket: bool = False) -> None:
        self.exec("systemctl", "stop", "kubelet")
        if remove_socket:
            self.exec("rm", "-f", f"{manifests.DEVICE_PLUGIN_DIR}/kubelet.sock")
        self.timeline.record("kubelet.stop", "kubelet", instance=self.starts, real=True, kind=True)

    def container_spec(self, container_id: str) -> dict[str, Any]:
        import json

        return (json.loads(self.exec("crictl", "inspect", container_id)).get("info") or {}).get("runtimeSpec") or {}

    def kubelet_log_tail(self, lines: int = 15) -> str:
        try:
            return self.exec("journalctl", "-u", "kubelet", "-n", str(lines), "--no-pager")
        except KindUnavailable as err:
            return str(err)

    def kubelet_file(self, name: str) -> Path | None:
        """Inside the node's container: not a path fakelet can read."""
        return None

    def power_off_pods(self) -> int:
        raise NotOnRealKubelet("a power cut of a kind node's pods is not modelled: the cluster is shared")

    def close(self) -> None:
        """The node is the cluster's: it outlives one check."""
