"""Rich renderables for what the CLI prints. Presentation only: no decisions here."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpuprov.plan.catalog import Catalog
from gpuprov.plan.plan import Plan

if TYPE_CHECKING:
    from gpuprov.cloud.images import Listed
    from gpuprov.cloud.providers.base import SpotPrice
    from gpuprov.cloud.timeline import Timeline
    from gpuprov.hosts.bootstrap import HostResult
    from gpuprov.hosts.check import CheckResult
    from gpuprov.hosts.doctor import DoctorReport, DoctorResult
    from gpuprov.hosts.gpubench import BenchResult
    from gpuprov.hosts.verify import Check, CheckReport
    from gpuprov.state import Node

_STYLE = {"ok": "green", "ready": "green", "interrupted": "yellow",
          "changed": "cyan", "unchanged": "green", "failed": "red", "unreachable": "red", "lost": "red",
          "running": "yellow", "rebooting": "magenta", "reboot": "magenta", "waiting": "dim"}


# --- tables that fit ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A column of a FitTable. `drop`: when the table is too wide, columns go highest first (0: always
    shown). `prose`: free text that may wrap between words; every other cell is never split."""

    header: str
    justify: str = "left"
    drop: int = 0
    prose: bool = False


PROSE_MIN = 12


class FitTable:
    """A rich Table that never splits a name, address, instance type or price mid-word, at any width
    and when piped (`gpuprov gpus | grep p4d.24xlarge` finds the row): those cells are kept whole, and
    when they do not fit, optional columns are left out (highest `drop` first), as the caption says."""

    def __init__(self, columns: list[Column], title: str | None = None, **table_kw: Any) -> None:
        self.columns = columns
        self.title = title
        self.table_kw = table_kw
        self.rows: list[tuple[tuple[Any, ...], bool]] = []

    def add_row(self, *cells: Any, end_section: bool = False) -> None:
        self.rows.append((cells, end_section))

    def _width(self, i: int) -> int:
        """Column i's narrowest width: a whole cell for most, the longest word for prose."""
        cells = [self.columns[i].header, *(_plain(cells[i]) for cells, _ in self.rows)]
        if self.columns[i].prose:  # folds a longer word rather than push the names off the line
            return min(max((cell_len(word) for cell in cells for word in cell.split()), default=1), PROSE_MIN)
        return max(cell_len(cell) for cell in cells)

    def table(self, shown: list[int]) -> Table:
        dropped = [c.header for i, c in enumerate(self.columns) if i not in shown]
        caption = f"left out at this width: {', '.join(dropped)} (wider terminal, or --json)" if dropped else None
        table = Table(title=self.title, caption=caption, caption_justify="left", **self.table_kw)
        # rich ignores `justify` on an overflow="ignore" column, so right-aligned cells are padded here
        right = {i: self._width(i) for i in shown if self.columns[i].justify == "right" and not self.columns[i].prose}
        for i in shown:
            col = self.columns[i]
            header = _rjust(col.header, right[i]) if i in right else col.header
            table.add_column(header, justify=col.justify, no_wrap=not col.prose,  # type: ignore[arg-type]
                             overflow="fold" if col.prose else "ignore",
                             min_width=None if col.prose else self._width(i))
        for cells, end_section in self.rows:
            table.add_row(*(_rjust(cells[i], right[i]) if i in right else cells[i] for i in shown),
                          end_section=end_section)
        return table

    def fitted(self, width: int) -> Table:
        shown = list(range(len(self.columns)))
        while True:
            table = self.table(shown)
            need = table._extra_width + sum(self._width(i) + table._get_padding_width(n) for n, i in enumerate(shown))
            optional = [i for i in shown if self.columns[i].drop]
            if need <= width or not optional:
                return table
            shown.remove(max(optional, key=lambda i: self.columns[i].drop))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fitted(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.fitted(options.max_width))


