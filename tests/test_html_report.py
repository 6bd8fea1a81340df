"""The HTML report: one self-contained page, a verdict table, and a timeline plot per check."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from reports.html import parse_events, reaction_time, render, write_html
from reports.model import CheckResult, SubjectReport

RESOURCE = "example.com/gpu"


def ev(t: float, kind: str, source: str = "kubelet", **data: Any) -> dict[str, Any]:
    return {"t_ns": 1_000_000_000 + int(t * 1e9), "kind": kind, "source": source, "data": data, "t_s": t}


def listed(t: float, endpoint: int, **health: str) -> dict[str, Any]:
    devices = [{"ID": dev.replace("_", "-"), "health": h} for dev, h in health.items()]
    return ev(t, "grpc.stream_msg", side="client", method="ListAndWatch", endpoint_id=endpoint, resource=RESOURCE,
              message={"devices": devices})


def counts(t: float, capacity: int, allocatable: int) -> dict[str, Any]:
    return ev(t, "kubelet.devices", instance=1, resource=RESOURCE, why="list", capacity=capacity,
              allocatable=allocatable)


def registered(t: float, endpoint: int, accepted: bool = True) -> dict[str, Any]:
    return ev(t, "kubelet.register", accepted=accepted, endpoint_id=endpoint, instance=1, resource=RESOURCE)


def device_op(t: float, op: str, device: str, health: str, temperature_c: float, present: bool = True) -> dict:
    return ev(t, f"device.{op}", "devices", device=device, health=health, temperature_c=temperature_c,
              present=present, ecc_errors=0)


# A plugin restart at 1.0s; the restarted plugin registers at 1.5s: reaction 0.5s.
PLUGIN_RESTART = [
    ev(0.01, "kubelet.start", instance=1),
    ev(0.02, "process.start", "plugin", pid=10, start=1),
    registered(0.30, 1),
    listed(0.30, 1, gpu_0="Healthy", gpu_1="Healthy"),
    counts(0.31, 2, 2),
    ev(1.00, "fault.plugin_restart", "harness", subject="plugin", crash=True),
    ev(1.01, "process.exit", "plugin", pid=10, returncode=-9),
    ev(1.04, "kubelet.stream_end", instance=1, resource=RESOURCE, endpoint_id=1, reason="stream ended by plugin"),
    counts(1.05, 2, 0),
    ev(1.10, "process.start", "plugin", pid=11, start=2),
    registered(1.50, 2),
    listed(1.502, 2, gpu_0="Healthy", gpu_1="Healthy"),
    counts(1.51, 2, 2),
    ev(2.00, "kubelet.stop", instance=1),
]

# The backend fails gpu-0 (and heats it) at 0.5s; the plugin lists it Unhealthy at 0.8s: reaction 0.3s.
DEVICE_FAILURE = [
    ev(0.01, "kubelet.start", instance=1),
    ev(0.02, "process.start", "plugin", pid=20, start=1),
    registered(0.10, 0, accepted=False),
    registered(0.20, 1),
    listed(0.21, 1, gpu_0="Healthy", gpu_1="Healthy"),
    counts(0.22, 2, 2),
    device_op(0.50, "fail", "gpu-0", "Unhealthy", 91.5),
    listed(0.80, 1, gpu_0="Unhealthy", gpu_1="Healthy"),
    counts(0.81, 2, 1),
]


def check(check_id: str, verdict: str, detail: str = "") -> CheckResult:
    return CheckResult(id=check_id, level="MUST", title=f"title of {check_id}", verdict=verdict, duration_s=2.0,
                       detail=detail, repro="" if verdict == "pass" else f"fakelet run --check {check_id}")


def sample_report() -> SubjectReport:
    detail = "expected gpu-0 Unhealthy <script>alert(1)</script> & more\nsecond line of detail"
    return SubjectReport(subject="ref<dp>", profile="fast", seed=7, defect="no-reregister", fakelet_version="0.1.0",
                         api_versions={"deviceplugin": "v1beta1"},
                         checks=[check("DP-A-01", "pass"), check("DP-B-02", "fail", detail)])


def write_artifacts(out: Path, timelines: dict[str, list[dict[str, Any]]]) -> None:
    for check_id, events in timelines.items():
        (out / "artifacts" / check_id).mkdir(parents=True)
        (out / "artifacts" / check_id / "timeline.json").write_text(json.dumps(events))


def written(tmp_path: Path) -> str:
    write_artifacts(tmp_path, {"DP-A-01": PLUGIN_RESTART, "DP-B-02": DEVICE_FAILURE})
    write_html(sample_report(), tmp_path)
    return (tmp_path / "report.html").read_text()


def svgs(page: str) -> dict[str, ET.Element]:
    """Each check's plot, parsed as XML (which also proves it well formed), keyed by check ID."""
    sections = re.findall(r'<details id="check-([^"]+)".*?</details>', page, re.S)
    plots = re.findall(r'<details id="check-[^"]+".*?(<svg class="timeline".*?</svg>).*?</details>', page, re.S)
    return {cid: ET.fromstring(svg) for cid, svg in zip(sections, plots, strict=True)}


