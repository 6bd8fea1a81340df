"""What fakelet deploys on a kind cluster: a subject as its DaemonSet, and the cluster's own config.

A device plugin's DaemonSet mounts the kubelet's device-plugins directory as a
hostPath; a DRA driver's mounts plugins_registry, plugins and the CDI
directory, runs under a ServiceAccount allowed to publish ResourceSlices and
read claims, and learns its node from the downward API. The subject's command
templates render against those in-cluster paths (`{plugin_dir}` is
/var/lib/kubelet/device-plugins, `{node_name}` is `$(NODE_NAME)`, `{kubeconfig}`
is empty: in-cluster config); a placeholder that names the sandbox or the fake
hardware on this machine has no meaning inside a kind node, and is an error.
"""

from __future__ import annotations

from typing import Any

from harness.spec.subjects import ProfileError, SubjectSpec, render, template_fields

NAMESPACE = "fakelet-kind"
APP_LABEL = "app.kubernetes.io/name"
MANAGED_BY = {"app.kubernetes.io/managed-by": "fakelet"}
KUBELET_DIR = "/var/lib/kubelet"  # kubelet --root-dir default
DEVICE_PLUGIN_DIR = f"{KUBELET_DIR}/device-plugins"  # deviceplugin v1beta1 DevicePluginPath
REGISTRY_DIR = f"{KUBELET_DIR}/plugins_registry"  # kubelet config DefaultKubeletPluginsRegistrationDirName
PLUGINS_DIR = f"{KUBELET_DIR}/plugins"  # kubelet config DefaultKubeletPluginsDirName
POD_RESOURCES_DIR = f"{KUBELET_DIR}/pod-resources"  # kubelet podresources socket directory
CDI_DIR = "/var/run/cdi"  # CDI's dynamic spec directory
POD_PORT = 8080  # {free_port}: the pod has a network namespace of its own, so any port is free there
KIND_API_VERSION = "kind.x-k8s.io/v1alpha4"  # sigs.k8s.io/kind pkg/apis/config/v1alpha4
# Feature gates the DRA checks need on a 1.36 cluster (taints and rules are beta, off by default).
DRA_GATES = {"DRADeviceTaints": True, "DRADeviceTaintRules": True}
DRA_RUNTIME_CONFIG = {"resource.k8s.io/v1beta2": "true"}  # DeviceTaintRules are served there


def _values(spec: SubjectSpec) -> dict[str, str]:
    """Placeholders as a DaemonSet's pod sees them."""
    driver = spec.driver or spec.resource
    return {"plugin_dir": DEVICE_PLUGIN_DIR, "kubelet_socket": f"{DEVICE_PLUGIN_DIR}/kubelet.sock",
            "resource": spec.resource, "registry_dir": REGISTRY_DIR, "plugins_dir": PLUGINS_DIR, "cdi_dir": CDI_DIR,
            "node_name": "$(NODE_NAME)", "kubeconfig": "", "driver": driver, "defect": "",
            "free_port": str(POD_PORT)}


def render_args(spec: SubjectSpec, args: list[str]) -> list[str]:
    """The image's arguments, rendered for a pod on a kind node; a ProfileError for what has no meaning there."""
    values = _values(spec)
    for arg in args:
        for name in template_fields(arg, spec.source):
            if name not in values:
                raise ProfileError(f"{spec.source}: {{{name}}} in {arg!r} names this machine's sandbox or fake "
                                   f"hardware, which a pod on a kind node cannot see; a kind run offers "
                                   f"{', '.join('{' + k + '}' for k in sorted(values))}")
    return [render(a, values, spec.source) for a in args]


def _host_path(name: str, path: str, kind: str = "DirectoryOrCreate") -> tuple[dict, dict]:
    return ({"name": name, "hostPath": {"path": path, "type": kind}}, {"name": name, "mountPath": path})


def daemonset(spec: SubjectSpec, image: str, name: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The objects that deploy `spec` from `image`, in order: for a DRA driver its RBAC first."""
    if not image:
        raise ProfileError(f"subject {spec.name}: a kind run deploys an image; give --image")
    mounts = [("device-plugins", DEVICE_PLUGIN_DIR)]
    if spec.is_dra:
        mounts = [("plugins-registry", REGISTRY_DIR), ("plugins", PLUGINS_DIR), ("cdi", CDI_DIR), *mounts]
    volumes, volume_mounts = (list(x) for x in zip(*(_host_path(n, p) for n, p in mounts), strict=True))
    # The subject's own mounts: on a kind node, the node's paths (the fake hardware is not there).
    for n, (inside, host) in enumerate(sorted(spec.mounts.items())):
        volume, mount = _host_path(f"mount-{n}", render_args(spec, [host])[0], "")
        mount["mountPath"] = inside
        volumes.append(volume)
        volume_mounts.append(mount)
    env = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    env += [{"name": k, "value": render(v, _values(spec), spec.source)} for k, v in spec.env.items()]
    container: dict[str, Any] = {
        "name": "plugin", "image": image, "imagePullPolicy": "IfNotPresent", "args": render_args(spec, spec.command),
        "env": env, "volumeMounts": volume_mounts,
        "securityContext": {"privileged": spec.privileged},
    }
    labels = {APP_LABEL: name, **MANAGED_BY}
    pod_spec: dict[str, Any] = {
        "containers": [container], "volumes": volumes, "priorityClassName": "system-node-critical",
        "tolerations": [{"operator": "Exists"}],
    }
    out: list[dict[str, Any]] = []
    if spec.is_dra:
        pod_spec["serviceAccountName"] = name
        out += _dra_rbac(name, namespace)
    out.append({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"selector": {"matchLabels": {APP_LABEL: name}},
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    })
    return out


def _dra_rbac(name: str, namespace: str) -> list[dict[str, Any]]:
    """What a DRA kubelet plugin needs of the API: its ResourceSlices, the claims it prepares, its Node."""
    rules = [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    ]
    meta = {"name": name, "labels": dict(MANAGED_BY)}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]


def cluster_config(pod_resources_host_dir: str) -> dict[str, Any]:
    """One node; its PodResources directory bound out to this machine, so fakelet reads it as it reads
    LocalNode's; the DRA gates the taint checks need."""
    return {
        "kind": "Cluster", "apiVersion": KIND_API_VERSION,
        "featureGates": dict(DRA_GATES), "runtimeConfig": dict(DRA_RUNTIME_CONFIG),
        "nodes": [{"role": "control-plane",
                   "extraMounts": [{"hostPath": pod_resources_host_dir, "containerPath": POD_RESOURCES_DIR}]}],
    }
