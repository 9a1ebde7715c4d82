"""`gpuprov state adopt`: records rebuilt from the tags gpuprov puts on every resource of the chosen cloud (on AWS
instances, volumes, security groups, spot requests, placement groups, Elastic IPs, key pairs, images; on Alibaba
Cloud instances, security groups, key pairs, images, deployment sets and gpuprov's own VPC and vSwitches, whatever
the provider's `tagged` lists, and the owner's global stop role), so a lost state file or a lost laptop loses
nothing. An adopted node is recorded as it is in the cloud (its instances' state, type, zone, addresses) with every
resource its tag names, so `status`, `stop` and `down` follow it by id like any other; a node's name that is already
recorded (live) is left alone.

An adopted node gets `ready_at`, so it is no orphan; unrecorded key pairs, images and gpuprov's own network parts are
recorded too, as no node's, so that the region's last `down` releases the shared ones as it would have. With team
state, adopt also reads the member's own pre-team tags.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuprov.cloud.own_network import KINDS as NETWORK_KINDS
from gpuprov.cloud.providers.base import GLOBAL, IMAGES, SHARED, CloudResource, Instance, Provider
from gpuprov.cloud.providers.capabilities import STOP_ROLE, offered, title
from gpuprov.state.machine import NodeState
from gpuprov.state.records import NodeFields, ResourceKind
from gpuprov.state.store import Store

if TYPE_CHECKING:
    from gpuprov.say import Say

# an instance's state (the protocol's words, EC2's) as a record's state: a running instance gpuprov tagged had
# finished its `up` or was started since (so it is no orphan); one still pending is still in an `up`
_STATES = {"running": NodeState.READY, "pending": NodeState.RUNNING, "stopping": NodeState.STOPPING,
           "stopped": NodeState.STOPPED, "shutting-down": NodeState.TERMINATING}
_KINDS: tuple[ResourceKind, ...] = ("instance", "spot-request", "volume", "security-group", "placement-group",
                                    "address")


def adopt(regions: Sequence[str], providers: Sequence[Provider], store: Store, say: Say, *,
          all_installs: bool = False) -> list[str]:
    """Record every tagged node of `regions` that the store lacks; returns the adopted names. `providers` list
    the same cloud by different tags (a team's, and the member's own from before the team). Another install's
    resources with this user and host name (`user@host/ID`, cloud/tags.py) may be its live nodes: named and left,
    unless `all_installs` (a lost state folder's own); the team's are the team's, whoever made them."""
    adopted: list[str] = []
    for region in regions:
        tagged = list({r.id: r for p in providers for r in p.tagged(region, everyone=all_installs)}.values())
        if not all_installs:
            seen = {r.id for r in tagged}
            others = sorted({r.node for p in providers for r in p.tagged(region, everyone=True)
                             if r.id not in seen and r.node and r.node not in (SHARED, IMAGES)})
            for name in others:
                say(f"left {name} ({region}): another gpuprov install with your user and host name tagged it; "
                    "`gpuprov state adopt --all-installs` takes it if it is yours (a lost state folder)")
        known = {r.cloud_id for r in store.resources(None, region=region) if r.cloud_id}
        for res in tagged:  # key pairs, images and networks outlive nodes: recorded apart, as `up` and `image bake` do
            shared = res.node == SHARED and res.kind in ("key-pair", *NETWORK_KINDS)
            if res.id not in known and (res.kind == "image" or shared):
                store.add_resource(None, res.kind, region, res.id,  # type: ignore[arg-type]
                                   res.id if res.kind == "key-pair" else None)
        by_node: dict[str, list[CloudResource]] = defaultdict(list)
        for res in tagged:
            if res.node and res.node not in (SHARED, IMAGES) and res.kind in _KINDS:
                by_node[res.node].append(res)
        instances = {i.id: i for p in providers for i in p.instances(region, everyone=all_installs)}
        for name, resources in sorted(by_node.items()):
            existing = store.find_node(name)
            if existing is not None and existing.live:
                continue
            mine = [instances[r.id] for r in resources if r.kind == "instance" and r.id in instances]
            fields = _fields(mine, resources)
            fields.update(_gpus(providers[0].name, fields.get("instance_type")))
            store.create_node(name, providers[0].name, region, **fields)  # the cloud it is on
            for res in resources:
                store.add_resource(name, res.kind, region, res.id)  # type: ignore[arg-type]
            store.event(name, "adopted", f"rebuilt from {len(resources)} tagged resource(s) by `state adopt`")
            say(f"{name}: adopted ({', '.join(f'{r.kind} {r.id}' for r in resources)})")
            adopted.append(name)
    _stop_role(providers[0], store, say)
    return adopted


def _stop_role(provider: Provider, store: Store, say: Say) -> None:
    """The owner's stop role (global, shared by the cloud's nodes) recorded as no node's where the cloud has one and
    no row names it, so that the last node's `down` deletes it as it would have."""
    roles = offered(provider, STOP_ROLE)
    if roles is None:
        return
    name = roles.stop_role_name()
    if any(r.client_token == name for r in store.resources(None, region=GLOBAL, kind="ram-role")):
        return
    if roles.has_stop_role():
        store.created(store.intend(None, "ram-role", GLOBAL, name), name)
        say(f"stop role {name}: recorded (deleted with your last {title(provider)} node)")


def _gpus(cloud: str, instance_type: str | None) -> NodeFields:
    """Its GPU and their number, as its cloud's catalog knows its type (`up` records them from the plan); none for a
    type the catalog does not know, or no instance."""
    from gpuprov.plan.plan import catalog_for

    found = next((t for t in catalog_for(cloud).instance_types if t.name == instance_type), None)
    return {"gpu": found.gpu, "gpu_count": found.gpus} if found is not None else {}


def _fields(instances: list[Instance], resources: list[CloudResource]) -> NodeFields:
    owner = next((r.owner for r in resources if r.owner), None)
    if not instances:  # what an `up` that died before RunInstances left: an orphan `down` or `gc` takes
        return {"state": NodeState.FAILED, "state_reason": "adopted without an instance", "owner": owner}
    first = min(instances, key=lambda i: i.launched_at.timestamp() if i.launched_at else 0)
    launched = first.launched_at.timestamp() if first.launched_at else None
    state = _STATES.get(first.state, NodeState.FAILED)
    return {"state": state, "zone": first.zone, "instance_type": first.instance_type, "market": first.market,
            "address": first.public_ip or first.private_ip, "connect": "public" if first.public_ip else "private",
            "ssh_user": "ubuntu", "owner": first.owner or owner, "ready_at": launched if state != "running" else None,
            "created_at": launched or 0.0, "running_since": launched if first.state == "running" else None,
            "cluster_size": len(instances) if len(instances) > 1 else None,
            "spot_type": "one-time" if first.market == "spot" else None}
