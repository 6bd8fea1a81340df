"""docs/reference/scenario-file.md: the scenario file format, key by key, from the loader's own tables.

The top-level, case and `real:` keys and what each means are harness/scenarios/schema.py's TOP_FIELDS,
CASE_FIELDS and REAL_FIELDS (the loader accepts exactly their names); the steps and conditions, their values,
keys and meanings are harness/scenarios/manual.py's entries, which read vocabulary.py's tables; where a step's
key goes, and any key the validator takes that manual.py does not describe yet, is read off vocabulary.py's
code by harness/scenarios/fileformat.py, with the examples. The fake kubelet's releases are
harness/kubelet/release_model.py over versions.py; the reference subjects' sockets and defaults are read off
fixtures/subjects/ and harness/reference/. Nothing here is a second copy of a table.
"""

from __future__ import annotations

from docgen.markdown import cell, code, header, table

ONLY_NOTES = ("DRA drivers only", "device plugins only")  # manual.py's notes of the kind a step is for


def _yaml(text: str) -> list[str]:
    return ["```yaml", text.rstrip("\n"), "```", ""]


def _key_section(anchor: str, name: str, doc: object) -> list[str]:
    from harness.scenarios.schema import KeyDoc

    assert isinstance(doc, KeyDoc)
    need = "**required**" if doc.required else f"optional; left out: {doc.default}"
    return [f"### `{name}` {{#{anchor}}}", "", doc.meaning[0].upper() + doc.meaning[1:] + ".", "",
            f"- takes: {doc.takes}", f"- {need}", "", *_yaml(doc.example)]


def _summary(fields: dict, anchor: str) -> list[str]:
    rows = [[f"[{code(k)}](#{anchor}{k.replace('_', '-')})", "yes" if d.required else "",
             cell(d.takes), cell(d.default)] for k, d in fields.items()]
    return table(["key", "required", "takes", "left out"], rows)


def _keys(fields: dict, anchor: str) -> list[str]:
    out = _summary(fields, anchor)
    for name, doc in fields.items():
        out += _key_section(f"{anchor}{name.replace('_', '-')}", name, doc)
    return out


def _only(name: str, what: str) -> str:
    from harness.scenarios.vocabulary import DP_ONLY, DP_ONLY_ACTIONS, DRA_ONLY

    if name in DRA_ONLY:
        return "DRA drivers only (`kind: dra`)"
    if (what == "step" and name in DP_ONLY_ACTIONS) or (what == "condition" and name in DP_ONLY):
        return "device plugins only (`kind: device-plugin`)"
    return "device plugins and DRA drivers"


def _default(key: object) -> str:
    from harness.scenarios.manual import _default as said

    return said(key)  # type: ignore[arg-type]


def _steps() -> list[str]:
    from harness.scenarios import fileformat, manual
    from harness.scenarios.vocabulary import ACTIONS

    out = ["## Steps", "",
           "`steps:` is a list; each step is a mapping with exactly one **action** key, one of "
           + ", ".join(f"[{code(a)}](#step-{a})" for a in ACTIONS) + ". The action's value is a word "
           "(`kubelet: restart`), a duration (`hold: 5s`) or a mapping of its own keys (`pod: {create: workload, "
           "devices: 2}`: *in the action's mapping*). A step's other keys are its **options** and stand *beside the "
           "action*, in the same mapping: in YAML, on the next line, indented as the action is. A key in the wrong "
           "place is an error with its line, as is an option the action does not take.", "",
           *_yaml("- expect: {allocatable: healthy}   # the action (expect) and its value (the conditions)\n"
                  "  within: 10s                      # an option of the step, beside the action\n"
                  "- pod: {create: workload, devices: 2}   # keys in the action's mapping"),
           "Every step is bounded and narrated with its time. The terms the forms use:", ""]
    out += [f"- **{k}**: {cell(v)}" for k, v in manual.TERMS.items()]
    out.append("")
    for entry in manual.steps():
        out += [f"### `{entry.name}` {{#step-{entry.name}}}", "", f"`{entry.form}`", "", entry.meaning, "",
                f"For {_only(entry.name, 'step')}.", ""]
        if entry.values:
            out += table(["value", "does"], [[code(v), cell(m)] for v, m in entry.values])
        keys = fileformat.step_keys(entry)
        if keys:
            out += table(["key", "where", "takes", "required or default", "meaning"],
                         [[code(k.name), where, cell(k.takes), cell(_default(k)), cell(k.meaning)]
                          for k, where in keys])
        notes = [n for n in entry.notes if not n.startswith(ONLY_NOTES)]  # said above, as "For ..."
        out += [f"- {cell(n)}" for n in notes] + ([""] if notes else [])
        example = fileformat.example(entry)
        if example:
            out += ["Example:", "", *_yaml(example)]
    return out


