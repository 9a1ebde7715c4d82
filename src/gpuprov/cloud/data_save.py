"""A node whose playbook saves data on `down` (`data:` entries with `when: down`): every member of it (each node of a
cluster) runs its save-data helper (templates/data_save.sh.j2) over SSH before anything is taken down; a save that
fails, or a node that cannot run it (stopped, unreachable), stops the take-down with nothing touched, so no
checkpoint goes with the disk unless the user says so (`down --no-save`). The destroy gate (cloud/destroy.py) runs
it, for `down` and `gc --stopped-for` alike."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuprov.errors import GpuprovError
from gpuprov.hosts.remote import HostSettings
from gpuprov.plan.data import SAVE_HELPER
from gpuprov.plan.inventory import Target
from gpuprov.state import Node

if TYPE_CHECKING:
    from gpuprov.say import Say

SAVE_TIMEOUT = 3600.0  # an hour for a checkpoint to go up; past that the user decides (--no-save)


def down_saves(node: Node) -> list[dict[str, Any]]:
    """The node's `data:` uploads for `down`, as its plan recorded them ([] for a node without, or from before)."""
    if not node.live:
        return []
    return [d for d in node.plan.get("data") or [] if "down" in (d.get("when") or [])]


def question(saving: dict[str, list[dict[str, Any]]]) -> str:
    """What the confirmation says besides the teardown: each node's uploads, first."""
    return "".join(f"\n  first {name} saves " + "; ".join(f"{d['from']} → {d['to']}" for d in saves)
                   + " (--no-save: do not)" for name, saves in saving.items())


class NotSaved(GpuprovError):
    """A node's `when: down` uploads did not run, or failed: nothing of it is taken down."""


def save_before_down(node: Node, targets: Sequence[Target], settings: HostSettings, say: Say) -> None:
    """Run `save-data down` (sudo) on each of the node's members (`targets`: every node of a cluster); NotSaved at
    the first that cannot, before anything is taken down. No targets: the node cannot be reached to save."""
    from gpuprov.hosts.access import exec_one

    if not targets:
        raise NotSaved(f"{node.name} is {node.state}: it cannot save its data before `down` (nothing was "
                       "taken down)\n  " + (f"`gpuprov start {node.name}` first, or " if node.state == "stopped"
                                            else "") + f"`gpuprov down {node.name} --no-save` to lose it")
    for target in targets:
        label = target.label or node.name
        say(f"{label}: saving its data first ({SAVE_HELPER} down)")
        # GPUPROV_SYSROOT: the prefix of every gpuprov path on a test host (empty on a real one), as in the steps
        result = exec_one(target, settings, f'"${{GPUPROV_SYSROOT:-}}"{shlex.quote(SAVE_HELPER)} down',
                          lambda t, stream, line: say(f"  {line}"), sudo=True, timeout=SAVE_TIMEOUT)
        if result.exit_code != 0:
            why = result.error or (f"no {SAVE_HELPER} on it: was it bootstrapped with its playbook?"
                                   if result.exit_code == 127 else
                                   f"save-data exited {result.exit_code}: {result.exit_code} upload(s) failed")
            raise NotSaved(f"{label}: its data was not saved ({why}); nothing was taken down\n  its log: "
                           f"/var/log/gpuprov/save-data.log; `gpuprov down {node.name} --no-save` to lose it")
