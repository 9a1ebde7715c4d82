"""`gc`: what no live local node owns, found and removed.

An orphan is one of two things, and nothing else:
- the record of a node whose `up` died before `ready` (locks.abandoned: the record says so and nobody holds
  the node's lock), taken down by its records (ids and tokens; tags may lag);
- a resource tagged as this owner's (cloud/tags.py) whose node no live record claims and no gpuprov
  process is working on (its lock is free): another machine's lost state, say. The region's shared key pair
  only when no node of the region uses it (counted under the region's lock, cloud/keys.py), the role the nodes'
  guards stop them with (cloud/stop_role.py) only when no node of the cloud does; images and snapshots as
  cloud/images.py judges them, an image being baked (its lock held) never.
A stopped, started, resized or baked node is never an orphan, whatever its process did. Every decision is
made again under the node's lock just before the delete, so an `up` that starts meanwhile (it takes the lock
before it records or creates anything) is never collected; a node whose lock is held is left alone and
named. Resources of another install with this user and host name (another CI runner, a cloned VM, this
machine's own lost state folder, or an older gpuprov that tagged `user@host` alone) may be live nodes of
another machine: they are listed apart and taken only with `--all-installs`.

A stopped persistent node's `disabled` spot request counts as claimed, and so do nodes `state push` moved to the
bucket (their resources carry this owner's tag and no team tag: without the row a local `gc` would take them).
A region's refusal is collected in `Sweep.errors` (`gc --all-regions`: the regions DescribeRegions says are
enabled). Spot requests go before instances.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuprov.cloud import destroy, images, keys, own_network, stop_role, tags
from gpuprov.cloud.providers.base import GLOBAL, IMAGES, SHARED, CloudResource, NotFound, Provider
from gpuprov.cloud.providers.capabilities import ROLES, STOP_ROLE, offered
from gpuprov.cloud.teardown import take_down
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.state import Store, locks

if TYPE_CHECKING:
    from gpuprov.say import Say

# a spot request before its instance: a persistent one would launch the instance again
ORDER = {"spot-request": 0, "instance": 1, "volume": 2, "security-group": 3, "address": 3, "placement-group": 3,
         "key-pair": 4, "image": 5, "snapshot": 6, "instance-profile": 7, "iam-role": 8}  # IAM: the profile empties first


@dataclass
class Sweep:
    regions: list[str]
    found: list[CloudResource] = field(default_factory=list)  # orphans: what `gc --yes` removes
    busy: list[str] = field(default_factory=list)  # "train: gpuprov up (pid 12, since 10:01:02) is working on it"
    others: list[CloudResource] = field(default_factory=list)  # other installs' (same user@host): --all-installs
    errors: list[str] = field(default_factory=list)  # "REGION: what AWS said": that region was not swept


def orphans(regions: Sequence[str], provider: Provider, store: Store, all_installs: bool = False,
            owner: str | None = None) -> Sweep:
    """`owner`: this install's owner tag, when it is not `tags.owner()` (a listing with no install id made has
    none: every resource is another install's)."""
    sweep = Sweep(list(regions))
    me = owner or tags.owner()
    team = tags.team_tags() is not None  # team state: every resource listed is the team's (tagged so), records shared
    nodes = store.nodes()
    dead = {n.name for n in nodes if locks.abandoned(n)}
    claimed = ({n.name for n in nodes} - dead) | set(store.moved())  # moved: a bucket's records own them
    for node in nodes:
        if node.region not in regions or node.provider != provider.name:  # another cloud's: its own gc --cloud
            continue
        if node.name in dead:
            sweep.found.append(CloudResource("node", node.name, node.region, node.name,
                                             f"its `up` ended before it was ready ({node.state})"))
            for r in store.resources(node.name, region=node.region):
                sweep.found.append(CloudResource(r.kind, r.cloud_id or f"(token {r.client_token})", r.region,
                                                 node.name, "recorded"))
        elif node.up_unfinished:
            sweep.busy.append(_busy_line(node.name))
    recorded = {r.cloud_id for r in store.resources(None, live_only=False) if r.cloud_id}
    seen = {r.id for r in sweep.found}
    for region in regions:
        try:
            tagged = provider.tagged(region, everyone=True)
            roles = offered(provider, ROLES)
            if region == regions[0] and roles:  # IAM is global: its roles and profiles once, with the first region
                tagged += roles.tagged_iam(region, everyone=True)
            stops = offered(provider, STOP_ROLE)
            if region == regions[0] and stops:  # so is RAM: the role the guards stop the nodes with, once
                tagged += stops.tagged_stop_roles(everyone=True)
        except UserInputError:  # no credentials, a profile that does not exist: every region's, said once
            raise
        except GpuprovError as exc:  # one region's refusal (a region not enabled, a denied call) stops no other
            sweep.errors.append(f"{region}: {exc}")
            continue
        for res in tagged:
            if res.team and not team and res.id not in recorded and not all_installs:
                sweep.others.append(res)  # a team's resource: its shared records own it, never this local file
                continue
            if res.owner != me and res.id not in recorded and not all_installs and not team:
                sweep.others.append(res)
                continue
            if res.kind in ("image", "snapshot") or res.id in seen:  # images: cloud/images.py says which
                continue
            if res.kind == "ram-role" and res.node == SHARED:
                if res.id not in seen and not stop_role.users(provider.name, store):
                    seen.add(res.id)
                    sweep.found.append(CloudResource(res.kind, res.id, GLOBAL, SHARED, "no node uses it", res.owner))
                continue
            if res.kind in ("key-pair", *own_network.KINDS) and res.node == SHARED:
                if not keys.key_users(region, store):
                    sweep.found.append(CloudResource(res.kind, res.id, region, SHARED, "no node of the region uses it",
                                                     res.owner))
                continue
            if res.node in claimed:
                continue
            if res.node and not locks.is_free(locks.node(res.node)):
                line = _busy_line(res.node)
                if line not in sweep.busy:
                    sweep.busy.append(line)
                continue
            sweep.found.append(res)
        sweep.found += images.orphans(region, [r for r in tagged if r.owner == me or all_installs or team or
                                               r.id in recorded], provider, store)
    return sweep


