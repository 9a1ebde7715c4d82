"""Elastic IPs for a cluster's nodes: enough of them, checked before anything is made.

EC2 gives no public address to an instance launched with more than one network interface, so each node of a public
EFA cluster (p4d, p5, p5en, p6: several network cards) gets an Elastic IP after it runs (cloud/cluster_up.py). The
account may hold 5 per region by default (EC2 user guide, "Elastic IP addresses", as of awsdocs/amazon-ec2-user-
guide 2023: "By default, all AWS accounts are limited to five (5) Elastic IP addresses per Region"), the quota
"EC2-VPC Elastic IPs" (Service Quotas code L-0263D0A3, as public code pairs it with that name; not in the AWS pages
read), shared with every address the account already holds there. Past it AllocateAddress answers
AddressLimitExceeded, with every node already running and billed: so `up --nodes` counts first, and refuses with the
quota, the addresses in use, the increase to ask for, or `--connect private`, which needs none.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuprov.cloud.failover import Order
from gpuprov.cloud.launch import UpOptions
from gpuprov.cloud.providers.base import Provider
from gpuprov.cloud.providers.capabilities import ADDRESSES, need
from gpuprov.errors import UserInputError

QUOTA_CODE = "L-0263D0A3"
QUOTA_NAME = "EC2-VPC Elastic IPs"
DEFAULT_QUOTA = 5


def check_quota(provider: Provider, region: str, nodes: int, opts: UpOptions, order: Order,
                elastic_ip: Callable[[str], bool]) -> None:
    """Refuse a cluster of `nodes` whose Elastic IPs (one a node reached on its public IPv4 address, on a candidate
    type that gets no public address by itself: `elastic_ip`) do not fit in the region's quota beside the addresses
    already held."""
    if opts.connect != "public" or opts.ipv6:  # private addresses, or IPv6 ones (public by themselves): none needed
        return
    types = sorted({c.instance_type for c in order.candidates if elastic_ip(c.instance_type)})
    if not types:
        return
    value = provider.quota(region, QUOTA_CODE)
    limit = int(value) if value is not None else DEFAULT_QUOTA
    held = need(provider, ADDRESSES, what="--nodes").address_count(region)
    if held + nodes <= limit:
        return
    which = "the default" if value is None else "Service Quotas says"
    raise UserInputError(
        "--nodes", f"{nodes} nodes of {' or '.join(types)} reached on public addresses need {nodes} Elastic "
        f"IPs (EC2 gives no public address to an instance with several network interfaces), and {region} has "
        f"{max(limit - held, 0)} of its {limit} free ({held} in use; quota '{QUOTA_NAME}', {QUOTA_CODE}: {which})",
        f"raise it: aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {QUOTA_CODE} "
        f"--desired-value {held + nodes} --region {region}\n  or reach the nodes on their private addresses: "
        "--connect private (VPN or bastion); or release addresses you no longer use")