def _conditions() -> list[str]:
    from harness.scenarios import fileformat, manual
    from harness.scenarios.vocabulary import CONDITIONS

    out = ["## Conditions", "",
           "`wait` and `expect` take a mapping of conditions, each named once; every one must hold at once: "
           + ", ".join(f"[{code(c)}](#condition-{c})" for c in CONDITIONS) + ". A state (what the node shows) "
           "counts once it has kept holding for 1.5 node-status periods, unless `glimpse: true`; a count (`calls`, "
           "`dialed`, `held`) when it is reached. What each counts, from when and on which kubelets: "
           "[scenario vocabulary](scenario-vocabulary.md).", ""]
    for entry in manual.conditions():
        out += [f"### `{entry.name}` {{#condition-{entry.name}}}", "", f"`{entry.form}`", "",
                entry.meaning[0].upper() + entry.meaning[1:] + ".", "", f"For {_only(entry.name, 'condition')}.", ""]
        if entry.keys:
            out += table(["key", "takes", "required or default", "meaning"],
                         [[code(k.name), cell(k.takes), cell(_default(k)), cell(k.meaning)] for k in entry.keys])
        notes = [n for n in entry.notes if not n.startswith(ONLY_NOTES)]
        out += [f"- {cell(n)}" for n in notes] + ([""] if notes else [])
        example = fileformat.example(entry)
        if example:
            out += ["Example:", "", *_yaml(example)]
    return out


def _releases() -> list[str]:
    from harness.kubelet.release_model import BEHAVIOURS, SOURCE
    from harness.kubelet.versions import DEFAULT_KUBELET_VERSION, KUBELET_VERSIONS
    from harness.node.real.releases import REAL_KUBELET_MODULES

    names = list(KUBELET_VERSIONS)
    head = ["behaviour", "subjects", *(f"{n} (default)" if n == DEFAULT_KUBELET_VERSION else n for n in names)]
    rows = [[cell(b.title), ", ".join(b.kinds), *(cell(b.says(KUBELET_VERSIONS[n])) for n in names)]
            for b in BEHAVIOURS.values()]
    return ["## The fake kubelet's releases {#fake-releases}", "",
            "The fake kubelet is one program. A case's `kubelet_version` on the fake node (or `--kubelet-version`) "
            f"makes it stand in for that release only through the behaviours below ({SOURCE}); everything else it "
            "does is the same for every release. So an outcome on the fake 1.33 is evidence about this model of "
            "1.33, not about a real 1.33 kubelet: the narration and the report of such a run say so and list the "
            "behaviours the subject meets. The real node (`node: real`) runs a real kubelet of the release; its "
            f"cases can name {', '.join(code(r) for r in sorted(REAL_KUBELET_MODULES))} "
            "(built from `fixtures/go/`).", "", *table(head, rows)]


