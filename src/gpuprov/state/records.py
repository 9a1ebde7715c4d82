"""The records gpuprov keeps, whichever store keeps them (sqlite.py's local file, s3.py's bucket): a node,
a cluster's member, a cloud resource, an event."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, TypedDict

from gpuprov.kinds import ResourceKind as ResourceKind  # named once, for the providers too
from gpuprov.state.machine import NodeState

# where an `up` leaves a record ("waiting": between two passes of `up --wait`, owning nothing)
UP_STATES = (NodeState.LAUNCHING, NodeState.RUNNING, NodeState.BOOTSTRAPPING, NodeState.FAILED,
             NodeState.TERMINATING, NodeState.WAITING)


@dataclass(frozen=True)
class Node:
    name: str
    provider: str
    region: str
    zone: str | None
    gpu: str | None
    gpu_count: int | None
    instance_type: str | None
    market: str | None
    state: NodeState
    state_reason: str | None
    address: str | None
    ssh_user: str | None
    price_usd_hour: float | None
    owner: str | None
    plan_json: str | None
    pid: int | None
    host: str | None
    created_at: float
    ready_at: float | None
    ended_at: float | None
    autostop_seconds: int | None = None  # the node's autostop idle window; None: off
    ttl_seconds: int | None = None
    ttl_deadline: float | None = None  # epoch seconds (the node keeps its own, a few seconds later): the sooner of
    # the TTL's own deadline and the budget's
    ttl_end: float | None = None  # epoch seconds the --ttl itself runs out, whatever a budget says (None: no TTL)
    on_interrupt: str | None = None
    spot_type: str | None = None  # spot: "one-time" (cannot stop) or "persistent" (interruption behaviour stop)
    shutdown_action: str | None = None  # what a shutdown on the node does: "stop" (disk kept) or "terminate"
    disk_gb: int | None = None
    connect: str | None = None  # "public" or "private": which address reaches it
    budget_usd: float | None = None
    budget_deadline: float | None = None  # epoch seconds the budget runs out at the price obtained
    budget_price: float | None = None  # $/h the budget was turned into a deadline with (spot price at launch)
    resize_from: str | None = None  # a `start --instance-type` in progress: the type before ...
    resize_to: str | None = None  # ... and the type asked for (recorded before ModifyInstanceAttribute)
    stopped_at: float | None = None
    cluster_size: int | None = None  # `up --nodes N`: the N asked for (None: a single node)
    members_json: str | None = None  # a cluster's nodes, rank order (see `members`)
    paid_usd_hour: float | None = None  # what it costs an hour: the spot price obtained at launch, or the list price
    billed_seconds: float | None = None  # its instance's running time before the current run (stops end a run)
    running_since: float | None = None  # when the current run began (None: stopped, or ended)
    reservation_id: str | None = None  # the Capacity Reservation or Block it launched into (cr-…)
    reservation_end: float | None = None  # a Capacity Block's end (epoch s): EC2 ends its instances 30 min before
    # `--locked`: the member (leases.member, the owner id) who locked its autostop, TTL and budget; only they may
    # change or lift them (team state: another member's `ttl off` is refused, cloud/guards.py). None: unlocked
    guards_locked_by: str | None = None
    # `state push`: the bucket this local record was moved to (the local file only). Local commands no longer see
    # the node; the row stays so a local `gc` never takes the node's resources for orphans
    moved_to: str | None = None
    # a multi-step operation in flight (a move, a resize): its journal, written before each step (see `journal`)
    journal_json: str | None = None
    # what its disk costs an hour as its cloud priced it at launch or stop, where the shipped catalog has no disk price
    # (Alibaba Cloud's DescribePrice): a stopped node's bill. None: the catalog's price, or none known
    disk_usd_hour: float | None = None

    def __post_init__(self) -> None:  # a store reads its state back as a word: the enum, whichever store read it
        object.__setattr__(self, "state", NodeState(self.state))

    def cost_so_far(self, now: float) -> float | None:
        """Dollars its instance has cost: the price it got, for the time it ran (stopped time costs no compute).
        A record from before those were kept: its age at the on-demand list price, as before."""
        if self.paid_usd_hour is None:
            if not self.price_usd_hour:
                return None
            return ((self.ended_at or now) - self.created_at) / 3600 * self.price_usd_hour
        run = (self.billed_seconds or 0.0)
        if self.running_since is not None:
            run += max(0.0, min(now, self.ended_at or now) - self.running_since)
        return run / 3600 * self.paid_usd_hour

    def stopped_run(self, at: float) -> RunEnded:
        """The fields that end its current run at `at` (a stop, an interruption, a teardown)."""
        if self.running_since is None:
            return {}
        return {"billed_seconds": (self.billed_seconds or 0.0) + max(0.0, at - self.running_since),
                "running_since": None}

    @property
    def members(self) -> tuple[Member, ...]:
        """A cluster's nodes by rank (node 0 first; `address` is node 0's); empty for a single node."""
        return tuple(Member(**m) for m in json.loads(self.members_json)) if self.members_json else ()

    @property
    def journal(self) -> Journal | None:
        """The operation in flight on it, as its last step recorded it; None when none is."""
        return Journal.from_json(self.journal_json) if self.journal_json else None

    @property
    def can_stop(self) -> bool:
        """On-demand nodes and persistent spot requests can stop; one-time spot instances cannot (EC2 refuses)."""
        return self.market != "spot" or self.spot_type == "persistent"

    @property
    def live(self) -> bool:
        return self.state != NodeState.TERMINATED

    @property
    def up_unfinished(self) -> bool:
        """Its `up` (one node or a cluster) never reached `ready`: a record that was launching, running,
        bootstrapping, failed or being taken back when that `up` ended. Whether the `up` is still at work is
        not in the record: its process holds the node's lock (gpuprov.state.locks) for as long as it lives. A node
        stopped, started, resized or baked after it was ready never counts."""
        return self.ready_at is None and self.state in UP_STATES

    @property
    def plan(self) -> dict[str, Any]:
        return json.loads(self.plan_json) if self.plan_json else {}


class NodeFields(TypedDict, total=False):
    """The fields `create_node` takes besides the name, provider and region it is claimed with: every field of
    Node, typed as Node has it (a misspelt one is a type error, and a TypeError at run time, in either store)."""

    zone: str | None
    gpu: str | None
    gpu_count: int | None
    instance_type: str | None
    market: str | None
    state: NodeState
    state_reason: str | None
    address: str | None
    ssh_user: str | None
    price_usd_hour: float | None
    owner: str | None
    plan_json: str | None
    pid: int | None
    host: str | None
    created_at: float
    ready_at: float | None
    ended_at: float | None
    autostop_seconds: int | None
    ttl_seconds: int | None
    ttl_deadline: float | None
    ttl_end: float | None
    on_interrupt: str | None
    spot_type: str | None
    shutdown_action: str | None
    disk_gb: int | None
    connect: str | None
    budget_usd: float | None
    budget_deadline: float | None
    budget_price: float | None
    resize_from: str | None
    resize_to: str | None
    stopped_at: float | None
    cluster_size: int | None
    members_json: str | None
    paid_usd_hour: float | None
    billed_seconds: float | None
    running_since: float | None
    reservation_id: str | None
    reservation_end: float | None
    guards_locked_by: str | None
    moved_to: str | None
    journal_json: str | None
    disk_usd_hour: float | None


class RunEnded(TypedDict, total=False):
    """The fields that end a node's current run (Node.stopped_run)."""

    billed_seconds: float
    running_since: None


