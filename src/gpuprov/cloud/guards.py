"""Guardrails changed on a live node (or a bootstrapped host): its idle autostop and its TTL deadline.

Each change runs the same guard step the bootstrap runs, rendered with the new value, over SSH (sudo),
then records it for a node. `ttl off` also lifts a --budget cap (the deadline is the user's then).

A node launched (or changed) with `--locked` records who locked its guardrails (Node.guards_locked_by): any
other member's change is refused before the node is reached, so a teammate cannot lift the TTL or budget a
node was given (stopping it or taking it down stays anyone's: those only save money).

`recorded_guards` says which guard steps a node's record implies, monitoring included: what `image bake` puts back
once the image is made, and what a check of a running node expects to find on it."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.hosts.remote import HostSettings
from gpuprov.plan.inventory import Target
from gpuprov.state import Node, NodeUpdate, Store, locks

if TYPE_CHECKING:
    from gpuprov.hosts.remote import Remote
    from gpuprov.plan.render import StepPlan
    from gpuprov.say import Say


@dataclass(frozen=True)
class RecordedGuards:
    """The steps a node's record says run on it, in the plan's order: its guards (autostop, ttl, spot-interrupt)
    and its monitoring (metrics, health). The ttl step starts a deadline (`reset`); run with its clock
    (GPUPROV_NOW) at `ttl_started`, that deadline is the one recorded (the TTL's, or the budget's when sooner)."""

    steps: tuple[StepPlan, ...]
    ttl_started: int | None = None
    deadline: int | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    def clock(self, step: str) -> str:
        """What goes before a step's script so that it keeps the recorded deadline (the ttl step's clock)."""
        return f"GPUPROV_NOW={self.ttl_started} " if step == "ttl" and self.ttl_started is not None else ""


def recorded_guards(node: Node) -> RecordedGuards:
    """The guard and monitoring steps a node's record implies: the plan it was bootstrapped with (its autostop,
    TTL, spot watch, the Capacity Block's end its watch warns before, its --metrics/--health), with the TTL or
    budget deadline it records, not a new one."""
    from gpuprov.cloud.stopstart import node_plan
    from gpuprov.plan.plan import guard_steps, ttl_step

    plan = node_plan(node)
    guards = plan.guards
    if node.reservation_end is not None:
        guards = guards.model_copy(update={"block_end": int(node.reservation_end)})
    deadlines = [d for d in (node.ttl_deadline, node.budget_deadline if node.budget_usd is not None else None)
                 if d is not None]
    started = deadline = None
    if deadlines:
        deadline = round(min(deadlines))
        ttl = node.ttl_seconds if node.ttl_deadline == min(deadlines) and node.ttl_seconds else \
            max(1, deadline - int(time.time()))
        started = deadline - ttl
        guards = guards.model_copy(update={"ttl_seconds": ttl})
    steps = [ttl_step(guards, reset=True) if s.name == "ttl" else s for s in guard_steps(guards)]
    steps += [s for s in plan.steps if s.kind == "monitor"]
    return RecordedGuards(tuple(steps), started, deadline)



def run_step(remote: Remote, label: str, name: str, text: str, failed: str, env: str = "") -> str:
    """One rendered step's script over an open connection, as root, `env` (assignments, quoted) before it; returns
    its GPUPROV_RESULT. One that exits non-zero or ends without that line is `{label}: {failed} failed`."""
    import shlex

    path = f"/tmp/gpuprov-{name}-{uuid.uuid4().hex[:12]}.sh"
    remote.put_bytes(text.encode(), path)
    result = remote.run(f"{env}bash {shlex.quote(path)}; rc=$?; rm -f {shlex.quote(path)}; exit $rc", sudo=True)
    lines = result.stdout.strip().splitlines()
    if not result.ok or not lines or not lines[-1].startswith("GPUPROV_RESULT="):
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise GpuprovError(f"{label}: {failed} failed (exit {result.exited}): {tail}")
    return lines[-1].split("=", 1)[1]


def _run_guard_step(label: str, what: str, script_text: str, target: Target, settings: HostSettings) -> str:
    """Run one rendered guard step on a live machine over SSH (sudo); returns its GPUPROV_RESULT."""
    from gpuprov.hosts.remote import Remote

    remote = Remote(target, settings)
    remote.open()
    try:
        return run_step(remote, label, what, script_text, f"the {what} step")
    finally:
        remote.close()


def _live_node(name: str | None, store: Store | None, what: str) -> Node | None:
    if name is None or store is None:
        return None
    node = store.node(name)
    if node.state not in ("ready", "running", "bootstrapping"):
        raise UserInputError("NAME", f"{name} is {node.state}", f"{what} changes a running node"
                             + (f"; `gpuprov start {name}` first" if node.state == "stopped" else ""))
    return node


class GuardsLock(TypedDict, total=False):
    """The lock's field of a node's record, as `check_lock` returns it to be written."""

    guards_locked_by: str | None


def check_lock(node: Node | None, what: str, lock: bool | None = None) -> GuardsLock:
    """Refuse a change to a node whose guardrails another member locked (one line, exit 2, nothing touched);
    returns the lock's field for the record: `lock` True locks them to this member, False unlocks, None keeps."""
    from gpuprov.cloud.tags import owner

    if node is None:
        if lock is not None:
            raise UserInputError("--locked" if lock else "--unlocked", "only a node's guardrails can be locked",
                                 "a host bootstrapped by hand has no shared record")
        return {}
    me = owner()
    if node.guards_locked_by is not None and node.guards_locked_by != me:
        raise UserInputError("NAME", f"{node.name}'s autostop, TTL and budget are locked by {node.guards_locked_by}: "
                             f"only they can change or lift them ({what} refused)",
                             f"ask them, or `gpuprov stop {node.name}` / `gpuprov down {node.name}`")
    if lock is None:
        return {}
    return {"guards_locked_by": me if lock else None}


