"""The one gate for destruction: the only module of cloud/ that asks a provider to terminate, delete or cancel
anything (tests/test_destroy_gate.py fails when another does).

Before anything of a node goes, in this order:
- the caller holds the node's lock, or with team state its lease (`locks.held`): a destroy without it is a path
  that forgot to lock, a GpuprovBug (`Unguarded`), never a user's error; a lease must be whole (`locks.fence`: one
  lost or unrenewed past its expiry stops its holder, LeaseLost, as before any cloud call);
- the node is this member's, or the caller chose every member's (`--team`, or the node named on the command line);
  with local state every node is this member's;
- the data rule: every `when: down` upload of the node's playbook (data_save.down_saves) ran on every member of it
  (each node of a cluster, by the cluster's record) in this process, or the user said `--no-save`. The save runs
  here, under the lock, where the node can be reached; a stopped one, or one that cannot be reached, is refused by
  name. A node with nothing to save costs nothing: no SSH, no look-up;
- the node's disk is not the only copy of an operation in flight (`in_flight`, from the node's journal).

`node` opens that gate for one node's whole take-down (`down`, `gc --stopped-for`, and `gc` with `stopped_for` in
the config: cloud/teardown.py's `down` and `take_down`, cloud/stale.py); `down` of several checks every node and
saves its data first (`before_all`: a refusal or a failed save takes nothing down). What an operation itself just
made (a failed `up`'s or move's instance, the move's image) or replaced (the instance a finished move leaves) holds no
user data: `take_back` opens the node to the destroys below on the lock alone. An orphan (`orphan`), the region's
shared key pair (`key_pair`) and network (`network_part`), the role the nodes' guards stop them with (`role`) and
an image removed by name (`image`) have no node: each is checked against the lock that guards it.

Inside an open gate, cloud/teardown.py, the take-backs and the moves call `end` (instances), `remove` (any
resource) and `remove_image` here instead of the provider: each asks again that the node is open and its lock
still held, so a destroy outside the gate fails before the cloud is asked.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from gpuprov.cloud.providers.base import IMAGES, SHARED, CloudResource, Provider
from gpuprov.errors import GpuprovBug, GpuprovError
from gpuprov.state import locks

if TYPE_CHECKING:
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target
    from gpuprov.say import Say
    from gpuprov.state import Node, Store

# how gpuprov reaches a node by name over SSH (cli/common.node_target): None when it cannot
Reach = Callable[[str], "Target | None"]


class Unguarded(GpuprovBug):
    """A destroy asked for without the lock (or a whole lease) of what it destroys, or outside the gate."""


class Refused(GpuprovError):
    """The gate would not take the node down: a teammate's, its data unsaved, or an operation's only copy."""


_open: dict[str, int] = {}  # lock key -> depth: what the gate let through in this process, and is still open
_saved: set[str] = set()  # nodes whose `when: down` uploads ran on every member in this process
_guard = threading.Lock()


def in_flight(node: Node) -> str | None:
    """Why deleting the node's disk now would lose data, read from its journal (state/records.py `Journal`, written by
    the moves: cloud/journal.py settles it): a move holds a copy of it, or its new instance does while the old one
    waits to be retired; the next step is named. None when nothing is in flight (a start or resize copies no disk)."""
    journal = node.journal
    if journal is None or not journal.is_move:
        return None
    if journal.copy_in_flight:
        on = f" {journal.new_instance}" if journal.new_instance else ""
        return (f"{node.name} is moving: its disk's data may be only on its new instance{on}; "
                f"`gpuprov start {node.name}` finishes the move first")
    return (f"{node.name} is moving: an image of its disk is being made; "
            f"`gpuprov stop {node.name}` takes it back first")


def _check_held(key: str, what: str) -> None:
    if not locks.held(key):
        raise Unguarded(f"{what} without holding {key}: a destroy must hold the lock (or a whole lease) of what "
                        "it destroys")
    # a lease held but lost (a teammate broke or took it) or unrenewed past its expiry stops its holder here, as
    # before its next cloud call: LeaseLost, naming the node and who holds it now
    locks.fence()


@contextlib.contextmanager
def _opened(key: str) -> Iterator[None]:
    with _guard:
        _open[key] = _open.get(key, 0) + 1
    try:
        yield
    finally:
        with _guard:
            if _open[key] > 1:
                _open[key] -= 1
            else:
                del _open[key]


def _check_open(key: str, what: str) -> None:
    with _guard:
        opened = key in _open
    if not opened:
        raise Unguarded(f"{what} outside the destroy gate (cloud/destroy.py): nothing opened {key}")
    _check_held(key, what)


# --- the gate's entries ----------------------------------------------------------------------------


def before_all(records: Sequence[Node], store: Store, *, anyone: bool, no_save: bool, reach: Reach | None,
               settings: HostSettings | None, say: Say) -> None:
    """`down` of several nodes: every node checked (its lock, its member) and its data saved (`save`) before any is
    taken down, so the first refusal, or a save that fails or cannot run, stops it with nothing touched."""
    for record in records:
        _check_held(locks.node(record.name), f"saving {record.name}'s data before its take-down")
        _check(record, anyone=anyone)
    for record in records:
        save(record, store, no_save=no_save, reach=reach, settings=settings, say=say)


@contextlib.contextmanager
def node(name: str, store: Store, say: Say, *, anyone: bool, no_save: bool, reach: Reach | None = None,
         settings: HostSettings | None = None) -> Iterator[Node]:
    """Open the gate for the node's whole take-down (cloud/teardown.take_down, inside the block) once its rules
    hold; Refused, naming the node, when one does not, and nothing is touched. The caller holds the node's lock."""
    key = locks.node(name)
    _check_held(key, f"taking {name} down")
    record = store.node(name)
    _check(record, anyone=anyone)
    save(record, store, no_save=no_save, reach=reach, settings=settings, say=say)
    why = in_flight(record)
    if why is not None:
        raise Refused(f"{name}: {why}; nothing was taken down")
    try:
        with _opened(key):
            yield record
    finally:
        with _guard:
            _saved.discard(name)  # the next take-down of a node of this name saves again


