"""Offline commands: gpus (and live spot prices), plan, render, bundle --offline."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from gpuprov.cli.common import (
    NODES,
    REGION_HELP,
    chosen_cloud,
    cloud_option,
    main,
    make_console,
    pin_options,
    pins_from,
    plan_from,
    quiet,
    region_from,
    sources_flag,
    stack_options,
    store_and_provider,
    warn,
)
from gpuprov.cli.complete import complete_gpu, complete_region
from gpuprov.cli.params import Number
from gpuprov.errors import GpuprovError, UserInputError

if TYPE_CHECKING:
    from datetime import datetime

    from typing_extensions import Unpack

    from gpuprov.cli.option_sets import PinOptions, StackOptions
    from gpuprov.cloud.cluster_network import ClusterLayout
    from gpuprov.cloud.images import ImageChoice
    from gpuprov.cloud.providers.capabilities import ZoneStock
    from gpuprov.plan.catalog import Catalog
    from gpuprov.plan.catalog_alibaba import GpuType
    from gpuprov.plan.plan import Plan


@main.command()
@click.argument("names", nargs=-1, metavar="[GPU]...", shell_complete=complete_gpu)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--live", is_flag=True, help="Ask the cloud (needs credentials): AWS's spot prices per zone; Alibaba "
                                            "Cloud's stock, spot and pay-as-you-go prices per zone.")
@click.option("--region", default=None, metavar="REGION", shell_complete=complete_region,
              help="Region for --live " + REGION_HELP[len("AWS region "):] + " With --cloud alibaba: "
                   "ALIBABA_CLOUD_REGION_ID, then cn-hangzhou.")
@cloud_option
def gpus(names: tuple[str, ...], as_json: bool, live: bool, region: str) -> None:
    """List the GPUs gpuprov knows, with the AWS instance types that carry them and their prices.

    With --cloud alibaba: Alibaba Cloud's GPU types (--live: each zone's stock, spot and pay-as-you-go prices).

    Name GPUs to see only those: `gpuprov gpus H100 a100-80gb` (any spelling `--gpu` takes).
    """
    from gpuprov.cli.report import gpus_table
    from gpuprov.plan import catalog

    if chosen_cloud() == "alibaba":
        if live:
            _alibaba_live(names, region_from(region).name, as_json)
        else:
            _alibaba_gpus(names, as_json)
        return
    if live:
        _live_gpus(names, region_from(region).name, as_json)
        return
    cat = catalog.load().only(names)
    if as_json:
        rows = [
            {**gpu.model_dump(), "instance_types": [it.model_dump() for it in cat.instance_types_for(gpu)]}
            for gpu in cat.gpus
        ]
        click.echo(json.dumps({"prices_as_of": cat.prices_as_of, "price_region": cat.price_region, "gpus": rows}, indent=2))
        return
    make_console().print(gpus_table(cat))


def _alibaba_gpus(names: tuple[str, ...], as_json: bool) -> None:
    """Alibaba Cloud's GPU instance types as its documentation lists them (data/catalog-alibaba.yaml, the facts `plan
    --cloud alibaba` plans on), GPUs named as `--gpu` takes them: the facts, with no price yet (DescribePrice is not
    read)."""
    from gpuprov.plan import catalog_alibaba

    ali = catalog_alibaba.facts()
    rows = _alibaba_types(names)
    if as_json:
        click.echo(json.dumps({"cloud": "alibaba", "source": ali.families_doc, "read": ali.read, "prices": None,
                               "instance_types": [t.model_dump() for t in rows]}, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"GPUs on Alibaba Cloud ECS, as its documentation lists them ({ali.read}); no prices yet",
                  title_justify="left")
    for head, right in (("GPU", False), ("mem/GPU", True), ("instance type", False), ("GPUs", True), ("vCPU", True),
                        ("memory", True)):
        table.add_column(head, justify="right" if right else "left", no_wrap=not right)
    for t in rows:
        table.add_row(t.gpu, f"{t.gpu_memory_gib} GiB", t.instance_type, str(t.gpus), str(t.vcpu),
                      f"{t.memory_gib:g} GiB")
    console = make_console()
    console.print(table)
    console.print(f"source: {ali.families_doc}", soft_wrap=True, markup=False)


def _alibaba_types(names: tuple[str, ...]) -> list[GpuType]:
    """The documented types whose GPU the names name (every one without names), by the plan's name or Alibaba's."""
    from gpuprov.plan import catalog_alibaba

    ali = catalog_alibaba.facts()
    wanted = {g.name for g in catalog_alibaba.catalog().only(names).gpus}
    documented = {n.upper() for n in names}  # A100: both memories, as Alibaba names the GPU
    return [t for t in ali.gpu_types if ali.plan_gpu(t) in wanted or t.gpu.upper() in documented]


def _alibaba_live(names: tuple[str, ...], region: str, as_json: bool) -> None:
    """`gpus --cloud alibaba --live`: the documented GPU types the region lists now, each zone's stock
    (DescribeAvailableResource), its latest spot price (DescribeSpotPriceHistory) and the type's pay-as-you-go
    price (DescribePrice), each said with its source and when it was read; ECS's own code and message when it
    refuses (the error path of every call)."""
    from datetime import datetime, timezone

    from gpuprov.cloud.providers.capabilities import LIVE_OFFERS, need

    types = {t.instance_type: t for t in _alibaba_types(names)}
    provider = store_and_provider()[1]
    offers = need(provider, LIVE_OFFERS, what="--live")
    stock_read = datetime.now(timezone.utc)
    stock = offers.zone_stock(region, list(types))
    listed = sorted({s.instance_type for s in stock})
    spot_read = datetime.now(timezone.utc)
    spot = {(p.instance_type, p.zone): p for p in provider.prices(region, listed)}
    paygo = {name: offers.list_price(region, name) for name in listed}
    unlisted = sorted(set(types) - set(listed))
    if as_json:
        def row(s: ZoneStock) -> dict[str, object]:
            here, price = spot.get((s.instance_type, s.zone)), paygo[s.instance_type]
            return {"instance_type": s.instance_type, "gpu": types[s.instance_type].gpu,
                    "gpus": types[s.instance_type].gpus, "zone": s.zone,
                    "stock": {"available": s.available, "status": s.status, "source": "DescribeAvailableResource",
                              "read": _when(stock_read)},
                    "spot": {"price_hour": here.price, "currency": price.currency, "at": _when(here.at),
                             "source": "DescribeSpotPriceHistory", "read": _when(spot_read)} if here else None,
                    "pay_as_you_go": {"price_hour": price.price, "currency": price.currency, "source": "DescribePrice",
                                      "read": _when(price.at)}}

        click.echo(json.dumps({"cloud": "alibaba", "region": region, "rows": [row(s) for s in stock],
                               "not_listed": unlisted}, indent=2))
        return
    from gpuprov.cli.report import alibaba_live_table

    console = make_console()
    if stock:
        console.print(alibaba_live_table(stock, spot, paygo, {n: f"{t.gpus}× {t.gpu}" for n, t in types.items()},
                                         region))
        spots = sorted({str(_when(p.at)) for p in spot.values() if p.at is not None})
        read = min(p.at for p in paygo.values())
        for line in (f"stock: DescribeAvailableResource (pay-as-you-go), read {_when(stock_read)}",
                     "spot: DescribeSpotPriceHistory, each zone's latest price"
                     + (f" (of {', '.join(spots)})" if spots else "") + f", read {_when(spot_read)}",
                     f"pay-as-you-go: DescribePrice (Linux, per hour), read {_when(read)}"):
            console.print(line, markup=False, highlight=False)
    else:
        console.print(f"no GPU type gpuprov knows is listed in {region} right now", markup=False, highlight=False)
    if unlisted:
        console.print(f"not listed in {region}: {', '.join(unlisted)}", markup=False, highlight=False)


def _when(at: datetime | None) -> str | None:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC") if at is not None else None


@main.command()
@stack_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--show-scripts", is_flag=True, help="Also print every rendered script.")
@click.option("--hours", type=Number(0, 100_000, low_open=True), default=None, metavar="H",
              help="Also print what H hours (0 < H ≤ 100_000) cost at the on-demand list price (and how long a --budget lasts).")
@click.option("--live", is_flag=True, help="Ask AWS (needs credentials): which image `up` would launch and which "
                                            "steps would run on it; with --hours also today's cheapest spot price.")
@click.option("--image", default=None, metavar="fresh|dlami|ID|NAME", help="With --live: as `up --image`.")
@click.option("--nodes", type=NODES, default=1, show_default=True,
              help="A cluster of this many nodes: also print its placement group, EFA interfaces and network.")
def plan(as_json: bool, show_scripts: bool, hours: float | None, live: bool, image: str | None, nodes: int,
         **kw: Unpack[StackOptions]) -> None:
    """Show what `up` would launch and install, without touching the network.

    Picks the cheapest instance type that carries the GPUs, resolves one consistent
    driver / CUDA / torch / Python stack (or explains why the pins cannot work), and lists
    the bootstrap steps in order.
    """
    from gpuprov.cli.report import plan_view
    from gpuprov.cloud import cluster_network as net

    if image is not None and not live:
        raise click.UsageError("--image is looked up in AWS: add --live")
    the_plan = plan_from(kw, live=live, planning=True)
    if the_plan.request.cloud != "aws":
        _plan_elsewhere(the_plan, hours, nodes)
    layout = _cluster_layout(the_plan, nodes)
    if layout is not None:
        the_plan = net.with_efa_step(the_plan, layout)
    estimate = the_plan.estimate(hours, _cheapest_spot(the_plan) if live and hours is not None else None)
    chosen = _image_choice(the_plan, image) if live else None
    sizes = _data_sizes(the_plan) if live and the_plan.playbook.data else None
    if as_json:
        data = the_plan.summary()
        data["warnings"] = list(the_plan.warnings)  # not in summary(): it is recorded in the bundle, and ages
        if layout is not None:
            data["cluster"] = net.layout_summary(layout, nodes)
        if estimate:
            data["estimate"] = estimate
        if chosen is not None:
            data["image"] = chosen.summary(the_plan)
        if sizes is not None:
            data["data"] = sizes
        if show_scripts:
            data["scripts"] = {s.filename: s.text for s in the_plan.bundle().scripts}
        click.echo(json.dumps(data, indent=2))
        return
    console = make_console()
    console.print(plan_view(the_plan))
    if layout is not None:
        console.print("Cluster", style="bold")
        for line in net.describe(layout, nodes):
            console.print(f"  {line}", markup=False)
    if chosen is not None:
        summary = chosen.summary(the_plan)
        console.print(chosen.line(), markup=False, highlight=False)
        console.print(f"  steps that will run: {', '.join(summary['steps_to_run']) or 'none'} (+ guards, verify)"  # type: ignore[arg-type]
                      + (f"; already on the image: {', '.join(chosen.on_image)}" if chosen.on_image else ""),
                      markup=False, highlight=False)
    if sizes is not None:
        from gpuprov.cloud.data import size_text

        console.print("Data (S3 now)", style="bold")
        for row in sizes:
            held = f": {row['objects']} objects, {size_text(row['bytes'])}" if "bytes" in row else \
                f" (on {', '.join(row['when'])})"
            console.print(f"  {row['from']} → {row['to']}{held}", markup=False, highlight=False)
    if estimate:
        price = estimate["usd_hour_on_demand"]
        if hours:
            spot = " (spot usually bills less: `gpuprov gpus --live` shows today's price)" if kw["spot"] else ""
            console.print(f"estimate for {hours:g}h: ${estimate['usd_on_demand']:,.2f} at the on-demand list price "
                          f"${price:,.2f}/h{spot}", markup=False)
        if "usd_spot" in estimate:
            console.print(f"  at today's spot price ${estimate['usd_hour_spot']:.4f}/h ({estimate['spot_zone']}): "
                          f"${estimate['usd_spot']:,.2f}", markup=False)
        elif live:
            console.print(f"  no spot price for {the_plan.instance.name if the_plan.instance else '?'} in "
                          f"{the_plan.request.region} right now", markup=False)
        if "budget_usd" in estimate:
            from gpuprov.plan.plan import budget_decides

            spot = " (on spot the deadline comes from the spot price obtained at launch)" if kw["spot"] else ""
            ttl = the_plan.request.ttl_seconds
            first = f"; --ttl {kw['ttl']} comes first, so the TTL decides" if ttl is not None and \
                not budget_decides(the_plan.guards) else ""
            console.print(f"budget ${estimate['budget_usd']:g} lasts {estimate['budget_hours']:.1f}h at "
                          f"${price:.3f}/h{first}; then {the_plan.guards.then}{spot}", markup=False)
    if show_scripts:
        from rich.syntax import Syntax

        for script in the_plan.bundle().scripts:
            console.rule(script.filename)
            console.print(Syntax(script.text, "bash", line_numbers=False))


def _plan_elsewhere(the_plan: Plan, hours: float | None, nodes: int) -> None:
    """What `plan` only does on AWS, refused on another cloud's catalog: an estimate needs a price; a cluster only on
    a cloud whose layout cluster_network knows (Alibaba Cloud's deployment sets)."""
    from gpuprov.cloud.providers import title
    from gpuprov.plan.plan import catalog_for, refuse_unpriced

    if hours is not None:
        refuse_unpriced(catalog_for(the_plan.request.cloud), "--hours")
    if nodes > 1 and the_plan.request.cloud != "alibaba":
        raise UserInputError("--nodes", f"gpuprov plans no cluster on {title(the_plan.request.cloud)} yet",
                             "plan one node (leave --nodes out)")


def _cluster_layout(the_plan: Plan, nodes: int) -> ClusterLayout | None:
    """The cluster's network for the plan's instance type (None for one node); bad --nodes is refused here."""
    from gpuprov.cloud.cluster_network import network_for
    from gpuprov.cloud.cluster_up import MAX_NODES

    if nodes == 1:
        return None
    if nodes > MAX_NODES:
        raise UserInputError("--nodes", f"{nodes} is not a cluster size", f"2 to {MAX_NODES}")
    if the_plan.instance is None:
        raise UserInputError("--nodes", "no instance type carries these GPUs", "pick another --gpu")
    return network_for(the_plan.instance, the_plan.request.cloud)


@main.command()
@stack_options
@click.option("-o", "--output", "out", required=True, metavar="FOLDER",
              help="Folder to write the scripts and manifest.json into: new, empty, or one an earlier render "
                   "wrote (the scripts its manifest lists are replaced).")
def render(out: str, **kw: Unpack[StackOptions]) -> None:
    """Write the bootstrap bundle: one script per step plus manifest.json (sha256 + resolved stack).

    Each script is self-contained bash; run them in order as root on the GPU host.
    """
    the_plan = plan_from(kw, planning=True)
    written = the_plan.bundle().write(out)
    click.echo(f"wrote {len(written) - 1} scripts and manifest.json to {written[-1].parent}")
    for path in written:
        click.echo(f"  {path.name}")


@main.command()
@pin_options
@click.option("--gpu", required=True, shell_complete=complete_gpu, help="The GPU the hosts carry: A100, h100, l40s.")
@click.option("--arch", type=click.Choice(["x86_64", "aarch64"]), default=None,
              help="The hosts' CPU (`uname -m`) [default: the GPU's only one (GH200: aarch64), else x86_64]: NVIDIA's "
                   "repository folder (sbsa for aarch64) and the wheels' platform follow it.")
@click.option("--offline", is_flag=True, help="Gather everything the plan downloads, for hosts with no route out "
                                               "(required: the one kind of bundle there is).")
@click.option("-o", "--output", "out", required=True, metavar="DIR",
              help="Folder to download into (made if missing; a rerun downloads only what changed).")
@click.option("--json", "as_json", is_flag=True, help="Print a summary as JSON instead of progress lines.")
def bundle(gpu: str, arch: str | None, offline: bool, out: str, as_json: bool, **kw: Unpack[PinOptions]) -> None:
    """Download what a plan installs into DIR, for `bootstrap HOST --offline DIR` on a host with no network.

    On a connected machine, for the plan `bootstrap --gpu … --os … -p …` makes for a host: NVIDIA's driver,
    Fabric Manager and toolkit packages with their dependencies (checked against the repository's signed index,
    which is copied with them), the wheels for the target's Python and CPU (pip download; torch's exactly as the
    wheel lock `gpuprov facts refresh` made pins them, by sha256, where one fits), the installers, and
    DIR/manifest.json (each file, its sha256, where it came from, the plan it serves, the wheel lock).
    """
    from pathlib import Path

    from gpuprov.hosts.planner import gpu_arch
    from gpuprov.plan.plan import make_host_plan
    from gpuprov.sources import offline as download
    from gpuprov.sources.http import SourceUnreachable

    if not offline:
        raise click.UsageError("bundle makes offline bundles only: add --offline")
    the_plan = make_host_plan(gpu, kw["playbook"], kw["os_name"] or "ubuntu-24.04", pins_from(kw),
                              jupyter=kw["jupyter"], docker=kw["docker"], sources_flag=sources_flag(kw),
                              arch=arch or gpu_arch(gpu))  # type: ignore[arg-type]  # click's Choice
    say = (lambda _line: None) if as_json or quiet() else (lambda line: click.echo(line, err=True))
    try:
        result = download.make(the_plan, Path(out), say)
    except SourceUnreachable as exc:
        raise GpuprovError(f"{exc}; nothing more was downloaded (run it again to resume)") from None
    manifest = result.manifest
    total = sum(i.size for i in manifest.items)
    from typing import get_args

    from gpuprov.plan.offline import Kind

    kinds = {k: sum(1 for i in manifest.items if i.kind == k) for k in get_args(Kind)}
    # torch's wheels: pinned by the lock they were downloaded by, or said not to be (the plan's words)
    wheels = the_plan.wheels if "torch" in manifest.names("wheel") else None
    if as_json:
        click.echo(json.dumps({"folder": str(Path(out).resolve()), "plan": manifest.plan.model_dump(mode="json"),
                               "files": kinds, "bytes": total, "from_os": result.from_os, "wheels": wheels},
                              indent=2))
        return
    click.echo(f"wrote {len(manifest.items)} files ({total / 2**20:,.1f} MiB: {kinds['package']} packages, "
               f"{kinds['wheel']} wheels, {kinds['installer']} installers, {kinds['python']} Python builds) and "
               f"manifest.json to {Path(out).resolve()}")
    if result.from_os:
        click.echo(f"from the OS's own repositories (not bundled): {', '.join(result.from_os)}")
    if wheels:
        click.echo(f"wheels: {wheels}")


def _image_choice(plan: Plan, image: str | None) -> ImageChoice:
    from gpuprov.cloud.images import choose

    _store, provider = store_and_provider()
    return choose(plan, image, provider)


def _data_sizes(plan: Plan) -> list[dict[str, Any]]:
    """Each download's S3 prefix and what it holds: cloud/data.py's rows as --json prints them (arbitrary JSON)."""
    from gpuprov.cloud.data import download_sizes

    _store, provider = store_and_provider()
    return download_sizes(plan, provider)


def _cheapest_spot(plan: Plan) -> tuple[str, float] | None:
    """Today's cheapest spot offer for the plan's instance type in its region: (zone, $/h)."""
    if plan.instance is None:
        return None
    _store, provider = store_and_provider()
    prices = provider.prices(plan.request.region, [plan.instance.name])
    return (prices[0].zone, prices[0].price) if prices else None


def _live_gpus(names: tuple[str, ...], region: str, as_json: bool) -> None:
    """`gpus --live`: the region's GPU types as EC2 describes them now (its error when it does not answer),
    what the snapshot has that EC2 no longer describes, and today's spot prices."""
    from gpuprov.cloud.instance_facts import live_catalog
    from gpuprov.plan import catalog

    shipped = catalog.load()
    cat = live_catalog(shipped, store_and_provider()[1], region, lambda line: warn(line), fallback=False).only(names)
    cat = cat.model_copy(update={"instance_types": tuple(it for it in cat.instance_types if not it.cpu_only)})  # GPUs
    if not as_json:
        known = {it.name for it in shipped.instance_types}
        console = make_console()
        for it in cat.instance_types:
            if it.retired:
                console.print(f"{it.name}: gone, never chosen ({it.retired})", markup=False, highlight=False)
            elif it.name not in known:
                console.print(f"{it.name}: {it.gpus}× {it.gpu}, from EC2 (not in the shipped catalog)",
                              markup=False, highlight=False)
        for name, gpu in sorted(cat.unplannable.items()) if not names else ():
            console.print(f"{name}: {gpu}, not planned (a GPU gpuprov has no compute capability for)",
                          markup=False, highlight=False)
        for name, part in sorted(cat.fractional.items()) if not names else ():
            console.print(f"{name}: {part}, not planned (a fractional GPU: NVIDIA's vGPU driver)",
                          markup=False, highlight=False)
    _live_prices(cat, region, as_json)


def _live_prices(cat: Catalog, region: str, as_json: bool) -> None:
    from gpuprov.cli.report import live_prices_table

    _store, provider = store_and_provider()
    on_demand = {it.name: it.price_usd_hour for it in cat.instance_types if not it.retired}
    offered = provider.offerings(region, list(on_demand))
    prices = provider.prices(region, sorted(offered))
    rows = [(p, on_demand.get(p.instance_type)) for p in prices]
    if as_json:
        click.echo(json.dumps([
            {"instance_type": p.instance_type, "zone": p.zone, "spot_usd_hour": p.price, "on_demand_usd_hour": od,
             "saving_pct": round((1 - p.price / od) * 100, 1) if od else None} for p, od in rows], indent=2))
        return
    console = make_console()
    if rows:
        console.print(live_prices_table(rows, region))
    else:  # an empty table reads as "nothing is offered"; say which it is
        console.print(f"no spot price in {region} right now for the {len(offered)} GPU type(s) it offers"
                      + (" (EC2 answered none, or only $0.0000, which is no price)" if offered else ""),
                      markup=False, highlight=False)
    from gpuprov.cli.capacity import reservation_lines
    from gpuprov.cloud.reservations import live_rows

    try:
        held = reservation_lines(live_rows(provider, region), region)  # capacity held: `up --reservation`
    except GpuprovError as exc:  # no ec2:DescribeCapacityReservations, say: the prices stand on their own
        held = [f"could not list Capacity Reservations: {exc}"]
    for line in held:
        console.print(line, markup=False, highlight=False)
