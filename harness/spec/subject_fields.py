"""What each subject-file field and placeholder means: the words beside subjects.py's SCHEMA.

SCHEMA says what a field may hold (types, choices, required keys); this says what it is for, its default and an
example, and what each placeholder expands to. docs/reference/subject-file.md is generated from both
(tools/docgen/subject_page.py), and tests/test_subject_fields.py fails when a field the loader accepts, a
placeholder or a cross-field rule has no words here.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.spec.subjects import DEFAULT_SKIN, DEFAULT_THERMAL


@dataclass(frozen=True)
class FieldDoc:
    meaning: str
    default: str = ""  # "" when the field is required or has no default worth naming ("none")
    example: str = ""  # YAML as it would appear in a subject file, the field's own line(s)


# The reference page's first example; tests/test_subject_fields.py checks it loads.
MINIMAL_EXAMPLE = """\
name: my-plugin
kind: device-plugin
resource: example.com/gpu
command: ["{python}", "my_plugin.py", "--plugin-dir", "{plugin_dir}", "--sysfs-root", "{sysfs_root}"]
backend: {inventory: inventories/basic.yaml, observes: [health]}
"""

NAME = "NAME"  # stands for a free key (a defect's name) in a field path, as the reference page shows it

FIELDS: dict[str, FieldDoc] = {
    "name": FieldDoc("The subject's name: it names its log files and report directory, and `--subject` takes it "
                     "for a bundled subject.", "", "name: my-plugin"),
    "kind": FieldDoc("What the subject is: a device plugin (the kubelet's Device Plugin API, `DP-` checks) or a "
                     "DRA driver (a kubelet plugin for Dynamic Resource Allocation, `DRA-` checks).", "",
                     "kind: device-plugin"),
    "reference": FieldDoc("Marks fakelet's own reference subjects, whose defects must fail exactly the checks "
                          "they list. Leave it out for your own plugin.", "false", "reference: false"),
    "description": FieldDoc("One line saying what the subject is; `fakelet subjects` and reports show it.",
                            "empty", "description: Example Corp's GPU device plugin"),
    "launcher": FieldDoc("How the plugin is started: `process`, a child process that sees the sandbox at its own "
                         "paths; `mount-namespace`, a child in a private mount namespace that sees the sandbox "
                         "at the kubelet's host paths (/var/lib/kubelet/...), for plugins that hard-code them; "
                         "`container`, the `image` run by a container engine, as a DaemonSet would.", "process",
                         "launcher: mount-namespace"),
    "driver": FieldDoc("A DRA driver's name, as it registers with the kubelet and publishes ResourceSlices. "
                       "Required for kind `dra`; not for a device plugin.", "required for kind `dra`",
                       "driver: gpu.example.com"),
    "resource": FieldDoc("The extended resource a device plugin registers. Required for kind `device-plugin`; "
                         "not for a DRA driver.", "required for kind `device-plugin`",
                         "resource: example.com/gpu"),
    "needs_api": FieldDoc("The DRA driver cannot start without an API server (it reads or writes API objects "
                          "itself). Without one the run says the subject is unavailable instead of failing it.",
                          "false", "needs_api: true"),
    "command": FieldDoc("The plugin's command line, one list item per argument; each item is a template "
                        "(see Placeholders). Required unless `launcher` is `container`, where it is what the "
                        "image's entrypoint gets.", "required unless `launcher: container`",
                        'command: ["{python}", "my_plugin.py", "--plugin-dir", "{plugin_dir}"]'),
    "image": FieldDoc("The container image to run; `launcher: container` needs it and only it takes it.",
                      "required for `launcher: container`",
                      "image: registry.example.com/vendor/plugin:1.2"),
    "privileged": FieldDoc("Run the container privileged (`launcher: container` only).", "false",
                           "privileged: true"),
    "mounts": FieldDoc("Extra bind mounts into the container (`launcher: container` only): path in the container "
                       "to host path; the host path is a template, so that the fake hardware can stand where a "
                       "DaemonSet's hostPath puts the real one.", "none",
                       'mounts: {/sys/class/drm: "{sysfs_root}/sys/class/drm"}'),
    "env": FieldDoc("Environment variables set for the plugin; each value is a template. `fakelet run --env` adds "
                    "or overrides.", "none", 'env: {LOG_LEVEL: debug, STATE: "{sandbox}/state"}'),
    "pass_env": FieldDoc("Names of variables copied from fakelet's own environment into the plugin's. Only names: "
                         "the values never land in a subject file, a run config or a report. A name not set when "
                         "the run starts is an error.", "none", "pass_env: [VENDOR_LICENSE]"),
    "socket": FieldDoc("The file name of the plugin's own gRPC socket in the device-plugin directory. Without it "
                       "fakelet learns it from the plugin's Register call (or the socket file it creates).",
                       "learned from the registration", "socket: example-gpu.sock"),
    "inventory": FieldDoc("An inventory file copied into the sandbox and given to the plugin as `{inventory}`, for "
                          "a plugin that reads its device list from a file instead of fake hardware. Relative "
                          "paths are looked up beside the subject file, then in fixtures/ (a bare name in "
                          "fixtures/inventories/).", "none", "inventory: inventories/basic.yaml"),
    "devices": FieldDoc("What the plugin should list and the device files it needs.", "none",
                        "devices: {expected_count: 4}"),
    "devices.files": FieldDoc("Empty files created in `{dev_dir}` before the plugin starts, for a plugin that "
                              "checks its device nodes exist.", "none", "  files: [gpu0, gpu1]"),
    "devices.expected_ids": FieldDoc("The exact device IDs the plugin must list; they override the IDs the "
                                     "inventory implies.", "the inventory's device IDs",
                                     "  expected_ids: [gpu-0, gpu-1]"),
    "devices.expected_count": FieldDoc("How many devices the plugin must list, when their IDs are not known.",
                                       "the inventory's device count", "  expected_count: 4"),
    "devices.ids": FieldDoc("How the plugin names devices: `inventory`, by the inventory's IDs; `opaque`, its own "
                            "way (hashes, UUIDs), so only counts are compared and devices are matched by what "
                            "Allocate returns.", "inventory", "  ids: opaque"),
    "devices.map": FieldDoc("Plugin device ID to inventory device ID, when the plugin names devices its own way "
                            "and fakelet cannot match them by what Allocate returns. Each inventory ID must exist.",
                            "matched automatically", "  map: {GPU-5f2a: gpu-0, GPU-9c1e: gpu-1}"),
    "defect_args": FieldDoc("Arguments added to the command when a run gives `--defect NAME` (templates; "
                            "`{defect}` is the name). For plugins with built-in defects, like the reference ones.",
                            "none", 'defect_args: ["--defect", "{defect}"]'),
    "defects": FieldDoc("The subject's built-in defects by name, each a mutant that must fail the checks it "
                        "lists (`fakelet run --defect NAME`).", "none",
                        "defects: {slow-health: {kills: [DP-HLT-01]}}"),
    "defects.NAME.description": FieldDoc("What the defect does wrong, one line.", "empty",
                                         '    description: "reports health changes 40 s late"'),
    "defects.NAME.kills": FieldDoc("The checks the defect must fail; a run with it that passes one of them, or "
                                   "fails another, is a harness bug.", "", "    kills: [DP-HLT-01, DP-HLT-02]"),
    "defects.NAME.checks": FieldDoc("Run only these checks for this defect (a hostile defect that would stall "
                                    "the others).", "every check of the subject's kind",
                                    "    checks: [DP-REG-01, DP-ALC-01]"),
    "defects.NAME.wall_s": FieldDoc("The most seconds a run with this defect may take.", "no bound",
                                    "    wall_s: 120"),
    "defects.NAME.findings": FieldDoc("Text each of which a subject finding of a run with this defect must "
                                      "contain.", "none", '    findings: ["never unmounts"]'),
    "build": FieldDoc("How to build the plugin's binary from Go sources before the run (cached in "
                      "~/.cache/fakelet); the command gets it as `{bin}`.", "none (no `{bin}`)",
                      "build: {module: go/my-plugin, package: example.com/my-plugin/cmd/plugin}"),
    "build.module": FieldDoc("The directory holding the go.mod to build in: absolute, beside the subject file, or "
                             "one of fakelet's own wrapper modules (fixtures/go/...).", "",
                             "  module: go/my-plugin"),
    "build.package": FieldDoc("The Go package to build, as `go build` takes it.", "",
                              "  package: example.com/my-plugin/cmd/plugin"),
    "build.binary": FieldDoc("The built binary's file name.", "the module directory's name",
                             "  binary: my-plugin"),
    "build.get": FieldDoc("A `module@version` to `go get` first, in a copy of the module (for an upstream without "
                          "a semver tag).", "none", "  get: github.com/squat/generic-device-plugin@latest"),
    "build.cgo": FieldDoc("Build with cgo (CGO_ENABLED=1), for a plugin that links a C library such as NVML.",
                          "false", "  cgo: true"),
    "private_dirs": FieldDoc("Absolute directories made private and empty in the plugin's mount namespace, "
                             "so that what it writes there stays out of the host. Needs launcher "
                             "`mount-namespace` or `container`.", "none", "private_dirs: [/tmp]"),
    "backend": FieldDoc("The fake device hardware wired to the plugin: an inventory materialized under the sandbox "
                        "as sysfs files, device nodes and, per skin, vendor libraries; checks change it (health, "
                        "temperature, hotplug) and watch the plugin react.", "none (a `--plugin-cmd` gets "
                        "the default inventory)", "backend: {inventory: inventories/basic.yaml, skin: drm}"),
    "backend.inventory": FieldDoc("The inventory file the hardware starts from; looked up like `inventory`.", "",
                                  "  inventory: inventories/basic.yaml"),
    "backend.skin": FieldDoc("Which vendor surfaces the fake hardware shows: `neutral` (plain sysfs), `drm` (Intel "
                             "GPU sysfs and the Level-Zero sidecar), `nvml` (a fake libnvidia-ml), or both.",
                             DEFAULT_SKIN, "  skin: nvml"),
    "backend.observes": FieldDoc("Which hardware changes the plugin can see, so which checks hold it to reacting: "
                                 "`health`, `temperature`, `hotplug`. A change it does not observe is not held "
                                 "against it.", "none", "  observes: [health, hotplug]"),
    "backend.thermal": FieldDoc("The plugin's own overtemperature limit, which temperature checks heat a device "
                                "past.", f"{DEFAULT_THERMAL[0]:g} °C, hysteresis {DEFAULT_THERMAL[1]:g} °C",
                                "  thermal: {threshold_c: 90, hysteresis_c: 3}"),
    "backend.thermal.threshold_c": FieldDoc("Degrees C at which the plugin marks a device unhealthy.",
                                            f"{DEFAULT_THERMAL[0]:g}", "    threshold_c: 90"),
    "backend.thermal.hysteresis_c": FieldDoc("Degrees C below the threshold a device must cool to before the "
                                             "plugin marks it healthy again.", f"{DEFAULT_THERMAL[1]:g}",
                                             "    hysteresis_c: 3"),
    "backend.poll_s": FieldDoc("How often the plugin polls its health source, in seconds; coverage waits twice "
                               "that (capped by the reaction bound) for its first read instead of the whole bound.",
                               "unknown (the whole bound)", "  poll_s: 5"),
    "observes": FieldDoc("Older spelling of `backend.observes`; give one or the other, and only with a `backend`.",
                         "none", "observes: [health]"),
    "rolling_update": FieldDoc("How the DRA driver runs as one of two instances during a DaemonSet rolling update "
                               "with surge: arguments and env added to each instance's, with `{pod_uid}` its own "
                               "pod UID (upstream kubeletplugin.RollingUpdate). Without it the driver runs as one "
                               "instance only.", "none", 'rolling_update: {args: ["--pod-uid", "{pod_uid}"]}'),
    "rolling_update.args": FieldDoc("Arguments added to the command of each instance (templates).", "none",
                                    '  args: ["--pod-uid", "{pod_uid}"]'),
    "rolling_update.env": FieldDoc("Variables added to the env of each instance (values are templates).", "none",
                                   '  env: {POD_UID: "{pod_uid}"}'),
    "device_plugin_beside": FieldDoc("How the DRA driver is told which devices a device plugin for the same "
                                     "hardware serves beside it, so it leaves them alone (DRA-EXT-02): arguments "
                                     "and env with `{dp_devices}` or `{dp_uuids}`. Without it DRA-EXT-02 does not "
                                     "apply.", "none",
                                     'device_plugin_beside: {args: ["--exclude", "{dp_devices}"]}'),
    "device_plugin_beside.args": FieldDoc("Arguments added to the driver's command (templates).", "none",
                                          '  args: ["--exclude", "{dp_devices}"]'),
    "device_plugin_beside.env": FieldDoc("Variables added to the driver's env (values are templates).", "none",
                                         '  env: {EXCLUDE_UUIDS: "{dp_uuids}"}'),
    "requires": FieldDoc("What the subject needs installed beside fakelet.", "none",
                         "requires: {python: {distribution: kubernetes-pydra==0.1.0, import: pydra}}"),
    "requires.python": FieldDoc("A Python distribution the subject imports; without it the run says the subject "
                                "is unavailable and how to install it.", "none",
                                "  python: {distribution: kubernetes-pydra==0.1.0, import: pydra}"),
    "requires.python.distribution": FieldDoc("What `pip install` takes.", "",
                                             "    distribution: kubernetes-pydra==0.1.0"),
    "requires.python.import": FieldDoc("The module whose presence shows the distribution is installed.", "",
                                       "    import: pydra"),
    "notes": FieldDoc("Free text for people (build cost, quirks); fakelet does not read it.", "empty",
                      "notes: Cold build ~1 min on 2 cores."),
}

# What each placeholder expands to when the subject starts (harness/world/env.py `_placeholders`,
# harness/world/draenv.py `_more_placeholders`, harness/world/dp_beside.py).
PLACEHOLDER_DOCS: dict[str, str] = {
    "python": "fakelet's own Python interpreter (sys.executable); not in a container.",
    "plugin_dir": "the kubelet's device-plugin directory, where the plugin puts its socket: the sandbox's, or "
                  "/var/lib/kubelet/device-plugins with launcher mount-namespace or container.",
    "kubelet_socket": "the kubelet's registration socket, kubelet.sock in that directory.",
    "dev_dir": "the directory of device nodes: the fake hardware's dev/ with a backend, else the sandbox's.",
    "sandbox": "the run's sandbox directory (the plugin may keep state under it).",
    "resource": "the resource name (for a DRA driver, its driver name).",
    "free_port": "a TCP port on 127.0.0.1 free when the subject starts (for a metrics or health endpoint).",
    "defect": "the --defect name of the run; empty without one.",
    "bin": "the binary `build` produced, or `--binary`; not in a container (the image's entrypoint is the plugin).",
    "inventory": "the inventory file in the sandbox: the subject's `inventory`, or the backend's starting one.",
    "sysfs_root": "the root of the fake hardware's sysfs tree (needs a backend).",
    "levelzero_socket": "the Level-Zero sidecar's socket (the drm skins only).",
    "cdi_dir": "where the node's runtime reads CDI specs (/var/run/cdi in a namespace or container).",
    "registry_dir": "the kubelet's plugin-registration directory (plugins_registry).",
    "plugins_dir": "the kubelet's plugins directory, where a DRA driver puts its sockets.",
    "kubeconfig": "a kubeconfig for the run's API server; empty when there is none.",
    "node_name": "the node's name, which the driver publishes ResourceSlices for.",
    "state_dir": "a directory for the driver's checkpoint and state, kept across its restarts.",
    "driver": "the driver's name.",
    "health_refresh_s": "a health-refresh interval in seconds, for a driver that takes one: a third of the "
                        "profile's DRA health timeout, at most 1 s (REFERENCE_HEALTH_REFRESH_S, "
                        "harness/world/draenv.py).",
    "pod_uid": "in `rolling_update` only: the instance's own pod UID, as a DaemonSet's downward API gives it.",
    "dp_devices": "in `device_plugin_beside` only: the devices the device plugin serves, by the fake backend's "
                  "device IDs, comma-separated.",
    "dp_uuids": "in `device_plugin_beside` only: the same devices by UUID, comma-separated.",
}

# The cross-field rules of subjects.py `_check_rules`, in words, one per message it gives (in its order).
RULES: tuple[str, ...] = (
    "A DRA subject (`kind: dra`) names its `driver`.",
    "A DRA subject gives no `resource`: its driver name is the resource.",
    "A device plugin (`kind: device-plugin`) names its `resource`.",
    "A device plugin gives no `driver`.",
    "`private_dirs` needs `launcher: mount-namespace` or `container` (a plain process has no mount namespace of "
    "its own).",
    "`launcher: container` needs an `image`.",
    "`image`, `privileged` and `mounts` are only for `launcher: container`.",
    "Any other launcher needs a `command`.",
    "With any other launcher, the `command` is not empty.",
    "`observes` and `backend.observes` are not both given.",
    "`observes` needs a `backend`: the fake hardware whose changes the plugin observes.",
    "`rolling_update` is only for a DRA driver.",
    "`rolling_update`'s args or env use `{pod_uid}`, so that each instance gets its own pod UID.",
    "A defect's name has no `+`: `+` joins defects (`--defect a+b` runs a mutant with both bugs).",
    "`device_plugin_beside` is only for a DRA driver.",
    "`device_plugin_beside`'s args or env use `{dp_devices}` or `{dp_uuids}`: that is how the driver is told.",
)
