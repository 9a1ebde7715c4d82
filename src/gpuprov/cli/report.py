"""What the CLI prints for plans and nodes: the GPU catalog, a plan, status, timelines, live prices and
images. Presentation only: no decisions here (hosts' views are in report_hosts.py)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuprov.plan import cpu
from gpuprov.plan.catalog import Catalog
from gpuprov.plan.plan import Plan

if TYPE_CHECKING:
    from gpuprov.cloud.images import Listed
    from gpuprov.cloud.providers.base import SpotPrice
    from gpuprov.cloud.providers.capabilities import ListPrice, ZoneStock
    from gpuprov.cloud.timeline import Timeline
    from gpuprov.plan.catalog import InstanceType
    from gpuprov.state import Node


from gpuprov.cli.fittable import STYLE, Column, FitTable, plural, price_text


def _cpu_arch(ec2_arch: str) -> str:
    """The CPU column in `--arch`'s words (uname -m): EC2 calls aarch64 arm64."""
    return "aarch64" if ec2_arch == "arm64" else ec2_arch


def gpus_table(cat: Catalog) -> FitTable:
    """GPUs and their types; CPU is the type's architecture (the GPU's own CPU where no type has it), kept at 80
    columns before CC and vCPU: it decides the image, the repository folder and the wheels."""
    table = FitTable([Column("GPU"), Column("arch", drop=8), Column("CC", drop=7), Column("mem/GPU", "right", drop=5),
                      Column("instance type"), Column("CPU", drop=4), Column("GPUs", "right"),
                      Column("vCPU", "right", drop=6),
                      Column("$/h", "right"), Column("good for", prose=True, drop=9)],
                     title=f"GPUs on AWS — on-demand list prices, {cat.price_region}, {cat.prices_as_of}")
    for gpu in cat.gpus:
        types = cat.instance_types_for(gpu)
        if not types:  # GH200: hosts of one's own only (render, bootstrap)
            table.add_row(gpu.name, gpu.arch.title(), gpu.compute_capability, f"{gpu.memory_mib / 1024:.0f} GiB",
                          "none on AWS", gpu.cpu_arch or "", "", "", "", gpu.good_for, end_section=True)
        for i, it in enumerate(types):
            first = i == 0
            table.add_row(
                gpu.name if first else "", gpu.arch.title() if first else "", gpu.compute_capability if first else "",
                f"{(it.gpu_memory_mib or gpu.memory_mib) / 1024:.0f} GiB", it.name, _cpu_arch(it.arch), str(it.gpus),
                str(it.vcpu),
                "retired" if it.retired else price_text(it.price_usd_hour).removesuffix("/h"),
                gpu.good_for if first else "",
                end_section=i == len(types) - 1,
            )
    return table


def ultraserver_lines(it: InstanceType, region: str) -> list[str]:
    """What buying a type sold only inside an UltraServer takes: a Capacity Block of the UltraServer, with the AWS
    CLI's commands (DescribeCapacityBlockOfferings takes the UltraServer's type and count, then PurchaseCapacityBlock)."""
    return [f"{it.name} is sold only as part of the UltraServer {it.ultraserver}, through Capacity Blocks (no "
            "on-demand or spot): buy a block, then `gpuprov up --capacity-block cr-…` launches into it",
            f"  aws ec2 describe-capacity-block-offerings --region {region} --ultraserver-type {it.ultraserver} "
            "--ultraserver-count 1 --capacity-duration-hours 24",
            f"  aws ec2 purchase-capacity-block --region {region} --capacity-block-offering-id cb-… "
            "--instance-platform Linux/UNIX"]