class NodeUpdate(NodeFields, total=False):
    """The fields `update_node` changes: a node's own fields, its region too (`start --move --region`)."""

    region: str


def node_fields(call: str, given: NodeUpdate | NodeFields, *, region: bool) -> dict[str, Any]:
    """`given` as a store writes it, checked before anything is: a field Node lacks is a TypeError naming it (as
    Python's own for an unknown keyword), and a state is the enum (ValueError for a word that is none)."""
    allowed = _UPDATABLE if region else _CREATABLE
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise TypeError(f"{call}() got an unexpected keyword argument {unknown[0]!r}"
                        + (f" (and {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else ""))
    out: dict[str, Any] = dict(given)
    if "state" in out:
        out["state"] = NodeState(out["state"])
    return out


_UPDATABLE = frozenset(f.name for f in fields(Node)) - {"name", "provider"}
_CREATABLE = _UPDATABLE - {"region"}


@dataclass(frozen=True)
class Journal:
    """One multi-step operation in flight on a node: what it is, the step it is about to take (written before the
    step is), and the ids it has made so far. The next command that touches the node reads it to finish the
    operation or undo it (cloud/journal.py); a node with none has nothing in flight."""

    op: str  # "move" (another zone of its region), "move-region", "resize" or "start" (cloud/stopstart.py), "bake"
    node: str
    step: str  # the step recorded last: a move's "image", "copy", "access", "launch", "retire"; "resize", "start";
    # a bake's "clean" (its clean-up), "image" (CreateImage), "guards" (the image made, its guards being put back)
    region: str  # where the node was when the operation began
    zone: str | None
    old_instance: str  # the instance the node had (a move: stopped, its disk the one being copied; a start: its own)
    image: str | None = None  # the image of its disk (in `region`)
    target_region: str | None = None  # a region move's destination
    copy: str | None = None  # the image's copy there
    new_instance: str | None = None  # the instance launched from it, once its id is known
    new_zone: str | None = None
    new_state: str | None = None  # what EC2 last said of the new instance (a start's: of its instance)
    began_at: float = 0.0
    from_type: str | None = None  # a resize: the type before ...
    to_type: str | None = None  # ... and the type asked for
    image_name: str | None = None  # a bake: the image's name, which finds it when CreateImage's answer was lost

    def to_json(self) -> str:
        from dataclasses import asdict

        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Journal:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})  # a newer gpuprov's extras left

    @property
    def to(self) -> str:
        """The region the new instance is launched in."""
        return self.target_region or self.region

    @property
    def is_move(self) -> bool:
        return self.op in ("move", "move-region")

    @property
    def is_bake(self) -> bool:
        return self.op == "bake"

    @property
    def copy_in_flight(self) -> bool:
        """The disk's only copy may be in the operation's hands: its old instance's disk is not yet retired while
        a new instance from its image exists or may (a launch asked for), or has been retired and the new one is
        the node's only disk."""
        return self.is_move and self.step in ("launch", "retire")

    def describe(self) -> str:
        """The operation as the node's state column says it (beside `moving`): what runs, what is not done yet, and
        the next step."""
        if self.is_bake:
            return self._bake_said()
        if not self.is_move:
            what = f"resize {self.from_type} -> {self.to_type}" if self.op == "resize" else "start"
            now = f"its instance {self.old_instance} {self.new_state}" if self.new_state else self.old_instance
            return (f"{what} interrupted at {self.step}, {now}; `gpuprov start {self.node}` finishes it, "
                    f"`gpuprov stop {self.node}` stops it")
        where = self.new_zone or self.target_region or "another zone"
        if self.new_instance and self.new_state in ("pending", "running", "stopping", "stopped"):
            return (f"new instance {self.new_instance} {self.new_state} in {where}, old one not yet retired; "
                    f"`gpuprov start {self.node}` finishes the move")
        if self.new_instance:
            return (f"new instance {self.new_instance} {self.new_state or 'not found'}; "
                    f"`gpuprov stop {self.node}` takes back what the move made")
        return (f"its disk is being copied ({self.step}), no new instance runs yet; "
                f"`gpuprov stop {self.node}` takes the copy back")

    def _bake_said(self) -> str:
        """A bake's: how far it got, and that `start` or `stop` settles it (cloud/bake.py `settle`)."""
        then = (f"`gpuprov start {self.node}` settles it (a stop and a start: new host keys, its guards back), "
                f"`gpuprov stop {self.node}` stops it")
        if self.step == "clean":
            return f"image bake interrupted at its clean-up (host keys, gpuprov's key and guards moved aside); {then}"
        made = f"image {self.image_name}" + (f" {self.image}" if self.image else "")
        seen = f" {self.new_state}" if self.new_state else ""
        if self.step == "guards":
            return f"image bake interrupted putting its guards back ({made} made); {then}"
        return f"image bake interrupted at CreateImage ({made}{seen}); {then}"


@dataclass(frozen=True)
class Member:
    """One node of a cluster: its rank, instance and addresses."""

    rank: int
    instance_id: str
    private_ip: str | None
    public_ip: str | None
    address: str | None  # the one gpuprov connects to (public or private, as the cluster's --connect says)
    state: str = "running"
    allocation_id: str | None = None  # its Elastic IP, where the type launches with several interfaces


def members_json(members: list[Member]) -> str:
    from dataclasses import asdict

    return json.dumps([asdict(m) for m in members])


@dataclass(frozen=True)
class Resource:
    id: int
    node: str | None
    kind: str
    region: str
    client_token: str | None
    cloud_id: str | None
    status: str  # "intent" (asked for, id unknown), "created", "deleted"
    created_at: float
    deleted_at: float | None


@dataclass(frozen=True)
class Event:
    node: str | None
    at: float
    kind: str
    message: str