def _rjust(cell: Any, width: int) -> Any:
    pad = width - cell_len(_plain(cell))
    if pad <= 0:
        return cell
    return Text(" " * pad) + cell if isinstance(cell, Text) else " " * pad + str(cell)


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _price(value: float | None) -> str:
    return f"${value:,.2f}/h" if value is not None else "n/a"


def gpus_table(cat: Catalog) -> FitTable:
    table = FitTable([Column("GPU"), Column("arch", drop=8), Column("CC", drop=7), Column("mem/GPU", "right", drop=5),
                      Column("instance type"), Column("GPUs", "right"), Column("vCPU", "right", drop=6),
                      Column("$/h", "right"), Column("good for", prose=True, drop=9)],
                     title=f"GPUs on AWS — on-demand list prices, {cat.price_region}, {cat.prices_as_of}")
    for gpu in cat.gpus:
        types = cat.instance_types_for(gpu)
        for i, it in enumerate(types):
            first = i == 0
            table.add_row(
                gpu.name if first else "", gpu.arch.title() if first else "", gpu.compute_capability if first else "",
                f"{(it.gpu_memory_mib or gpu.memory_mib) / 1024:.0f} GiB", it.name, str(it.gpus), str(it.vcpu),
                _price(it.price_usd_hour).removesuffix("/h"), gpu.good_for if first else "",
                end_section=i == len(types) - 1,
            )
    return table


def plan_view(plan: Plan) -> Group:
    parts: list[Table | Text] = []
    market = "spot" if plan.request.spot else "on-demand"
    head = Text.assemble(("Plan: ", "bold"), f"{plan.count}× {plan.gpu.name}" if plan.gpu else "no GPU")
    if plan.instance:
        head.append(f" on {plan.instance.name} ({plan.instance.gpus} GPUs, {plan.instance.vcpu} vCPU, "
                    f"{plan.instance.ram_gib} GiB) · {market} · {plan.request.region}")
    parts.append(head)
    if plan.instance and plan.gpu and plan.instance.gpus > plan.count:
        parts.append(Text(f"  ({plan.count} requested; the smallest instance type with {plan.gpu.name} "
                          f"has {plan.instance.gpus})"))
    if plan.instance:
        cost = Text(f"  on-demand list price {_price(plan.instance.price_usd_hour)} (us-east-1 catalog)")
        if plan.request.spot:
            cost.append("; spot is billed at the current spot price, capped at on-demand")
        parts.append(cost)
        others = [c for c in plan.candidates if c != plan.instance][:4]
        if others:
            parts.append(Text("  fallbacks: " + ", ".join(f"{c.name} {_price(c.price_usd_hour)}" for c in others)))

    if plan.stack:
        s = plan.stack
        stack = Table(title="Stack", show_header=False, title_justify="left", box=None, padding=(0, 2))
        stack.add_row("driver", f"R{s.driver_branch}{' = ' + s.driver_version if s.driver_version else ''} "
                      f"{s.driver_package} ({s.kernel_module} kernel module), pinned with {s.driver_pinning_package}, held")
        if s.fabric_manager != "no":
            stack.add_row("fabric manager", f"{s.fabric_manager_package} at the driver's exact version, held"
                          + (" (installed only if the host has NVSwitch)" if s.fabric_manager == "auto" else "")
                          + (f" + {', '.join(s.fabric_extra_packages)}; {', '.join(s.fabric_kernel_modules)} loaded "
                             "at every boot" if s.nvlsm else ""))
        if s.cuda_toolkit_package:
            stack.add_row("CUDA toolkit", f"{s.cuda_toolkit_package} (nvcc)")
        if s.torch:
            stack.add_row("torch", f"{s.torch.requirement} {s.torch.variant} (CUDA {s.torch.cuda}) from {s.torch.index_url}")
        if plan.playbook.env:
            stack.add_row("python", f"{s.python} in {plan.playbook.env.path} ({plan.playbook.env.manager})")
        if s.min_driver:
            stack.add_row("needs driver", f"≥ {s.min_driver}")
        parts.append(stack)
    else:
        parts.append(Text(f"Stack: none (playbook {plan.playbook.name!r} installs no GPU stack)"))

    steps = Table(title=f"Steps (playbook {plan.playbook.name})", title_justify="left", box=None, padding=(0, 2))
    steps.add_column("#", justify="right")
    steps.add_column("step")
    steps.add_column("what")
    for i, step in enumerate(plan.steps, 1):
        steps.add_row(str(i), step.name, step.summary)
    parts.append(steps)
    if plan.stack and plan.stack.reasons:
        parts.append(Text("Why: " + "; ".join(plan.stack.reasons), style="dim"))
    if plan.unverified:
        parts.append(Text("Unverified facts this plan relies on (check before production):", style="yellow"))
        parts.extend(Text(f"  - {note}", style="yellow") for note in plan.unverified)
    return Group(*parts)


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
                style = _STYLE.get(row.state.split()[0], "")
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
                      Column("log", drop=1)], title="bootstrap", title_justify="left")
    for r in results:
        counts: dict[str, int] = {}
        for step in r.steps:
            counts[step.outcome] = counts.get(step.outcome, 0) + 1
        steps = ", ".join(f"{n} {k}" for k, n in counts.items())
        table.add_row(r.target.name, Text(r.summary, style=_STYLE.get(r.status, "")), steps,
                      f"{r.seconds:.1f}s", str(r.log_path or ""))
    parts: list[FitTable | Text] = [table]
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