def plan_view(plan: Plan) -> Group:
    parts: list[Table | Text] = []
    market = "spot" if plan.request.spot else "on-demand"
    if plan.request.spot and plan.request.spot_duration is not None:
        market += f" (protection period {plan.request.spot_duration} h)"
    head = Text.assemble(("Plan: ", "bold"), f"{plan.count}× {plan.gpu.name}" if plan.gpu else
                         "CPU-only, no GPU" if plan.cpu_only else "no GPU")
    if plan.instance:
        gpus = "" if plan.cpu_only else f"{plural(plan.instance.gpus, 'GPU')}, "
        head.append(f" on {plan.instance.name} ({gpus}{plan.instance.vcpu} vCPU, "
                    f"{plan.instance.ram_gib} GiB) · {market} · {plan.request.region}")
    parts.append(head)
    if plan.instance and plan.gpu and plan.instance.gpus > plan.count:
        parts.append(Text(f"  ({plan.count} requested; the smallest instance type with {plan.gpu.name} "
                          f"has {plan.instance.gpus})"))
    if plan.arch != "x86_64" or (plan.instance is None and plan.request.arch):
        parts.append(Text(f"  hosts: {plan.arch} (NVIDIA's {plan.stack.repo_arch if plan.stack else plan.arch} "
                          "repositories" + (f", {plan.instance.name}'s CPU as EC2 describes it: {plan.instance.arch})"
                                            if plan.instance else ")")))
    if plan.instance and plan.instance.ultraserver:
        for line in ultraserver_lines(plan.instance, plan.request.region):
            parts.append(Text(f"  {line}"))
    if plan.instance is None and plan.gpu and plan.stack:
        parts.append(Text(f"  no AWS instance type carries {plan.gpu.name}: these steps are for a host of your own "
                          "(`gpuprov render`, `gpuprov bootstrap HOST`)"))
    from gpuprov.plan.plan import catalog_for

    unpriced = catalog_for(plan.request.cloud).prices_unknown
    if plan.instance and unpriced:
        parts.append(Text(f"  price: not known ({unpriced})"))
        if names := [c.name for c in plan.candidates if c != plan.instance][:4]:
            parts.append(Text("  fallbacks: " + ", ".join(names)))
    elif plan.instance:
        cost = Text(f"  on-demand list price {price_text(plan.instance.price_usd_hour)} (us-east-1 catalog)")
        if plan.request.spot:
            cost.append("; spot is billed at the current spot price, capped at on-demand")
        parts.append(cost)
        others = [c for c in plan.candidates if c != plan.instance][:4]
        if others:
            parts.append(Text("  fallbacks: " + ", ".join(f"{c.name} {price_text(c.price_usd_hour)}" for c in others)))


    if plan.stack:
        s = plan.stack
        stack = Table(title="Stack", show_header=False, title_justify="left", box=None, padding=(0, 2))
        stack.add_row("driver", f"R{s.driver_branch}{' = ' + s.driver_version if s.driver_version else ''} "
                      + (f"{s.driver_package} ({s.kernel_module} kernel module), " if not s.kept_driver else "") + s.driver_lock)
        if s.fabric_manager != "no":
            stack.add_row("fabric manager", f"{s.fabric_manager_package} at the driver's exact version, held"
                          + (" (installed only if the host has NVSwitch)" if s.fabric_manager == "auto" else "")
                          + (f" + {', '.join(s.fabric_extra_packages)}; {', '.join(s.fabric_kernel_modules)} loaded "
                             "at every boot" if s.nvlsm else ""))
        if s.cuda_toolkit_package:
            stack.add_row("CUDA toolkit", f"{s.cuda_toolkit_package} (nvcc)")
        if s.torch:
            stack.add_row("torch", f"{s.torch.requirement} {s.torch.variant} (CUDA {s.torch.cuda}) from {s.torch.index_url}")
            stack.add_row("wheels", plan.wheels or "")
        if plan.playbook.env:
            stack.add_row("python", f"{s.python} in {plan.playbook.env.path} ({plan.playbook.env.manager})")
        if s.min_driver:
            stack.add_row("needs driver", f"≥ {s.min_driver}")
        parts.append(stack)
    elif plan.cpu_only and plan.instance:
        parts.append(Text(f"Stack: no GPU stack ({plan.instance.name} is a CPU-only type): skipped "
                          + ", ".join(cpu.GPU_STEPS_SKIPPED)))
        if plan.cpu_torch:
            parts.append(Text(f"  torch {plan.cpu_torch.requirement} CPU wheel from {plan.cpu_torch.index_url}"))
    else:
        parts.append(Text(f"Stack: none (playbook {plan.playbook.name!r} installs no GPU stack)"))


    steps = Table(title=f"Steps (playbook {plan.playbook.name})", title_justify="left", box=None, padding=(0, 2))
    steps.add_column("#", justify="right")
    steps.add_column("step")
    steps.add_column("what")
    for i, step in enumerate(plan.steps, 1):
        steps.add_row(str(i), step.name, step.summary)
    parts.append(steps)
    if downloads := plan.step_sources():
        from rich.markup import escape

        fetched = Table(title="Sources (--sources, a playbook's sources:, config [sources]; docs/mirrors.md)",
                        title_justify="left", box=None, padding=(0, 2))
        for column in ("step", "source", "from", "set by"):
            fetched.add_column(column)
        for row in downloads:
            fetched.add_row(row["step"], row["key"], escape(row["url"]), escape(row["from"]))
        parts.append(fetched)
    if plan.stack and plan.stack.reasons:
        parts.append(Text("Why: " + "; ".join(plan.stack.reasons), style="dim"))
    if plan.unverified:
        parts.append(Text("Unverified facts this plan relies on (check before production):", style="yellow"))
        parts.extend(Text(f"  - {note}", style="yellow") for note in plan.unverified)
    parts.extend(Text(f"warning: {note}", style="yellow") for note in plan.warnings)
    return Group(*parts)