@contextlib.contextmanager
def take_back(name: str, what: str) -> Iterator[None]:
    """Open the node to `end`, `remove` and `remove_image` for what `what` (an `up`, a move) itself just made, or
    a finished move replaced: none of it holds the user's data, so only the lock is checked."""
    key = locks.node(name)
    _check_held(key, f"{what}'s take-back of {name}")
    with _opened(key):
        yield


def orphan(provider: Provider, res: CloudResource, settle: float = 0.0) -> None:
    """A resource no record claims (cloud/gc.py said so): deleted under the lock that guards it, its node's, an
    image's own, or for a snapshot whose image is gone, the region's."""
    key = _cover(res)
    _check_held(key, f"deleting the orphan {res.kind} {res.id}")
    provider.delete(res, settle=settle)


def key_pair(provider: Provider, region: str, name: str, settle: float = 0.0, *, replace: bool = False) -> None:
    """The region's shared key pair (cloud/keys.py), under the region's lock: deleted with the region's last node,
    or `replace`d when a lost state left one of this owner's name."""
    _check_held(locks.region(region), f"deleting the key pair {name}")
    if replace:
        provider.delete_key_pair(region, name, settle=settle)
    else:
        provider.delete(CloudResource("key-pair", name, region, SHARED), settle=settle)


def network_part(provider: Provider, res: CloudResource, settle: float = 0.0) -> None:
    """A subnet or the VPC of gpuprov's own network in a region (cloud/own_network.py), under the region's lock:
    deleted with the region's last node."""
    _check_held(locks.region(res.region), f"deleting the {res.kind} {res.id}")
    provider.delete(res, settle=settle)


