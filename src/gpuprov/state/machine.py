"""A node's states and the moves between them: one table, which both stores check every state change against.

The table is what the commands do (cloud/): `up` goes launching -> running -> bootstrapping -> ready, `stop` and
`start` go round through stopping, stopped, resizing and starting (moving, for `start --move`), `image bake`
goes ready -> baking -> ready (a killed one: stopped), `status --refresh`
follows what EC2 did (stopped, interrupted, gone), `up --wait` parks a name as waiting between its passes. A move
the table lacks is a mistake in gpuprov (a command wrote a state its node cannot be in), so it is refused as a bug,
before anything is written. A teardown is never refused: `down`, a take-back and `gc` must reach every node, whatever it says.
"""

from __future__ import annotations

from enum import Enum

from gpuprov.errors import GpuprovBug


class NodeState(str, Enum):
    """Where a node is in its life. A str, so a record's state compares with, prints as, and is stored (JSON,
    SQLite) as its plain word: `node.state == "ready"`, f"{node.state}" and a state file of any gpuprov agree."""

    LAUNCHING = "launching"  # its record exists; its `up` asks for capacity
    RUNNING = "running"  # its instance runs and has an address (an `up` before its bootstrap, a `start`)
    BOOTSTRAPPING = "bootstrapping"
    READY = "ready"
    FAILED = "failed"  # its `up` failed: being taken back
    TERMINATING = "terminating"
    TERMINATED = "terminated"  # nothing of it is left; the name is free again
    STOPPING = "stopping"
    STOPPED = "stopped"  # its disk kept, its compute not billed
    RESIZING = "resizing"  # a `start --instance-type`: the type is being changed, the node stopped
    STARTING = "starting"
    MOVING = "moving"  # a `start --move`: its journal (records.Journal) says how far; the next command finishes it
    BAKING = "baking"  # an `image bake`: its journal says how far; a bake killed mid-way is settled by `start`/`stop`
    WAITING = "waiting"  # `up --wait`, between two passes: owning nothing
    INTERRUPTED = "interrupted"  # a spot node EC2 took back (a persistent one EC2 alone starts again)
    GONE = "gone"  # an on-demand node whose instance was terminated outside gpuprov

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:  # f"{state}" is the word on every Python, not "NodeState.READY"
        return format(str(self.value), spec)


S = NodeState
# where a teardown may take any node, whatever state it is in (terminated too: `down` of a record that is already
# down is harmless, and `failed` is where a take-back starts)
TEARDOWN = frozenset({S.TERMINATING, S.TERMINATED, S.FAILED, S.GONE})


def _then(*states: NodeState) -> frozenset[NodeState]:
    return frozenset(states) | TEARDOWN


# from -> the states a node may go to from it (the same state again is no change, and always allowed)
TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    # up: the instance runs (a cluster: all of them)
    S.LAUNCHING: _then(S.RUNNING),
    # up: bootstrap, or ready without one; refresh: guards (or EC2) stopped it, EC2 took a spot node back;
    # a `start` killed after its instance ran: stopped again
    S.RUNNING: _then(S.BOOTSTRAPPING, S.READY, S.STOPPING, S.STOPPED, S.INTERRUPTED),
    S.BOOTSTRAPPING: _then(S.READY, S.STOPPING, S.STOPPED, S.INTERRUPTED),
    S.READY: _then(S.STOPPING, S.STOPPED, S.INTERRUPTED, S.BAKING),
    # a bake: done or put back (ready again); a killed one settled by stopping it; refresh: EC2 took a spot node back
    S.BAKING: _then(S.READY, S.STOPPED, S.INTERRUPTED),
    S.STOPPING: _then(S.STOPPED),
    # start (resized first, or as it is; start --move), refresh: EC2 stopped a persistent spot node
    S.STOPPED: _then(S.RESIZING, S.STARTING, S.INTERRUPTED, S.MOVING),
    # a move: finished (the new instance runs, the old one retired), or undone (stopped where it was)
    S.MOVING: _then(S.STARTING, S.STOPPED),
    # EC2 refused the type: stopped as it was; or the start goes on
    S.RESIZING: _then(S.STOPPED, S.STARTING),
    # came up; refused or interrupted: stopped again; a killed `start` rerun with --instance-type
    S.STARTING: _then(S.RUNNING, S.STOPPED, S.RESIZING),
    # refresh: EC2 started the interrupted spot instance again
    S.INTERRUPTED: _then(S.READY),
    S.WAITING: _then(),
    S.FAILED: _then(),
    S.GONE: _then(),
    S.TERMINATING: _then(),
    # up --wait: a refused pass, taken back, waits for the next
    S.TERMINATED: _then(S.WAITING),
}


class IllegalTransition(GpuprovBug):
    """A state change the table refuses: gpuprov wrote a state its node cannot be in."""

    def __init__(self, node: str, old: NodeState, new: NodeState) -> None:
        self.node, self.old, self.new = node, old, new
        allowed = ", ".join(sorted(TRANSITIONS[old] - TEARDOWN)) or "only a teardown"
        super().__init__(f"node {node!r}: no move from {old} to {new} (from {old}: {allowed}); nothing was written")


def check_move(node: str, old: NodeState | str, new: NodeState) -> None:
    """Refuse (IllegalTransition) a change of `node` from `old` to `new` that the table lacks."""
    old = NodeState(old)
    if new != old and new not in TRANSITIONS[old]:
        raise IllegalTransition(node, old, new)