def _per_host(results: list[CheckResult] | list[DoctorResult], table: Callable[[str, Any], Table]) -> list[Table | Text]:
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


def _age(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h" if seconds < 86400 else f"{seconds / 86400:.1f}d"


def status_rows(nodes: list[Node]) -> list[dict[str, object]]:
    now = time.time()
    rows: list[dict[str, object]] = []
    for n in nodes:
        hours = ((n.ended_at or now) - n.created_at) / 3600
        rows.append({
            "name": n.name, "gpu": n.gpu, "gpu_count": n.gpu_count, "instance_type": n.instance_type,
            "market": n.market, "region": n.region, "zone": n.zone, "state": n.state, "state_reason": n.state_reason,
            "address": n.address, "price_usd_hour": n.price_usd_hour,
            "cost_so_far_usd": round(hours * n.price_usd_hour, 2) if n.price_usd_hour else None,
            "age_seconds": round(now - n.created_at),
            "interrupted": n.state == "interrupted",
            "autostop_seconds": n.autostop_seconds,
            "ttl_seconds": n.ttl_seconds,
            "ttl_deadline": n.ttl_deadline,
            "ttl_left_seconds": max(round(n.ttl_deadline - now), 0) if n.ttl_deadline and n.live else None,
            "on_interrupt": n.on_interrupt,
            **_stop_fields(n, now),
            **_cluster_fields(n),
        })
    return rows


def _cluster_fields(n: Node) -> dict[str, object]:
    """A cluster (`up --nodes N`): its size and its nodes by rank; a single node has neither."""
    if n.cluster_size is None:
        return {}
    return {"cluster_size": n.cluster_size, "members": [
        {"rank": m.rank, "instance_id": m.instance_id, "address": m.address, "private_ip": m.private_ip,
         "public_ip": m.public_ip, "state": m.state} for m in n.members]}


def _stop_fields(n: Node, now: float) -> dict[str, object]:
    """What stop/start, the shutdown action and a budget add to a status row."""
    from gpuprov.plan import catalog

    storage = catalog.load().storage
    left = (max(0.0, (n.budget_deadline - now) / 3600 * n.budget_price)
            if n.budget_usd is not None and n.budget_deadline and n.budget_price else None)
    if left is not None and n.state == "stopped" and n.stopped_at:
        left = max(0.0, (n.budget_deadline or 0) - n.stopped_at) / 3600 * (n.budget_price or 0)
    return {
        "spot_type": n.spot_type, "can_stop": n.can_stop,
        "autostop_action": n.shutdown_action or "terminate",  # nodes launched before stop existed terminate
        "disk_gb": n.disk_gb,
        "storage_usd_month": round(storage.month(n.disk_gb), 2) if n.disk_gb else None,
        "storage_price": {"usd_per_gb_month": storage.usd_per_gb_month, "volume_type": storage.volume_type,
                          "source": storage.source, "unverified": storage.unverified},
        "stopped_at": n.stopped_at,
        "budget_usd": n.budget_usd, "budget_price_usd_hour": n.budget_price,
        "budget_left_usd": round(left, 2) if left is not None else None,
    }


def _stopped_note(nodes: list[Node]) -> str:
    if not any(n.state == "stopped" for n in nodes):
        return ""
    from gpuprov.plan import catalog

    storage = catalog.load().storage
    return f"; a stopped node's disk: {storage.volume_type} ${storage.usd_per_gb_month:g}/GB-month ({storage.source})"


def status_table(nodes: list[Node]) -> FitTable | Text:
    """At 80 columns: name, GPU, state, address, $/h, $ so far and age stay; the rest go as width runs out."""
    if not nodes:
        return Text("no nodes; `gpuprov up --gpu L4 --spot` launches one")
    from gpuprov.plan.spec import format_duration

    table = FitTable([Column("name"), Column("GPU"), Column("type", drop=4), Column("market", drop=6),
                      Column("zone", drop=9), Column("state", prose=True), Column("address"),
                      Column("$/h", "right", drop=2), Column("$ so far", "right", drop=3), Column("age", "right", drop=5),
                      Column("autostop", drop=8), Column("TTL left", drop=7)],
                     title="nodes (cost at on-demand list price; spot bills less)" + _stopped_note(nodes),
                     title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for row in status_rows(nodes):
        idle = row["autostop_seconds"]
        left = row["ttl_left_seconds"]
        then = f" → {row['autostop_action']}"
        budget = row["budget_left_usd"]
        guards = (f"{format_duration(idle)} idle{then}" if isinstance(idle, int) else "-",
                  (format_duration(left) + (then if not isinstance(budget, float) else "") if isinstance(left, int)
                   else "-") + (f" (${budget:.2f} of ${row['budget_usd']:g} left)" if isinstance(budget, float) else ""))
        price = row["price_usd_hour"]
        cost = row["cost_so_far_usd"]
        state = str(row["state"]) + (f" ({row['state_reason']})" if row["state_reason"] else "")
        month = row["storage_usd_month"]
        if row["state"] == "stopped" and isinstance(month, float):
            state += f", disk ${month:.2f}/month"
        members = row.get("members")
        size = f"{len(members)}×" if isinstance(members, list) and members else ""  # a cluster: N nodes of the type
        count = len(members) if isinstance(members, list) and members else 1
        table.add_row(
            str(row["name"]), f"{size}{row['gpu_count']}× {row['gpu']}", str(row["instance_type"] or "-"),
            str(row["market"]), str(row["zone"] or row["region"]), Text(state, style=_STYLE.get(str(row["state"]), "")),
            str(row["address"] or "-"), f"${price * count:.2f}" if isinstance(price, float) else "-",
            f"${cost * count:.2f}" if isinstance(cost, float) else "-", _age(float(str(row["age_seconds"]))), *guards,
        )
        for m in members if isinstance(members, list) else []:  # the cluster's nodes beneath its row
            table.add_row(f"  node {m['rank']}", "", "", "", "", Text(str(m["state"])), str(m["address"] or "-"),
                          "", "", "", "", "")
    return table


def _took(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 60 else f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


def timeline_table(timeline: Timeline) -> Group:
    """Where an `up`/`start` spent its time: each phase at its offset, the launch attempts (AWS's code for a
    refusal) and the bootstrap steps indented under theirs, then the total; what failed, in words, below."""
    from gpuprov.cloud.timeline import VERIFY

    ended = "ready" if timeline.outcome == "ok" else "failed"
    rows: list[tuple[str, str, str, Text]] = []
    failures: list[str] = []
    for phase in timeline.phases:
        rows.append((_took(phase.start_s), _took(phase.seconds), phase.name,
                     Text(phase.outcome, style=_STYLE.get(phase.outcome, ""))))
        for a in phase.attempts:
            rows.append((_took(a.start_s), _took(a.end_s - a.start_s), f"  {a.instance_type} {a.zone} {a.market}",
                         Text(a.code or a.outcome, style="yellow" if a.code else "green")))
        for s in phase.steps if phase.name != VERIFY else []:  # verify's one step is the phase
            rows.append((_took(s.start_s), _took(s.end_s - s.start_s), f"  {s.name}",
                         Text(s.outcome, style=_STYLE.get(s.outcome, ""))))
        failed = next((s for s in phase.steps if s.outcome == "failed"), None)
        if phase.outcome == "failed" and (phase.detail or failed):
            where = f"{phase.name}, step {failed.name}" if failed and phase.name != VERIFY else phase.name
            failures.append(f"{where}: {(failed.message if failed else '') or phase.detail}")
    rows.append((_took(timeline.total_s), "", ended, Text("")))
    # right-aligned by padding: FitTable's whole-cell columns do not justify
    at_w, took_w = (max(len(r[i]) for r in rows) for i in (0, 1))
    table = FitTable([Column("at"), Column("took"), Column("phase", prose=True), Column("result")],
                     box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1), pad_edge=False,
                     collapse_padding=True)
    for at, took, name, result in rows:
        table.add_row(at.rjust(at_w), took.rjust(took_w), name, result)
    head = f"{timeline.command} {timeline.node}: {ended} after {_took(timeline.total_s)}"
    return Group(Text(head + (f"; image: {timeline.image}" if timeline.image else "")), table,
                 *(Text(f"failed at {line}") for line in failures))


def live_prices_table(rows: list[tuple[SpotPrice, float | None]], region: str) -> FitTable:
    table = FitTable([Column("instance type"), Column("zone"), Column("spot $/h", "right"),
                      Column("on-demand $/h", "right", drop=2), Column("saving", "right", drop=1)],
                     title=f"spot prices in {region}, cheapest first", title_justify="left")
    for price, on_demand in rows:
        saving = f"{(1 - price.price / on_demand) * 100:.0f}%" if on_demand else "-"
        table.add_row(price.instance_type, price.zone, f"${price.price:.4f}", _price(on_demand).removesuffix("/h"), saving)
    return table


# --- monitor -----------------------------------------------------------------------------------

if TYPE_CHECKING:
    from gpuprov.hosts.access import GpuSample


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


# --- doctor ------------------------------------------------------------------------------------

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


# --- bench -------------------------------------------------------------------------------------

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


def images_table(rows: list[Listed], regions: list[str]) -> FitTable | Text:
    """Baked images (cloud/images.py `Listed`): name, id, stack, region, created, size, snapshots."""
    if not rows:
        return Text(f"no baked images in {', '.join(regions)}; `gpuprov image bake NODE` makes one")
    table = FitTable([Column("name"), Column("id"), Column("stack"), Column("region", drop=3),
                      Column("created", drop=2), Column("size", "right", drop=4), Column("snapshots", drop=5),
                      Column("state", drop=1)],
                     title="baked images (they outlive nodes: `gpuprov image rm NAME` removes one)",
                     title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for row in rows:
        image = row.image
        state = image.state + ("" if row.recorded else ", no local record (gc)")
        table.add_row(image.name, image.id, (image.stack or "-")[:12], image.region, (image.created or "-")[:16],
                      f"{image.size_gb} GB" if image.size_gb else "-", " ".join(image.snapshot_ids) or "-", state)
    return table
