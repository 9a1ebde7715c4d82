"""Monitoring on the node: what `--metrics` and `--health` ask for, which exporter serves the GPU metrics on
the node's OS, and the two plan steps that install them. Pure: facts come from data/monitoring.yaml and
data/xid.yaml, with their sources.

Metrics: the distribution's prometheus-node-exporter on 127.0.0.1:9100, plus GPU metrics under DCGM's names:
NVIDIA's dcgm-exporter on 127.0.0.1:9400 where DCGM is packaged for the OS, else a textfile collector that reads
`nvidia-smi --query-gpu` on a systemd timer into the node exporter. Neither port is opened in the security
group; `gpuprov metrics serve` reaches them through SSH tunnels.

Health: a watch (gpuprov-health.service) for Xid lines in the kernel log, ECC errors, GPUs gone from the bus,
temperatures past the slowdown point and, optionally, a process that exited; each finding runs a hook and/or
posts to a webhook at most once an hour, and is recorded for `status` and `doctor`.

`Monitoring` is what `--metrics`/`--health`/`--watch-process`/`--on-alert`/`--alert-webhook` ask for, checked with
the playbook's `metrics:`; `exporter_for` picks DCGM's exporter or the textfile collector; the `metrics` and
`health` steps go after the driver stack, before the env. `webhook_target`: Slack JSON to the URL, or `ntfy+URL`
(ntfy's JSON to the server's root, the topic from the path); plans and records show a webhook's scheme and host
only. data/xid.yaml is the one Xid table (NVIDIA's meaning, what to do, fatal or not): doctor reads it and the
watch renders it.

On the node. templates/metrics.sh.j2 writes gpuprov's ARGS (`--web.listen-address=127.0.0.1:9100`, the textfile
directory) and a drop-in pointing the packaged unit at them *before* installing the package, whose postinst starts
it. DCGM's path installs `datacenter-gpu-manager-4-core`, `-cuda<major>` (the driver's CUDA major, as NVIDIA's own
images choose it) and `datacenter-gpu-manager-exporter`, with gpuprov's counters CSV (the dashboard's fields, ECC
on) and `-a 127.0.0.1:9400` (the packaged default is every interface); nv-hostengine binds 127.0.0.1:5555 by
default. The textfile path's `gpu-metrics` (on a 15 s timer) queries only the fields this nvidia-smi lists in
`--help-query-gpu` (an unknown field fails the whole query), writes them under dcgm-exporter's names and labels
with the last Xid per GPU and Xid counts from `journalctl -k` since a cursor, by temp file + rename. Each
exporter's step fails unless every listener of its port is on loopback (`ss -Hltn`).

The health watch (templates/health_watch.sh.j2, every 15 s): the kernel log since its cursor, one nvidia-smi query
(GPU count against EXPECTED_GPUS or the first count seen, uncorrected ECC going up, temperature against "GPU
Slowdown Temp" or T.Limit against "GPU Slowdown T.Limit Temp", thermal slowdown reasons) and `pgrep -f` for a
watched process. A finding (kind, key) alerts at most once per REPEAT_SECONDS per key: the hook (0700) with the
finding in GPUPROV_ALERT_*, and the webhook's message into an outbox each pass flushes (a failed POST is retried,
never lost); the URL (a 0600 file) reaches curl on stdin (`-K -`), never a command line. Alerted findings go to
/var/lib/gpuprov/health/findings.jsonl and last.json, every finding's time to the node exporter. The clock is
GPUPROV_NOW when set, as for the guards.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from gpuprov.errors import UserInputError
from gpuprov.plan.render import StepPlan
from gpuprov.resources import load_data

MetricsMode = Literal["off", "auto", "dcgm", "textfile"]
COLLECT_SECONDS = 15  # the textfile collector's timer; Prometheus' own default scrape interval is 1m
REPEAT_SECONDS = 3600  # a finding alerts at most once in this long
STATE = "/var/lib/gpuprov/health"  # on the node: the watch's findings (status and doctor read them)


class _Fact(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NodeExporter(_Fact):
    package: str
    unit: str
    port: int
    textfile_dir: str
    source: str
    unverified: str | None = None


class Dcgm(_Fact):
    os: tuple[str, ...]
    os_source: str
    core_package: str
    cuda_package_prefix: str
    cuda_majors: tuple[int, ...]
    hostengine_unit: str
    hostengine_port: int
    exporter_package: str
    exporter_unit: str
    exporter_binary: str
    port: int
    source: str
    unverified: str | None = None


class GpuMetric(_Fact):
    field: str | None = None  # the nvidia-smi --query-gpu field it is read from (None: not from nvidia-smi)
    metric: str
    type: Literal["gauge", "counter"]
    help: str
    csv: bool = False  # in dcgm-exporter's default CSV


class MonitoringFacts(_Fact):
    node_exporter: NodeExporter
    dcgm: Dcgm
    gpu_metrics: tuple[GpuMetric, ...]
    xid_metric: GpuMetric
    own_metrics: tuple[GpuMetric, ...]

    def exported(self, exporter: str) -> tuple[str, ...]:
        """Every GPU metric name an exporter produces ("textfile" or "dcgm", with gpuprov's CSV)."""
        names = [m.metric for m in (*self.gpu_metrics, self.xid_metric)]
        if exporter == "textfile":
            names += [m.metric for m in self.own_metrics]
        else:
            names += [m.metric for m in self.own_metrics if m.metric.startswith("gpuprov_health")]
        return tuple(names)


class Xid(_Fact):
    mnemonic: str
    meaning: str
    action: str
    fatal: bool
    source: str
    unverified: str | None = None


class XidTable(_Fact):
    actions: dict[str, str]
    xids: dict[int, Xid]

    def describe(self, code: int) -> str:
        """'79 (GPU has fallen off the bus): reboot the machine; …' for a known code, else what NVIDIA says."""
        xid = self.xids.get(code)
        if xid is None:
            return f"Xid {code}: not in gpuprov's table; see NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)"
        return f"Xid {code} ({xid.meaning}): {self.actions[xid.action]}"


@cache
def facts() -> MonitoringFacts:
    return MonitoringFacts.model_validate(load_data("monitoring.yaml"))


@cache
def xid_table() -> XidTable:
    table = XidTable.model_validate(load_data("xid.yaml"))
    unknown = {x.action for x in table.xids.values()} - set(table.actions)
    if unknown:
        raise ValueError(f"data/xid.yaml: actions {sorted(unknown)} have no words")
    return table


# --- what the user asked for -------------------------------------------------------------------

_PROCESS = re.compile(r"^[^\x00-\x1f]{1,200}$")


class Monitoring(BaseModel):
    """Metrics and the health watch as asked (flags, playbook). `health` None: on with metrics, else off."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metrics: MetricsMode = "off"
    health: bool | None = None
    watch_process: str | None = None
    on_alert: str | None = None
    alert_webhook: str | None = None

    @property
    def health_on(self) -> bool:
        return self.health if self.health is not None else (self.metrics != "off" or self._alerts_asked)

    @property
    def _alerts_asked(self) -> bool:
        return bool(self.watch_process or self.on_alert or self.alert_webhook)

    @property
    def any(self) -> bool:
        return self.metrics != "off" or self.health_on

    def check(self) -> Monitoring:
        """Refuse what cannot work, naming the flag (exit 2), before anything is contacted."""
        if self.health is False and self._alerts_asked:
            flag = "--watch-process" if self.watch_process else "--on-alert" if self.on_alert else "--alert-webhook"
            raise UserInputError(flag, "needs the health watch, and --no-health turns it off", "drop --no-health")
        if self.watch_process is not None and not _PROCESS.fullmatch(self.watch_process):
            raise UserInputError("--watch-process", f"{self.watch_process!r} is not a process pattern",
                                 "1-200 printable characters, matched against command lines (pgrep -f), e.g. torchrun")
        if self.on_alert is not None and not self.on_alert.strip():
            raise UserInputError("--on-alert", "an empty command", "a command the node runs per finding, or drop it")
        if self.alert_webhook is not None:
            webhook_target(self.alert_webhook)
        return self


def webhook_target(url: str) -> tuple[str, str, str | None]:
    """(kind, URL to POST to, ntfy topic) for --alert-webhook: `https://…` gets Slack's JSON; `ntfy+https://HOST/TOPIC`
    gets ntfy's JSON, POSTed to the server's root as ntfy's JSON publishing requires, with TOPIC in the body."""
    kind = "ntfy" if url.startswith("ntfy+") else "slack"
    raw = url.removeprefix("ntfy+")
    parts = urlsplit(raw)
    hint = "an http(s) URL, e.g. https://hooks.slack.com/services/… or ntfy+https://ntfy.sh/my-topic"
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c in raw for c in "\n\r\x00 '\"\\"):
        raise UserInputError("--alert-webhook", "not a webhook URL", hint)
    if kind == "slack":
        return kind, raw, None
    topic = parts.path.strip("/")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", topic):
        raise UserInputError("--alert-webhook", "an ntfy webhook names its topic as the URL's path",
                             "e.g. ntfy+https://ntfy.sh/my-gpu-alerts (letters, digits, - and _)")
    return kind, f"{parts.scheme}://{parts.netloc}/", topic


