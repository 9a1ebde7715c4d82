"""Issue 26 without SSH: the plan's metrics and health steps, the webhook and its redaction, bad input, the
Grafana dashboard against Grafana's dashboard schema and the metrics the exporters produce, the textfile
collector's output under the nvidia-smi shim (linted by the real promtool), the health watch's findings and
alerts under the shims with its clock injected, the file_sd list and its ports, doctor's Xid rules."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from gpuprov.errors import UserInputError
from gpuprov.hosts import metrics as m
from gpuprov.hosts.doctor_facts import DoctorFacts, Unit
from gpuprov.hosts.health import health_checks
from gpuprov.plan.inventory import Target
from gpuprov.plan.monitoring import Monitoring, exporter_for, facts, redacted, webhook_target, xid_table
from gpuprov.plan.plan import NodeRequest, make_host_plan, make_plan
from gpuprov.plan.stack import StackPins
from gpuprov.resources import data_file
from tests import forkcli
from tests.prometheus import promtool_check

ROOT = Path(__file__).resolve().parents[1]
SHIMS = ROOT / "tests" / "shims"
SECRET = "https://hooks.slack.com/services/T000/B000/s3cr3t-t0ken"


def gpuprov(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "200", **(env or {})})


# --- the plan ------------------------------------------------------------------------------------


def test_metrics_pick_dcgm_where_nvidia_packages_it_and_the_textfile_collector_elsewhere():
    assert exporter_for(Monitoring(metrics="auto"), "ubuntu-24.04") == "dcgm"
    assert exporter_for(Monitoring(metrics="auto"), "debian-13") == "textfile"
    assert exporter_for(Monitoring(metrics="textfile"), "ubuntu-22.04") == "textfile"
    assert exporter_for(Monitoring(), "ubuntu-22.04") is None
    with pytest.raises(UserInputError) as refused:
        exporter_for(Monitoring(metrics="dcgm"), "debian-13")
    assert refused.value.field == "--metrics" and "--metrics textfile" in str(refused.value.hint)


def test_the_plan_puts_metrics_and_the_watch_after_the_driver_and_health_comes_with_metrics():
    plan = make_plan(NodeRequest(gpu="H100:8", monitoring=Monitoring(metrics="auto")))
    names = [s.name for s in plan.steps]
    assert names.index("persistence") < names.index("metrics") < names.index("health") < names.index("python-env")
    health = next(s for s in plan.steps if s.name == "health")
    assert "expect 8" in health.summary and "logs it" in health.summary
    assert plan.summary()["monitoring"] == {"metrics": "auto", "exporter": "dcgm", "health": True, "watch_process": None,
                                            "on_alert": False, "alert_webhook": None}
    off = make_plan(NodeRequest(gpu="H100:8"))
    assert not {"metrics", "health"} & {s.name for s in off.steps}
    alone = make_plan(NodeRequest(gpu="T4", monitoring=Monitoring(watch_process="torchrun")))
    assert [s.name for s in alone.steps if s.kind == "monitor"] == ["health"]  # an alert option alone: the watch only
    assert "process 'torchrun' exiting" in alone.steps[[s.name for s in alone.steps].index("health")].summary


def test_a_playbook_says_metrics_true_and_an_existing_host_learns_its_gpu_count(tmp_path):
    book = tmp_path / "watched.yml"
    book.write_text("name: watched\nmetrics: true\nenv: null\n")
    plan = make_plan(NodeRequest(gpu="L4", os="ubuntu-22.04", playbook=str(book)))
    assert plan.summary()["monitoring"]["exporter"] == "dcgm"
    host = make_host_plan("A100", str(book), "ubuntu-22.04", StackPins())
    watch = next(s for s in host.steps if s.name == "health")
    assert dict(watch.extra)["expected_gpus"] == 0  # learnt on the node: the host's own count, not 1
    counted = make_host_plan("A100:4", str(book), "ubuntu-22.04", StackPins())
    assert dict(next(s for s in counted.steps if s.name == "health").extra)["expected_gpus"] == 4


@pytest.mark.parametrize(("url", "kind", "post_to", "topic"), [
    (SECRET, "slack", SECRET, None),
    ("ntfy+https://ntfy.sh/gpu-alerts", "ntfy", "https://ntfy.sh/", "gpu-alerts"),
    ("ntfy+http://10.0.0.5:8080/ops_1", "ntfy", "http://10.0.0.5:8080/", "ops_1"),
])
def test_a_webhook_is_slack_json_to_its_url_or_ntfy_json_to_the_servers_root(url, kind, post_to, topic):
    assert webhook_target(url) == (kind, post_to, topic)


@pytest.mark.parametrize("url", ["ftp://x/y", "hooks.slack.com/services/x", "https://", "https://a b/c",
                                 "https://x/'; rm -rf /", "ntfy+https://ntfy.sh/", "ntfy+https://ntfy.sh/a/b"])
def test_a_bad_webhook_is_refused_naming_the_flag(url):
    with pytest.raises(UserInputError) as refused:
        webhook_target(url)
    assert refused.value.field == "--alert-webhook"


def test_the_webhooks_secret_path_is_in_no_plan_output_or_record():
    plan = make_plan(NodeRequest(gpu="T4", monitoring=Monitoring(metrics="auto", alert_webhook=SECRET)))
    shown = json.dumps(plan.summary()) + " ".join(s.summary for s in plan.steps)
    assert "s3cr3t" not in shown and redacted(SECRET) == "https://hooks.slack.com/…"
    assert "https://hooks.slack.com/…" in shown
    cli = gpuprov("plan", "--gpu", "T4", "--metrics", "--alert-webhook", SECRET, "--json")
    assert cli.returncode == 0, cli.stderr
    assert "s3cr3t" not in cli.stdout + cli.stderr
    # the node needs it: only the health step carries it, base64, into a root-only file
    (health,) = [s for s in plan.bundle().scripts if s.name == "health"]
    assert "s3cr3t" not in health.text and "alert-webhook\" 600" in health.text


@pytest.mark.parametrize(("args", "field"), [
    (["--metrics", "prometheus"], "--metrics"),
    (["--alert-webhook", "ftp://x"], "--alert-webhook"),
    (["--watch-process", "a\nb"], "--watch-process"),
    (["--no-health", "--on-alert", "echo hi"], "--on-alert"),
    (["--on-alert", "  "], "--on-alert"),
])
def test_bad_monitoring_input_is_one_error_line_and_exit_2(args, field):
    result = gpuprov("plan", "--gpu", "T4", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {field}: ") and "Traceback" not in result.stderr


# --- the dashboard ------------------------------------------------------------------------------
# The fields the dashboard uses, as Grafana's dashboard schema defines them (grafana/grafana
# kinds/dashboard/dashboard_kind.cue @ 00139e84, schema 0.0: #Panel, #RowPanel, #GridPos, #VariableModel,
# #FieldConfigSource, #ThresholdsConfig, #FieldColor, #DataSourceRef). extra="forbid": a field the schema does not
# have is a typo Grafana would drop.


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GridPos(_Strict):
    h: int = Field(gt=0)
    w: int = Field(gt=0, le=24)
    x: int = Field(ge=0, lt=24)
    y: int = Field(ge=0)


class DataSourceRef(_Strict):
    type: str | None = None
    uid: str | None = None


class Threshold(_Strict):
    value: float | None
    color: str


class ThresholdsConfig(_Strict):
    mode: Literal["absolute", "percentage"]
    steps: list[Threshold]


class FieldColor(_Strict):
    mode: Literal["thresholds", "palette-classic", "palette-saturated", "continuous-GrYlRd", "fixed"]


class FieldConfig(_Strict):
    unit: str | None = None
    min: float | None = None
    max: float | None = None
    thresholds: ThresholdsConfig | None = None
    color: FieldColor | None = None
    custom: dict[str, object] | None = None


class FieldConfigSource(_Strict):
    defaults: FieldConfig
    overrides: list[dict[str, object]]


class Target_(BaseModel):  # #Target is open ({...}); Prometheus' query fields
    datasource: DataSourceRef
    expr: str
    legendFormat: str
    refId: str
    instant: bool = False
    format: str = "time_series"


class Panel(_Strict):
    id: int = Field(ge=0)
    type: str = Field(min_length=1)
    title: str
    description: str = ""
    datasource: DataSourceRef
    gridPos: GridPos
    targets: list[Target_]
    transformations: list[dict[str, object]]
    options: dict[str, object]
    fieldConfig: FieldConfigSource


class RowPanel(_Strict):
    id: int = Field(ge=0)
    type: Literal["row"]
    title: str
    collapsed: bool
    gridPos: GridPos
    panels: list[Panel]


class Variable(BaseModel):  # #VariableModel is open ("..."): its own fields checked, the plugin's allowed
    type: Literal["query", "adhoc", "constant", "datasource", "interval", "textbox", "custom", "system"]
    name: str
    hide: Literal[0, 1, 2]
    query: str | dict[str, object] | None = None
    datasource: DataSourceRef | None = None


class Dashboard(_Strict):
    title: str
    uid: str = Field(min_length=8, max_length=40)
    description: str
    tags: list[str]
    editable: bool
    graphTooltip: Literal[0, 1, 2]
    time: dict[str, str]
    timepicker: dict[str, object]
    timezone: str
    fiscalYearStartMonth: int = Field(ge=0, lt=12)
    weekStart: str
    refresh: str
    schemaVersion: int
    version: int
    links: list[dict[str, object]]
    annotations: dict[str, list[dict[str, object]]]
    templating: dict[str, list[Variable]]
    panels: list[RowPanel | Panel]
    # import-time fields Grafana's exports carry beside the model
    inputs: list[object] = Field(default_factory=list, alias="__inputs")
    requires: list[dict[str, str]] = Field(default_factory=list, alias="__requires")


def _dashboard() -> dict[str, object]:
    result = gpuprov("metrics", "dashboard")
    assert result.returncode == 0, result.stderr
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_the_dashboard_fits_grafanas_dashboard_schema_and_its_variables_resolve():
    data = _dashboard()
    board = Dashboard.model_validate(data)
    assert board.schemaVersion >= 36  # the schema's own default; older models are migrated forward on import
    variables = {v.name for v in board.templating["list"]}
    assert variables == {"datasource", "cluster", "node", "gpu"}
    text = json.dumps(data)
    used = set(re.findall(r"\$\{?(\w+)\}?", text)) - {"__all"}
    assert used <= variables, used - variables
    panels = [p for p in board.panels if isinstance(p, Panel)]
    assert len({p.id for p in board.panels}) == len(board.panels)
    for panel in panels:  # no two panels on one cell of the grid
        for other in panels:
            if other.id < panel.id:
                a, b = panel.gridPos, other.gridPos
                assert a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y, (panel.title, other.title)
    titles = " ".join(p.title.lower() for p in panels)
    for what in ("utilisation", "memory", "temperature", "power", "xid", "ecc", "cluster"):
        assert what in titles, what


def test_the_dashboard_reads_only_metrics_both_exporters_produce():
    data = _dashboard()
    exprs = [t["expr"] for p in data["panels"] for t in p.get("targets", [])]  # type: ignore[attr-defined]
    exprs += [v["query"] for v in data["templating"]["list"] if v["type"] == "query"]  # type: ignore[index]
    names = {n for e in exprs for n in re.findall(r"\b(DCGM_[A-Z0-9_]+|gpuprov_[a-z0-9_]+)\b", e)}
    produced = set(facts().exported("textfile")) & set(facts().exported("dcgm"))
    assert names and names <= produced, names - produced
    # the DCGM ones are also fields gpuprov's counters CSV gives dcgm-exporter (the metrics step writes it from
    # the same table), and the labels the panels group by are the exporters' or the file_sd list's
    labels = {n for e in exprs for n in re.findall(r"(\w+)=~", e)} | {
        n for e in exprs for n in re.findall(r"by \((\w+)\)", e)}
    assert labels <= {"cluster", "node", "gpu"}, labels


# --- the textfile collector ---------------------------------------------------------------------


def _collector(tmp_path: Path, **env: str) -> tuple[str, Path]:
    """Render the textfile plan, run its collector under the shims; the .prom text and the sysroot."""
    plan = make_plan(NodeRequest(gpu="H100:8", os="ubuntu-22.04", monitoring=Monitoring(metrics="textfile")))
    (step,) = [s for s in plan.bundle().scripts if s.name == "metrics"]
    script = re.search(r"gpu-metrics\" 755 <<'GPUPROV_EOF'\n(.*?)\nGPUPROV_EOF\n", step.text, re.S)
    assert script
    path = tmp_path / "gpu-metrics"
    path.write_text(script.group(1) + "\n")
    sysroot, state, run = tmp_path / "root", tmp_path / "shim-state", tmp_path / "shim-run"
    for d in (sysroot, state, run):
        d.mkdir(exist_ok=True)
    (state / "installed").write_text("nvidia-open 580.95.05-1\n")
    shim_env = {"PATH": f"{SHIMS / 'bin'}:/usr/bin:/bin", "GPUPROV_SYSROOT": str(sysroot), "GPUPROV_SHIM_STATE": str(state),
                "GPUPROV_SHIM_RUN": str(run), "GPUPROV_SHIM_GPU": "H100", "GPUPROV_SHIM_GPU_COUNT": "2", **env}
    done = subprocess.run(["bash", str(path)], env=shim_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    prom = sysroot / "var/lib/prometheus/node-exporter/gpuprov-gpu.prom"
    assert oct(prom.stat().st_mode & 0o777) == "0o644"  # the node exporter's `prometheus` user reads it
    return prom.read_text(), sysroot


def _samples(text: str, name: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(rf"^{name}\{{gpu=\"(\d+)\".*\}} (\S+)$", text, re.M)}


@pytest.mark.heavy  # promtool (the prometheus package)
def test_the_collector_writes_dcgms_names_per_gpu_in_a_format_promtool_parses(tmp_path):
    text, _ = _collector(tmp_path, GPUPROV_SHIM_UTIL="37,81", GPUPROV_SHIM_TEMP="61,64", GPUPROV_SHIM_MEM_USED="1000,2000")
    assert _samples(text, "DCGM_FI_DEV_GPU_UTIL") == {"0": "37", "1": "81"}
    assert _samples(text, "DCGM_FI_DEV_GPU_TEMP") == {"0": "61", "1": "64"}
    assert _samples(text, "DCGM_FI_DEV_FB_USED") == {"0": "1000", "1": "2000"}
    assert _samples(text, "DCGM_FI_DEV_FB_TOTAL") == {"0": "81559", "1": "81559"}
    assert "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter" in text
    assert re.search(r'^DCGM_FI_DEV_GPU_UTIL\{gpu="0",UUID="GPU-[0-9a-f-]+",pci_bus_id="00000000:53:00.0",'
                     r'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="[^"]+"\} 37$', text, re.M)
    assert re.search(r"^gpuprov_gpu_metrics_up\{.*\} 1$", text, re.M)
    lint = promtool_check(text)
    assert lint.returncode in (0, 3) and "parsing error" not in lint.stderr + lint.stdout, lint.stdout + lint.stderr
    # promtool's style lints are dcgm-exporter's own choices (its label names, counters without _total)
    for line in (lint.stdout + lint.stderr).splitlines():
        assert ("camelCase" in line or 'should have "_total" suffix' in line), line
    names = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    assert names <= set(facts().exported("textfile")), names - set(facts().exported("textfile"))


def test_the_collector_counts_xids_from_the_kernel_log_and_keeps_answering_gpus_when_one_is_lost(tmp_path):
    run = tmp_path / "shim-run"
    run.mkdir()
    (run / "kmsg").write_text("2026-12-01T21:30:00+0000 gp kernel: NVRM: Xid (PCI:0000:64:00): 79, pid='<unknown>', "
                              "name=<unknown>, GPU has fallen off the bus.\n")
    text, _ = _collector(tmp_path, GPUPROV_SHIM_UTIL="5,6", GPUPROV_SHIM_GPU_LOST="1")
    assert _samples(text, "DCGM_FI_DEV_GPU_UTIL") == {"0": "5"}  # GPU 1 no longer answers
    assert re.search(r"^gpuprov_gpu_metrics_up\{.*\} 0$", text, re.M)  # nvidia-smi exited 15
    text, _ = _collector(tmp_path, GPUPROV_SHIM_UTIL="5,6")
    assert _samples(text, "DCGM_FI_DEV_XID_ERRORS") == {"0": "0", "1": "79"}
    assert re.search(r'^gpuprov_xid_errors_total\{gpu="1",.*,xid="79"\} 1$', text, re.M)
    with (run / "kmsg").open("a") as log:
        log.write("2026-12-01T21:31:00+0000 gp kernel: NVRM: Xid (PCI:0000:64:00): 13, pid=77, Graphics Exception\n")
    text, _ = _collector(tmp_path)
    assert _samples(text, "DCGM_FI_DEV_XID_ERRORS")["1"] == "13"  # the last one, as DCGM reports it
    assert re.search(r'^gpuprov_xid_errors_total\{gpu="1",.*,xid="79"\} 1$', text, re.M)  # not counted twice


# --- the file_sd list ---------------------------------------------------------------------------


def test_ports_are_kept_per_machine_and_exporter_and_the_list_is_prometheus_file_sd(gp_home):
    a = m.Machine("train", Target(host="10.0.0.1"), ("node", "dcgm"), {"cluster": "", "instance_type": "p5.48xlarge",
                                                                      "gpu_model": "H100", "owner": "me@box/1"})
    b = m.Machine("tm:0", Target(host="10.0.0.2"), None, {"cluster": "tm"})
    ports = m.assign_ports([a, b], 19300)
    assert ports == {("train", "node"): 19300, ("train", "dcgm"): 19301, ("tm:0", "node"): 19302}
    assert m.assign_ports([b], 19300) == {("tm:0", "node"): 19302}  # the same machine keeps its port
    ports = m.assign_ports([a, b], 19300, learned={"tm:0": ("node", "dcgm")})
    assert ports[("tm:0", "dcgm")] == 19303
    groups = m.file_sd([a, b], ports)
    assert groups[0] == {"targets": ["127.0.0.1:19300"], "labels": {
        "node": "train", "instance_type": "p5.48xlarge", "gpu_model": "H100", "owner": "me@box/1", "exporter": "node"}}
    assert [g["labels"]["exporter"] for g in groups] == ["node", "dcgm", "node", "dcgm"]  # type: ignore[index]
    assert groups[2]["labels"] == {"node": "tm:0", "cluster": "tm", "exporter": "node"}
    path = gp_home / "sd" / "gpuprov.json"
    path.parent.mkdir(parents=True)
    m.write_file_sd(path, groups)
    assert json.loads(path.read_text()) == groups and oct(path.stat().st_mode & 0o777) == "0o644"


# --- doctor's Xid rules, from the one table -------------------------------------------------------


def test_doctor_names_each_xid_with_nvidias_meaning_and_the_watchs_findings():
    f = DoctorFacts(xid_lines=[
        "2026-12-01T21:30:00+0000 h kernel: NVRM: Xid (PCI:0000:64:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
        "2026-12-01T21:30:01+0000 h kernel: NVRM: Xid (PCI:0000:53:00): 13, pid=1896, Graphics SM Warp Exception",
        "2026-12-01T21:30:02+0000 h kernel: NVRM: Xid (PCI:0000:53:00): 13, pid=1896, Graphics SM Warp Exception",
    ], health=[json.dumps({"kind": "gpus-missing", "key": "gpus-missing-7", "message": "7 of 8 GPUs answer nvidia-smi",
                           "time": "2026-12-01T21:31:00Z", "text": "ignored"}), "{cut sho"],
        units={"gpuprov-health": Unit(active="active", enabled="enabled")})
    checks = {c.name: c for c in health_checks(f, "train")}
    table = xid_table()
    assert checks["xid 79"].severity == "fail" and "GPU has fallen off the bus" in checks["xid 79"].detail
    assert checks["xid 79"].fix == table.actions[table.xids[79].action]
    assert checks["xid 13"].severity == "warn" and "2×" in checks["xid 13"].detail
    assert checks["health: gpus-missing"].detail == "2026-12-01T21:31:00Z: 7 of 8 GPUs answer nvidia-smi"
    assert "gpuprov exec train" in str(checks["health: gpus-missing"].fix)
    assert checks["health watch"].ok
    stopped = DoctorFacts(units={"gpuprov-health": Unit(active="failed", enabled="enabled")})
    assert not {c.name: c for c in health_checks(stopped, "h")}["health watch"].ok


def test_the_watch_on_the_node_carries_the_same_table():
    plan = make_plan(NodeRequest(gpu="T4", monitoring=Monitoring(metrics="auto")))
    (step,) = [s for s in plan.bundle().scripts if s.name == "health"]
    table = xid_table()
    for code, xid in table.xids.items():
        # rendered through `q`: the meaning and its action, quoted for bash
        assert f"    {code}) printf '%s' " in step.text and xid.meaning.split("'")[0] in step.text, code
    assert all(words.split("'")[0] in step.text for words in table.actions.values())
    assert data_file("xid.yaml").is_file()


# --- the health watch under the shims, its clock injected -----------------------------------------


class Watch:
    """The rendered health watch, run one pass at a time (`--once`) under the shims with GPUPROV_NOW."""

    def __init__(self, tmp: Path, gpu: str, count: int, **monitoring: object) -> None:
        plan = make_host_plan(f"{gpu}:{count}", "minimal", "ubuntu-22.04", StackPins(),
                              monitoring=Monitoring(health=True, **monitoring))  # type: ignore[arg-type]
        (step,) = [s for s in plan.bundle().scripts if s.name == "health"]
        self.root, self.state, self.run = tmp / "root", tmp / "shim-state", tmp / "shim-run"
        for d in (self.root, self.state, self.run):
            d.mkdir(exist_ok=True)
        (self.state / "installed").write_text("nvidia-open 580.95.05-1\n")
        self.env = {"PATH": f"{SHIMS / 'bin'}:/usr/bin:/bin", "GPUPROV_SYSROOT": str(self.root),
                    "GPUPROV_SHIM_STATE": str(self.state), "GPUPROV_SHIM_RUN": str(self.run),
                    "GPUPROV_SHIM_GPU": gpu, "GPUPROV_SHIM_GPU_COUNT": str(count), "HOME": str(tmp)}
        step_path = tmp / "health.sh"
        step_path.write_text(step.text)
        done = subprocess.run(["bash", str(step_path)], env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.strip().endswith("GPUPROV_RESULT=changed"), done.stderr

    def once(self, now: int, **env: str) -> None:
        done = subprocess.run(["bash", str(self.root / "usr/local/lib/gpuprov/health-watch"), "--once"],
                              env={**self.env, "GPUPROV_NOW": str(now), **env}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    def alerted(self) -> list[dict[str, str]]:
        path = self.root / "var/lib/gpuprov/health/findings.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_gpu_past_its_slowdown_point_and_rising_ecc_errors_alert_once_an_hour(tmp_path):
    hook = f"printf '%s|%s|%s\\n' \"$GPUPROV_ALERT_KIND\" \"$GPUPROV_ALERT_GPU\" \"$GPUPROV_ALERT_KEY\" >> {tmp_path}/hook.log"
    watch = Watch(tmp_path, "T4", 2, on_alert=hook)
    watch.once(1000, GPUPROV_SHIM_TEMP="70")
    assert watch.alerted() == []  # T4's "GPU Slowdown Temp" is 93 C
    watch.once(1015, GPUPROV_SHIM_TEMP="70,94")
    (hot,) = watch.alerted()
    assert hot["kind"] == "thermal" and hot["gpu"] == "1" and "94 C" in hot["message"] and "93 C" in hot["message"]
    watch.once(1030, GPUPROV_SHIM_TEMP="70,95", GPUPROV_SHIM_ECC_UNCORRECTED="0,2")
    assert [f["kind"] for f in watch.alerted()] == ["thermal", "ecc"]  # the heat again: not within the hour
    assert "2 uncorrectable ECC errors" in watch.alerted()[1]["message"]
    watch.once(1045, GPUPROV_SHIM_ECC_UNCORRECTED="0,2")
    assert len(watch.alerted()) == 2  # the count did not rise
    watch.once(4700, GPUPROV_SHIM_TEMP="70,95", GPUPROV_SHIM_ECC_UNCORRECTED="0,3")
    kinds = [f["kind"] for f in watch.alerted()]
    assert kinds[:2] == ["thermal", "ecc"] and sorted(kinds[2:]) == ["ecc", "thermal"]  # an hour on: again
    hooks = (tmp_path / "hook.log").read_text().splitlines()
    assert [h.split("|")[0] for h in hooks] == kinds and hooks[0].split("|")[1] == "1"


def test_h100_slowdown_is_read_as_tlimit_and_hardware_thermal_slowdown_counts(tmp_path):
    watch = Watch(tmp_path, "H100", 1)
    watch.once(1000, GPUPROV_SHIM_TEMP="84")  # T.Limit 3 C: not yet at "GPU Slowdown T.Limit Temp" (-2 C)
    assert watch.alerted() == []
    watch.once(1015, GPUPROV_SHIM_TEMP="89")  # T.Limit -2 C: at the slowdown point
    assert "-2 C from its T.Limit" in watch.alerted()[0]["message"]
    (tmp_path / "b").mkdir()
    other = Watch(tmp_path / "b", "H100", 1)
    other.once(1000, GPUPROV_SHIM_THERMAL="0")
    assert "thermal slowdown active (hardware: Active" in other.alerted()[0]["message"]


def test_a_watched_process_that_exits_is_a_finding_with_the_hook_seeing_it(tmp_path):
    hook = f"env | grep ^GPUPROV_ALERT_ | sort > {tmp_path}/hook.env"
    watch = Watch(tmp_path, "A100", 1, watch_process="gpuprov-test-sleeper 4242", on_alert=hook)
    sleeper = subprocess.Popen(["bash", "-c", "exec -a 'gpuprov-test-sleeper 4242' sleep 300"])
    try:
        watch.once(1000)
        assert watch.alerted() == []
    finally:
        sleeper.kill()
        sleeper.wait()
    watch.once(1015)
    (gone,) = watch.alerted()
    assert gone["kind"] == "process-exited" and "'gpuprov-test-sleeper 4242' is no longer running" in gone["message"]
    seen = dict(line.split("=", 1) for line in (tmp_path / "hook.env").read_text().splitlines())
    assert seen["GPUPROV_ALERT_KIND"] == "process-exited" and seen["GPUPROV_ALERT_MESSAGE"] == gone["message"]
    assert json.loads(seen["GPUPROV_ALERT_JSON"])["key"] == "process-exited"
    watch.once(1030)
    assert len(watch.alerted()) == 1  # gone is gone: once, until it runs again


def test_an_image_bake_takes_the_monitoring_away_with_the_guards():
    """What is one node's (its findings, its watch's settings) must not travel in an image of it: the bake moves the
    monitoring steps' markers and their own units aside like the guards', so the next node installs its own."""
    from gpuprov.cloud.images import GUARD_STEPS, GUARD_UNITS

    plan = make_plan(NodeRequest(gpu="T4", monitoring=Monitoring(metrics="textfile", watch_process="x")))
    monitor = [s for s in plan.bundle().scripts if s.kind == "monitor"]
    assert {s.name for s in monitor} == {"metrics", "health"} <= set(GUARD_STEPS)
    units = {u for s in monitor for u in re.findall(r"^gp_put_unit (\S+) <<", s.text, re.M) if "/" not in u and ".d/" not in u}
    assert units and units <= set(GUARD_UNITS), units - set(GUARD_UNITS)