def _reference_subjects() -> list[str]:
    from harness.launch.sandbox import PLUGIN_DIR_NAME, PLUGINS_DIR_NAME, REGISTRY_DIR_NAME, SOCKET_PATH_MAX
    from harness.reference import dra_driver
    from harness.reference.device_plugin import KUBELET_SOCKET
    from harness.scenarios.check import inventory_ids
    from harness.spec.subjects import load_subject
    from harness.world.draenv import REFERENCE_HEALTH_REFRESH_S
    from harness.world.socket_paths import POD_UID_FLAG

    dp, dra = load_subject("reference-dp"), load_subject("reference-dra")
    driver = dra.driver or dra.resource
    reg, endpoint = dra_driver.socket_names(driver)
    uid_reg, uid_endpoint = dra_driver.socket_names(driver, "UID")

    def thermal(spec: object) -> tuple[float, float]:
        values = (getattr(spec, "backend", None) or {}).get("thermal") or {}
        return float(values.get("threshold_c", 85)), float(values.get("hysteresis_c", 5))

    def devices(spec: object) -> str:
        ids = inventory_ids(spec) or []  # type: ignore[arg-type]
        return f"{', '.join(code(i) for i in ids)} (`@0` to `@{len(ids) - 1}`)" if ids else "its inventory's"

    dp_hot, dp_hyst = thermal(dp)
    dra_hot, dra_hyst = thermal(dra)
    unhealthy = f"{driver}/{dra_driver.TAINT_UNHEALTHY}"
    temperature = f"{driver}/{dra_driver.TAINT_TEMPERATURE}"
    out = ["## The reference subjects {#reference-subjects}", "",
           "A file that names no subject runs the reference subject of its kind. What their defaults do is what a "
           "scenario meets first. Paths are under the kubelet's root (`/var/lib/kubelet` on a node, the sandbox's "
           "`kubelet/` under fakelet).", "",
           f"### `{dp.name}` {{#reference-dp}}", "",
           f"{cell(dp.description)}. Resource {code(dp.resource)}; devices {devices(dp)}.", ""]
    out += table(["socket", "where", "what"], [
        [code(KUBELET_SOCKET), f"`{PLUGIN_DIR_NAME}/`", "the kubelet's registration socket: the plugin registers "
         "on it, and registers again when a new kubelet creates it (`socket: {delete: kubelet}` deletes it)"],
        [code(dp.socket), f"`{PLUGIN_DIR_NAME}/`", "the plugin's endpoint, the name it registers (`dialed: "
         f"{{socket: {dp.socket}}}`, `socket: {{delete: plugin}}`); deleted, the plugin serves on it again"],
        ["`--socket-name NAME.sock`", f"`{PLUGIN_DIR_NAME}/`", "a rolling update's new instance: give it one in "
         "`args:`, or it removes the first instance's socket as a stale one and serves in its place"],
    ])
    out += ["- `device: {fail: DEV}`: the next ListAndWatch lists the device Unhealthy, so allocatable drops by "
            "one and capacity stays; `recover` brings it back.",
            f"- Overtemperature: Unhealthy above {dp_hot:g} °C, Healthy again below {dp_hot - dp_hyst:g} °C "
            f"(`device: {{heat: DEV, to: {dp_hot + 10:g}}}`).",
            "- `unplug`: the device leaves the list (capacity and allocatable drop); `plug` brings it back.",
            "- It watches the device-plugins directory: it registers again whenever `kubelet.sock` is created (a "
            "kubelet restart), with back-off on a failed Register, and exits cleanly on SIGTERM (`plugin: stop`).",
            ""]
    out += [f"### `{dra.name}` {{#reference-dra}}", "",
            f"{cell(dra.description)}. Driver {code(driver)}; one ResourceSlice pool named after the node; devices "
            f"{devices(dra)}.", ""]
    out += table(["socket", "where", "what"], [
        [code(reg), f"`{REGISTRY_DIR_NAME}/`", "its registration socket (kubelet plugin watcher)"],
        [code(endpoint), f"`{PLUGINS_DIR_NAME}/{driver}/`", "its endpoint: DRAPlugin v1 and v1beta1, "
         "DRAResourceHealth (`dialed: {socket: dra.sock}`)"],
        [f"{code(uid_reg)}, {code(uid_endpoint)}", "the same", f"a rolling update's new instance, given "
         f"`args: [\"{POD_UID_FLAG}\", \"UID\"]` (as upstream's kubeletplugin.RollingUpdate), so the two instances "
         f"never share a socket. Where a name with the whole UID would make a path over {SOCKET_PATH_MAX} bytes "
         f"(a real pod's 36-character UID under a sandbox), UID is the first {dra_driver.UID_DIGEST_CHARS} hex "
         "digits of the UID's SHA-256: the same name every time for the same UID"],
    ])
    out += [f"- **`device: {{fail: DEV}}` under a DRA pod evicts it.** The driver reports the device Unhealthy on "
            f"its health stream (`resources_status`, `device_health`) and taints it {code(unhealthy + ':NoExecute')} "
            "in its ResourceSlice; the device-taint eviction controller (the local control plane's "
            "kube-controller-manager) then evicts every pod on it that does not tolerate the taint, the claim is "
            "unprepared and its CDI spec removed, and no new claim is given the device. A scenario about a pod that "
            "keeps running on a failed device needs a pod that tolerates the taint, or a subject that publishes no "
            "taints; otherwise it expects the eviction (`pod: {name: NAME, phase: Deleted}`). `recover` removes the "
            "taint. See [device taints and eviction](../taints.md).",
            f"- Temperature: above {dra_hot - 10:g} °C (the threshold less 10) "
            f"{code(temperature + '=warning:NoSchedule')} keeps new claims away; above {dra_hot:g} °C "
            f"{code(temperature + '=critical:NoExecute')} evicts as a failure does, and the device is Unhealthy "
            f"until below {dra_hot - dra_hyst:g} °C.",
            f"- Its health stream resends every device's health every {REFERENCE_HEALTH_REFRESH_S:g} s or more often "
            f"under fakelet, well inside the kubelet's {dra_driver.KUBELET_HEALTH_TIMEOUT_S:g} s health timeout.",
            "- SIGTERM (`plugin: stop`, `restart`) removes both sockets and leaves its ResourceSlices; `kill` and "
            "`crash` leave the sockets, and the next start removes them as stale. A deleted socket is made again "
            "(the registration socket is served again and the kubelet registers the driver again).",
            "- Its prepared claims are in a checkpoint of its own: a restarted driver unprepares, and prepares "
            "again, with the same answer (CDI devices named after the claim).",
            "- `plug` and `unplug` republish its ResourceSlice (`slices: {devices: N}`).", ""]
    return out