def redacted(url: str | None) -> str | None:
    """A webhook URL as plans, logs and state show it: its scheme and host only (the path is often the secret)."""
    if url is None:
        return None
    kind = "ntfy+" if url.startswith("ntfy+") else ""
    parts = urlsplit(url.removeprefix("ntfy+"))
    return f"{kind}{parts.scheme}://{parts.hostname}/…"


def exporter_for(monitoring: Monitoring, os_name: str) -> Literal["dcgm", "textfile"] | None:
    """Which exporter serves the GPU metrics on this OS (None: no metrics asked)."""
    if monitoring.metrics == "off":
        return None
    dcgm = facts().dcgm
    if monitoring.metrics == "dcgm" and os_name not in dcgm.os:
        raise UserInputError("--metrics", f"NVIDIA packages DCGM for {', '.join(dcgm.os)}, not {os_name}",
                             "use --metrics textfile (nvidia-smi on a timer, the same metric names)")
    if monitoring.metrics == "textfile":
        return "textfile"
    return "dcgm" if os_name in dcgm.os else "textfile"


# --- the steps ---------------------------------------------------------------------------------


def monitoring_steps(monitoring: Monitoring, os_name: str, gpus: int) -> list[StepPlan]:
    """The metrics step and the health step (in that order), for a host with `gpus` GPUs (0: learn the count
    on the node at the watch's first look)."""
    steps = []
    exporter = exporter_for(monitoring, os_name)
    node = facts().node_exporter
    if exporter is not None:
        gpu_part = (f"dcgm-exporter on 127.0.0.1:{facts().dcgm.port} (DCGM for the driver's CUDA)"
                    if exporter == "dcgm" else
                    f"nvidia-smi → textfile every {COLLECT_SECONDS}s (gpuprov-gpu-metrics.timer), DCGM's metric names")
        steps.append(StepPlan(
            "metrics", "metrics.sh.j2", "monitor",
            f"{node.package} on 127.0.0.1:{node.port} + {gpu_part}; localhost only, reach it with `gpuprov metrics serve`",
            (("monitoring", monitoring), ("exporter", exporter), ("facts", facts()), ("collect_seconds", COLLECT_SECONDS)),
        ))
    if monitoring.health_on:
        what = ["Xid in the kernel log", "ECC errors", f"GPUs on the bus (expect {gpus})" if gpus else "GPUs on the bus",
                "temperature past slowdown"]
        if monitoring.watch_process:
            what.append(f"process {monitoring.watch_process!r} exiting")
        then = [w for w, on in (("runs the on-alert hook", monitoring.on_alert),
                                (f"posts to {redacted(monitoring.alert_webhook)}", monitoring.alert_webhook)) if on]
        steps.append(StepPlan(
            "health", "health.sh.j2", "monitor",
            f"watch {', '.join(what)} (gpuprov-health.service); per finding, at most hourly: "
            f"{' and '.join(then) or 'logs it'}; `gpuprov status`/`doctor` show it",
            (("monitoring", monitoring), ("expected_gpus", gpus), ("xids", xid_table()),
             ("repeat_seconds", REPEAT_SECONDS), ("webhook", _webhook_parts(monitoring.alert_webhook)),
             ("textfile_dir", node.textfile_dir if exporter is not None else "")),
        ))
    return steps


def _webhook_parts(url: str | None) -> dict[str, str]:
    if url is None:
        return {}
    kind, target, topic = webhook_target(url)
    return {"kind": kind, "url": target, "topic": topic or ""}


def summary(monitoring: Monitoring, os_name: str) -> dict[str, object]:
    """What `plan --json` and the node's record say about monitoring (the webhook without its path)."""
    return {"metrics": monitoring.metrics, "exporter": exporter_for(monitoring, os_name),
            "health": monitoring.health_on, "watch_process": monitoring.watch_process,
            "on_alert": bool(monitoring.on_alert), "alert_webhook": redacted(monitoring.alert_webhook)}
