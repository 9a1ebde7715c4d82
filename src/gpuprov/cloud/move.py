"""`start --move`: a stopped node whose zone has no capacity for it, taken with its disk to a zone that has.

An EBS volume attaches only to an instance in its own Availability Zone, and a volume made from a snapshot "begins
as an exact replica of the volume that was used to create that snapshot" (Amazon EBS user guide, "Create an Amazon
EBS volume", docs.aws.amazon.com/ebs/latest/userguide/ebs-creating-volume.html). So: an image of
the stopped instance (CreateImage snapshots its root volume; EC2 does not start a stopped instance for it) ->
RunInstances from that image, same type, key pair and security group, in each other zone that offers the type
until one has capacity -> the new instance runs -> only then the old instance is terminated (its volume with it)
and the image and its snapshot deleted. The node keeps its name, records, disk contents and bootstrap markers;
`start`'s own tail (address, ssh config, bootstrap + verify) follows. Not its host key: cloud-init deletes an
image's host keys on a new instance's first boot and makes new ones (cc_ssh, `ssh_deletekeys`, default true), so
the new key is pinned on first contact, as `up` pins a new node's (stopstart.came_up `new_instance`).

Each launch goes into a subnet of the node's own VPC in its zone (`--subnet` names one): a security group belongs to
one VPC, and EC2 refuses a launch into a subnet of another (InvalidParameter "Security group sg-… and subnet
subnet-… belong to different networks", quoted in QT-DevOps/DevOpsIssues#256 (2018) for a launch that named no
subnet and got the default VPC's, and in kubernetes-sigs/cluster-api-provider-aws#3399 (2022)).
A zone where the VPC has no subnet is skipped and said so; with none in any, the move is refused before anything is
made.

Each resource is recorded under the node before it is asked for (the image by its name, each launch by its
ClientToken). A refusal everywhere, a failure or a signal before the new instance runs removes what the move made
(the new instance, the image, its snapshot) and touches nothing of the old node: it stays stopped where it was.
A crash mid-way leaves rows that `down NAME` follows (teardown deletes a node's image rows too).

The subnet in each zone (`_targets`: DescribeSubnets by vpc-id and zone) is the zone's default subnet, else the one
with most free addresses; `--subnet` names one of the node's VPC, its zone the target. A public address is asked
for where the subnet gives none, an IPv6 one for a node reached over IPv6. The move's timeline has a `disk image`
phase (CreateImage, and CopyImage for a region move) before the capacity search.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpuprov.cloud import destroy, keys, stop_role
from gpuprov.cloud import timeline as tl
from gpuprov.cloud.providers.base import (
    Access,
    CloudResource,
    ImageRequest,
    Instance,
    LaunchError,
    LaunchRequest,
    Network,
    NotFound,
    Provider,
)
from gpuprov.cloud.providers.capabilities import title
from gpuprov.cloud.settle import settle, settle_window
from gpuprov.cloud.stopstart import StartOptions, StartResult, came_up
from gpuprov.cloud.tags import owner
from gpuprov.cloud.teardown import find_lost_launch, poll_of
from gpuprov.errors import GpuprovError, Interrupted, UserInputError
from gpuprov.state import Journal, Node, NodeState, Resource, Store, locks

if TYPE_CHECKING:
    from gpuprov.say import Say

IMAGE_PREFIX = "gpuprov-move-"  # a move's image is named IMAGE_PREFIX + node + "-" + when: its journal finds it
MOVE_STACK = "start-move"  # the image's stack tag: never a plan's stack hash, so `up` never picks it as a bake


@dataclass(frozen=True)
class MoveOptions:
    zone: str | None = None  # where to: this zone only [default: every other zone that offers the type]
    region: str | None = None  # another region: cloud/move_region.py, which the CLI calls instead
    subnet: str | None = None  # into this subnet (its zone is where to); in --region's region for a region move
    image_timeout: float = 3600.0


@dataclass(frozen=True)
class Destination:
    """One place a move asks for its instance: a zone, and the key pair, group and subnet the launch names."""

    zone: str
    access: Access


def narrowed(offered: list[str], mopts: MoveOptions, subnet_zone: str | None, instance_type: str,
             where: str) -> list[str]:
    """The zones a move may try: `--subnet`'s zone, then `--zone`, each refused in one line when the type is not
    offered there (`where` names the zones it is) or when the two disagree."""
    if subnet_zone is not None:  # the subnet says where to; --zone may only agree
        if mopts.zone is not None and mopts.zone != subnet_zone:
            raise UserInputError("--zone", f"{mopts.subnet} is in {subnet_zone}, not {mopts.zone}",
                                 "leave --zone out: the subnet's zone is where the node goes")
        if subnet_zone not in offered:
            raise UserInputError("--subnet", f"{instance_type} is not offered in {subnet_zone}, "
                                 f"{mopts.subnet}'s zone", where)
        return [subnet_zone]
    if mopts.zone is not None:
        if mopts.zone not in offered:
            raise UserInputError("--zone", f"{instance_type} is not offered in {mopts.zone}", where)
        return [mopts.zone]
    return offered


def move(name: str, mopts: MoveOptions, opts: StartOptions, provider: Provider, store: Store, say: Say) -> StartResult:
    store.node(name)  # an unknown name is refused before the lock is waited for
    with locks.nodes([name], "start --move", say):
        return _move(name, mopts, opts, provider, store, say)


def check_movable(node: Node) -> None:
    """What no move can take (to another zone or region): a cluster, a node that is not stopped, a spot node."""
    name = node.name
    if node.cluster_size:
        raise UserInputError("NAME", f"{name} is a cluster; `start --move` takes one node", f"`gpuprov down {name}`")
    if node.state != "stopped":
        raise UserInputError("NAME", f"{name} is {node.state}", "only a stopped node can move")
    if node.market == "spot":
        raise UserInputError("--move", f"{name} is a spot node, whose request {title(node.provider)} keeps in its zone",
                             f"`gpuprov down {name}`, or `gpuprov image bake` it first and `gpuprov up` elsewhere")


def _checked(name: str, mopts: MoveOptions, provider: Provider,
             store: Store) -> tuple[Node, Resource, list[str], Network | None]:
    node = store.node(name)
    check_movable(node)
    rows = [r for r in store.resources(name, region=node.region, kind="instance") if r.cloud_id]
    if len(rows) != 1 or not node.instance_type:
        raise GpuprovError(f"{name} has no single recorded instance (state {node.state}); `gpuprov down {name}`")
    offered = [z for z in provider.offerings(node.region, [node.instance_type]).get(node.instance_type, [])
               if z != node.zone]
    pinned = provider.network(node.region, mopts.subnet) if mopts.subnet else None
    if pinned is not None and pinned.zone == node.zone:
        raise UserInputError("--subnet", f"{mopts.subnet} is in {node.zone}, where {name} already is",
                             "a subnet in another zone, or leave --subnet out")
    if pinned is None and mopts.zone == node.zone:  # with --subnet, narrowed() says the two disagree
        raise UserInputError("--zone", f"{name} is already in {mopts.zone}", "another zone, or leave --zone out")
    offered = narrowed(offered, mopts, pinned.zone if pinned else None, node.instance_type,
                       f"offered in: {', '.join(offered) or 'no other zone of ' + node.region}")
    if not offered:
        raise UserInputError("--move", f"no other zone of {node.region} offers {node.instance_type}",
                             f"`gpuprov start {name} --instance-type …` in {node.zone}")
    return node, rows[0], offered, pinned


def _destinations(node: Node, current: Instance, zones: Sequence[str], pinned: Network | None, group: str,
                  provider: Provider, say: Say) -> list[Destination]:
    """A subnet of the node's own VPC in each zone (its group is that VPC's), reached as the node was: its private
    address, a public one (asked for where the subnet gives none, as `up` does), or IPv6 (a subnet with an IPv6
    CIDR block). Zones without one are skipped and said so; none anywhere is refused: nothing is made yet."""
    name = node.name
    # EC2 has had no instance outside a VPC since EC2-Classic retired; `up` without --subnet uses the default one
    vpc = current.vpc_id or provider.network(node.region, None).vpc_id
    v6 = node.address is not None and ":" in node.address
    if pinned is not None and pinned.vpc_id != vpc:
        raise UserInputError("--subnet", f"{pinned.subnet_id} is in {pinned.vpc_id}, not in {vpc}, the VPC of {name} "
                             "and its security group", f"a subnet of {vpc} in another zone, or leave --subnet out")
    found = [pinned] if pinned is not None else provider.subnets(node.region, vpc, zones)
    destinations: list[Destination] = []
    for zone in zones:
        here = [n for n in found if n.zone == zone and (n.ipv6 or not v6)]
        if not here:
            why = " with an IPv6 CIDR block (it is reached over IPv6)" if v6 and any(n.zone == zone for n in found) else ""
            say(f"  {zone}: skipped: {vpc} has no subnet there{why}")
            continue
        # a zone's default subnet where the VPC has one (as `up` without --subnet gets), else the one with most room
        best = min(here, key=lambda n: (not n.default_for_az, -n.free_addresses, n.subnet_id or ""))
        destinations.append(Destination(zone, Access(
            key_name=keys.key_name(owner()), security_group_id=group, subnet_id=best.subnet_id,
            public_ip=node.connect != "private" and not best.maps_public_ip, ipv6=v6)))
    if not destinations:
        subnet = "a subnet with an IPv6 CIDR block" if v6 else "a subnet"
        raise UserInputError("--subnet", f"{name}'s VPC {vpc} has no {subnet.removeprefix('a ')} in "
                             f"{', '.join(zones)}, where the move would go",
                             f"add {subnet} to {vpc} in one of them, then `gpuprov start {name} --move --subnet "
                             "subnet-…`")
    return destinations


def _move(name: str, mopts: MoveOptions, opts: StartOptions, provider: Provider, store: Store, say: Say) -> StartResult:
    rec = tl.Recorder("start", name)
    rec.phase(tl.CHECKS)
    node, row, zones, pinned = _checked(name, mopts, provider, store)
    old = row.cloud_id or ""
    (current,) = provider.describe(node.region, [old], settle=settle(row))
    if current.state != "stopped":
        raise UserInputError("NAME", f"{name}'s instance {old} is {current.state}", "only a stopped node can move")
    groups = [r.cloud_id for r in store.resources(name, region=node.region, kind="security-group") if r.cloud_id]
    if not groups:
        raise GpuprovError(f"{name} has no recorded security group; `gpuprov down {name}`")
    destinations = _destinations(node, current, zones, pinned, groups[0], provider, say)
    made: list[int] = []  # the move's own rows: what a failure takes back
    journal = Journal(op="move", node=name, step="image", region=node.region, zone=node.zone, old_instance=old,
                      began_at=time.time())
    try:
        note(store, journal)
        rec.phase(tl.IMAGE)
        image_id, _image_row = image_disk(node, old, provider, store, say, made)
        journal = note(store, replace(journal, step="launch", image=image_id))
        instance = launch(node, node.region, image_id, destinations, provider, store, say, rec, made)
    except BaseException:
        take_back(node, made, provider, store, say)
        undone(store, name)
        raise
    # the new instance runs: from here the node lives there, and the old one is retired
    journal = note(store, replace(journal, step="retire", new_instance=instance.id, new_zone=instance.zone,
                                  new_state=instance.state))
    with half_done(name):
        finish(node, journal, instance, provider, store, say)
    return came_up(name, store.node(name), instance, opts, node.instance_type or "", None, store, say, rec,
                   new_instance=True)


def note(store: Store, journal: Journal) -> Journal:
    """The move's next step, recorded before it is taken: the node is `moving` and its state says how far."""
    store.update_node(journal.node, state=NodeState.MOVING, journal_json=journal.to_json(),
                      state_reason=journal.describe())
    return journal


