"""gpuprov's own VPC and vSwitches on ECS, for a region with no default VPC (or a zone with no default vSwitch): what
`capabilities.OwnNetwork` asks of Alibaba Cloud.

One VPC per owner and region, and one vSwitch per zone launched into, each named before it is made (the name the
launch records first, and CreateVpc's and CreateVSwitch's ClientToken, so that a resend after a lost answer is the
same one) and looked up by that name before it is made again. ECS's CreateVpc and CreateVSwitch take no Tag, and
neither TagResources nor ListTagResources lists a VPC or a vSwitch among their resource types (their request
models, alibabacloud-ecs20140526 7.11.8): as a deployment set does (alibaba_sets.py), each carries gpuprov's tags in
its description, which `tagged_networks` reads back for gc.

Both are made asynchronously: a VPC is Pending, then Available, and so is a vSwitch ("CreateVSwitch is an
asynchronous operation ... If the vSwitch is in the Pending state, the vSwitch is being configured",
alibabacloud.com/help/doc-detail/35745.htm, updated 2024-03-04), and nothing is launched into either before it is
Available. A vSwitch that still holds an instance is not deleted (DependencyViolation, "Specified object has dependent
resources": DeleteVSwitch, doc-detail/35746, updated 2024-03-04), nor a VPC that still holds a vSwitch or a group:
each is asked again for a while (a released instance lingers), then kept and said.

The VPC's block is a /16 of 10.0.0.0/8 that no other VPC of the region uses ("10.0.0.0/8, 172.16.0.0/12,
192.168.0.0/16, or their subnets": CreateVpc, doc-detail/35737), so that it can later be peered or joined to another;
each zone's vSwitch takes the next /20 of it that no vSwitch of the VPC has.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
from collections.abc import Sequence
from typing import Any

from gpuprov.backoff import tries
from gpuprov.cloud.providers.alibaba_base import EcsBase, EcsError
from gpuprov.cloud.providers.base import SHARED, TAG_NODE, TAG_OWNER, TAG_TEAM, CloudResource, NotFound
from gpuprov.errors import GpuprovError

MARK = "gpuprov network:"  # the description's first words: a VPC or vSwitch gpuprov made
POOL = ipaddress.ip_network("10.0.0.0/8")
SWITCH_PREFIX = 20  # 4091 addresses a zone
AVAILABLE = 300.0  # seconds a new VPC or vSwitch may stay Pending
IN_USE = 150  # polls (300 s at the usual 2 s) a released instance may still hold its vSwitch (DependencyViolation)


class EcsNetwork(EcsBase):
    """Find, make, list and delete gpuprov's own VPC and its vSwitches."""

    # --- names -----------------------------------------------------------------------------------

    def own_vpc_name(self) -> str:
        """The VPC's name and ClientToken: one per owner (a digest: the owner has characters a name may not)."""
        return f"gpuprov-net-{hashlib.sha256(self.owner.encode()).hexdigest()[:12]}"

    def own_switch_name(self, zone: str) -> str:
        return f"{self.own_vpc_name()}-{zone}"[:64]

    def _description(self) -> str:
        tags = {TAG_NODE: SHARED, TAG_OWNER: self.owner, **(self.team or {})}
        return " ".join([MARK, *(f"{k}={v}" for k, v in tags.items())])

    # --- find ------------------------------------------------------------------------------------

    def own_vpc(self, region: str) -> dict[str, Any] | None:
        """gpuprov's own VPC of this owner in the region, by its name (DescribeVpcs filters by no name)."""
        name = self.own_vpc_name()
        return next((v for v in self._pages(region, "DescribeVpcs", ("Vpcs", "Vpc"), IsDefault=False)
                     if v.get("VpcName") == name), None)

    def own_vpc_cidr(self, region: str) -> str:
        """The block gpuprov's own VPC gets when it is made now: the first /16 of 10.0.0.0/8 no VPC of the region
        has (`--connect private` opens SSH to it before it is made)."""
        taken = [ipaddress.ip_network(str(v.get("CidrBlock"))) for v in
                 self._pages(region, "DescribeVpcs", ("Vpcs", "Vpc")) if v.get("CidrBlock")]
        return _free(POOL, 16, taken, "VPC")

    def own_switch(self, region: str, zone: str) -> dict[str, Any] | None:
        """gpuprov's own vSwitch in the zone (of gpuprov's own VPC), by its name."""
        name = self.own_switch_name(zone)
        return next((s for s in self._pages(region, "DescribeVSwitches", ("VSwitches", "VSwitch"), ZoneId=zone,
                                            IsDefault=False) if s.get("VSwitchName") == name), None)

    def zones_without_default_subnet(self, region: str, zones: Sequence[str]) -> list[str]:
        """Those of `zones` with no default vSwitch (DescribeVSwitches IsDefault)."""
        have = {str(s.get("ZoneId")) for s in self._pages(region, "DescribeVSwitches", ("VSwitches", "VSwitch"),
                                                          IsDefault=True)}
        return [z for z in zones if z not in have]

    # --- make --------------------------------------------------------------------------------------

    def create_own_vpc(self, region: str) -> tuple[str, str]:
        """gpuprov's own VPC (found by name, else CreateVpc with its name as ClientToken), once Available:
        (its id, its CIDR)."""
        found = self.own_vpc(region)
        if found is None:
            cidr = self.own_vpc_cidr(region)
            name = self.own_vpc_name()
            reply = self._call(region, "CreateVpc", VpcName=name, CidrBlock=cidr, Description=self._description(),
                               ClientToken=name)
            vpc_id = str(reply["VpcId"])
        else:
            vpc_id, cidr = str(found["VpcId"]), str(found.get("CidrBlock"))
        self._available(region, "DescribeVpcs", ("Vpcs", "Vpc"), "VpcId", vpc_id)
        return vpc_id, cidr

    def create_own_switch(self, region: str, vpc_id: str, vpc_cidr: str, zone: str) -> str:
        """gpuprov's own vSwitch in the zone (found by name, else CreateVSwitch with its name as ClientToken), once
        Available."""
        found = self.own_switch(region, zone)
        if found is None:
            taken = [ipaddress.ip_network(str(s.get("CidrBlock"))) for s in
                     self._pages(region, "DescribeVSwitches", ("VSwitches", "VSwitch"), VpcId=vpc_id)
                     if s.get("CidrBlock")]
            cidr = _free(ipaddress.ip_network(vpc_cidr), SWITCH_PREFIX, taken, "vSwitch")
            name = self.own_switch_name(zone)
            reply = self._call(region, "CreateVSwitch", VpcId=vpc_id, ZoneId=zone, CidrBlock=cidr, VSwitchName=name,
                               Description=self._description(), ClientToken=name)
            switch = str(reply["VSwitchId"])
        else:
            switch = str(found["VSwitchId"])
        self._available(region, "DescribeVSwitches", ("VSwitches", "VSwitch"), "VSwitchId", switch)
        return switch

    def _available(self, region: str, action: str, key: tuple[str, str], field: str, rid: str) -> None:
        for _ in tries(AVAILABLE, self.poll, self.poll * 8):
            where: dict[str, Any] = {field: rid}
            rows = [r for r in self._pages(region, action, key, **where) if r.get(field) == rid]
            if rows and rows[0].get("Status") == "Available":
                return
        raise GpuprovError(f"{rid} is not Available after {AVAILABLE:.0f}s")

    # --- list and delete ---------------------------------------------------------------------------

    def tagged_networks(self, region: str) -> list[CloudResource]:
        """The region's VPCs and vSwitches gpuprov made, with the owner their descriptions name."""
        out = []
        for kind, action, key, field in (("vpc", "DescribeVpcs", ("Vpcs", "Vpc"), "VpcId"),
                                         ("vswitch", "DescribeVSwitches", ("VSwitches", "VSwitch"), "VSwitchId")):
            for raw in self._pages(region, action, key, IsDefault=False):
                text = str(raw.get("Description") or "")
                if not text.startswith(MARK):
                    continue
                tags = dict(word.split("=", 1) for word in text.removeprefix(MARK).split() if "=" in word)
                out.append(CloudResource(kind=kind, id=str(raw[field]), region=region, node=SHARED,
                                         owner=tags.get(TAG_OWNER), team=tags.get(TAG_TEAM)))
        return out

    def delete_network_part(self, region: str, kind: str, rid: str) -> None:
        """DeleteVSwitch or DeleteVpc by id, or by the recorded name of a create whose answer was lost (NotFound when
        none has it); one still in use is asked again for a while, then the refusal stands."""
        if kind == "vswitch":
            action, field, code = "DeleteVSwitch", "VSwitchId", "InvalidVSwitchId.NotFound"
            if not rid.startswith("vsw-"):
                zone = rid.removeprefix(self.own_vpc_name() + "-")
                found = self.own_switch(region, zone)
                rid = str(found["VSwitchId"]) if found else ""
        else:
            action, field, code = "DeleteVpc", "VpcId", "InvalidVpcId.NotFound"
            if not rid.startswith("vpc-"):
                found = self.own_vpc(region)
                rid = str(found["VpcId"]) if found else ""
        if not rid:
            raise NotFound(kind, rid, code)
        deadline = time.monotonic() + IN_USE * self.poll
        while True:
            try:
                self._call(region, action, **{field: rid})
                return
            except EcsError as exc:
                if exc.code == code:
                    raise NotFound(kind, rid, code) from None
                if not exc.code.startswith("DependencyViolation") or time.monotonic() > deadline:
                    raise
            time.sleep(self.poll)


def _free(pool: ipaddress.IPv4Network | ipaddress.IPv6Network, prefix: int,
          taken: list[ipaddress.IPv4Network | ipaddress.IPv6Network], what: str) -> str:
    """The first block of `prefix` bits in `pool` that overlaps none of `taken`."""
    for block in pool.subnets(new_prefix=prefix):
        if not any(block.overlaps(t) for t in taken if t.version == block.version):
            return str(block)
    raise GpuprovError(f"no free /{prefix} for gpuprov's own {what} in {pool}")