def set_autostop(name: str | None, seconds: int | None, store: Store | None, target: Target, settings: HostSettings,
                 say: Say, lock: bool | None = None) -> str:
    with locks.nodes([name] if name else [], "autostop", say):  # one change to a node at a time
        return _set_autostop(name, seconds, store, target, settings, say, lock)


def _set_autostop(name: str | None, seconds: int | None, store: Store | None, target: Target,
                  settings: HostSettings, say: Say, lock: bool | None = None) -> str:
    """Change a running node's (or a bootstrapped host's: name None) autostop window (None: off) over SSH,
    then record it for a node.

    Runs the same `autostop` step the bootstrap runs, rendered with the new window: it rewrites
    /etc/gpuprov/autostop.conf and enables or disables gpuprov-autostop.timer. Returns its result.
    """
    from gpuprov.plan.plan import autostop_script
    from gpuprov.plan.spec import format_duration

    node = _live_node(name, store, "autostop")
    locked = check_lock(node, "autostop", lock)
    label = name or target.label or target.host
    script = autostop_script(seconds, shutdown_action=node.shutdown_action if node else None,
                             cloud=node.provider if node else "aws")
    result = _run_guard_step(label, "autostop", script.text, target, settings)
    if node is not None and store is not None:
        store.update_node(node.name, autostop_seconds=seconds, **locked)
        store.event(node.name, "autostop", f"autostop {format_duration(seconds)}")
    say(f"{label}: autostop {'off' if seconds is None else 'after ' + format_duration(seconds) + ' idle'}")
    return result


def set_ttl(name: str | None, seconds: int | None, store: Store | None, target: Target, settings: HostSettings,
            say: Say, lock: bool | None = None) -> str:
    with locks.nodes([name] if name else [], "ttl", say):  # one change to a node at a time
        return _set_ttl(name, seconds, store, target, settings, say, lock)


def _set_ttl(name: str | None, seconds: int | None, store: Store | None, target: Target, settings: HostSettings,
             say: Say, lock: bool | None = None) -> str:
    """Give a running node (or a bootstrapped host: name None) a new deadline, `seconds` from now, or none
    (None), over SSH: the `ttl` step rendered to start a new deadline. `off` also lifts a --budget cap."""
    from gpuprov.plan.plan import ttl_script
    from gpuprov.plan.spec import format_duration

    node = _live_node(name, store, "ttl")
    locked = check_lock(node, "ttl", lock)
    label = name or target.label or target.host
    script = ttl_script(seconds, shutdown_action=node.shutdown_action if node else None,
                        cloud=node.provider if node else "aws")
    started = time.time()
    result = _run_guard_step(label, "ttl", script.text, target, settings)
    if node is not None and store is not None:
        deadline = started + seconds if seconds is not None else None
        fields: NodeUpdate = {"ttl_seconds": seconds, "ttl_deadline": deadline, "ttl_end": deadline}
        if "guards_locked_by" in locked:
            fields["guards_locked_by"] = locked["guards_locked_by"]
        if node.budget_usd is not None:  # the deadline is the user's now, not the budget's
            fields["budget_usd"] = fields["budget_deadline"] = fields["budget_price"] = None
            say(f"{label}: the ${node.budget_usd:g} budget no longer applies (the deadline is set by hand)")
        store.update_node(node.name, **fields)
        store.event(node.name, "ttl", f"ttl {format_duration(seconds)}")
    if seconds is None:
        say(f"{label}: TTL off (no deadline)")
    else:
        at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started + seconds))
        say(f"{label}: TTL {format_duration(seconds)}: shuts down at about {at}")
    return result