def undone(store: Store, name: str) -> None:
    """The move was taken back: the node is stopped where it was, nothing in flight."""
    store.update_node(name, state=NodeState.STOPPED, journal_json=None, state_reason=None)


@contextmanager
def half_done(name: str) -> Iterator[None]:
    """A signal once the new instance runs leaves the move to be finished, never undone: the last line says how."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted):
            exc.note = (f"{name} is moving: its new instance runs and the old one is not yet retired; "
                        f"run: gpuprov start {name} (finishes the move) or gpuprov stop {name}")
        raise


def move_images(name: str, region: str, store: Store) -> list[Resource]:
    """The images (and copies) a move of `name` made in `region`: their names begin as image_disk names them."""
    return [r for r in store.resources(name, region=region, kind="image")
            if (r.client_token or "").startswith(f"{IMAGE_PREFIX}{name}-")]


def finish(node: Node, journal: Journal, instance: Instance, provider: Provider, store: Store, say: Say) -> None:
    """The new instance runs (or ran): its volumes recorded, the old instance retired with its volumes, the move's
    image gone, and the node recorded in its new zone, `starting`, nothing in flight."""
    name = node.name
    kept = {r.cloud_id for r in store.resources(name, region=journal.to, kind="volume")}
    old_volumes = [v for v in store.resources(name, region=journal.region, kind="volume")
                   if v.cloud_id and v.cloud_id not in instance.volume_ids]
    for volume in instance.volume_ids:
        if volume not in kept:
            store.add_resource(name, "volume", journal.to, volume)
    olds = [r for r in store.resources(name, region=journal.region, kind="instance") if r.cloud_id == journal.old_instance]
    if olds:
        retire(node, olds[0], old_volumes, provider, store, say)
    for image in move_images(name, journal.region, store):
        forget_image(node, journal.region, image.id, provider, store, say)
    store.update_node(name, zone=instance.zone, state=NodeState.STARTING, journal_json=None, state_reason=None)
    store.event(name, "moved", f"{journal.old_instance} {journal.zone} -> {instance.id} {instance.zone}")
    say(f"{name}: moved to {instance.zone} ({instance.id}); the old instance {journal.old_instance} is terminated")


def image_disk(node: Node, iid: str, provider: Provider, store: Store, say: Say, made: list[int],
          where: str = "another zone") -> tuple[str, int]:
    image_name = f"{IMAGE_PREFIX}{node.name}-{int(time.time())}"
    say(f"{node.name}: imaging its disk ({iid}, stopped) to take it to {where}")
    rid = store.intend(node.name, "image", node.region, image_name)
    made.append(rid)
    image_id = provider.create_image(ImageRequest(
        region=node.region, instance_id=iid, name=image_name, description=f"gpuprov start --move of {node.name}",
        source_node=node.name, stack=MOVE_STACK, os=str(node.plan.get("os") or "")))
    store.created(rid, image_id)
    provider.wait_image(node.region, image_id, timeout=3600, settle=settle_window())
    return image_id, rid


def launch(node: Node, region: str, image_id: str, destinations: Sequence[Destination], provider: Provider, store: Store,
           say: Say, rec: tl.Recorder, made: list[int]) -> Instance:
    """RunInstances from the move's image in each destination until one has capacity; each launch recorded first."""
    refused: list[str] = []
    rec.phase(tl.CAPACITY)
    # the role its guards stop it with, as its first launch had (a record of before it: none, as before)
    role = stop_role.for_launch(provider, store, say) if node.plan.get("guards", {}).get("stop_role") else None
    for dest in destinations:
        zone, access = dest.zone, dest.access
        token = f"gpuprov-{node.name}-move-{uuid.uuid4().hex[:12]}"
        into = f", subnet {access.subnet_id}" if access.subnet_id else ""
        say(f"asking for {node.instance_type} in {zone}{into} (on-demand, from the image of its disk)")
        rid = store.intend(node.name, "instance", region, token)
        made.append(rid)
        asked = rec.now()
        try:
            instance = provider.launch(LaunchRequest(
                node=node.name, region=region, zone=zone, instance_type=node.instance_type or "",
                market="on-demand", image_id=image_id, access=access, disk_gb=node.disk_gb or 100, client_token=token,
                shutdown_behavior=node.shutdown_action or "stop", instance_profile=role), settle=settle_window())
        except LaunchError as exc:
            rec.attempt(node.instance_type or "", zone, "on-demand", asked, exc.code, exc.message)
            say(f"  {exc.code}: {exc.message}")
            if exc.then != "retry":
                store.deleted(rid)
                made.remove(rid)
            if exc.then not in ("next-candidate", "next-market", "retry"):
                raise GpuprovError(f"{title(provider)} refused the move: {exc.code}: {exc.message}") from None
            refused.append(f"{zone}: {exc.code}")
            continue
        store.created(rid, instance.id)
        rec.attempt(node.instance_type or "", zone, "on-demand", asked)
        rec.phase(tl.RUNNING)
        return provider.wait_running(region, instance.id, timeout=900, settle=settle_window())
    if region != node.region:
        raise GpuprovError(f"no zone of {region} had capacity for {node.instance_type}: {'; '.join(refused)}")
    raise GpuprovError(f"no other zone had capacity for {node.instance_type}: {'; '.join(refused)}")


