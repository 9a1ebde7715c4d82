"""gpuprov's own network in a region that has no default one (a cloud declaring capabilities.OWN_NETWORK: Alibaba
Cloud): one VPC per owner and region and a subnet in each zone a launch may try, shared by the region's nodes as its
key pair is (cloud/keys.py), and like it made under the region's lock and deleted with the region's last node. In
a region with a default VPC, a zone of it with no default subnet gets one of gpuprov's the same way.

Each part is recorded before it is asked for, by the name the provider gives it (also its create's idempotency
token), so that a kill between the record and the create leaves a row that `down` or `gc` finds the part by, or
learns there is none. The release deletes every subnet before the VPC, through the one destroy gate
(destroy.network_part); a part the cloud still counts in use (something else in it) is kept and said, its row kept
for the next `down` or `gc`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuprov.cloud import destroy
from gpuprov.cloud.providers.base import SHARED, CloudResource, Network, NotFound, Provider
from gpuprov.cloud.providers.capabilities import OWN_NETWORK, OwnNetwork, need, offered
from gpuprov.cloud.settle import settle
from gpuprov.errors import GpuprovError
from gpuprov.kinds import ResourceKind
from gpuprov.state import Store, locks

if TYPE_CHECKING:
    from gpuprov.say import Say
    from gpuprov.state.records import Resource

KINDS: tuple[ResourceKind, ...] = ("vswitch", "vpc")  # the order of release: a VPC holds its subnets


def for_zones(network: Network, zones: Sequence[str], region: str, say: Say) -> Network:
    """The network a launch will try `zones` of (none named with --subnet): gpuprov's own gets a subnet in each of
    them (said), the default VPC one in each zone that has no default subnet."""
    if network.subnet_id:
        return network
    if network.own:
        say(f"{region} has no default VPC: the launch uses gpuprov's own " + (network.vpc_id or "(made now)")
            + ", deleted with the region's last node")
    return replace(network, zones=tuple(dict.fromkeys(zones)))


def ensure(provider: Provider, store: Store, region: str, network: Network) -> Network:
    """gpuprov's own VPC and a subnet in each of the network's zones, or in the default VPC a subnet of gpuprov's in
    each of its zones with no default one, each recorded before it is made, under the region's lock; the network as
    it is where the cloud makes no network of gpuprov's."""
    nets = offered(provider, OWN_NETWORK)
    if network.own and nets is None:
        need(provider, OWN_NETWORK, what="a region with no default VPC")
    if nets is None or network.subnet_id or not (network.own or network.zones):
        return network
    missing = network.zones if network.own else nets.zones_without_default_subnet(region, network.zones)
    if not network.own and not missing:
        return network
    with locks.hold(locks.region(region), "network"):
        vpc_id, cidr = _part(store, region, "vpc", nets.own_vpc_name(), lambda: nets.create_own_vpc(region)) \
            if network.own else (network.vpc_id, network.vpc_cidr)
        for zone in missing:
            _part(store, region, "vswitch", nets.own_switch_name(zone), _switch(nets, region, vpc_id, cidr, zone))
    return replace(network, vpc_id=vpc_id, vpc_cidr=cidr)


def _switch(nets: OwnNetwork, region: str, vpc_id: str, cidr: str, zone: str) -> Callable[[], tuple[str, str]]:
    return lambda: (nets.create_own_switch(region, vpc_id, cidr, zone), "")


def _part(store: Store, region: str, kind: ResourceKind, name: str, make: Callable[[], tuple[str, str]]) -> tuple[str, str]:
    """One part: its row first (kept when there is one), then the part found or made (the provider looks it up by
    its name before it makes it), then the row marked made."""
    rows = [r for r in store.resources(None, region=region, kind=kind) if r.client_token == name]
    rid = rows[0].id if rows else store.intend(None, kind, region, name)
    made = make()
    store.created(rid, made[0])
    return made


def release(region: str, provider: Provider, store: Store, say: Say,
            unrecorded: Sequence[CloudResource] = ()) -> list[str]:
    """With the region's lock held and no node of the region left: every recorded part of gpuprov's own network
    deleted (subnets first), and the `unrecorded` ones gc found by their descriptions. Returns what was deleted."""
    gone: list[str] = []
    kept_vpc = False
    for kind in KINDS:
        rows = store.resources(None, region=region, kind=kind)
        parts: list[tuple[str, Resource | None]] = [(r.cloud_id or r.client_token or "", r) for r in rows]
        parts += [(r.id, None) for r in unrecorded if r.kind == kind and r.id not in {p for p, _ in parts}]
        for part, row in parts:
            if kind == "vpc" and kept_vpc:
                say(f"  kept the VPC {part}: a subnet of it is still there (`gpuprov gc` deletes it later)")
                continue
            try:
                destroy.network_part(provider, CloudResource(kind, part, region, SHARED),
                                     settle=settle(row) if row is not None else 0.0)
            except NotFound:
                pass
            except GpuprovError as exc:
                say(f"  kept the {kind} {part}: {exc} (`gpuprov gc` deletes it once nothing is in it)")
                kept_vpc = True
                continue
            if row is not None:
                store.deleted(row.id)
            gone.append(f"{kind} {part}")
    return gone
