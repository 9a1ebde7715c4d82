"""`gpuprov down` of a node whose playbook saves data on `down` (`data:` entries with `when: down`): the node runs
its save-data helper (templates/data_save.sh.j2) over SSH before anything is taken down; a save that fails, or a node
that cannot run it (stopped, unreachable), stops the `down` with nothing touched, so no checkpoint goes with the disk
unless the user says so (`down --no-save`)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
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


def save_before_down(nodes: Sequence[Node], target_for: Callable[[str], Target | None], settings: HostSettings,
                     say: Say) -> None:
    """Run `save-data down` on each node (sudo); the first that cannot is a GpuprovError, before any teardown."""
    from gpuprov.hosts.access import exec_one

    for node in nodes:
        target = target_for(node.name) if node.state in ("ready", "running", "bootstrapping") else None
        if target is None:
            raise GpuprovError(f"{node.name} is {node.state}: it cannot save its data before `down` (nothing was "
                               "taken down)\n  " + (f"`gpuprov start {node.name}` first, or " if node.state == "stopped"
                                                    else "") + f"`gpuprov down {node.name} --no-save` to lose it")
        say(f"{node.name}: saving its data first ({SAVE_HELPER} down)")
        # GPUPROV_SYSROOT: the prefix of every gpuprov path on a test host (empty on a real one), as in the steps
        result = exec_one(target, settings, f'"${{GPUPROV_SYSROOT:-}}"{shlex.quote(SAVE_HELPER)} down',
                          lambda t, stream, line: say(f"  {line}"), sudo=True, timeout=SAVE_TIMEOUT)
        if result.exit_code != 0:
            why = result.error or (f"no {SAVE_HELPER} on it: was it bootstrapped with its playbook?"
                                   if result.exit_code == 127 else
                                   f"save-data exited {result.exit_code}: {result.exit_code} upload(s) failed")
            raise GpuprovError(f"{node.name}: its data was not saved ({why}); nothing was taken down\n  its log: "
                               f"/var/log/gpuprov/save-data.log; `gpuprov down {node.name} --no-save` to lose it")