def role(provider: Provider, res: CloudResource, settle: float = 0.0) -> None:
    """The role every node of a cloud shares (cloud/stop_role.py), under its lock (its region's, "global"): deleted
    with the cloud's last node."""
    _check_held(locks.region(res.region), f"deleting the {res.kind} {res.id}")
    provider.delete(res, settle=settle)


def image(provider: Provider, region: str, image_id: str, name: str) -> list[str]:
    """`image rm`: the image and its snapshots, under the image's lock (a bake of it holds it)."""
    _check_held(locks.image(name), f"removing the image {image_id}")
    return provider.delete_image(region, image_id)


# --- what an open gate lets through ------------------------------------------------------------------


def end(provider: Provider, node: str, region: str, ids: Sequence[str], settle: float) -> None:
    """Terminate the node's instances `ids` (the gate open for `node`)."""
    _check_open(locks.node(node), f"terminating {', '.join(ids)} of {node}")
    provider.terminate(region, ids, settle=settle)


def remove(provider: Provider, res: CloudResource, settle: float = 0.0) -> None:
    """Delete one of the node's resources (`res.node`, the gate open for it)."""
    _check_open(locks.node(res.node or ""), f"deleting {res.kind} {res.id} of {res.node}")
    provider.delete(res, settle=settle)


def remove_image(provider: Provider, node: str, region: str, image_id: str, settle: float = 0.0) -> list[str]:
    """Deregister an image of the node's (a move's) and delete its snapshots (the gate open for `node`)."""
    _check_open(locks.node(node), f"deleting the image {image_id} of {node}")
    return provider.delete_image(region, image_id, settle=settle)


# --- the rules ---------------------------------------------------------------------------------------


def _cover(res: CloudResource) -> str:
    if res.node == SHARED:
        return locks.region(res.region)
    if res.node == IMAGES:
        if res.kind == "image":  # its state reads "NAME | …" (providers/aws.py tagged)
            return locks.image(res.state.split(" | ", 1)[0])
        return locks.region(res.region)
    return locks.node(res.node or "")


def _check(record: Node, *, anyone: bool) -> None:
    """With team state, a teammate's node goes only when the caller chose every member's (or named it)."""
    if anyone:
        return
    from gpuprov.state.url import configured

    if configured() is None:
        return
    from gpuprov.cloud.team import by_member, member_name

    mine, _others = by_member([record])
    if not mine:
        raise Refused(f"{record.name} is {member_name(record)}'s node, not yours: left as it is (`--team` takes "
                      "every member's)")


def save(record: Node, store: Store, *, no_save: bool, reach: Reach | None, settings: HostSettings | None,
         say: Say) -> None:
    """The data rule: the node's `when: down` uploads run on every member of it, once per process; Refused when
    they cannot run or fail. Nothing to save (or `--no-save`) returns at once."""
    from gpuprov.cloud import data_save

    if no_save or record.name in _saved or not data_save.down_saves(record):
        return
    targets = _targets(record, store, reach)
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.paths import known_hosts_path

    try:
        data_save.save_before_down(record, targets, settings or HostSettings(known_hosts=known_hosts_path(),
                                                                             connect_timeout=15), say)
    except data_save.NotSaved as exc:
        raise Refused(str(exc)) from None
    _saved.add(record.name)


def _targets(record: Node, store: Store, reach: Reach | None) -> list[Target]:
    """Every member of the node as SSH reaches it: a launched cluster's from its record in the store (each rank,
    local or a team's), one node's by `reach`; [] when it cannot be reached (not running, no way given)."""
    if record.state not in ("ready", "running", "bootstrapping") or reach is None:
        return []
    if record.cluster_size:
        from gpuprov.cluster import Cluster

        text = store.cluster_json(record.name)
        return Cluster.model_validate_json(text).targets() if text else []
    target = reach(record.name)
    return [target] if target is not None else []
