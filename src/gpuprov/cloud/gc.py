"""`gc`: what no live local node owns, found and removed.

An orphan is the record of a node whose `up` crashed, or a resource tagged as this user's that no live
node claims (another machine's lost state, say); images and snapshots are judged by cloud/images.py.
Crashed nodes are taken down by their records (ids and tokens; tags may lag), the rest by id."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuprov.cloud import images
from gpuprov.cloud.providers.base import SHARED, CloudResource, NotFound, Provider
from gpuprov.cloud.teardown import take_down
from gpuprov.errors import GpuprovError
from gpuprov.state import Store

Say = Callable[[str], None]


def orphans(regions: Sequence[str], provider: Provider, store: Store) -> list[CloudResource]:
    """What no live local node owns: the records of nodes whose `up` crashed, and resources tagged as
    this user's that no live node claims (another machine's lost state, say)."""
    alive = [n for n in store.nodes() if not n.crashed]
    live = {n.name for n in alive}
    regions_in_use = {n.region for n in alive}
    found: list[CloudResource] = []
    for node in store.nodes():
        if node.crashed and node.region in regions:  # the node itself: gc takes it down by its records
            found.append(CloudResource("node", node.name, node.region, node.name, f"its `up` crashed ({node.state})"))
            for r in store.resources(node.name, region=node.region):
                found.append(CloudResource(r.kind, r.cloud_id or f"(token {r.client_token})", r.region, node.name,
                                           "recorded"))
    seen = {r.id for r in found}
    for region in regions:
        tagged = provider.tagged(region)
        for res in tagged:
            if res.kind in ("image", "snapshot"):  # images outlive nodes: cloud/images.py says which are orphans
                continue
            owned = res.node in live or (res.node == SHARED and region in regions_in_use)
            if not owned and res.id not in seen:
                found.append(res)
        found += images.orphans(region, tagged, provider, store)
    return found


def gc(found: list[CloudResource], provider: Provider, store: Store, say: Say) -> list[str]:
    """Remove what `orphans` found: crashed nodes by their records (ids and tokens; tags may lag), then the
    rest by id. Returns what could not be removed (each with the reason)."""
    left: list[str] = []
    crashed = {n.name: n for n in store.nodes() if n.crashed}
    for name in sorted({r.id for r in found if r.kind == "node" and r.id in crashed}):
        result = take_down(name, crashed[name].region, provider, store, say)
        left += [f"{name}: {what}" for what in result.left]
        if result.complete:
            store.update_node(name, state_reason="its `up` crashed; collected by gc")
    order = {"instance": 0, "spot-request": 1, "volume": 2, "security-group": 3, "address": 3, "placement-group": 3,
             "key-pair": 4, "image": 5, "snapshot": 6}
    for res in sorted(found, key=lambda r: order.get(r.kind, 9)):
        if res.kind == "node" or res.node in crashed:
            continue
        try:
            provider.delete(res)
        except NotFound:
            continue
        except GpuprovError as exc:
            left.append(f"{res.kind} {res.id}: {exc}")
            continue
        say(f"deleted {res.kind} {res.id} ({res.region}, node {res.node})")
        if res.kind == "image":
            from gpuprov.cloud.images import collected

            collected(store, res)
    return left

