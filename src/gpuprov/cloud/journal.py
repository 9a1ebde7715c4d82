"""A multi-step operation's journal, read by the next command that touches the node: finish it, or undo it.

A `start --move` (cloud/move.py to another zone, cloud/move_region.py to another region) writes its journal
(state/records.py `Journal`: the step it is about to take, the ids it made) before each step, with the node
`moving`, and clears it when it ends either way. A journal left behind means the command never ended: SIGKILL, a
lost machine, a second signal during its take-back. What comes next hangs on one fact the cloud is asked: does an
instance launched from the disk's image exist?

- It does (pending, running, or stopped since): the move goes forward. The new instance holds the disk's data and
  may already have written more; it is never taken for nothing. The old instance is retired and the image deleted
  only then, as the move itself would have (`finish`).
- It does not: the move is undone. What it made (the image, a copy, a group in the other region, a launch whose
  answer was lost, found by its ClientToken) is taken back, and the node is stopped where it was, its old disk
  untouched.

`status --refresh` says which, on the node's state (`look`); `start` finishes the move and brings the node up
(`start`), starting the new instance first if `stop` stopped it; `stop` stops whichever instance of the node runs
(`stop`); `down` settles it before taking the node down, `gc --yes` before it sweeps (`resume`; without --yes
it names the move and its next step). A node whose move is
still at work (its lock is held) is left to it. The destroy gate (cloud/destroy.py `in_flight`) reads the same
journal to refuse deleting a disk a move still needs.

A `start` (resized first, or not: cloud/stopstart.py) journals its two steps too, with the node `resizing` or
`starting`: a rerun `start` finishes it as it always has (the resize asked for is done first), `status --refresh`
says what EC2 says of its instance, and `stop` stops that instance, recording the type EC2 says it has.

An `image bake` journals its steps too, with the node `baking` (cloud/bake.py says why it is settled the way it
is): `status --refresh` says what EC2 has of its image; `start` and `stop` record the image if EC2 made it (waiting
until available) and stop the node, `start` then starting it as any stopped node, its guards put back; `down`
and `gc` record the image, `gc` naming the next step.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuprov.cloud import bake, move, move_region
from gpuprov.cloud import timeline as tl
from gpuprov.cloud.destroy import in_flight
from gpuprov.cloud.providers.base import LaunchError
from gpuprov.cloud.providers.capabilities import title
from gpuprov.cloud.settle import settle_window
from gpuprov.cloud.stopstart import StartOptions, StartResult, came_up
from gpuprov.cloud.teardown import find_lost_launch, poll_of
from gpuprov.errors import GpuprovError
from gpuprov.state import Journal, Node, NodeState, Store, locks

if TYPE_CHECKING:
    from gpuprov.cloud.providers.base import Instance, Provider
    from gpuprov.say import Say

FORWARD = ("pending", "running", "stopping", "stopped")  # a new instance in one of these holds the disk's data


def next_step(journal: Journal, new: Instance | None) -> str:
    """'finish' once an instance launched from the disk's image exists (never taken for nothing), else 'undo'."""
    return "finish" if new is not None and new.state in FORWARD else "undo"


def new_instance(node: Node, journal: Journal, provider: Provider, store: Store) -> Instance | None:
    """The instance the move launched, if one exists: by its recorded id, or by the ClientToken of a launch whose
    answer never came (EC2's filter lags: looked for as long as it may, then its row is closed)."""
    for row in store.resources(node.name, region=journal.to, kind="instance"):
        if row.cloud_id is None:
            find_lost_launch(row, provider, store, poll_of(provider))
    ids = [r.cloud_id for r in store.resources(node.name, region=journal.to, kind="instance")
           if r.cloud_id and r.cloud_id != journal.old_instance]
    found = provider.instances(journal.to, ids=ids) if ids else []
    return next((i for i in found if i.state in FORWARD), found[0] if found else None)


def _kept(journal: Journal, new: Instance | None) -> Instance | None:
    """The new instance when the move goes forward with it (next_step), else None: the move is undone."""
    return new if next_step(journal, new) == "finish" else None


