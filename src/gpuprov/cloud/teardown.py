"""Take a node's cloud resources down, following the local records first, and never half-way.

Order: spot requests (a persistent one would relaunch a terminated instance: each recorded instance is read
by id first to learn its request; an instance whose request cannot be cancelled is left running, named), then
instances (by recorded id; launches whose answer was lost are found by their ClientToken, looked for as long
as EC2 may not show them yet), then volumes, then the
security group (by recorded id, or by its recorded name), a cluster's Elastic IPs and placement
group (EC2 refuses both while an instance uses them), then whatever else carries the node's tag.
A NotFound on a resource created moments ago is looked at again (EC2 is eventually consistent); on
an older one it means gone. A row is marked deleted only once the cloud confirmed it. What could
not be removed is returned, not raised, so the other resources still go.

TerminateInstances goes one recorded id per call. Lost launches are looked for by ClientToken with backoff for the
whole settle window, since the token filter lags too, and one token may have launched a whole cluster. A lost
create of the security group, an Elastic IP or a placement group is followed by its recorded name. `take_down` runs
this for one node with its record (`terminating`; once complete, the region's key pair if no node needs it, the
ssh config entry, a cluster's record, `terminated`), only inside the destroy gate (cloud/destroy.py: `node`,
`take_back`), whose `end` and `remove` it asks instead of the provider; `down` runs it for several and raises
`TeardownIncomplete` naming what is left. A node's `image` rows are followed too, so `down` finishes a move that crashed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuprov.cloud import destroy
from gpuprov.cloud.providers.base import CloudResource, NotFound, Provider
from gpuprov.cloud.providers.capabilities import ADDRESSES, need, service
from gpuprov.cloud.settle import settle
from gpuprov.errors import GpuprovError
from gpuprov.state import NodeState, Resource, Store, locks

if TYPE_CHECKING:
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.say import Say


# Kinds EC2 refuses to delete while an instance uses them: a volume still attached (VolumeInUse), a security
# group, a cluster placement group (InvalidPlacementGroup.InUse), an Elastic IP still associated.
WAIT_FOR_INSTANCES = ("volume", "security-group", "address", "placement-group", "instance-profile", "iam-role")


@dataclass
class Teardown:
    node: str
    removed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # "security-group sg-1: DependencyViolation …"
    # each row's settle window is measured from here: time spent looking for a lost launch does not make a fresh
    # group's or volume's NotFound believed later in the same teardown
    started: float = field(default_factory=time.time)

    @property
    def complete(self) -> bool:
        return not self.left


class TeardownIncomplete(GpuprovError):
    """Some of a node's resources could not be removed (yet); rerunning `down` finishes the job."""

    def __init__(self, results: Sequence[Teardown]) -> None:
        self.results = list(results)
        lines = [f"  {r.node}: {what}" for r in results for what in r.left]
        names = " ".join(r.node for r in results)
        super().__init__("could not remove everything; still there:\n" + "\n".join(lines) +
                         f"\n  the nodes stay listed; rerun: gpuprov down {names}")


def down(names: Sequence[str], provider: Provider, store: Store, say: Say, *, anyone: bool, no_save: bool,
         reach: destroy.Reach | None, settings: HostSettings | None) -> dict[str, Teardown]:
    """Terminate each node and remove everything it owns; idempotent (an already-gone node is fine). Every node's
    data is saved first (destroy.before_all), then each node goes through the destroy gate. Every node is tried;
    TeardownIncomplete afterwards names what is left of which. `anyone`: a teammate's node may go."""
    for n in names:
        store.node(n)  # an unknown name is refused before any lock is waited for
    with locks.nodes(list(names), "down", say):  # an `up`, `start` or `gc` at work on one finishes first
        records = [store.node(n) for n in names]
        destroy.before_all(records, store, anyone=anyone, no_save=no_save, reach=reach, settings=settings, say=say)
        results = {}
        for record in records:
            with destroy.node(record.name, store, say, anyone=anyone, no_save=no_save, reach=reach, settings=settings):
                results[record.name] = take_down(record.name, record.region, provider, store, say)
        return results