def take_back(node: Node, made: list[int], provider: Provider, store: Store, say: Say) -> None:
    """What the move made goes (its instance first, then the image and snapshot); the old node is not touched."""
    rows = {r.id: r for r in store.resources(node.name, region=node.region)}
    mine = [rows[i] for i in made if i in rows]
    say(f"{node.name}: the move failed; removing what it made (the node stays stopped in {node.zone}, untouched)")
    for r in mine:
        if r.kind == "instance" and r.cloud_id is None:  # a launch whose answer never came: its ClientToken finds it
            find_lost_launch(r, provider, store, poll_of(provider))
    rows = {r.id: r for r in store.resources(node.name, region=node.region)}
    mine = [rows[i] for i in made if i in rows]
    instances = [r for r in mine if r.kind == "instance" and r.cloud_id]
    if instances:
        ids = [r.cloud_id or "" for r in instances]
        with destroy.take_back(node.name, "start --move"):
            destroy.end(provider, node.name, node.region, ids, settle=max(settle(r) for r in instances))
        provider.wait_terminated(node.region, ids)
        for r in instances:
            store.deleted(r.id)
            say(f"  removed instance {r.cloud_id}")
    for r in mine:
        if r.kind == "image" and r.cloud_id is None:  # CreateImage never answered: its unique name finds it
            found = provider.images(node.region, name=r.client_token or "")
            if not found:
                store.deleted(r.id)
                continue
            store.created(r.id, found[0].id)
        if r.kind == "image":
            forget_image(node, node.region, r.id, provider, store, say)


