"""Launching into capacity held beforehand: On-Demand Capacity Reservations and Capacity Blocks for ML.

`up --reservation cr-…` asks only for what the reservation holds (its instance type, in its zone, on-demand) and
targets it (CapacityReservationSpecification.CapacityReservationTarget); `--reservation open` says EC2's default
out loud and asks first where an active open reservation of the type has room. `up --capacity-block cr-…|cb-…`
targets a Capacity Block with MarketType capacity-block (EC2 guide, "Launch instances into Capacity Blocks": "you
must specify the Capacity Block reservation ID"; "Your instance can't launch in a subnet in a different Availability
Zone"). A block that has not started is refused with its start time, or, with `up --wait`, waited for (each pass
answers InsufficientInstanceCapacity until it starts). The node records the reservation and a block's end, which
`status` shows and the node's interrupt watch acts on (plan.BLOCK_WARN_SECONDS before it).

Checked before anything is recorded (launchpad): the reservation exists (InvalidCapacityReservationId.NotFound is
bad input), is active (or a scheduled block, waited for), holds a type that carries the plan's GPUs, and is not for
spot. States are EC2's CapacityReservationState (botocore's EC2 model: active, expired, cancelled, pending, failed,
scheduled, payment-pending, payment-failed, …).

`narrow` (called by launch.launchpad, so before anything is recorded) leaves the reservation's one candidate, or
puts open reservations' candidates first; the launch carries the target (and MarketType capacity-block,
providers/aws_instances.py). The node records `reservation_id` and a block's `reservation_end`; the interrupt
watch (templates/guard_interrupt_watch.sh.j2) warns with `wall` and runs the hook once BLOCK_WARN_SECONDS before the
end, ahead of EC2's own termination, which begins 30 minutes before it. The calls are providers/aws_capacity.py.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from gpuprov.cloud.failover import Candidate, Order
from gpuprov.cloud.providers.base import Provider, Reservation
from gpuprov.cloud.providers.capabilities import BLOCKS, need, offered, service
from gpuprov.errors import UserInputError
from gpuprov.plan.plan import Plan
from gpuprov.state import Node

if TYPE_CHECKING:
    from gpuprov.say import Say

USABLE = ("active",)


def _when(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC") if t is not None else "?"


def find(provider: Provider, region: str, given: str, flag: str) -> Reservation:
    """The reservation a cr-… (or a block's cb-…) names; bad input when the account has none such."""
    if given.startswith("cb-"):
        blocks = [r for r in need(provider, BLOCKS, what=flag).reservations(region) if r.block_id == given]
        if not blocks:
            raise UserInputError(flag, f"no Capacity Block {given} in {region}", "`gpuprov status` lists the blocks bought")
        return blocks[0]
    if not given.startswith("cr-"):
        raise UserInputError(flag, f"{given!r} is not a Capacity Reservation id",
                             "cr-… (or open)" if flag == "--reservation" else "cr-… or cb-…")
    try:
        (found,) = need(provider, BLOCKS, what=flag).reservations(region, [given])
    except UserInputError as exc:  # the provider's refusal of an unknown id, blamed on the flag that gave it
        raise UserInputError(flag, exc.problem, exc.hint) from None
    return found


def narrow(order: Order, plan: Plan, opts: Any, provider: Provider, region: str,
           say: Say) -> tuple[Order, Reservation | None]:
    """The candidates a reservation allows (targeted), or open reservations' first (open); and the reservation the
    launch targets (a block named by its cb-… resolved), read once for the launch and the record."""
    if plan.request.spot:
        raise UserInputError("--reservation" if opts.reservation else "--capacity-block",
                             "reserved capacity is on-demand", "drop --spot")
    if opts.reservation == "open" and not opts.capacity_block:
        return _open_first(order, provider, region, say), None
    flag = "--capacity-block" if opts.capacity_block else "--reservation"
    res = find(provider, region, str(opts.capacity_block or opts.reservation), flag)
    if res.state == "payment-pending":
        res = _paid(res, provider, region, flag, say)
    if opts.capacity_block and res.kind != "capacity-block":
        raise UserInputError(flag, f"{res.id} is an On-Demand Capacity Reservation, not a Capacity Block",
                             f"--reservation {res.id}")
    if not opts.capacity_block and res.kind == "capacity-block":
        raise UserInputError(flag, f"{res.id} is a Capacity Block", f"--capacity-block {res.id}")
    if res.state == "scheduled" and res.kind == "capacity-block" and not opts.patient:
        raise UserInputError(flag, f"{res.id} starts at {_when(res.start)}",
                             f"add --wait (e.g. --wait {_hours_to(res.start)}h) to launch when it starts")
    if res.state not in USABLE and not (res.state == "scheduled" and opts.patient):
        raise UserInputError(flag, f"{res.id} is {res.state}", "only an active reservation can be launched into")
    types = {c.name: c.price_usd_hour for c in plan.candidates}
    if res.instance_type not in types:
        raise UserInputError(flag, f"{res.id} holds {res.instance_type}, which does not carry {plan.count}× "
                             f"{plan.gpu.name if plan.gpu else '?'}",
                             f"--gpu for what it holds, or one of: {', '.join(sorted(types))}")
    if order.candidates and not any(c.zone == res.zone for c in order.candidates):
        raise UserInputError("--subnet", f"{res.id} is in {res.zone}, and this launch can only go to "
                             f"{', '.join(sorted({c.zone for c in order.candidates}))}", "a subnet in its zone")
    say(f"reservation {res.id}: {res.instance_type} in {res.zone}, {res.available} of {res.total} free, {res.state}"
        + (f", ends {_when(res.end)}" if res.end else ""))
    return Order((Candidate(res.instance_type, res.zone, "on-demand", types[res.instance_type]),), order.skipped,
                 order.max_hourly), res


PAYMENT_WAIT = 300.0  # seconds a freshly bought block may stay payment-pending before `up` gives up on it


def _paid(res: Reservation, provider: Provider, region: str, flag: str, say: Say) -> Reservation:
    """A block bought moments ago is `payment-pending` until EC2 has taken the payment: waited for, not refused."""
    say(f"{res.id} is payment-pending (bought moments ago): waiting for {service(provider)} to take the payment")
    deadline, wait = time.monotonic() + PAYMENT_WAIT, float(getattr(provider, "poll", 2.0))
    while res.state == "payment-pending":
        if time.monotonic() + wait > deadline:
            raise UserInputError(flag, f"{res.id} is still payment-pending after {PAYMENT_WAIT:.0f}s",
                                 "`gpuprov capacity list` shows its state; launch into it once it is scheduled or "
                                 "active")
        time.sleep(wait)
        wait = min(wait * 2, 30.0)
        (res,) = need(provider, BLOCKS, what=flag).reservations(region, [res.id])
    say(f"  {res.id} is {res.state}")
    return res


def startable(node: Node, instance_type: str, instance_id: str, provider: Provider) -> None:
    """A stopped node launched into a reservation starts only in it: refused before StartInstances when the
    reservation is over or holds another type (a resize): "you can't restart them until you target another
    Capacity Block in the active state" (EC2 user guide, Capacity Blocks). Its disk bills meanwhile."""
    if not node.reservation_id:
        return
    found = [r for r in need(provider, BLOCKS, what=node.name).reservations(node.region) if r.id == node.reservation_id]
    res = found[0] if found else None
    ended = res is None or res.state in ("expired", "cancelled", "failed", "payment-failed") or (
        res.end is not None and res.end.timestamp() <= time.time())
    other = res is not None and res.instance_type != instance_type
    if not (ended or other):
        return
    what = "Capacity Block" if (res is not None and res.kind == "capacity-block") or node.reservation_end else \
        "Capacity Reservation"
    why = (f"its {what} {node.reservation_id} " + ("has ended" if ended else f"holds {res.instance_type if res else '?'}"
                                                   f", not {instance_type}"))
    disk = f"its {node.disk_gb} GB disk" if node.disk_gb else "its disk"
    raise UserInputError("NAME", f"{node.name} cannot start: {why}, and {service(provider)} starts it only there; {disk} bills "
                         "while it stays stopped",
                         f"`gpuprov start {node.name} --move` takes it (image, disk and all) to on-demand capacity "
                         f"in another zone; or make it start outside the reservation: aws ec2 "
                         f"modify-instance-capacity-reservation-attributes --region {node.region} --instance-id "
                         f"{instance_id} --capacity-reservation-specification CapacityReservationPreference=open, then "
                         f"`gpuprov start {node.name}`; or `gpuprov down {node.name}` (its disk too)")


def _hours_to(t: datetime | None) -> int:
    return max(1, int(((t.timestamp() if t else time.time()) - time.time()) // 3600) + 2)


def _open_first(order: Order, provider: Provider, region: str, say: Say) -> Order:
    room = {(r.instance_type, r.zone) for r in need(provider, BLOCKS, what="--reservation").reservations(region)
            if r.state == "active" and r.match == "open" and r.available > 0}
    first = [c for c in order.candidates if (c.instance_type, c.zone) in room]
    say(f"open reservations with room: {len(first)} of the candidates" if first else
        f"no open reservation with room for these types: {service(provider)} launches on-demand as usual")
    return Order(tuple(first + [c for c in order.candidates if c not in first]), order.skipped, order.max_hourly)


def reservation_of(opts: Any) -> dict[str, Any]:
    """The LaunchRequest fields for the options: the reservation targeted (or open), and a block's market type."""
    given = opts.capacity_block or opts.reservation
    if not given:
        return {}
    return {"reservation": given, "capacity_block": bool(opts.capacity_block)}


def held_group(opts: Any, provider: Provider, region: str) -> tuple[bool, str | None]:
    """Whether a launch targets one reservation, and the cluster placement group that reservation was made in.
    A cluster launched into one makes no placement group of its own: "there is no need to use a cluster placement
    group with a Capacity Block", and a reservation made outside a placement group cannot be moved into one (EC2
    user guide, Capacity Blocks and Capacity Reservations in cluster placement groups); AWS ParallelCluster refuses
    that combination too."""
    given = opts.capacity_block or opts.reservation
    if not given or given == "open":
        return False, None
    found = opts.held or find(provider, region, str(given), "--capacity-block" if opts.capacity_block else "--reservation")
    return True, found.placement_group


def resolved(opts: Any, held: Reservation | None) -> dict[str, Any]:
    """The options with the reservation's own id (a block named cb-… launches by its cr-…), and the reservation
    itself, as `narrow` read it."""
    if held is None:
        return {}
    return {"capacity_block" if opts.capacity_block else "reservation": held.id, "held": held}


def recorded(opts: Any, provider: Provider, region: str) -> dict[str, Any]:
    """What the node records of the reservation it launched into: its id and, for a block, its end."""
    given = opts.capacity_block or opts.reservation
    if not given or given == "open":
        return {}
    res = opts.held or find(provider, region, str(given), "--capacity-block" if opts.capacity_block else "--reservation")
    end = res.end.timestamp() if res.end is not None and res.kind == "capacity-block" else None
    return {"reservation_id": res.id, "reservation_end": end}


def block_guards(plan: Plan, node: Node, say: Say) -> Plan:
    """A node in a Capacity Block: its interrupt watch learns the block's end (and runs the hook before it)."""
    if node.reservation_end is None:
        return plan
    from gpuprov.plan.plan import replace_guards

    end = int(node.reservation_end)
    when = _when(datetime.fromtimestamp(end, timezone.utc))
    say(f"Capacity Block ends {when}: {service(node.provider)} ends the instance 30 min before; the node warns and "
        "runs its on-interrupt hook 40 min before")
    return replace_guards(plan, plan.guards.model_copy(update={"block_end": end}))


def live_rows(provider: Provider, region: str) -> list[Reservation]:
    """`gpus --live`: the account's active (and scheduled) reservations for instance types that carry GPUs."""
    from gpuprov.plan import catalog

    blocks = offered(provider, BLOCKS)
    if blocks is None:
        return []
    gpu_types = {t.name for t in catalog.load().instance_types if not t.cpu_only}
    return [r for r in blocks.reservations(region) if r.state in ("active", "scheduled")
            and r.instance_type in gpu_types]