def take_down(name: str, region: str, provider: Provider, store: Store, say: Say) -> Teardown:
    """One node's teardown with its record, the destroy gate open for it (destroy.node, destroy.take_back):
    `terminating` while it runs; once complete, the region's key pair if no node needs it any more, its ssh config
    entry and cluster record, and `terminated`."""
    store.update_node(name, state=NodeState.TERMINATING)
    result = teardown(name, region, provider, store, say, poll=poll_of(provider))
    # a `start --move --region` that ended mid-way (cloud/move_region.py) left rows in the other region too
    others = sorted({r.region for r in store.resources(name)} - {region})
    for other in others:
        more = teardown(name, other, provider, store, say, poll=poll_of(provider))
        result.removed += more.removed
        result.left += more.left
    if not result.complete:
        store.update_node(name, state_reason="teardown incomplete: " + "; ".join(result.left)[:500])
        store.event(name, "down-incomplete", "; ".join(result.left))
        return result
    from gpuprov.cloud.keys import release_key_if_unused

    for each in [region, *others]:
        release_key_if_unused(each, provider, store, say)
    from gpuprov.cloud.stop_role import release_if_unused

    for role in release_if_unused(provider, store, say):  # the role its guards stopped it with, after the last node
        say(f"  removed the role {role} (no node uses it now)")
    from gpuprov.hosts import findings, sshconfig

    try:
        sshconfig.remove_node(name)
        findings.forget(name)  # a later node of this name starts with no health finding of this one's
    except (GpuprovError, OSError) as exc:  # a full or read-only state disk: the cloud resources are gone all the same
        say(f"  could not remove {name}'s ssh config entry or health findings: {exc}")
    if store.node(name).cluster_size:  # a launched cluster's record (`exec NAME`, `NAME:K`) goes with it
        from gpuprov import cluster

        cluster.forget(name)
    now = time.time()
    store.update_node(name, state=NodeState.TERMINATED, ended_at=now, **store.node(name).stopped_run(now))
    store.event(name, "down", ", ".join(result.removed) or "nothing left to remove")
    return result


def poll_of(provider: Provider) -> float:
    """The provider's poll interval (seconds between looks while waiting on the cloud)."""
    return float(getattr(provider, "poll", 1.0))


def teardown(node: str, region: str, provider: Provider, store: Store, say: Say, poll: float = 1.0) -> Teardown:
    result = Teardown(node)
    _instances(node, region, provider, store, say, result, poll)
    instances_left = bool(result.left)
    # "image": a `start --move` that ended mid-way (cloud/move.py) records its image under the node
    # "instance-profile", "iam-role": `up --s3-access` (cloud/data.py); IAM wants the profile emptied and gone first
    for kind in ("spot-request", "volume", "image", "security-group", "address", "placement-group", "instance-profile",
                 "iam-role"):
        for row in store.resources(node, region=region, kind=kind):
            if kind in WAIT_FOR_INSTANCES and instances_left:  # EC2 refuses while an instance still uses it
                result.left.append(f"{kind} {row.cloud_id or row.client_token}: waits for the instance")
                continue
            _delete_row(row, provider, store, say, result)
    if not result.left:  # best effort: anything else tagged with the node (tags may lag; records did the work)
        recorded = {r.cloud_id for r in store.resources(node, region=region, live_only=False)}
        try:
            tagged = provider.tagged(region)
        except GpuprovError as exc:
            say(f"  could not look for other resources tagged {node}: {exc} (`gpuprov gc` finds them)")
            tagged = []
        for res in tagged:
            if res.node == node and res.kind != "instance" and res.id not in recorded:
                _delete(res, None, provider, store, say, result)
    return result


def _instances(node: str, region: str, provider: Provider, store: Store, say: Say, result: Teardown,
               poll: float) -> None:
    rows = store.resources(node, region=region, kind="instance")
    for row in rows:
        if row.cloud_id is None and row.client_token:
            find_lost_launch(row, provider, store, poll)
    try:  # launches recorded nowhere (a row lost with an old state file) but tagged with the node
        for inst in provider.instances(region, node=node):
            if inst.state != "terminated":
                store.add_resource(node, "instance", region, inst.id)
                if inst.spot_request_id:
                    store.add_resource(node, "spot-request", region, inst.spot_request_id)
    except GpuprovError as exc:
        say(f"  could not list {node}'s instances by tag: {exc}")
    # each recorded instance read by id (not a tag filter, which lags): its spot request, if it has one, is learnt
    # here, so none is left to launch it again
    request_of = _spot_requests_of(node, region, provider, store, say)
    # a persistent spot request relaunches a terminated instance: requests are cancelled first (EC2 guide, "Cancel
    # a Spot Instance request": cancelling does not terminate the instance); one that cannot be cancelled keeps its
    # instance running, since terminating it would only make EC2 launch another
    kept: dict[str, str] = {}
    for spot in store.resources(node, region=region, kind="spot-request"):
        before = len(result.left)
        _delete_row(spot, provider, store, say, result)
        if len(result.left) > before:
            why = result.left.pop()
            for iid, sir in request_of.items():
                if sir == spot.cloud_id:
                    kept[iid] = why
            result.left.append(why)
    asked = []
    for row in store.resources(node, region=region, kind="instance"):
        if row.cloud_id is None:
            continue
        if row.cloud_id in kept:
            result.left.append(f"instance {row.cloud_id}: not terminated: its spot request could not be cancelled "
                               f"({kept[row.cloud_id].partition(': ')[2]}), and {service(provider)} would launch it again")
            continue
        try:
            destroy.end(provider, node, region, [row.cloud_id], settle=settle(row, result.started))
            asked.append(row)
        except NotFound:
            store.deleted(row.id)  # old enough to believe: it is gone
        except GpuprovError as exc:
            result.left.append(f"instance {row.cloud_id}: {exc}")
    if not asked:
        return
    try:
        provider.wait_terminated(region, [r.cloud_id for r in asked if r.cloud_id])
    except GpuprovError as exc:
        result.left += [f"instance {r.cloud_id}: termination asked, not yet confirmed ({exc})" for r in asked]
        return
    for row in asked:
        store.deleted(row.id)
        result.removed.append(f"instance {row.cloud_id}")
        say(f"  removed instance {row.cloud_id}")


