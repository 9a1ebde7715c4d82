"""`start --move --region R`: a stopped node taken with its disk to another region.

An AMI is regional: CopyImage, asked in the destination region, copies it and its snapshots there ("The copy
operation must be initiated in the destination Region", EC2 API reference, CopyImage). So: an
image of the stopped instance in its region (as a zone move makes, cloud/move.py) -> CopyImage to R, recorded under
the node before it is asked for, its name as the ClientToken (a retry gets the first copy) -> the copy available ->
in R the user's key pair and a security group as `up` makes them (recorded, tagged, SSH open to what the old group
opened it to) -> RunInstances in each zone of R that offers the type until one has capacity -> running -> only then
the old instance, its volumes and its security group go, and both images with their snapshots. The node's record
gets R and the new zone; `status`, `ssh` and `down` then work on it there.

A node reached on its private address (`up --connect private --subnet …`) moves only with `--subnet` in R: its VPC
is of its own region, and only the user knows which subnet of R they reach (over a VPN, a bastion). The group is
made in that subnet's VPC, and SSH that was open to the old VPC's CIDR (`--connect private` without --ssh-cidr) is
open to the new VPC's.

A refusal everywhere, a failure or a signal before the new instance runs removes what the move made in both regions
(the new instance, group, the copy, the image, their snapshots; R's key pair if no node needs it) and touches
nothing of the old node. A crash mid-way leaves rows that `down NAME` follows in each region (cloud/teardown.py).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuprov.cloud import destroy, keys
from gpuprov.cloud import timeline as tl
from gpuprov.cloud.move import (
    Destination,
    MoveOptions,
    check_movable,
    forget_image,
    half_done,
    image_disk,
    launch,
    move_images,
    narrowed,
    note,
    retire,
    undone,
)
from gpuprov.cloud.providers.base import Access, CloudResource, ImageCopy, Instance, Network, NotFound, Provider
from gpuprov.cloud.providers.capabilities import IMAGE_COPY, need
from gpuprov.cloud.settle import settle, settle_window
from gpuprov.cloud.stopstart import StartOptions, StartResult, came_up
from gpuprov.cloud.teardown import find_lost_launch, poll_of
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.state import Journal, Node, NodeState, Resource, Store, locks

if TYPE_CHECKING:
    from gpuprov.say import Say

MOVES_WITH = {"instance", "volume", "security-group"}  # what a plain node has in its region; others stay: refused


def _checked(name: str, mopts: MoveOptions, provider: Provider,
             store: Store) -> tuple[Node, Resource, list[str], Network]:
    from gpuprov.plan import catalog

    node = store.node(name)
    to = catalog.load().check_region(mopts.region) if mopts.region else ""  # a region that does not exist, first
    if to == node.region:  # as --zone of its own zone: nothing would move
        raise UserInputError("--region", f"{name} is already in {to}", "another region, or --zone in this one")
    need(provider, IMAGE_COPY, what="--region")  # before anything is made: the move goes through a copied image
    check_movable(node)
    if node.connect == "private" and not mopts.subnet:
        raise UserInputError("--subnet", f"{name} is reached on its private address, in a VPC of {node.region}: in "
                             f"{to} it needs a subnet you reach", f"`gpuprov start {name} --move --region {to} "
                             "--subnet subnet-…` (one of that region's, reached over your VPN or bastion)")
    staying = sorted({r.kind for r in store.resources(name, region=node.region)} - MOVES_WITH - {"image"})
    already = any(r.region == to for r in store.resources(name))
    if staying or already:
        what = ", ".join(staying) or f"resources already in {to} (a move that ended mid-way: `gpuprov down {name}`)"
        raise UserInputError("--region", f"{name} has {what}, which a move to another region does not take along",
                             f"`gpuprov down {name}` and `gpuprov up` in {to}")
    if to not in provider.enabled_regions(node.region):
        raise UserInputError("--region", f"{to} is not a region enabled for this account",
                             "one `aws ec2 describe-regions` lists")
    rows = [r for r in store.resources(name, region=node.region, kind="instance") if r.cloud_id]
    if len(rows) != 1 or not node.instance_type:
        raise GpuprovError(f"{name} has no single recorded instance (state {node.state}); `gpuprov down {name}`")
    offered = sorted(provider.offerings(to, [node.instance_type]).get(node.instance_type, []))
    if not offered:
        raise UserInputError("--region", f"{node.instance_type} is not offered in {to} (DescribeInstanceTypeOfferings)",
                             f"another region, or `gpuprov start {name} --move` to another zone of {node.region}")
    network = provider.network(to, mopts.subnet)  # the subnet's VPC in R, or R's default VPC as `up` without --subnet
    offered = narrowed(offered, mopts, network.zone, node.instance_type, f"offered in {to}: {', '.join(offered)}")
    return node, rows[0], offered, network


def move(name: str, mopts: MoveOptions, opts: StartOptions, provider: Provider, store: Store, say: Say) -> StartResult:
    store.node(name)  # an unknown name is refused before the lock is waited for
    with locks.nodes([name], "start --move", say):
        return _move(name, mopts, opts, provider, store, say)


def _move(name: str, mopts: MoveOptions, opts: StartOptions, provider: Provider, store: Store, say: Say) -> StartResult:
    rec = tl.Recorder("start", name)
    rec.phase(tl.CHECKS)
    node, row, zones, network = _checked(name, mopts, provider, store)
    to, old = mopts.region or "", row.cloud_id or ""
    (current,) = provider.describe(node.region, [old], settle=settle(row))
    if current.state != "stopped":
        raise UserInputError("NAME", f"{name}'s instance {old} is {current.state}", "only a stopped node can move")
    groups = [r for r in store.resources(name, region=node.region, kind="security-group") if r.cloud_id]
    if not groups:
        raise GpuprovError(f"{name} has no recorded security group; `gpuprov down {name}`")
    cidrs = provider.ssh_cidrs(node.region, groups[0].cloud_id or "")
    if not cidrs:
        raise GpuprovError(f"{name}'s security group {groups[0].cloud_id} opens no SSH; `gpuprov down {name}`")
    if any(":" in c for c in cidrs) and not network.ipv6:
        where = f"subnet {network.subnet_id} has" if network.subnet_id else f"the default VPC's subnets in {to} have"
        raise UserInputError("--subnet" if network.subnet_id else "--region", f"{name} is reached over IPv6, and "
                             f"{where} no IPv6 CIDR block", f"--subnet with one in {to}")
    cidrs = _vpc_cidrs(node, to, current, cidrs, network, provider, say)
    made: list[int] = []  # the move's rows in its own region (the image); R's rows are all the move's (checked)
    journal = Journal(op="move-region", node=name, step="image", region=node.region, zone=node.zone,
                      old_instance=old, target_region=to, began_at=time.time())
    try:
        note(store, journal)
        rec.phase(tl.IMAGE)
        image_id, _image_row = image_disk(node, old, provider, store, say, made, where=to)
        journal = note(store, replace(journal, step="copy", image=image_id))
        copy_id, _copy_row = _copy(node, to, image_id, provider, store, say)
        journal = note(store, replace(journal, step="access", copy=copy_id))
        rec.phase(tl.ACCESS)
        access = _access(node, to, network, cidrs, provider, store)
        journal = note(store, replace(journal, step="launch"))
        instance = launch(node, to, copy_id, [Destination(z, access) for z in zones], provider, store, say, rec, made)
    except BaseException:
        take_back(node, to, made, provider, store, say)
        undone(store, name)
        raise
    # the new instance runs in R: from here the node lives there, and the old one is retired
    journal = note(store, replace(journal, step="retire", new_instance=instance.id, new_zone=instance.zone,
                                  new_state=instance.state))
    with half_done(name):
        finish(node, journal, instance, provider, store, say)
    return came_up(name, store.node(name), instance, opts, node.instance_type or "", None, store, say, rec,
                   new_instance=True)


def finish(node: Node, journal: Journal, instance: Instance, provider: Provider, store: Store, say: Say) -> None:
    """As a zone move finishes (cloud/move.py `finish`), and in the old region its security group, the image's
    copy in R and the old region's key pair if no other node there needs it; the node's record gets R."""
    name, to = node.name, journal.to
    kept = {r.cloud_id for r in store.resources(name, region=to, kind="volume")}
    old_volumes = [v for v in store.resources(name, region=node.region, kind="volume") if v.cloud_id]
    for volume in instance.volume_ids:
        if volume not in kept:
            store.add_resource(name, "volume", to, volume)
    olds = [r for r in store.resources(name, region=node.region, kind="instance") if r.cloud_id == journal.old_instance]
    if olds:
        retire(node, olds[0], old_volumes, provider, store, say)
    for group in [r for r in store.resources(name, region=node.region, kind="security-group") if r.cloud_id]:
        _delete_group(node, group, provider, store, say)
    for region in (node.region, to):
        for image in move_images(name, region, store):
            forget_image(node, region, image.id, provider, store, say)
    store.update_node(name, region=to, zone=instance.zone, state=NodeState.STARTING, journal_json=None,
                      state_reason=None)
    keys.release_key_if_unused(node.region, provider, store, say)  # the old region's, if no other node there needs it
    store.event(name, "moved", f"{journal.old_instance} {node.zone} -> {instance.id} {instance.zone}")
    say(f"{name}: moved to {instance.zone} ({instance.id}); the old instance {journal.old_instance} in {node.region} "
        "is terminated")


def _copy(node: Node, to: str, image_id: str, provider: Provider, store: Store, say: Say) -> tuple[str, int]:
    image_row = next(r for r in store.resources(node.name, region=node.region, kind="image") if r.cloud_id == image_id)
    name = image_row.client_token or f"gpuprov-move-{node.name}"
    say(f"{node.name}: copying the image {image_id} to {to}")
    rid = store.intend(node.name, "image", to, name)  # recorded first: `down` finds a lost copy by its name
    copying = need(provider, IMAGE_COPY, what="--region")
    copy_id = copying.copy_image(ImageCopy(region=to, source_region=node.region, source_image_id=image_id, name=name,
                                            description=f"gpuprov start --move of {node.name} from {node.region}",
                                            source_node=node.name, client_token=name))
    store.created(rid, copy_id)
    provider.wait_image(to, copy_id, timeout=3600, settle=settle_window())
    return copy_id, rid


def _vpc_cidrs(node: Node, to: str, current: Instance, cidrs: list[str], network: Network, provider: Provider,
               say: Say) -> list[str]:
    """The old group's SSH CIDRs for the new one: the old VPC's own CIDR (what `up --connect private` opens SSH to
    without --ssh-cidr: whatever is inside the VPC, a bastion, a VPN endpoint) becomes the new VPC's; a CIDR the user
    gave stays as it was."""
    if node.connect != "private" or not current.subnet_id:
        return cidrs
    was = provider.network(node.region, current.subnet_id).vpc_cidr
    if was not in cidrs or was == network.vpc_cidr:
        return cidrs
    say(f"SSH will be open to the VPC's CIDR {network.vpc_cidr} in {to} (it was open to "
        f"its VPC's CIDR {was} in {node.region})")
    return [network.vpc_cidr if c == was else c for c in cidrs]


def _access(node: Node, to: str, network: Network, cidrs: list[str], provider: Provider, store: Store) -> Access:
    """R's key pair and a security group as `up` makes them (cloud/launch.py), SSH open as the old group had it;
    a public address asked for where the subnet gives none, as `up` asks (cloud/node.py)."""
    from gpuprov.cloud.launch import prepare_access

    public_ip = node.connect != "private" and network.subnet_id is not None and not network.maps_public_ip
    access = prepare_access(node.name, to, provider, store, network, cidrs[0], public_ip=public_ip)
    for cidr in cidrs[1:]:
        provider.authorize_ssh(to, access.security_group_id, cidr, settle=settle_window())
    return access


def _delete_group(node: Node, group: Resource, provider: Provider, store: Store, say: Say) -> None:
    users = [r for r in store.resources(None, region=group.region, kind="security-group")
             if r.cloud_id == group.cloud_id and r.node != node.name]
    if users:  # another node's too: it stays (and its record with that node)
        store.deleted(group.id)
        return
    try:
        with destroy.take_back(node.name, "start --move --region"):  # the old region's group, or the move's own
            destroy.remove(provider, CloudResource("security-group", group.cloud_id or "", group.region, node.name),
                           settle=settle(group))
    except NotFound:
        pass
    except GpuprovError as exc:  # EC2 may still count the terminated instance a while: `down` removes it
        say(f"  could not delete the old security group {group.cloud_id} yet ({exc}); `gpuprov down {node.name}` will")
        return
    store.deleted(group.id)


def take_back(node: Node, to: str, made: list[int], provider: Provider, store: Store, say: Say) -> None:
    """What the move made goes, in both regions: R's instances first, then its group, the copy, the image; the old
    node is not touched. R's key pair goes too if no node there needs it."""
    say(f"{node.name}: the move failed; removing what it made in {to} and {node.region} "
        f"(the node stays stopped in {node.zone}, untouched)")
    for r in store.resources(node.name, region=to, kind="instance"):
        if r.cloud_id is None:  # a launch whose answer never came: its ClientToken finds it
            find_lost_launch(r, provider, store, poll_of(provider))
    instances = [r for r in store.resources(node.name, region=to, kind="instance") if r.cloud_id]
    if instances:
        ids = [r.cloud_id or "" for r in instances]
        with destroy.take_back(node.name, "start --move --region"):
            destroy.end(provider, node.name, to, ids, settle=max(settle(r) for r in instances))
        provider.wait_terminated(to, ids)
        for r in instances:
            store.deleted(r.id)
            say(f"  removed instance {r.cloud_id}")
    for r in store.resources(node.name, region=to):
        if r.kind == "image":
            if r.cloud_id:
                forget_image(node, to, r.id, provider, store, say)
            else:  # CopyImage never answered: its name finds it
                found = provider.images(to, name=r.client_token or "")
                if found:
                    store.created(r.id, found[0].id)
                    forget_image(node, to, r.id, provider, store, say)
                else:
                    store.deleted(r.id)
        elif r.kind == "security-group":
            _delete_group(node, r, provider, store, say)
        elif r.kind == "volume":
            store.deleted(r.id)  # a new instance's root: DeleteOnTermination took it with it
    here = {r.id: r for r in store.resources(node.name, region=node.region, kind="image")}
    for rid in made:
        if rid in here and not here[rid].cloud_id:  # CreateImage never answered: its unique name finds it
            found = provider.images(node.region, name=here[rid].client_token or "")
            if not found:
                store.deleted(rid)
                continue
            store.created(rid, found[0].id)
        if rid in here:
            forget_image(node, node.region, rid, provider, store, say)
    keys.release_key_if_unused(to, provider, store, say)
