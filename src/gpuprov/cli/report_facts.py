"""What `gpuprov facts` prints: each family with its age and origin, the driver branches and their lifecycle,
then each family's source and unverified notes. Presentation only."""

from __future__ import annotations

from datetime import date
from typing import TYPE_CHECKING, Literal, TypedDict

from rich.console import Group
from rich.padding import Padding
from rich.text import Text

from gpuprov.cli.fittable import Column, FitTable

if TYPE_CHECKING:
    from rich.console import RenderableType

    from gpuprov.plan.facts import FamilyState


class DriverBranch(TypedDict):
    """A driver branch and its lifecycle, as `facts --json` prints it and the view shows it."""

    branch: int
    type: Literal["LTSB", "PB", "NFB"] | None
    end_of_life: str | None
    ended: bool
    installable: bool
    pinning_package_seen: bool


def facts_view(states: list[FamilyState], branches: list[DriverBranch], today: date) -> Group:
    from gpuprov.plan.facts import STALE_DAYS, stale_note

    table = FitTable([Column("family"), Column("read"), Column("age", "right"), Column("from"),
                      Column("unverified", "right", drop=1)],
                     title=f"Facts gpuprov plans with (stale after {STALE_DAYS} days)")
    for s in states:
        age = s.age_days(today)
        table.add_row(s.family.name, s.read.isoformat(), Text(f"{age}d", style="yellow" if age > STALE_DAYS else ""),
                      "your refresh" if s.origin == "refreshed" else "snapshot", str(len(s.unverified)))
    lifecycle = FitTable([Column("branch"), Column("type"), Column("end of life"), Column("status"),
                          Column("pinning package", drop=1)], title="Driver branches (NVIDIA's lifecycle)")
    for b in branches:
        status = ("ended" if b["ended"] else "supported") + ("" if b["installable"] else " (not installable)")
        lifecycle.add_row(f"R{b['branch']}", b["type"] or "?", b["end_of_life"] or ("ended" if b["ended"] else "-"),
                          Text(status, style="yellow" if b["ended"] else ""),
                          "seen" if b["pinning_package_seen"] else ("not seen" if b["installable"] else "-"))
    parts: list[RenderableType] = [table, lifecycle]
    for s in states:
        parts.append(Text(f"{s.family.name}: {s.family.what}", style="bold"))
        parts.append(Padding(Text(f"source: {s.source}"), (0, 0, 0, 2)))
        if s.family.refreshed_from:
            parts.append(Padding(Text(f"`gpuprov facts refresh` reads: {s.family.refreshed_from}", style="dim"),
                                 (0, 0, 0, 2)))
        parts.extend(Padding(Text(f"unverified: {note}", style="yellow"), (0, 0, 0, 2)) for note in s.unverified)
    if note := stale_note(on=today):
        parts.append(Text(f"warning: {note}", style="yellow"))
    return Group(*parts)
