"""Static public addresses for a cluster's nodes: enough of them, checked before anything is made.

A type whose network layout gets no public address by itself (cloud/cluster_network.py `elastic_ip`: on AWS an
instance with several network interfaces) is reached on a static address put on each node after it runs
(cloud/cluster_up.py). The cloud's quota of them is counted first, because past it the allocation is refused with
every node already running and billed; the provider's `check_room` (the addresses capability) says the quota, the
addresses in use and the increase to ask for; `--connect private` needs none. AWS's quota is in providers/aws.py.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuprov.cloud.failover import Order
from gpuprov.cloud.launch import UpOptions
from gpuprov.cloud.providers.base import Provider
from gpuprov.cloud.providers.capabilities import ADDRESSES, need


def check_quota(provider: Provider, region: str, nodes: int, opts: UpOptions, order: Order,
                elastic_ip: Callable[[str], bool]) -> None:
    """Refuse a cluster of `nodes` whose static addresses (one a node reached on its public IPv4 address, on a
    candidate type that gets no public address by itself: `elastic_ip`) do not fit in the region's quota beside the
    addresses already held."""
    if opts.connect != "public" or opts.ipv6:  # private addresses, or IPv6 ones (public by themselves): none needed
        return
    types = sorted({c.instance_type for c in order.candidates if elastic_ip(c.instance_type)})
    if not types:
        return
    need(provider, ADDRESSES, what="--nodes").check_room(region, nodes, types)