def lane(svg: ET.Element, cls: str) -> list[ET.Element]:
    return [g for g in svg.iter("g") if g.get("class") == f"lane {cls}"]


def marks(svg: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in svg.iter() if cls in (e.get("class") or "").split() and "mk" in (e.get("class") or "")]


def polyline_levels(line: ET.Element) -> tuple[list[float], list[float]]:
    points = [tuple(map(float, p.split(","))) for p in (line.get("points") or "").split()]
    xs, ys = [x for x, _ in points], [y for _, y in points]
    levels = [y for i, y in enumerate(ys) if i == 0 or y != ys[i - 1]]
    return xs, levels


def test_reaction_time_is_from_the_last_injection_to_the_next_answer() -> None:
    assert reaction_time(parse_events(PLUGIN_RESTART)) == 1.50 - 1.00
    assert abs(reaction_time(parse_events(DEVICE_FAILURE)) - 0.3) < 1e-9  # type: ignore[operator]
    two_faults = [ev(0.2, "fault.kubelet_restart", "harness"), listed(0.5, 1, gpu_0="Healthy"),
                  ev(1.0, "fault.fired", "kubelet", method="Register", action="reject"),
                  registered(1.1, 2, accepted=False), registered(1.4, 2)]
    assert abs(reaction_time(parse_events(two_faults)) - 0.4) < 1e-9  # type: ignore[operator]


def test_reaction_time_is_none_without_a_fault_or_an_answer() -> None:
    assert reaction_time(parse_events([registered(0.1, 1), listed(0.2, 1, gpu_0="Healthy")])) is None
    assert reaction_time(parse_events([registered(0.1, 1), ev(0.3, "fault.kubelet_restart", "harness")])) is None
    # The first list of a stream registered before the fault answers that registration, not the fault.
    late_list = [registered(0.1, 1), ev(0.11, "fault.kubelet_restart", "harness"), listed(0.12, 1, gpu_0="Healthy")]
    assert reaction_time(parse_events(late_list)) is None
    assert reaction_time(parse_events([*late_list, listed(0.3, 1, gpu_0="Unhealthy")])) == 0.3 - 0.11


def test_page_is_self_contained(tmp_path: Path) -> None:
    page = written(tmp_path)
    assert page.startswith("<!DOCTYPE html>")
    for external in ("http://", "https://", "src=", "<script", "<link", "url(", "@import"):
        assert external not in page.lower(), external
    assert "<style>" in page and "<svg" in page


def test_header_and_verdict_table(tmp_path: Path) -> None:
    page = written(tmp_path)
    assert "NOT CONFORMANT" in page and "1 pass, 1 fail, 0 not exercised, 0 n/a, 0 skip, 0 error of 2" in page
    assert "ref&lt;dp&gt;" in page and "ref<dp>" not in page
    for text in ("no-reregister", "fast", "deviceplugin v1beta1", "0.1.0", "<dd>7</dd>"):
        assert text in page, text
    rows = dict(re.findall(r'<tr class="row-(\w+)"><td class="id"><a href="#check-[^"]+">([^<]+)</a>', page))
    assert rows == {"pass": "DP-A-01", "fail": "DP-B-02"}
    fail_row = re.search(r'<tr class="row-fail">.*?</tr>', page, re.S)
    pass_row = re.search(r'<tr class="row-pass">.*?</tr>', page, re.S)
    assert fail_row is not None and pass_row is not None
    assert '<span class="badge v-fail">' in fail_row[0] and "<code>fakelet run --check DP-B-02</code>" in fail_row[0]
    assert "second line" not in fail_row[0]  # the table shows the first line only
    assert "0.300 s" in fail_row[0] and "0.500 s" in pass_row[0] and "<code>" not in pass_row[0]


def test_failures_are_open_with_full_detail_and_repro(tmp_path: Path) -> None:
    page = written(tmp_path)
    assert '<details id="check-DP-B-02" class="check" open>' in page
    assert '<details id="check-DP-A-01" class="check">' in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more\nsecond line of detail</pre>" in page
    assert '<pre class="repro">fakelet run --check DP-B-02</pre>' in page