def _finish(node: Node, journal: Journal, new: Instance, provider: Provider, store: Store, say: Say) -> None:
    journal = move.note(store, replace(journal, step="retire", new_instance=new.id, new_zone=new.zone,
                                       new_state=new.state))
    say(f"{node.name}: finishing its interrupted move: the new instance {new.id} in {new.zone} is kept, the old one "
        f"{journal.old_instance} retired")
    with move.half_done(node.name):
        (move_region.finish if journal.target_region else move.finish)(node, journal, new, provider, store, say)
    from gpuprov.hosts import sshconfig

    # a new instance: cloud-init made it new host keys; whichever command reaches it first pins its key, as after `up`
    sshconfig.await_new_key(node.name)


def _undo(node: Node, journal: Journal, provider: Provider, store: Store, say: Say) -> None:
    """No new instance exists: what the move made goes, and the node is stopped where it was."""
    mine = move.move_images(node.name, journal.region, store)
    if journal.target_region:
        move_region.take_back(node, journal.to, [r.id for r in mine], provider, store, say)
    else:
        launched = [r for r in store.resources(node.name, region=journal.region, kind="instance")
                    if r.cloud_id != journal.old_instance]
        move.take_back(node, [r.id for r in (*mine, *launched)], provider, store, say)
    move.undone(store, node.name)
    store.event(node.name, "move-undone", f"{journal.op} from {journal.zone} taken back at step {journal.step}")


def resume(name: str, provider: Provider, store: Store, say: Say) -> Node:
    """Finish or undo the move a killed command left on `name` (nothing when it has no journal)."""
    if store.node(name).journal is None:
        return store.node(name)
    with locks.nodes([name], "resume a move", say):  # a move still at work finishes first
        node = store.node(name)
        journal = node.journal
        if journal is not None and journal.is_bake:  # its image recorded if made; the node's teardown follows
            bake.forget(name, provider, store, say)
            return store.node(name)
        if journal is None or not journal.is_move:  # a start's: its records are the node's own, `down` follows them
            return node
        new = _kept(journal, new_instance(node, journal, provider, store))
        if new is not None:
            _finish(node, journal, new, provider, store, say)
        else:
            _undo(node, journal, provider, store, say)
        return store.node(name)


def start(name: str, opts: StartOptions, provider: Provider, store: Store, say: Say) -> StartResult | None:
    """`start` of a node a killed move left: its new instance (started again if `stop` stopped it) is kept, the
    move finished, the node brought up as the move would have. None: no new instance, the move undone, the node
    stopped where it was for a plain start."""
    with locks.nodes([name], "start", say):
        node = store.node(name)
        journal = node.journal
        if journal is not None and journal.is_bake:  # stopped, its image recorded; then started as any stopped node
            bake.settle(name, provider, store, say)
            return None
        if journal is None or not journal.is_move:  # a killed start or resize: stopstart.start resumes it
            return None
        rec = tl.Recorder("start", name)
        rec.phase(tl.CHECKS)
        new = _kept(journal, new_instance(node, journal, provider, store))
        if new is None:
            _undo(node, journal, provider, store, say)
            return None
        if new.state in ("stopping", "stopped"):
            provider.wait_stopped(journal.to, [new.id])
            say(f"{name}: starting its new instance {new.id} in {new.zone}")
            try:
                provider.start(journal.to, [new.id], settle=settle_window())
            except LaunchError as exc:  # its new zone is full now: the instance is kept, stopped, for a later start
                raise GpuprovError(f"{title(provider)} refused to start {name}'s new instance {new.id}: {exc.code}: "
                                   f"{exc.message}\n"
                                   f"  {name} stays moving, its new instance stopped and kept; try again later: "
                                   f"gpuprov start {name}") from None
        rec.phase(tl.RUNNING)
        new = provider.wait_running(journal.to, new.id, timeout=opts.ssh_timeout, settle=settle_window())
        _finish(node, journal, new, provider, store, say)
        return came_up(name, store.node(name), new, opts, node.instance_type or "", None, store, say, rec,
                       new_instance=True)


def stop(name: str, provider: Provider, store: Store, say: Say) -> Node:
    """`stop` of a node a killed move left: whichever of its instances runs is stopped (the new one, kept with its
    disk, the move left to `start` to finish); with no new instance the move is undone, the node stopped as it was."""
    with locks.nodes([name], "stop", say):
        node = store.node(name)
        journal = node.journal
        if journal is None:
            return node
        if journal.is_bake:
            bake.settle(name, provider, store, say)
            return store.node(name)
        if not journal.is_move:
            return _stop_start(node, journal, provider, store, say)
        new = _kept(journal, new_instance(node, journal, provider, store))
        if new is None:
            _undo(node, journal, provider, store, say)
            return store.node(name)
        if new.state in ("pending", "running"):
            say(f"{name}: stopping its new instance {new.id} in {new.zone} (the move is not finished; its disk is kept)")
            provider.stop(journal.to, [new.id], settle=settle_window())
        provider.wait_stopped(journal.to, [new.id])
        move.note(store, replace(journal, new_instance=new.id, new_zone=new.zone, new_state="stopped"))
        store.event(name, "stopped", f"{new.id} (a move's new instance, not yet finished)")
        return store.node(name)