def retire(node: Node, row: Resource, volumes: list[Resource], provider: Provider, store: Store, say: Say) -> None:
    """The old instance, once the new one runs: terminated, then its volumes (the root one goes with it:
    DeleteOnTermination; a NotFound is that)."""
    old = row.cloud_id or ""
    try:
        with destroy.take_back(node.name, "start --move"):  # the new instance runs from the image of its disk
            destroy.end(provider, node.name, node.region, [old], settle=0)
        provider.wait_terminated(node.region, [old])
    except NotFound:
        pass
    store.deleted(row.id)
    for vol in volumes:
        try:
            with destroy.take_back(node.name, "start --move"):
                destroy.remove(provider, CloudResource("volume", vol.cloud_id or "", node.region, node.name),
                               settle=settle(vol))
        except NotFound:
            pass
        except GpuprovError as exc:  # still detaching, say: kept on the record, `down` removes it
            say(f"  could not delete the old volume {vol.cloud_id} yet ({exc}); `gpuprov down {node.name}` will")
            continue
        store.deleted(vol.id)


def forget_image(node: Node, region: str, rid: int, provider: Provider, store: Store, say: Say) -> None:
    row = next((r for r in store.resources(node.name, region=region, kind="image") if r.id == rid), None)
    if row is None or not row.cloud_id:
        return
    try:
        with destroy.take_back(node.name, "start --move"):  # the move's own image, made and used by it
            removed = destroy.remove_image(provider, node.name, region, row.cloud_id, settle=settle(row))
    except NotFound:
        removed = []
    store.deleted(rid)
    say(f"  removed the move's image {row.cloud_id}" + (f" and {', '.join(removed[1:])}" if len(removed) > 1 else ""))