def render() -> str:
    from harness.scenarios import fileformat, schema

    out = header("Scenario file", "harness/scenarios/schema.py, manual.py, vocabulary.py and fileformat.py, "
                 "harness/kubelet/release_model.py and the reference subjects",
                 "A scenario file is a reported bug as YAML: what the report says, what a correct system does, what "
                 "the bug looks like, what it runs on, the verdicts it promises, and the steps. The library's are "
                 "`fixtures/scenarios/NAME.yaml`; one of your own can be anywhere: `fakelet scenario check FILE` "
                 "reports every problem as `file:line: field: problem`, `fakelet scenario show FILE` prints it as "
                 "the library's are shown, and `fakelet scenario run --file FILE` runs it. The file's name without "
                 f"`.yaml` is the scenario's name ({code(schema.NAME.pattern)}). How to turn an issue into one: "
                 "[scenarios](../scenarios.md); what each condition counts and where: "
                 "[scenario vocabulary](scenario-vocabulary.md).")
    out += ["## A whole file", "", *_yaml(fileformat.EXAMPLE_FILE)]
    out += ["## Top-level keys", "", "Any other key is an error (`unknown field`) with its line.", ""]
    out += _keys(schema.TOP_FIELDS, "key-")
    out += ["## Case keys {#case-keys}", "",
            "Each item of `cases:` is one promise. `fakelet scenario show` numbers and names them "
            "(`[real:]SUBJECT[/DEFECT][@VERSION]`, e.g. `reference-dp/stale-socket-crash`, `real:reference-dp@1.37`) "
            "and `--case N|NAME|all` runs them; two cases may not share subject, defect, node and release.", ""]
    out += _keys(schema.CASE_FIELDS, "case-")
    out += ["## `real:` keys {#real-keys}", ""]
    out += _keys(schema.REAL_FIELDS, "real-")
    out += _steps()
    out += _conditions()
    out += _releases()
    out += _reference_subjects()
    return "\n".join(out).rstrip() + "\n"