def _spot_requests_of(node: str, region: str, provider: Provider, store: Store, say: Say) -> dict[str, str]:
    """Instance id -> its spot request id, for the node's recorded instances, each request recorded too."""
    ids = [r.cloud_id for r in store.resources(node, region=region, kind="instance") if r.cloud_id]
    if not ids:
        return {}
    try:
        found = provider.instances(region, ids=ids)
    except GpuprovError as exc:
        say(f"  could not read {node}'s instances by id: {exc}")
        return {}
    out = {}
    for inst in found:
        if inst.spot_request_id and inst.state != "terminated":
            store.add_resource(node, "spot-request", region, inst.spot_request_id)
            out[inst.id] = inst.spot_request_id
    return out


def find_lost_launch(row: Resource, provider: Provider, store: Store, poll: float) -> None:
    """A launch whose answer never arrived: the ClientToken finds what it made, or nothing was made. The
    client-token filter is eventually consistent too, so a fresh launch is looked for, with backoff, for as long
    as EC2 may not show it (the settle time after the request); an old one once."""
    step = poll if poll > 0 else 0.05
    window, waited, wait = settle(row), 0.0, step
    while True:
        found = provider.find_launched(row.region, row.client_token or "")
        if found:
            store.created(row.id, found[0].id)
            for inst in found:
                if inst.spot_request_id:
                    store.add_resource(row.node, "spot-request", row.region, inst.spot_request_id)
            for extra in found[1:]:
                store.add_resource(row.node, "instance", row.region, extra.id, row.client_token)
            return
        if waited + wait > window:
            break
        time.sleep(wait)
        waited += wait
        wait = min(wait * 2, step * 8)
    store.deleted(row.id)  # asked for, never made


def _delete_row(row: Resource, provider: Provider, store: Store, say: Say, result: Teardown) -> None:
    if row.cloud_id is None:  # a create whose answer was lost: its recorded name finds it
        found = _lost(row, provider)
        if found is None:
            store.deleted(row.id)
            return
        store.created(row.id, found)
        row = next(r for r in store.resources(row.node, region=row.region) if r.id == row.id)
    res = CloudResource(row.kind, row.cloud_id or "", row.region, row.node)
    _delete(res, row, provider, store, say, result)


def _lost(row: Resource, provider: Provider) -> str | None:
    """The id of a resource whose create answer never arrived, by the name recorded before the call."""
    name = row.client_token or ""
    if row.kind == "security-group":
        return provider.find_security_group(row.region, name)
    if row.kind == "address":
        return need(provider, ADDRESSES, what=row.node or row.kind).find_address(row.region, name)
    # its name is its id: deleting one never made is a NotFound (a role's or profile's `up` killed after CreateRole
    # but before the answer was recorded leaves an intent row naming it: without this the role was forgotten)
    if row.kind in ("placement-group", "iam-role", "instance-profile"):
        return name
    if row.kind == "image":  # CreateImage or CopyImage whose answer was lost: the name is unique in its region
        found = provider.images(row.region, name=name)
        return found[0].id if found else None
    return None


def _delete(res: CloudResource, row: Resource | None, provider: Provider, store: Store, say: Say,
            result: Teardown) -> None:
    try:
        destroy.remove(provider, res, settle=settle(row, result.started) if row else 0.0)
    except NotFound:
        pass  # already gone (a volume that went with its instance, a closed spot request)
    except GpuprovError as exc:
        result.left.append(f"{res.kind} {res.id}: {exc}")
        return
    else:
        result.removed.append(f"{res.kind} {res.id}")
        say(f"  removed {res.kind} {res.id}")
    if row is not None:
        store.deleted(row.id)