def _stop_start(node: Node, journal: Journal, provider: Provider, store: Store, say: Say) -> Node:
    """A killed `start` (resized first, or not): its instance, running or not, is stopped, and the node recorded
    stopped as the type EC2 says it is (the resize done or not), nothing in flight."""
    from gpuprov.plan import catalog

    name, region, iid = node.name, node.region, journal.old_instance
    (current,) = provider.describe(region, [iid], settle=settle_window())
    if current.state in ("terminated", "shutting-down"):
        store.update_node(name, state=NodeState.GONE, journal_json=None, resize_from=None, resize_to=None,
                          state_reason=current.state_reason or "instance terminated")
        return store.node(name)
    if current.state in ("pending", "running"):
        say(f"{name}: stopping {iid} (its {journal.op} was interrupted; its disk is kept)")
        provider.stop(region, [iid], settle=settle_window())
    provider.wait_stopped(region, [iid])
    it = catalog.load().instance_type(current.instance_type)
    now = time.time()
    store.update_node(name, state=NodeState.STOPPED, instance_type=it.name, gpu=it.gpu or node.gpu, gpu_count=it.gpus,
                      price_usd_hour=it.price_usd_hour, resize_from=None, resize_to=None, journal_json=None,
                      stopped_at=now, state_reason=f"its {journal.op} was interrupted", **node.stopped_run(now))
    store.event(name, "stopped", f"{iid} ({journal.op} interrupted)")
    return store.node(name)


def look(nodes: list[Node], provider: Provider, store: Store, say: Say) -> None:
    """`status --refresh`: each moving node's state says what EC2 says of its new instance, and the next step. A
    move at work (its lock held) is left as its record says."""
    for node in nodes:
        if node.journal is None:
            continue
        try:
            with locks.hold(locks.node(node.name), "status --refresh", wait=False, subject=node.name):
                node = store.node(node.name)
                journal = node.journal
                if journal is None:
                    continue
                if journal.is_bake:  # what EC2 has of its image
                    bake.look(node.name, provider, store)
                    continue
                if not journal.is_move:  # a killed start: what EC2 says of its instance
                    (current,) = provider.instances(node.region, ids=[journal.old_instance]) or (None,)
                    seen = replace(journal, new_state=current.state if current else "not found")
                    store.update_node(node.name, journal_json=seen.to_json(), state_reason=seen.describe())
                    continue
                new = _kept(journal, new_instance(node, journal, provider, store))
                if new is not None:
                    move.note(store, replace(journal, new_instance=new.id, new_zone=new.zone, new_state=new.state))
                else:
                    move.note(store, replace(journal, new_state=None))
        except locks.Busy as busy:
            say(f"{node.name}: not refreshed, {busy.holder} is working on it")


def settle_all(provider: Provider, store: Store, say: Say, *, act: bool) -> None:
    """`gc`: each move a killed command left is finished or undone (act), else named with its next step; a move at
    work (its lock held) is left to it. Only the nodes of this provider's cloud."""
    for node in store.nodes():
        if node.journal is None or node.provider != provider.name:
            continue
        try:
            if node.journal.is_bake:  # its image recorded if EC2 made it, never swept; the next step named
                with locks.hold(locks.node(node.name), "gc", wait=False, subject=node.name):
                    bake.look(node.name, provider, store)
                    say(f"{node.name}: {store.node(node.name).state_reason}")
                continue
            if not node.journal.is_move:
                continue  # a killed start's records are the node's own: nothing to collect
            with locks.hold(locks.node(node.name), "gc", wait=False, subject=node.name):
                if act:
                    resume(node.name, provider, store, say)
                else:
                    say(f"{in_flight(store.node(node.name))}")
        except locks.Busy as busy:
            say(f"{node.name}: its {node.journal.op} is at work ({busy.holder}); left to it")
