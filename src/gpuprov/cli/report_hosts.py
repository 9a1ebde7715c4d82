"""What the CLI prints for hosts: bootstrap's live progress and summary, check, doctor, bench and monitor
tables. Presentation only: no decisions here."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from gpuprov.hosts.access import GpuSample
    from gpuprov.hosts.bootstrap import HostResult
    from gpuprov.hosts.check import CheckResult
    from gpuprov.hosts.doctor import DoctorReport, DoctorResult
    from gpuprov.hosts.doctor_sources import SourcesReport
    from gpuprov.hosts.gpubench import BenchResult
    from gpuprov.hosts.remote import HostOutcome, Judged
    from gpuprov.hosts.verify import Check, CheckReport


from gpuprov.cli.fittable import STYLE, Column, FitTable


@dataclass
class _Row:
    step: str = ""
    state: str = "waiting"
    start: float = field(default_factory=time.monotonic)


class LiveHosts:
    """A live table, one line per host: current step, state, elapsed. A bootstrap Reporter."""


    def __init__(self, console: Console, hosts: list[str], enabled: bool = True) -> None:
        """On a terminal: a live table. Elsewhere (CI logs): one plain line per finished step, on
        stderr. Disabled (--json, --verbose): nothing."""
        self._console = console
        self._rows: dict[str, _Row] = {h: _Row() for h in hosts}
        self._lock = threading.Lock()
        self._enabled = enabled
        self._live = Live(console=console, get_renderable=self._table, refresh_per_second=4, transient=True) \
            if enabled and console.is_terminal else None
        self._lines = Console(stderr=True, highlight=False) if enabled and self._live is None else None


    def event(self, host: str, step: str, state: str) -> None:
        with self._lock:
            row = self._rows.setdefault(host, _Row())
            row.step, row.state = step or row.step, state
        if self._lines is not None and state != "running":
            self._lines.print(f"{host}: {step} {state}".replace("  ", " "), markup=False)


    def _table(self) -> Table:
        table = Table(box=None, padding=(0, 2))
        for col in ("host", "step", "state", "elapsed"):
            table.add_column(col)
        now = time.monotonic()
        with self._lock:
            for host, row in self._rows.items():
                style = STYLE.get(row.state.split()[0], "")
                table.add_row(host, row.step, Text(row.state, style=style), f"{now - row.start:5.1f}s")
        return table


    def __enter__(self) -> LiveHosts:
        if self._live:
            self._live.__enter__()
        return self


    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._live:
            self._live.__exit__(kind, exc, tb)


def bootstrap_summary(results: list[HostResult]) -> Group:
    table = FitTable([Column("host"), Column("result"), Column("steps", prose=True, drop=2), Column("duration", "right"),
                      Column("log", prose=True)], title="bootstrap", title_justify="left")
    for r in results:
        counts: dict[str, int] = {}
        for step in r.steps:
            counts[step.outcome] = counts.get(step.outcome, 0) + 1
        steps = ", ".join(f"{n} {k}" for k, n in counts.items())
        table.add_row(r.target.name, Text(r.summary, style=STYLE.get(r.status, "")), steps,
                      f"{r.seconds:.1f}s", str(r.log_path or ""))
    parts: list[FitTable | Text] = [table]
    from gpuprov.plan.noroot import NO_ROOT

    for r in results:  # a step left out for want of root: one line each, saying so
        parts += [Text(f"{r.target.name}: skipped {s.name}: {s.message}", style="yellow")
                  for s in r.steps if s.outcome == "skipped" and s.message.startswith(NO_ROOT)]
    for r in results:
        if r.error:
            parts.append(Text(f"{r.target.name}: {r.error}", style="red"))
    if results and all(r.status == "ok" for r in results):
        parts.append(Text("nothing to do: every step was already done on every host", style="green"))
    return Group(*parts)


def _checks_table(title: str, style: str, first: str, checks: list[Check]) -> Table:
    """One host's checks or findings: what, ok/warn/FAIL, detail, fix."""
    table = Table(title=title, title_justify="left", title_style=style)
    table.add_column(first, no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("detail", overflow="fold")
    table.add_column("fix", overflow="fold")
    for c in checks:
        mark = "ok" if c.ok else ("warn" if c.severity == "warn" else "FAIL")
        table.add_row(c.name, Text(mark, style="green" if c.ok else "yellow" if mark == "warn" else "red"),
                      c.detail, c.fix or "")
    return table


R = TypeVar("R", bound="Judged")  # a host's report: check's or doctor's


def _per_host(results: list[HostOutcome[R]], table: Callable[[str, R], Table]) -> list[Table | Text]:
    """One table per host that answered; one red line for each that did not."""
    out: list[Table | Text] = []
    for r in results:
        if r.report is None:
            out.append(Text(f"{r.target.name}: {'unreachable' if r.unreachable else 'failed'} — {r.error}", style="red"))
        else:
            out.append(table(r.target.name, r.report))
    return out


def check_tables(results: list[CheckResult]) -> list[Table | Text]:
    def table(host: str, rep: CheckReport) -> Table:
        return _checks_table(f"{host}: {'OK' if rep.ok else 'FAILED'}", "green" if rep.ok else "red", "check", rep.checks)


    return _per_host(results, table)


def _bar(pct: int | None, width: int = 10) -> Text:
    if pct is None:
        return Text("n/a", style="dim")
    filled = round(max(0, min(pct, 100)) / 100 * width)
    style = "green" if pct < 50 else "yellow" if pct < 85 else "red"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"), f" {pct:>3}%")


def monitor_table(samples: list[GpuSample], interval: float | None = None) -> FitTable:
    """One row per GPU of every host: utilisation, memory, temperature, power."""
    when = time.strftime("%H:%M:%S", time.localtime(max((s.at for s in samples), default=time.time())))
    every = f", every {interval:g}s (Ctrl-C to stop)" if interval else ""
    table = FitTable([Column("host"), Column("GPU", "right"), Column("name", drop=3), Column("util"),
                      Column("memory", "right"), Column("temp", "right", drop=2), Column("power", "right", drop=1)],
                     title=f"GPUs at {when}{every}", title_justify="left")
    for sample in samples:
        if sample.error is not None:
            table.add_row(sample.target.name, "", Text(sample.error, style="red"), "", "", "", "", end_section=True)
            continue
        if not sample.gpus:
            table.add_row(sample.target.name, "", Text("no GPU", style="yellow"), "", "", "", "", end_section=True)
            continue
        for i, gpu in enumerate(sample.gpus):
            used, total = gpu.memory_used_mib, gpu.memory_total_mib
            memory = f"{(used or 0) / 1024:.1f}/{total / 1024:.1f} GiB" if total else "n/a"
            table.add_row(
                sample.target.name if i == 0 else "", str(gpu.index), gpu.name, _bar(gpu.utilization_pct), memory,
                f"{gpu.temperature_c} °C" if gpu.temperature_c is not None else "n/a",
                f"{gpu.power_w:.0f} W" if gpu.power_w is not None else "n/a",
                end_section=i == len(sample.gpus) - 1,
            )
    return table


def doctor_tables(results: list[DoctorResult]) -> list[Table | Text]:
    """One table per host: every finding, root cause first, with its fix; unreachable hosts as a line."""


    def table(host: str, rep: DoctorReport) -> Table:
        fails, warns = len(rep.failures), sum(not c.ok and c.severity == "warn" for c in rep.findings)
        if fails:
            verdict = f"{fails} problem(s)" + (f", {warns} warning(s)" if warns else "")
        else:
            verdict = f"{warns} warning(s)" if warns else "healthy"
        return _checks_table(f"{host}: {verdict}", "red" if fails else "yellow" if warns else "green",
                             "finding", rep.findings)


    return _per_host(results, table)


_VERDICT_STYLE = {"ok": "green", "slow": "red", "failed": "red", "no figure": "yellow", "skipped": "dim"}


def bench_tables(results: list[BenchResult]) -> list[FitTable | Text]:
    """Per host: each measured figure beside NVIDIA's, with the percentage and the verdict; then where
    the published figures come from. Unreachable or failed hosts as one red line."""
    out: list[FitTable | Text] = []
    for r in results:
        rep = r.report
        if rep is None:
            out.append(Text(f"{r.target.name}: {'unreachable' if r.unreachable else 'failed'} — {r.error}", style="red"))
            continue
        below = len(rep.below)
        head = "as published" if rep.ok else (f"{below} figure(s) below published" if below else "not measured")
        table = FitTable([Column("GPU"), Column("figure"), Column("measured", "right"), Column("unit", drop=2),
                          Column("published", "right"), Column("%", "right"), Column("verdict"),
                          Column("detail", prose=True, drop=3)],
                         title=f"{r.target.name}: {head}", title_justify="left",
                         title_style="green" if rep.ok else "red")
        for f in rep.figures:
            table.add_row(f.gpu, f.name, f"{f.measured:,.1f}" if f.measured is not None else "-", f.unit,
                          f"{f.published:,.1f}" if f.published is not None else "-",
                          f"{f.percent:.0f}%" if f.percent is not None else "-",
                          Text(f.verdict, style=_VERDICT_STYLE[f.verdict]), f.detail)
        out.append(table)
        if rep.error:
            out.append(Text(f"{r.target.name}: {rep.error}", style="red"))
        for y in rep.yardsticks:
            note = f" (unverified: {y.unverified})" if y.unverified else ""
            out.append(Text(f"published {y.gpu} = {y.variant}: {y.source}; read {y.read}{note}", style="dim"))
    return out


def sources_tables(results: list[HostOutcome[SourcesReport]]) -> list[Table | Text]:
    """doctor --sources: per host, each source of each key with its time or why it failed, the fastest marked."""
    from gpuprov.plan.sources import KEYS

    def table(host: str, rep: SourcesReport) -> Table:
        keys = list(dict.fromkeys(t.key for t in rep.timed))
        missing = [k for k in keys if rep.fastest(k) is None]
        out = Table(title=f"{host}: " + (f"no source works for {', '.join(missing)}" if missing
                                         else "a source works for every key"),
                    title_justify="left", title_style="red" if missing else "green")
        for name in ("key", "source", "seconds", "result", "url"):
            out.add_column(name, justify="right" if name == "seconds" else "left",
                           overflow="fold" if name == "url" else "ellipsis")
        for key in sorted(keys, key=lambda k: KEYS.index(k) if k in KEYS else len(KEYS)):
            best = rep.fastest(key)
            for t in sorted((t for t in rep.timed if t.key == key), key=lambda t: (not t.ok, t.seconds or 0.0)):
                result = Text("fastest", style="green") if t is best else Text("ok") if t.ok else \
                    Text(t.problem, style="red")
                out.add_row(key, t.source, f"{t.seconds:.3f}" if t.seconds is not None else "-", result, t.url)
        return out

    return _per_host(results, table)
