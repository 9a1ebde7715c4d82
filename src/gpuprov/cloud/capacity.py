"""Capacity Blocks for ML: `capacity offers` lists what EC2 sells for a GPU, `capacity buy` purchases one.

Offers: every instance type that carries the GPUs asked for (the catalog's, cheapest first) is asked
DescribeCapacityBlockOfferings for that many instances and hours in the window; a type EC2 sells no blocks of (its
answer is an error, or empty) is simply absent. The offers listed are kept (STATE/capacity-offers.json), since
EC2 has no look-up of one offering by its id: `buy` reads the offering's price and window from there.

Buy: a Capacity Block cannot be cancelled ("You can't modify or cancel a Capacity Block", EC2 user guide, "Cancel a
Capacity Reservation", docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-release.html); the CLI says
so before asking. The purchase is recorded before PurchaseCapacityBlock is called (STATE/capacity-blocks.json, state
`buying`), sent once (no ClientToken: gpuprov/mutations.py ONCE), then `bought` with its reservation id, or `failed`
with EC2's words. A purchase whose answer was lost is looked for by its tags among the account's reservations (the
provider, for the settle window): found, it is `bought` and the user is told the answer was lost; not found, it
stays `buying` and the error says so; a later `buy` of it looks again before it asks.
`status` lists the blocks with their window and what they cost.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from gpuprov.cloud.providers.base import BlockOffering, BlockUnknown, Provider, Reservation
from gpuprov.cloud.providers.capabilities import BLOCKS, need, service
from gpuprov.cloud.settle import settle_window
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.files import lock_beside, locked, write_atomic
from gpuprov.paths import state_dir, state_folder

if TYPE_CHECKING:
    from gpuprov.say import Say



@dataclass(frozen=True)
class Block:
    """One Capacity Block offer as listed, or a block bought (its reservation id set)."""

    offering: str
    region: str
    instance_type: str
    zone: str
    count: int
    start: float  # epoch seconds
    end: float
    hours: int
    upfront_usd: float
    state: str = "offered"  # offered | buying | bought | failed
    reservation_id: str | None = None
    note: str = ""

    @property
    def window(self) -> str:
        fmt = "%Y-%m-%d %H:%M"
        return (f"{datetime.fromtimestamp(self.start, timezone.utc).strftime(fmt)} to "
                f"{datetime.fromtimestamp(self.end, timezone.utc).strftime(fmt)} UTC")


def _offers_file() -> Path:
    return state_dir() / "capacity-offers.json"


def _blocks_file() -> Path:
    return state_dir() / "capacity-blocks.json"


def _read(path: Path) -> list[Block]:
    if not path.exists():
        return []
    try:
        return [Block(**row) for row in json.loads(path.read_text())]
    except (ValueError, TypeError) as exc:
        raise GpuprovError(f"{path}: not a list of Capacity Blocks gpuprov wrote ({exc}); move it aside") from None


def _write(path: Path, rows: list[Block]) -> None:
    write_atomic(path, json.dumps([asdict(r) for r in rows], indent=2))


def offers(provider: Provider, region: str, types: list[str], count: int, hours: int, start_after: datetime | None,
           end_before: datetime | None, say: Say) -> list[Block]:
    """Every offering for the types, cheapest first; kept for `buy`."""
    blocks = need(provider, BLOCKS, what="capacity offers")
    found: list[BlockOffering] = []
    for it in types:
        try:
            found += blocks.block_offerings(region, it, count, hours, start_after, end_before)
        except UserInputError:
            raise
        except GpuprovError as exc:  # a type EC2 sells no blocks of, in this region
            say(f"  {it}: {exc}")
    rows = sorted((Block(o.id, region, o.instance_type, o.zone, o.count, o.start.timestamp(), o.end.timestamp(),
                         o.hours, o.upfront_usd) for o in found), key=lambda b: (b.upfront_usd, b.start))
    with locked(lock_beside(_offers_file())):
        kept = {b.offering: b for b in _read(_offers_file()) if b.end > time.time()}
        kept.update({b.offering: b for b in rows})
        _write(_offers_file(), list(kept.values()))
    return rows


def offered(offering: str) -> Block:
    """An offering `capacity offers` listed (EC2 looks an offering up by nothing but the listing)."""
    for b in _read(_offers_file()):
        if b.offering == offering:
            return b
    raise UserInputError("OFFERING", f"{offering!r} is not an offering `gpuprov capacity offers` listed",
                         "list them first: gpuprov capacity offers --gpu H100:8 --hours 24")


def buy(provider: Provider, offering: str, say: Say) -> Block:
    """Record, then PurchaseCapacityBlock, sent once; the record says what came of it. An offering whose last
    purchase's answer was lost (still `buying`) is looked for among the account's reservations first, and asked for
    again only when none of it is there."""
    blocks = need(provider, BLOCKS, what="capacity buy")
    offer = offered(offering)
    if offer.start + offer.hours * 3600 <= time.time():
        raise UserInputError("OFFERING", f"{offering} ended {offer.window}", "gpuprov capacity offers lists new ones")
    with locked(lock_beside(_blocks_file())):
        rows = _read(_blocks_file())
        if any(b.offering == offering and b.state == "bought" for b in rows):
            raise UserInputError("OFFERING", f"{offering} is already bought", "`gpuprov status`")
        unsure = any(b.offering == offering and b.state == "buying" for b in rows)
        if not unsure:
            rows.append(_with(offer, state="buying"))
            _write(_blocks_file(), rows)
    if unsure:
        say(f"{offering}: its last purchase got no answer; looking for it among the account's reservations first")
        found = blocks.find_block(offer.region, _tag(offering))
        if found is not None:
            say(f"  found {found.id} ({found.state}): it was bought then; not buying again")
            return _bought(offering, found)
        say("  not there: asking for it again")
    say(f"buying {offering}: {offer.count} × {offer.instance_type} in {offer.zone}, {offer.window}, "
        f"${offer.upfront_usd:,.2f} up front")
    try:
        purchase = blocks.purchase_block(offer.region, offering, _tag(offering), settle=settle_window())
    except BlockUnknown as exc:
        _set(offering, note=str(exc).split("\n")[0][:300])  # stays `buying`: it may have been bought
        raise
    except GpuprovError as exc:
        _set(offering, state="failed", note=str(exc)[:300])
        raise
    if purchase.lost:
        say(f"  the purchase's answer was lost ({purchase.lost}); {service(provider)} lists the block it bought: "
            f"{purchase.reservation.id} ({purchase.reservation.state}); it was asked for once")
    return _bought(offering, purchase.reservation)


def _bought(offering: str, reservation: Reservation) -> Block:
    """The record of a purchase EC2 made, whether its answer came or the block was found after."""
    return _set(offering, state="bought", reservation_id=reservation.id, note=reservation.state)


def _tag(offering: str) -> str:
    """What a purchase is tagged with (the node tag), which finds it after a lost answer."""
    return f"block-{offering}"


def _with(b: Block, **change: object) -> Block:
    return Block(**{**asdict(b), **change})  # type: ignore[arg-type]


def _set(offering: str, **change: object) -> Block:
    with locked(lock_beside(_blocks_file())):
        rows = _read(_blocks_file())
        at = max(i for i, b in enumerate(rows) if b.offering == offering)  # the record `buy` wrote last
        rows[at] = _with(rows[at], **change)
        _write(_blocks_file(), rows)
    return rows[at]


def bought() -> list[Block]:
    """The blocks this install bought (or is buying), for `status`: those not yet over (read where they are kept,
    with no state folder made for a look)."""
    kept = _read(state_folder() / "capacity-blocks.json")
    return [b for b in kept if b.state in ("buying", "bought") and b.end > time.time() - 86400]
