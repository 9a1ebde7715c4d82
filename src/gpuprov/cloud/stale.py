"""Stopped nodes forgotten: a stopped node bills its disk every month, so `gc --stopped-for 14d` finds (and with
`--yes` takes down) the nodes stopped longer than that, saying what each has cost while stopped; `status` flags
them (past the config's `stopped_for`, else 14 days).

What a stopped disk costs: the catalog's gp3 price per GB-month (catalog.yaml `storage`, with its source) for the
time stopped; on a cloud whose catalog has none, the node's own disk price its cloud answered at launch or stop
(`disk_usd_hour`, Alibaba Cloud's DescribePrice). EBS bills "by the gigabyte-month … how many gigabytes … and how
long" (AWS re:Post knowledge center, "How are charges for Amazon EBS volumes calculated on my bill?",
repost.aws/knowledge-center/ebs-volume-charges: "In a 30-day month … a 1-GB volume for 720 hours"); the month is taken
as 30 days here, so a 31-day month's figure is about 3 % high, a February's 7 % low.

A stopped node is never an orphan (cloud/gc.py): this is a separate choice the user makes with a duration.
Each decision is made again under the node's lock just before its teardown, which goes through the destroy gate
(cloud/destroy.py); a node another gpuprov is working on (a `start` meanwhile) is left alone and named, and so is
one whose playbook saves data on `down`: stopped, it cannot run the save.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuprov.cloud import destroy
from gpuprov.cloud.providers.base import Provider
from gpuprov.cloud.teardown import Teardown, take_down
from gpuprov.state import Node, Store, locks

if TYPE_CHECKING:
    from gpuprov.say import Say

MONTH_SECONDS = 30 * 86400  # a GB-month's month (see above)
FLAG_SECONDS = 14 * 86400  # what `status` flags when the config sets no `stopped_for`


@dataclass(frozen=True)
class Stale:
    node: Node
    stopped_seconds: float
    disk_usd: float | None  # what its disk has cost while stopped (None: its size or its cloud's disk price unknown)
    month_usd: float | None  # what the disk costs a month


def stopped_seconds(node: Node, now: float) -> float | None:
    """How long the node has been stopped (by `stop`, or by its guards); None unless it is stopped."""
    if node.state != "stopped" or node.stopped_at is None:
        return None
    return max(0.0, now - node.stopped_at)


def month_usd(node: Node) -> float | None:
    from gpuprov.plan.plan import catalog_for

    storage = catalog_for(node.provider).storage  # None: its cloud's catalog has no disk price ...
    if storage is None and node.disk_usd_hour is not None:  # ... but the cloud priced the node's own, at launch or stop
        return node.disk_usd_hour * MONTH_SECONDS / 3600
    return storage.month(node.disk_gb) if node.disk_gb and storage is not None else None


def of(node: Node, now: float) -> Stale | None:
    """The node as a stopped one (how long, what its disk cost meanwhile), or None when it is not stopped."""
    seconds = stopped_seconds(node, now)
    if seconds is None:
        return None
    month = month_usd(node)
    return Stale(node, seconds, month * seconds / MONTH_SECONDS if month is not None else None, month)


def stopped_longer(nodes: Sequence[Node], seconds: float, now: float) -> list[Stale]:
    """The nodes stopped longer than `seconds`, longest first."""
    found = [s for s in (of(n, now) for n in nodes) if s is not None and s.stopped_seconds > seconds]
    return sorted(found, key=lambda s: -s.stopped_seconds)


def take_stale(stale: Sequence[Stale], seconds: float, now: float, provider: Provider, store: Store,
               say: Say, *, anyone: bool) -> dict[str, Teardown]:
    """Take down each node found, if under its lock it is still stopped since before the cut-off (a `start` that
    ran meanwhile saves it); a node whose lock is held is named and left, and so is one the destroy gate refuses (its
    `when: down` data cannot be saved while it is stopped: its Teardown names why). `anyone`: with team state, the
    caller chose every member's nodes (`--team`)."""
    done: dict[str, Teardown] = {}
    for found in stale:
        name = found.node.name
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(locks.hold(locks.node(name), "gc --stopped-for", wait=False, subject=name))
            except locks.Busy as busy:
                say(f"left {name} alone: {busy.holder} is working on it")
                continue
            node = store.find_node(name)
            again = of(node, now) if node is not None else None
            if again is None or again.stopped_seconds <= seconds:
                say(f"left {name}: no longer stopped since before the cut-off")
                continue
            try:  # the gate: a node whose `when: down` data cannot be saved (it is stopped) is refused by name
                with destroy.node(name, store, say, anyone=anyone, no_save=False):
                    done[name] = take_down(name, found.node.region, provider, store, say)
            except destroy.Refused as refused:
                say(f"left {name}: {refused}")
                done[name] = Teardown(name, left=[str(refused).splitlines()[0]])
                continue
            if done[name].complete:
                store.update_node(name, state_reason="stopped too long; collected by gc --stopped-for")
    return done