def test_device_lanes_show_listed_and_backend_health(tmp_path: Path) -> None:
    plots = svgs(written(tmp_path))
    assert set(plots) == {"DP-A-01", "DP-B-02"}
    for svg in plots.values():
        assert [g.get("data-device") for g in lane(svg, "device")] == ["gpu-0", "gpu-1"]
    gpu0 = lane(plots["DP-B-02"], "device")[0]
    classes = [r.get("class") for r in gpu0.iter("rect") if (r.get("class") or "").startswith("h-")]
    assert classes == ["h-ok", "h-bad", "h-bad"]  # listed Healthy then Unhealthy; backend Unhealthy
    assert any("91.5" in (t.text or "") for t in gpu0.iter("text"))  # the temperature is labelled
    assert gpu0.find("polyline[@class='temp']") is not None
    # After the stream ended, nothing is listed until the new stream's first list.
    gpu1 = lane(plots["DP-A-01"], "device")[1]
    assert [r.get("class") for r in gpu1.iter("rect") if (r.get("class") or "").startswith("h-")] == ["h-ok"] * 2


def test_allocatable_and_capacity_step_lines(tmp_path: Path) -> None:
    svg = svgs(written(tmp_path))["DP-A-01"]
    (panel,) = lane(svg, "counts")
    alloc = panel.find("polyline[@class='alloc r0']")
    capacity = panel.find("polyline[@class='capacity r0']")
    assert alloc is not None and capacity is not None
    xs, levels = polyline_levels(alloc)
    assert xs == sorted(xs) and len(xs) == 6  # three values as steps, ended by the kubelet stop
    background = panel.find("rect[@class='lane-bg']")
    assert background is not None
    right_edge = float(background.get("x", 0)) + float(background.get("width", 0))
    assert xs[0] > float(background.get("x", 0)) and xs[-1] < right_edge - 5  # the line stops with the kubelet
    assert len(levels) == 3 and levels[0] == levels[2] and levels[1] > levels[0]  # 2, then 0 (lower), then 2
    _, capacity_levels = polyline_levels(capacity)
    assert capacity_levels == [levels[0]]
    assert "+0.310s=2, +1.050s=0, +1.510s=2" in (alloc.findtext("title") or "")


def test_markers_for_faults_registrations_and_processes(tmp_path: Path) -> None:
    plots = svgs(written(tmp_path))
    restart, failure = plots["DP-A-01"], plots["DP-B-02"]
    assert len(marks(restart, "fault")) == 1 and "fault.plugin_restart" in (marks(restart, "fault")[0].findtext("title")
                                                                             or "")
    assert len(marks(failure, "device-op")) == 1 and not marks(failure, "fault")
    assert len(marks(restart, "reg-ok")) == 2 and not marks(restart, "reg-bad")
    assert len(marks(failure, "reg-bad")) == 1
    assert len(marks(restart, "plugin-start")) == 2 and len(marks(restart, "failed")) == 1  # exit -9
    assert len(marks(restart, "kubelet-start")) == 1 and len(marks(restart, "kubelet-stop")) == 1
    reaction = next(g for g in restart.iter("g") if g.get("class") == "reaction")
    assert "reaction 0.500 s" in "".join(reaction.itertext())


def test_render_without_artifacts() -> None:
    page = render(sample_report(), None)
    assert page.count("no timeline recorded") == 2 and "<svg class=\"timeline\"" not in page
    assert page.count('<td class="num">n/a</td>') == 2


def test_write_html_with_missing_or_broken_timelines(tmp_path: Path) -> None:
    (tmp_path / "artifacts" / "DP-A-01").mkdir(parents=True)
    (tmp_path / "artifacts" / "DP-A-01" / "timeline.json").write_text("{not json")
    write_html(sample_report(), tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert page.count("no timeline recorded") == 2


def test_facts_are_one_folded_line_per_kind_after_the_checks() -> None:
    slots = "; ".join(f"cgroup v1 /fakelet/run/s-{n}: pids.max 4096" for n in range(25))
    r = SubjectReport(subject="s", profile="fast", seed=0,
                      checks=[CheckResult("DP-A-01", "MUST", "a", "pass", 0.1)],
                      facts={"cgroup": slots, "device mapping": "gpu-0->gpu-0",
                             "fake hardware read": {"health": ["h0", "h1"], "temperature": ["t0"], "other": []}})
    page = render(r, None)
    assert page.index("<h2>Checks</h2>") < page.index("<h2>Facts</h2>")
    facts = page[page.index("<h2>Facts</h2>"):]
    assert facts.count("<li><details") == 2  # the cgroup lines and the files read; the mapping is one short line
    assert ('<summary>cgroup: <span class="title">cgroup v1 /fakelet/run/s-0: pids.max 4096 (and 24 more)</span>'
            "</summary>") in facts
    assert "<li>cgroup v1 /fakelet/run/s-24: pids.max 4096</li>" in facts  # all of it, folded
    assert "fake hardware read: <span class=\"title\">health: 2 files, temperature: 1 file</span>" in facts
    assert "<li>device mapping: gpu-0-&gt;gpu-0</li>" in facts