def _busy_line(name: str) -> str:
    return f"{name}: {locks.holder(locks.node(name))} is working on it; left alone"


def gc(found: list[CloudResource], provider: Provider, store: Store, say: Say) -> list[str]:
    """Remove what `orphans` found, each decision made again under the lock of the node (or image) it belongs
    to: dead nodes by their records, then the rest by id, the region's key pair last (under its lock). Returns
    what could not be removed (each with the reason)."""
    left: list[str] = []
    with contextlib.ExitStack() as held:
        mine = _lock_nodes(found, held, say)
        for name in sorted({r.id for r in found if r.kind == "node" and r.id in mine}):
            node = store.find_node(name)
            if node is None or not locks.abandoned(node):
                continue
            with destroy.take_back(name, "gc"):  # an `up` that died before ready: what it made, no user data yet
                result = take_down(name, node.region, provider, store, say)
            left += [f"{name}: {what}" for what in result.left]
            if result.complete:
                store.update_node(name, state_reason="its `up` ended before it was ready; collected by gc")
        shared: dict[str, list[str]] = {}
        networks: dict[str, list[CloudResource]] = {}  # gpuprov's own network's parts, released with the key pair
        roles: list[str] = []  # the role the nodes' guards stop them with: released with the cloud's last node
        overdue: dict[str, locks.Overdue] = {}  # regions whose lock gc waited for in vain: not waited for again
        for res in sorted(found, key=lambda r: ORDER.get(r.kind, 9)):
            if res.kind == "node" or res.node in {r.id for r in found if r.kind == "node"}:
                continue
            if res.node == SHARED and res.kind == "ram-role":
                roles.append(res.id)
                continue
            if res.node == SHARED and res.kind in own_network.KINDS:
                networks.setdefault(res.region, []).append(res)
                continue
            if res.node == SHARED:
                shared.setdefault(res.region, []).append(res.id)
                continue
            if res.node != IMAGES and (res.node not in mine or _claimed(res.node, store)):
                continue  # busy, or a record claims it now
            if res.kind == "image" and not _image_free(res, held):
                say(f"left image {res.id}: a bake of it is in progress")
                continue
            if res.node == IMAGES and res.kind != "image":  # a snapshot whose image is gone: the region's lock
                if res.region in overdue:
                    left.append(f"{res.kind} {res.id}: {overdue[res.region]}")
                    continue
                try:  # bounded as a key pair's release is (a stopped holder must not keep gc waiting)
                    held.enter_context(locks.hold(locks.region(res.region), "gc", subject=f"the region {res.region}",
                                                  patience=locks.patience(keys.RELEASE_PATIENCE)))
                except locks.Overdue as late:
                    overdue[res.region] = late
                    left.append(f"{res.kind} {res.id}: {late}")
                    continue
            try:
                destroy.orphan(provider, res)
            except NotFound:
                continue
            except GpuprovError as exc:
                left.append(f"{res.kind} {res.id}: {exc}")
                continue
            say(f"deleted {res.kind} {res.id} ({res.region}, node {res.node})")
            if res.kind == "image":
                images.collected(store, res)
        for region in sorted({*shared, *networks}):
            for name in keys.release_key_if_unused(region, provider, store, say, unrecorded=shared.get(region, []),
                                                   networks=networks.get(region, [])):
                what = name if " " in name else f"key-pair {name}"  # a network part is "KIND ID"
                say(f"deleted {what} ({region}, no node of the region uses it)")
        for name in stop_role.release_if_unused(provider, store, say, unrecorded=roles):
            say(f"deleted ram-role {name} (no node uses it)")
    return left


def _lock_nodes(found: list[CloudResource], held: contextlib.ExitStack, say: Say) -> set[str]:
    """The nodes of `found` whose lock gc could take (held until the end); the others are named and skipped."""
    mine: set[str] = set()
    for name in sorted({r.node for r in found if r.node and r.node not in (SHARED, IMAGES)}):
        try:
            held.enter_context(locks.hold(locks.node(name), "gc", wait=False, subject=name))
        except locks.Busy as busy:
            say(f"left {name} alone: {busy.holder} is working on it")
            continue
        mine.add(name)
    return mine


def _claimed(name: str, store: Store) -> bool:
    node = store.find_node(name)
    return node is not None and node.live and not node.up_unfinished


def _image_free(res: CloudResource, held: contextlib.ExitStack) -> bool:
    name = res.state.split(" | ", 1)[0]  # "NAME | state" (providers/aws.py tagged)
    try:
        held.enter_context(locks.hold(locks.image(name), "gc", wait=False))
    except locks.Busy:
        return False
    return True
