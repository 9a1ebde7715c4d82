"""`gpuprov capacity`: Capacity Blocks for ML (offers, buy) and the account's reservations (list)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import click

from gpuprov.cli.common import NODES, confirm, main, make_console, region_from, say_to, store_and_provider
from gpuprov.cli.complete import complete_gpu, complete_region
from gpuprov.cli.params import Number
from gpuprov.errors import UserInputError

if TYPE_CHECKING:
    from gpuprov.cloud.capacity import Block
    from gpuprov.cloud.providers.base import Provider, Reservation

REGION_OPT = click.option("--region", default=None, metavar="REGION", shell_complete=complete_region,
                          help="AWS region [default: the AWS chain's].")


@main.group()
def capacity() -> None:
    """Capacity Blocks for ML (GPU capacity bought ahead for a window) and the account's Capacity Reservations."""


def _moment(text: str | None, flag: str) -> datetime | None:
    """An ISO 8601 date or time (UTC unless it says otherwise)."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UserInputError(flag, f"{text!r} is not a date or time", "e.g. 2026-12-24 or 2026-12-24T08:00Z") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _block_row(b: Block) -> dict[str, object]:
    return {"offering": b.offering, "region": b.region, "instance_type": b.instance_type, "zone": b.zone,
            "count": b.count, "start": b.start, "end": b.end, "hours": b.hours, "upfront_usd": b.upfront_usd,
            "state": b.state, "reservation_id": b.reservation_id}


@capacity.command()
@click.option("--gpu", required=True, shell_complete=complete_gpu, help="GPU[:COUNT] per node, e.g. H100:8.")
@click.option("--nodes", type=NODES, default=1, show_default=True, help="Instances in the block (1 to 64).")
@click.option("--hours", type=Number(24, 182 * 24, whole=True), default=24, show_default=True,
              help="How long: 24-hour steps up to 14 days, then 7-day steps up to 182 days (EC2's rule).")
@click.option("--start-after", default=None, metavar="WHEN", help="Offers starting at or after this (ISO 8601, UTC).")
@click.option("--end-before", default=None, metavar="WHEN", help="Offers ending at or before this (ISO 8601, UTC).")
@REGION_OPT
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def offers(gpu: str, nodes: int, hours: int, start_after: str | None, end_before: str | None, region: str | None,
           as_json: bool) -> None:
    """Capacity Block offerings for a GPU: price, start, end, zone (DescribeCapacityBlockOfferings)."""
    from gpuprov.cloud import capacity as blocks
    from gpuprov.plan import catalog
    from gpuprov.plan.plan import choose_instances

    if (hours > 14 * 24 and hours % (7 * 24)) or (hours <= 14 * 24 and hours % 24):
        raise UserInputError("--hours", f"{hours} is not a Capacity Block's length",
                             "24-hour steps up to 336 (14 days), then 168-hour steps up to 4368 (182 days)")
    after, before = _moment(start_after, "--start-after"), _moment(end_before, "--end-before")
    name, count = catalog.parse_gpu_request(gpu)
    types = [it.name for it in choose_instances(catalog.load().gpu(name), count)]
    where = region_from(region).name
    _store, provider = store_and_provider()
    console = make_console(stderr=as_json)
    found = blocks.offers(provider, where, types, nodes, hours, after, before, say_to(console))
    if as_json:
        click.echo(json.dumps([_block_row(b) for b in found], indent=2))
        return
    if not found:
        console.print(f"no Capacity Block offerings for {nodes} × {', '.join(types)} ({hours}h) in {where}", markup=False)
        return
    for b in found:
        console.print(f"{b.offering}  {b.count} × {b.instance_type}  {b.zone}  {b.window}  ${b.upfront_usd:,.2f}",
                      markup=False, highlight=False)
    console.print("buy one (it cannot be cancelled): gpuprov capacity buy OFFERING", markup=False)


@capacity.command()
@click.argument("offering")
@click.option("-y", "--yes", is_flag=True, help="Do not ask (needed without a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def buy(offering: str, yes: bool, as_json: bool) -> None:
    """Buy a Capacity Block offering `capacity offers` listed. It cannot be cancelled, and is paid up front."""
    from gpuprov.cloud import capacity as blocks

    offer = blocks.offered(offering)
    console = make_console(stderr=as_json)
    console.print(f"{offering}: {offer.count} × {offer.instance_type} in {offer.zone}, {offer.window}, "
                  f"${offer.upfront_usd:,.2f} up front. A Capacity Block cannot be cancelled or changed once bought "
                  "(EC2 ends its instances 30 minutes before its end).", markup=False, highlight=False)
    if not yes:
        confirm(f"Buy {offering} for ${offer.upfront_usd:,.2f}, which cannot be cancelled?", "buy it")
    _store, provider = store_and_provider()
    got = blocks.buy(provider, offering, say_to(console))
    if as_json:
        click.echo(json.dumps(_block_row(got), indent=2))
        return
    console.print(f"bought: {got.reservation_id} ({got.note}); launch into it when it starts: "
                  f"gpuprov up NAME --gpu … --capacity-block {got.reservation_id} [--wait …]", markup=False)


@capacity.command(name="list")
@REGION_OPT
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(region: str | None, as_json: bool) -> None:
    """The account's active and scheduled reservations for GPU types, and the Capacity Blocks bought here."""
    from gpuprov.cloud import capacity as blocks
    from gpuprov.cloud import reservations

    where = region_from(region).name
    rows = reservations.live_rows(_reading_provider(), where)
    mine = blocks.bought()
    if as_json:
        click.echo(json.dumps({"reservations": [reservation_row(r) for r in rows],
                               "blocks": [_block_row(b) for b in mine]}, indent=2))
        return
    console = make_console()
    for line in reservation_lines(rows, where) + block_lines(mine):
        console.print(line, markup=False, highlight=False)


def _reading_provider() -> Provider:
    """The account's reservations are no install's: with no state yet, a look makes none (nor an install id)."""
    from gpuprov.cli.common import provider_owned_by
    from gpuprov.cloud.tags import legacy_owner
    from gpuprov.state import unrecorded

    if unrecorded() is None:
        return store_and_provider()[1]
    return provider_owned_by(legacy_owner())  # tags nothing: it only reads


def reservation_row(r: Reservation) -> dict[str, object]:
    return {"id": r.id, "instance_type": r.instance_type, "zone": r.zone, "total": r.total, "available": r.available,
            "state": r.state, "start": r.start.isoformat() if r.start else None,
            "end": r.end.isoformat() if r.end else None, "match": r.match, "kind": r.kind, "block_id": r.block_id}


def reservation_lines(rows: list[Reservation], region: str) -> list[str]:
    if not rows:
        return [f"no active Capacity Reservations for GPU types in {region}"]
    out = [f"Capacity Reservations in {region} (`up --reservation ID`, or `--capacity-block ID` for a block):"]
    for r in rows:
        end = f", ends {r.end:%Y-%m-%d %H:%M} UTC" if r.end else ""
        out.append(f"  {r.id}  {r.instance_type}  {r.zone}  {r.available}/{r.total} free  {r.state}  "
                   f"{'Capacity Block' if r.kind == 'capacity-block' else r.match}{end}")
    return out


def block_lines(mine: list[Block]) -> list[str]:
    return [f"block {b.reservation_id or '(buying ' + b.offering + ')'}: {b.count} × {b.instance_type} {b.zone}, "
            f"{b.window}, ${b.upfront_usd:,.2f} ({b.state})" for b in mine]