def _age(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h" if seconds < 86400 else f"{seconds / 86400:.1f}d"


def status_rows(nodes: list[Node]) -> list[dict[str, object]]:
    now = time.time()
    rows: list[dict[str, object]] = []
    for n in nodes:
        cost = n.cost_so_far(now)
        rows.append({
            "name": n.name, "owner": n.owner, "gpu": n.gpu, "gpu_count": n.gpu_count, "instance_type": n.instance_type,
            "market": n.market, "cloud": n.provider, "region": n.region, "zone": n.zone, "state": n.state,
            "state_reason": n.state_reason,
            "address": n.address, "price_usd_hour": n.price_usd_hour,
            "cost_so_far_usd": round(cost, 2) if cost is not None else None,
            "paid_usd_hour": n.paid_usd_hour,  # the spot price obtained, or the list price; what `$ so far` uses
            "age_seconds": round(now - n.created_at),
            "interrupted": n.state == "interrupted",
            "autostop_seconds": n.autostop_seconds,
            "ttl_seconds": n.ttl_seconds,
            "ttl_deadline": n.ttl_deadline,
            "ttl_left_seconds": max(round(n.ttl_deadline - now), 0) if n.ttl_deadline and n.live else None,
            "on_interrupt": n.on_interrupt,
            # a move in flight: its step and the ids it made (state_reason says it in words, with the next step)
            "journal": asdict(n.journal) if n.journal is not None else None,
            **_stop_fields(n, now),
            **_cluster_fields(n),
            "health": _health(n.name),
        })
    return rows


def _health(name: str) -> dict[str, object] | None:
    """The last finding of the node's health watch that gpuprov has read (metrics serve, doctor), or None."""
    from gpuprov.hosts import findings

    found = findings.last(name)
    return found.model_dump() if found else None


def health_lines(nodes: list[Node]) -> list[str]:
    """One line per node with a recorded health finding, for beneath the status table."""
    lines = []
    for n in nodes:
        found = _health(n.name)
        if found:
            lines.append(f"health {n.name}: {found['time'] or '?'} {found['kind']}: {found['message']}")
    return lines


def stop_mode(n: Node) -> str | None:
    """How an Alibaba Cloud node's guards stop it: "economical" where it was launched with the RAM role they ask ECS
    with (its plan's guards say so), else "standard" (ECS's stop of an instance powered off from within, whose compute
    may go on billing: plan/guards.py `Guards.then`); None on another cloud."""
    if n.provider != "alibaba":
        return None
    return "economical" if (n.plan.get("guards") or {}).get("stop_role") else "standard"


def guard_lines(nodes: list[Node]) -> list[str]:
    """One line per Alibaba Cloud node whose guards would stop it in ECS's standard mode, for beneath the status
    table (a node launched before gpuprov gave its nodes the RAM role their stop asks ECS with)."""
    return [f"{n.name}: its guards' stop is ECS's standard mode: the disk is kept and the compute may go on billing "
            f"(`gpuprov stop {n.name}` stops in economical mode; `gpuprov down {n.name}` ends the bill)"
            for n in nodes if stop_mode(n) == "standard" and n.live
            and (n.autostop_seconds is not None or n.ttl_deadline is not None)]


def _cluster_fields(n: Node) -> dict[str, object]:
    """A cluster (`up --nodes N`): its size and its nodes by rank; a single node has neither."""
    if n.cluster_size is None:
        return {}
    return {"cluster_size": n.cluster_size, "members": [
        {"rank": m.rank, "instance_id": m.instance_id, "address": m.address, "private_ip": m.private_ip,
         "public_ip": m.public_ip, "state": m.state} for m in n.members]}


def _stop_fields(n: Node, now: float) -> dict[str, object]:
    """What stop/start, the shutdown action and a budget add to a status row: its disk's price is its cloud's catalog's,
    else the node's own as its cloud priced it (`disk_usd_hour`; none where neither is known: `storage_unknown` says
    why), and whether it can stop is its cloud's rule."""
    from gpuprov.cloud import stale
    from gpuprov.cloud.providers import CLOUDS
    from gpuprov.plan.plan import catalog_for

    found = catalog_for(n.provider)
    storage = found.storage
    month = stale.month_usd(n)
    left = (max(0.0, (n.budget_deadline - now) / 3600 * n.budget_price)
            if n.budget_usd is not None and n.budget_deadline and n.budget_price else None)
    if left is not None and n.state == "stopped" and n.stopped_at:
        left = max(0.0, (n.budget_deadline or 0) - n.stopped_at) / 3600 * (n.budget_price or 0)
    return {
        "spot_type": n.spot_type, "can_stop": n.can_stop or (n.provider in CLOUDS and CLOUDS[n.provider].spot_stops),
        "autostop_action": n.shutdown_action or "terminate",  # nodes launched before stop existed terminate
        # an Alibaba node's guards: economical mode with its RAM role, else ECS's standard mode (compute may bill on)
        **({"autostop_stop_mode": stop_mode(n)} if n.provider == "alibaba" else {}),
        # Alibaba Cloud's spot protection period as `up --spot-duration` asked for it (its plan's record)
        **({"spot_duration_hours": n.plan["spot_duration_hours"]} if "spot_duration_hours" in n.plan else {}),
        "disk_gb": n.disk_gb,
        "storage_usd_month": round(month, 2) if month is not None else None,
        "storage_price": {"usd_per_gb_month": storage.usd_per_gb_month, "volume_type": storage.volume_type,
                          "source": storage.source, "unverified": storage.unverified} if storage else None,
        # where the catalog has no disk price, the node's own as its cloud answered it at launch or stop (DescribePrice)
        "disk_usd_hour": n.disk_usd_hour if storage is None else None,
        "storage_unknown": found.storage_unknown if n.disk_usd_hour is None or storage else None,
        "stopped_at": n.stopped_at,
        **_stale_fields(n, now),
        "reservation_id": n.reservation_id, "reservation_end": n.reservation_end,
        "budget_usd": n.budget_usd, "budget_price_usd_hour": n.budget_price,
        "budget_left_usd": round(left, 2) if left is not None else None,
        "guards_locked_by": n.guards_locked_by,  # `--locked`: only this member may change or lift them
    }


def _stale_fields(n: Node, now: float) -> dict[str, object]:
    """A stopped node: how long, what its disk has cost meanwhile, and whether that is past the config's
    `stopped_for` (else 14 days): what `gc --stopped-for` takes."""
    from gpuprov.cloud import stale

    found = stale.of(n, now)
    if found is None:
        return {"stopped_seconds": None, "disk_usd_while_stopped": None, "stopped_too_long": False}
    return {"stopped_seconds": round(found.stopped_seconds),
            "disk_usd_while_stopped": round(found.disk_usd, 2) if found.disk_usd is not None else None,
            "stopped_too_long": found.stopped_seconds > _flag_seconds()}


def _flag_seconds() -> float:
    from gpuprov.cloud import stale
    from gpuprov.plan import config
    from gpuprov.plan.spec import parse_duration

    given = config.load().stopped_for
    seconds = parse_duration(given, "stopped_for") if given else None
    return float(seconds) if seconds else stale.FLAG_SECONDS


def _stopped_note(nodes: list[Node]) -> str:
    """The price of a stopped node's disk, on each cloud a stopped node is on (its compute is not billed)."""
    from gpuprov.cloud.providers import DEFAULT
    from gpuprov.plan.plan import catalog_for

    notes = []
    for cloud in dict.fromkeys(n.provider for n in nodes if n.state == "stopped"):
        found = catalog_for(cloud)
        storage = found.storage
        where = f" on {found.cloud_title}" if cloud != DEFAULT else ""
        priced = all(n.disk_usd_hour is not None for n in nodes if n.state == "stopped" and n.provider == cloud)
        notes.append(f"; a stopped node's disk{where}: {storage.volume_type} ${storage.usd_per_gb_month:g}/GB-month "
                     f"({storage.source})" if storage else
                     f"; a stopped node's disk{where} is billed, its compute is not: its $/h is the disk's "
                     f"({found.cloud_title}'s price, read at launch or stop)" if priced else
                     f"; a stopped node's disk{where} is billed, its compute is not: no price known "
                     f"({found.storage_unknown})")
    return "".join(notes)


def status_table(nodes: list[Node]) -> FitTable | Text:
    """At 80 columns: name, GPU, state, address, $/h and the guardrails (autostop, TTL left) stay; zone, market,
    age, type and $ so far go first as width runs out."""
    if not nodes:
        return Text("no nodes; `gpuprov up --gpu L4 --spot` launches one")
    from gpuprov.plan.spec import format_duration


    # the guardrails stay longest: what is about to stop a node (or let it run up a bill) is what a user looks for
    table = FitTable([Column("name"), Column("GPU"), Column("type", drop=6), Column("market", drop=8),
                      Column("zone", drop=9), Column("state", prose=True), Column("address"),
                      Column("$/h", "right", drop=2), Column("$ so far", "right", drop=4), Column("age", "right", drop=7),
                      Column("autostop, TTL", prose=True, drop=1, beneath=True)],
                     title="nodes ($/h: on-demand list; $ so far: the price obtained, for the time run)"
                     + _stopped_note(nodes),
                     title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    from gpuprov.state.url import configured

    team = configured() is not None  # a team's nodes: who made each (user@host), beside its name
    for row in status_rows(nodes):
        idle = row["autostop_seconds"]
        left = row["ttl_left_seconds"]
        budget = row["budget_left_usd"]
        guards = [f"{format_duration(idle)} idle" if isinstance(idle, int) else "",
                  f"TTL {format_duration(left)}" if isinstance(left, int) else "",
                  f"${budget:.2f} of ${row['budget_usd']:g} left" if isinstance(budget, float) else ""]
        guard = ", ".join(g for g in guards if g)
        guard = f"{guard} → {row['autostop_action']}" if guard else "off"
        if guard != "off" and row.get("autostop_stop_mode"):
            guard += f" ({row['autostop_stop_mode']})"
        if guard != "off" and row["guards_locked_by"]:
            guard += " (locked)"
        price = row["price_usd_hour"]
        cost = row["cost_so_far_usd"]
        state = str(row["state"]) + (f" ({row['state_reason']})" if row["state_reason"] else "")
        month = row["storage_usd_month"]
        disk_hour = row["disk_usd_hour"]
        if row["state"] == "stopped" and isinstance(disk_hour, float):
            state += f" (compute $0/h, disk ${disk_hour:.4f}/h)"
        elif row["state"] == "stopped" and isinstance(month, float):
            state += f" (disk ${month:.2f}/month)"
        elif row["state"] == "stopped" and row["storage_unknown"]:
            state += " (compute $0/h, disk billed)"
        ends = row["reservation_end"]
        if isinstance(ends, float) and row["state"] not in ("stopped", "terminated"):
            state += f", block ends {time.strftime('%m-%d %H:%M', time.localtime(ends))}"
        stopped, spent = row["stopped_seconds"], row["disk_usd_while_stopped"]
        if row["stopped_too_long"] and isinstance(stopped, int):
            paid = f" (${spent:.2f})" if isinstance(spent, float) else ""
            state += f", stopped {format_duration(stopped)}{paid}: gc --stopped-for"
        members = row.get("members")
        count = len(members) if isinstance(members, list) and members else 1
        each = row["gpu_count"]  # none where the record says none (adopted of a type no catalog knows, no instance)
        gpus = (f"{each * count}× {row['gpu']}" if isinstance(each, int) else "-") + \
            (f" ({count} nodes)" if count > 1 else "")
        if row["state"] == "stopped":  # compute is not billed while stopped: the disk is, per month (in the state),
            # or per hour where its cloud priced it so (its $/h is then the disk's)
            price = disk_hour if isinstance(disk_hour, float) else 0.0
        name = str(row["name"])
        if team and row["owner"]:
            name += f" ({str(row['owner']).split('/')[0]})"
        table.add_row(
            name, gpus, str(row["instance_type"] or "-"),
            str(row["market"]), str(row["zone"] or row["region"]), Text(state, style=STYLE.get(str(row["state"]), "")),
            str(row["address"] or "-"), f"${price * count:.2f}" if isinstance(price, float) else "-",
            f"${cost * count:.2f}" if isinstance(cost, float) else "-", _age(float(str(row["age_seconds"]))), guard,
        )
        for m in members if isinstance(members, list) else []:  # the cluster's nodes beneath its row
            table.add_row(f"  node {m['rank']}", "", "", "", "", Text(str(m["state"])), str(m["address"] or "-"),
                          "", "", "", "")
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
                     Text(phase.outcome, style=STYLE.get(phase.outcome, ""))))
        for a in phase.attempts:
            rows.append((_took(a.start_s), _took(a.end_s - a.start_s), f"  {a.instance_type} {a.zone} {a.market}",
                         Text(a.code or a.outcome, style="yellow" if a.code else "green")))
        for s in phase.steps if phase.name != VERIFY else []:  # verify's one step is the phase
            rows.append((_took(s.start_s), _took(s.end_s - s.start_s), f"  {s.name}",
                         Text(s.outcome, style=STYLE.get(s.outcome, ""))))
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
        table.add_row(price.instance_type, price.zone, f"${price.price:.4f}", price_text(on_demand).removesuffix("/h"), saving)
    return table


def alibaba_live_table(stock: list[ZoneStock], spot: dict[tuple[str, str], SpotPrice], paygo: dict[str, ListPrice],
                       gpus: dict[str, str], region: str) -> FitTable:
    """`gpus --cloud alibaba --live`: each type in each zone that lists it, its stock, spot and pay-as-you-go
    prices per hour (in the currency ECS answered: $ for USD)."""
    table = FitTable([Column("instance type"), Column("GPUs", drop=1), Column("zone"), Column("stock"),
                      Column("spot/h", "right"), Column("pay-as-you-go/h", "right")],
                     title=f"Alibaba Cloud ECS in {region} now", title_justify="left", box=box.SIMPLE_HEAD,
                     pad_edge=False)
    for s in stock:
        here, price = spot.get((s.instance_type, s.zone)), paygo[s.instance_type]
        table.add_row(s.instance_type, gpus.get(s.instance_type, "?"), s.zone,
                      "in stock" if s.available else "sold out",
                      _money(here.price, price.currency) if here else "-", _money(price.price, price.currency))
    return table


def _money(value: float, currency: str) -> str:
    return f"${value:.4f}" if currency == "USD" else f"{value:.4f} {currency}"


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
