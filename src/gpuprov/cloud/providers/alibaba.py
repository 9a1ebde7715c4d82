"""Alibaba Cloud ECS behind the provider protocol, through Alibaba's own SDK (alibabacloud-ecs20140526).

ECS's vocabulary stays in here: a VPC's vSwitch is a Network's subnet, SpotStrategy is the market, a ClientToken
makes RunInstances idempotent, economical mode (StoppedMode=StopCharging) is how a node stops. alibaba_base.py is the
client and the one error path, alibaba_images.py the images, alibaba_refusals.py what each launch refusal means; the
GPU families' documented facts are data (plan/catalog_alibaba.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from gpuprov.cloud.providers.alibaba_base import NOT_FOUND, RETRIES, EcsError, EcsNoAnswer, stamp, tags_of
from gpuprov.cloud.providers.alibaba_images import EcsImages
from gpuprov.cloud.providers.alibaba_network import EcsNetwork
from gpuprov.cloud.providers.alibaba_ram import RamRoles
from gpuprov.cloud.providers.alibaba_refusals import classify
from gpuprov.cloud.providers.alibaba_sets import EcsSets
from gpuprov.cloud.providers.base import (
    IMAGES,
    SHARED,
    TAG_IMAGE,
    TAG_NODE,
    TAG_OWNER,
    TAG_TEAM,
    CloudResource,
    Instance,
    InstanceStore,
    InstanceTypeInfo,
    LaunchError,
    LaunchRequest,
    Market,
    Network,
    NotFound,
    SpotPrice,
)
from gpuprov.cloud.providers.capabilities import (
    LIVE_OFFERS,
    OWN_NETWORK,
    PLACEMENT,
    SPOT_STOP,
    STOP_ROLE,
    DiskPrice,
    ListPrice,
    ZoneStock,
)
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.plan.catalog_alibaba import facts

# RunInstances' error table (API reference; the copy read whole, as alibaba_refusals.py says): 404
# InvalidRamRole.NotFound 'The specified parameter "RAMRoleName" does not exist.'
FRESH_ROLE = "InvalidRamRole.NotFound"
TAG_TOKEN = "gpuprov:token"  # the launch's ClientToken: a lost RunInstances answer is found by it
BANDWIDTH_MBPS = 100  # InternetMaxBandwidthOut: a public address, paid by traffic (PayByTraffic), not by this cap
DISK = "cloud_essd"  # the system disk's category
# ECS's Status, in the protocol's words (DescribeInstances, "Status": Pending, Running, Starting, Stopping, Stopped)
STATES = {"Pending": "pending", "Starting": "pending", "Running": "running", "Stopping": "stopping",
          "Stopped": "stopped"}
# ListTagResources' ResourceType, in the records' kinds
TAGGED_KINDS = {"instance": "instance", "securitygroup": "security-group", "keypair": "key-pair", "image": "image",
                "snapshot": "snapshot"}


class AlibabaProvider(EcsImages, EcsSets, EcsNetwork, RamRoles):
    """Alibaba Cloud ECS: the core of the provider protocol (see base.py)."""

    name = "alibaba"
    # of capabilities.py's: cluster placement through deployment sets (alibaba_sets.py), its live offers (stock,
    # DescribePrice), a stop of any spot instance and the RAM role a node's guards stop it with (alibaba_ram.py). No
    # eRDMA, EIPs, RAM roles of the user's own, reservations or image copy in gpuprov yet (each refused by name through
    # `capabilities.need`). Its stop is always economical (StopCharging), and a
    # preemptible instance stops so as a pay-as-you-go one does ("Economical mode for pay-as-you-go instances
    # (including spot instances)", alibabacloud.com/help/en/ecs/user-guide/economical-mode: a VPC, pay-as-you-go or
    # preemptible, no local storage; gpuprov launches into a VPC, and none of the catalog's families has local disks).
    # Where a region has no default VPC, gpuprov's own (alibaba_network.py).
    capabilities: frozenset[str] = frozenset({PLACEMENT.flag, LIVE_OFFERS.flag, SPOT_STOP.flag, OWN_NETWORK.flag,
                                              STOP_ROLE.flag})

    # --- where to launch ---------------------------------------------------------------------

    def offerings(self, region: str, instance_types: Sequence[str]) -> dict[str, list[str]]:
        """Zones whose stock (DescribeAvailableResource, pay-as-you-go) offers each type now: Status Available (SoldOut
        is left out)."""
        found: dict[str, list[str]] = {}
        for stock in self.zone_stock(region, instance_types):
            if stock.available:
                found.setdefault(stock.instance_type, []).append(stock.zone)
        return {name: sorted(zones) for name, zones in found.items()}

    def zone_stock(self, region: str, instance_types: Sequence[str]) -> list[ZoneStock]:
        """Every zone's word on each type (DescribeAvailableResource, pay-as-you-go): Available, or SoldOut (no stock
        now); a type a zone does not list is absent."""
        wanted, found = set(instance_types), list[ZoneStock]()
        reply = self._call(region, "DescribeAvailableResource", DestinationResource="InstanceType",
                           InstanceChargeType="PostPaid")
        for zone in (reply.get("AvailableZones") or {}).get("AvailableZone") or []:
            for resource in (zone.get("AvailableResources") or {}).get("AvailableResource") or []:
                for item in (resource.get("SupportedResources") or {}).get("SupportedResource") or []:
                    if str(item.get("Value")) in wanted:
                        status = str(item.get("Status") or "")
                        found.append(ZoneStock(str(item.get("Value")), str(zone.get("ZoneId")),
                                               status == "Available", status))
        return sorted(found, key=lambda s: (s.instance_type, s.zone))

    def enabled_regions(self, region: str) -> list[str]:
        reply = self._call(region, "DescribeRegions")
        return sorted(str(r["RegionId"]) for r in (reply.get("Regions") or {}).get("Region") or [])

    def network(self, region: str, subnet: str | None) -> Network:
        """The named vSwitch's VPC, or the region's default VPC, else gpuprov's own (`own`: found, or made by the
        launch once recorded: alibaba_network.py)."""
        if subnet:
            switches = self._pages(region, "DescribeVSwitches", ("VSwitches", "VSwitch"), VSwitchId=subnet)
            if not switches:
                raise UserInputError("--subnet", f"no vSwitch {subnet} in {region}", "a vSwitch id (vsw-...)")
            vpc = self._vpc(region, str(switches[0]["VpcId"]))
            return self._switch(switches[0], vpc)
        vpcs = self._pages(region, "DescribeVpcs", ("Vpcs", "Vpc"), IsDefault=True)
        if not vpcs:
            found = self.own_vpc(region)
            return Network(vpc_id=str(found["VpcId"]) if found else "",
                           vpc_cidr=str(found.get("CidrBlock", "")) if found else self.own_vpc_cidr(region),
                           maps_public_ip=False, own=True)
        return Network(vpc_id=str(vpcs[0]["VpcId"]), vpc_cidr=str(vpcs[0].get("CidrBlock", "")), maps_public_ip=False)

    def _vpc(self, region: str, vpc_id: str) -> dict[str, Any]:
        vpcs = self._pages(region, "DescribeVpcs", ("Vpcs", "Vpc"), VpcId=vpc_id)
        if not vpcs:
            raise GpuprovError(f"VPC {vpc_id} is not listed in {region}")
        return vpcs[0]

    @staticmethod
    def _switch(raw: dict[str, Any], vpc: dict[str, Any]) -> Network:
        return Network(vpc_id=str(raw["VpcId"]), vpc_cidr=str(vpc.get("CidrBlock", "")), subnet_id=str(raw["VSwitchId"]),
                       zone=str(raw.get("ZoneId")), maps_public_ip=False, default_for_az=bool(raw.get("IsDefault")),
                       free_addresses=int(raw.get("AvailableIpAddressCount") or 0))

    def subnets(self, region: str, vpc_id: str, zones: Sequence[str]) -> list[Network]:
        vpc = self._vpc(region, vpc_id)
        return [self._switch(raw, vpc) for zone in zones
                for raw in self._pages(region, "DescribeVSwitches", ("VSwitches", "VSwitch"), VpcId=vpc_id,
                                       ZoneId=zone)]

    # --- SSH access ------------------------------------------------------------------------

    def key_pair_exists(self, region: str, name: str) -> bool:
        return bool(self._pages(region, "DescribeKeyPairs", ("KeyPairs", "KeyPair"), KeyPairName=name))

    def import_key_pair(self, region: str, name: str, public_key: str) -> str:
        """ImportKeyPair, tagged as shared; a name already there (a lost first answer) is that key pair."""
        try:
            self._call(region, "ImportKeyPair", KeyPairName=name, PublicKeyBody=public_key,
                       Tag=self._tag_list(SHARED))
        except EcsError as exc:
            if exc.code != "KeyPair.AlreadyExist":
                raise
        return name

    def delete_key_pair(self, region: str, name: str, settle: float = 0) -> None:
        self._call(region, "DeleteKeyPairs", KeyPairNames=f'["{name}"]')

    def create_security_group(self, region: str, node: str, vpc: str, name: str, description: str) -> str:
        """CreateSecurityGroup with a ClientToken made of its name: a resend returns the first group."""
        reply = self._call(region, "CreateSecurityGroup", VpcId=vpc, SecurityGroupName=name, Description=description,
                           ClientToken=f"sg-{name}"[:64], Tag=self._tag_list(node))
        return str(reply["SecurityGroupId"])

    def find_security_group(self, region: str, name: str) -> str | None:
        groups = self._pages(region, "DescribeSecurityGroups", ("SecurityGroups", "SecurityGroup"),
                             SecurityGroupName=name)
        return str(groups[0]["SecurityGroupId"]) if groups else None

    def ssh_cidrs(self, region: str, group_id: str) -> list[str]:
        reply = self._settle("security-group", group_id, 0, lambda: self._call(
            region, "DescribeSecurityGroupAttribute", SecurityGroupId=group_id, Direction="ingress"))
        cidrs = []
        for rule in (reply.get("Permissions") or {}).get("Permission") or []:
            if str(rule.get("IpProtocol", "")).upper() in ("TCP", "ALL") and rule.get("PortRange") in ("22/22",
                                                                                                     "-1/-1"):
                cidrs += [c for c in (rule.get("SourceCidrIp"), rule.get("Ipv6SourceCidrIp")) if c]
        return cidrs

    def authorize_ssh(self, region: str, group_id: str, cidr: str, settle: float) -> None:
        where = {"Ipv6SourceCidrIp": cidr} if ":" in cidr else {"SourceCidrIp": cidr}
        self._settle("security-group", group_id, settle, lambda: self._call(
            region, "AuthorizeSecurityGroup", SecurityGroupId=group_id, IpProtocol="tcp", PortRange="22/22",
            ClientToken=f"ssh-{group_id}-{cidr}"[:64], **where))

    # --- launch ----------------------------------------------------------------------------

    def launch(self, request: LaunchRequest, settle: float) -> Instance:
        return self.launch_group(request, settle)[0]

    def launch_group(self, request: LaunchRequest, settle: float) -> list[Instance]:
        """RunInstances with the request's ClientToken, its tags on the instance and its disk. After an answer that
        never came, the instances are looked for by the token's tag before the same request is sent again."""
        market = request.market
        params = self._run_params(request)
        lost = False
        deadline = time.monotonic() + settle
        attempt = 0
        while attempt < RETRIES:
            attempt += 1
            try:
                reply = self._send(request.region, "RunInstances", params)
                ids = [str(i) for i in (reply.get("InstanceIdSets") or {}).get("InstanceIdSet") or []]
                return self.describe(request.region, ids, settle)
            except EcsNoAnswer:
                if attempt == RETRIES:
                    raise
                lost = True
            except EcsError as exc:
                # a RAM role made moments ago that ECS does not know yet (RAM is eventually consistent, as IAM is):
                # the same request again within the settle time; a refusal made nothing for its token
                if exc.code == FRESH_ROLE and request.instance_profile and time.monotonic() < deadline:
                    attempt -= 1
                else:
                    row = classify(exc.code, market)
                    if row.then != "retry" or attempt == RETRIES:
                        raise LaunchError(row.then, exc.code, exc.message, row.fix, row.quota) from None
            time.sleep(self.poll * max(attempt, 1))
            if lost:
                made = self.find_launched(request.region, request.client_token)
                if made:
                    return made
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _run_params(self, request: LaunchRequest) -> dict[str, Any]:
        switch = request.access.subnet_id or self._default_switch(request.region, request.zone)
        tags = self._tag_list(request.node, {**request.tags, TAG_TOKEN: request.client_token})
        params: dict[str, Any] = {
            "ZoneId": request.zone, "InstanceType": request.instance_type, "ImageId": request.image_id,
            "SecurityGroupId": request.access.security_group_id, "VSwitchId": switch,
            "KeyPairName": request.access.key_name, "InstanceName": f"gpuprov-{request.node}",
            "Amount": request.count, "MinAmount": request.min_count, "ClientToken": request.client_token,
            "InstanceChargeType": "PostPaid", "InternetChargeType": "PayByTraffic",
            "InternetMaxBandwidthOut": BANDWIDTH_MBPS,
            "SystemDisk": {"Size": str(request.disk_gb), "Category": DISK},
            "Tag": tags,
        }
        if request.instance_profile:  # the RAM role the node's guards stop it with (alibaba_ram.py)
            params["RamRoleName"] = request.instance_profile
        if request.placement_group:  # a cluster's deployment set: every instance of the Amount goes into it
            params["DeploymentSetId"] = request.placement_group
        if request.market == "spot":
            params["SpotStrategy"] = "SpotWithPriceLimit" if request.max_price else "SpotAsPriceGo"
            if request.max_price:  # "precise up to three decimal places" (RunInstances, SpotPriceLimit)
                params["SpotPriceLimit"] = round(request.max_price, 3)
            params["SpotInterruptionBehavior"] = "Stop" if request.persistent else "Terminate"
            if request.spot_duration is not None:  # the protection period, hours: 1 (ECS's default) or 0 (none)
                params["SpotDuration"] = request.spot_duration
        else:
            params["SpotStrategy"] = "NoSpot"
        return params

    def _default_switch(self, region: str, zone: str) -> str:
        """The zone's default vSwitch, else gpuprov's own there (made before the launch where the region has no
        default VPC)."""
        switches = self._pages(region, "DescribeVSwitches", ("VSwitches", "VSwitch"), ZoneId=zone, IsDefault=True)
        own = None if switches else self.own_switch(region, zone)
        if own is not None:
            return str(own["VSwitchId"])
        if not switches:
            raise LaunchError("next-candidate", "InvalidVSwitchId.NotFound",
                              f"zone {zone} has no default vSwitch (of the default VPC)",
                              "create a default vSwitch in the zone, or pass --subnet vsw-...")
        return str(switches[0]["VSwitchId"])

    def find_launched(self, region: str, client_token: str) -> list[Instance]:
        raws = self._pages(region, "DescribeInstances", ("Instances", "Instance"),
                           Tag=[{"Key": TAG_TOKEN, "Value": client_token}])
        return [self._instance(region, raw) for raw in raws]

    # --- instances -------------------------------------------------------------------------

    def _instance(self, region: str, raw: dict[str, Any]) -> Instance:
        tags = tags_of(raw)
        public = ((raw.get("PublicIpAddress") or {}).get("IpAddress") or [None])[0] \
            or (raw.get("EipAddress") or {}).get("IpAddress") or None
        vpc = raw.get("VpcAttributes") or {}
        private = ((vpc.get("PrivateIpAddress") or {}).get("IpAddress") or [None])[0]
        locks = (raw.get("OperationLocks") or {}).get("LockReason") or []
        market: Market = "on-demand" if raw.get("SpotStrategy") in (None, "", "NoSpot") else "spot"
        return Instance(
            id=str(raw["InstanceId"]), region=region, zone=raw.get("ZoneId"), instance_type=str(raw["InstanceType"]),
            state=STATES.get(str(raw.get("Status")), str(raw.get("Status", "")).lower()), market=market,
            public_ip=public, private_ip=private, launched_at=stamp(raw.get("CreationTime")),
            state_reason=str(locks[0].get("LockMsg") or "") if locks else None,
            state_code=str(locks[0].get("LockReason")) if locks else None,
            node=tags.get(TAG_NODE), owner=tags.get(TAG_OWNER), team=tags.get(TAG_TEAM),
            member=tags.get("gpuprov:member"), subnet_id=vpc.get("VSwitchId"), vpc_id=vpc.get("VpcId"))

    def describe(self, region: str, ids: Sequence[str], settle: float = 0) -> list[Instance]:
        """By id, looked at again within `settle` while an id is not listed yet (ECS lists a new instance a moment
        after RunInstances answers)."""
        if not ids:
            return []

        def look() -> list[Instance]:
            found = self.instances(region, ids=ids)
            missing = sorted(set(ids) - {i.id for i in found})
            if missing:
                raise EcsError("DescribeInstances", "InvalidInstanceId.NotFound", f"{', '.join(missing)} not listed")
            return sorted(found, key=lambda i: list(ids).index(i.id))

        return self._settle("instance", ",".join(ids), settle, look)

    def instances(self, region: str, *, ids: Sequence[str] = (), node: str | None = None,
                  everyone: bool = False) -> list[Instance]:
        params: dict[str, Any] = {}
        if ids:
            params["InstanceIds"] = "[" + ",".join(f'"{i}"' for i in ids) + "]"
        if node:
            params["Tag"] = [{"Key": TAG_NODE, "Value": node}]
        raws = self._pages(region, "DescribeInstances", ("Instances", "Instance"), **params)
        found = [self._instance(region, raw) for raw in raws]
        if ids:
            return found
        return [i for i in found if self._mine({TAG_OWNER: i.owner or "", TAG_TEAM: i.team or ""}, everyone)]

    def _wait(self, region: str, ids: Sequence[str], done: Callable[[Instance | None], bool], timeout: float,
              what: str) -> list[Instance]:
        deadline = time.monotonic() + timeout
        while True:
            found = {i.id: i for i in self.instances(region, ids=ids)}
            if all(done(found.get(i)) for i in ids):
                return [found[i] for i in ids if i in found]
            if time.monotonic() > deadline:
                raise GpuprovError(f"{', '.join(ids)} not {what} after {timeout:.0f}s")
            time.sleep(self.poll)

    def wait_running(self, region: str, instance_id: str, timeout: float, settle: float) -> Instance:
        self.describe(region, [instance_id], settle)
        return self._wait(region, [instance_id], lambda i: i is not None and i.state == "running", timeout,
                          "running")[0]

    def _each(self, region: str, action: str, ids: Sequence[str], settle: float, **params: Any) -> None:
        self._settle("instance", ",".join(ids), settle, lambda: self._call(
            region, action, InstanceId=list(ids), **params))

    def terminate(self, region: str, ids: Sequence[str], settle: float) -> None:
        """DeleteInstances with Force: a running instance is stopped and released at once."""
        self._each(region, "DeleteInstances", ids, settle, Force=True)

    def wait_terminated(self, region: str, ids: Sequence[str], timeout: float = 900) -> None:
        self._wait(region, ids, lambda i: i is None, timeout, "released")

    def stop(self, region: str, ids: Sequence[str], settle: float) -> None:
        """StopInstances in economical mode: compute is not billed while stopped, the disks are kept."""
        self._each(region, "StopInstances", ids, settle, StoppedMode="StopCharging")

    def wait_stopped(self, region: str, ids: Sequence[str], timeout: float = 900) -> list[Instance]:
        return self._wait(region, ids, lambda i: i is not None and i.state == "stopped", timeout, "stopped")

    def start(self, region: str, ids: Sequence[str], settle: float) -> None:
        """StartInstances; economical mode gave the compute back, so no stock now is a LaunchError."""
        try:
            self._each(region, "StartInstances", ids, settle)
        except EcsError as exc:
            row = classify(exc.code, "on-demand")
            raise LaunchError(row.then, exc.code, exc.message, row.fix, row.quota) from None

    def set_instance_type(self, region: str, instance_id: str, instance_type: str, settle: float) -> None:
        self._settle("instance", instance_id, settle, lambda: self._call(
            region, "ModifyInstanceSpec", InstanceId=instance_id, InstanceType=instance_type))

    def delete(self, resource: CloudResource, settle: float = 0) -> None:
        kind, rid, region = resource.kind, resource.id, resource.region
        try:
            if kind == "instance":
                self.terminate(region, [rid], settle)
                self.wait_terminated(region, [rid])
            elif kind == "security-group":
                self._settle(kind, rid, settle, lambda: self._in_use(lambda: self._call(
                    region, "DeleteSecurityGroup", SecurityGroupId=rid)))
            elif kind == "key-pair":
                self.delete_key_pair(region, rid, settle)
            elif kind == "image":
                self.delete_image(region, rid, settle)
            elif kind == "snapshot":
                self._settle(kind, rid, settle, lambda: self._call(region, "DeleteSnapshot", SnapshotId=rid))
            elif kind == "placement-group":
                self.delete_set(region, rid, settle)
            elif kind in ("vswitch", "vpc"):
                self.delete_network_part(region, kind, rid)
            elif kind == "ram-role":
                self.delete_stop_role(rid)
            else:
                raise GpuprovError(f"Alibaba Cloud has no {kind} of gpuprov's to delete ({rid})")
        except NotFound:
            raise
        except EcsError as exc:
            if exc.code in NOT_FOUND.get(kind, ()):
                raise NotFound(kind, rid, exc.code) from None
            raise

    def _in_use(self, fn: Callable[[], Any], timeout: float = 300) -> None:
        """ECS keeps a group in use for a while after its instance is released (DependencyViolation): bounded."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                fn()
                return
            except EcsError as exc:
                if not exc.code.startswith("DependencyViolation") or time.monotonic() > deadline:
                    raise
                time.sleep(self.poll)

    def tagged(self, region: str, everyone: bool = False) -> list[CloudResource]:
        """Every resource of the region that carries a gpuprov:owner tag of this install (ListTagResources, each
        resource type gpuprov makes)."""
        out = []
        images = self.images(region, everyone=everyone)
        names = {i.name for i in images}
        for kind, ours in TAGGED_KINDS.items():
            if kind == "image":  # as AWS's: "NAME | state", the name being what a bake's lock is called
                out += [CloudResource("image", i.id, region, IMAGES, f"{i.name} | {i.state}", i.owner,
                                      member=i.member) for i in images]
                continue
            rows = self._tag_rows(region, kind)
            for rid, tags in rows.items():
                if not self._mine(tags, everyone):
                    continue
                if kind == "snapshot":  # only a snapshot whose image is gone (a live image's are the image's)
                    if tags.get(TAG_IMAGE) in names:
                        continue
                    out.append(CloudResource("snapshot", rid, region, IMAGES, f"of image {tags.get(TAG_IMAGE)} (gone)",
                                             tags.get(TAG_OWNER), member=tags.get("gpuprov:member")))
                    continue
                out.append(CloudResource(kind=ours, id=rid, region=region, node=tags.get(TAG_NODE),
                                         owner=tags.get(TAG_OWNER), team=tags.get(TAG_TEAM),
                                         member=tags.get("gpuprov:member")))
        sets = self.tagged_sets(region) + self.tagged_networks(region)  # untaggable: tags in their descriptions
        return out + [r for r in sets if self._mine({TAG_OWNER: r.owner or "", TAG_TEAM: r.team or ""}, everyone)]

    def _tag_rows(self, region: str, kind: str) -> dict[str, dict[str, str]]:
        rows: dict[str, dict[str, str]] = {}
        token: str | None = None
        key = TAG_TEAM if self.team else TAG_OWNER
        while True:
            page = self._call(region, "ListTagResources", ResourceType=kind, TagFilter=[{"TagKey": key}],
                              **({"NextToken": token} if token else {}))
            for row in (page.get("TagResources") or {}).get("TagResource") or []:
                rows.setdefault(str(row["ResourceId"]), {})[str(row["TagKey"])] = str(row["TagValue"])
            token = page.get("NextToken") or None
            if not token:
                return rows

    # --- facts: prices, types, quotas --------------------------------------------------------

    def prices(self, region: str, instance_types: Sequence[str]) -> list[SpotPrice]:
        """The latest spot price of each type in each zone (DescribeSpotPriceHistory, $/h)."""
        out = []
        for name in instance_types:
            reply = self._call(region, "DescribeSpotPriceHistory", InstanceType=name, NetworkType="vpc",
                               OSType="linux")
            latest: dict[str, dict[str, Any]] = {}
            for row in (reply.get("SpotPrices") or {}).get("SpotPriceType") or []:
                zone = str(row.get("ZoneId"))
                if zone not in latest or str(row.get("Timestamp")) > str(latest[zone].get("Timestamp")):
                    latest[zone] = row
            out += [SpotPrice(instance_type=name, zone=zone, price=float(row.get("SpotPrice") or 0),
                              at=stamp(row.get("Timestamp"))) for zone, row in sorted(latest.items())]
        return out

    def list_price(self, region: str, instance_type: str, *, zone: str | None = None,
                   disk_gb: int | None = None) -> ListPrice:
        """The pay-as-you-go price per hour now (DescribePrice, PostPaid by default, PriceUnit Hour): the compute's
        (its instanceType row) and, with `disk_gb`, the system disk's (its systemDisk row), in the answer's
        currency."""
        params: dict[str, Any] = {"ResourceType": "instance", "InstanceType": instance_type, "PriceUnit": "Hour"}
        if zone:
            params["ZoneId"] = zone
        if disk_gb:
            params["SystemDisk"] = {"Category": DISK, "Size": disk_gb}
        reply = self._call(region, "DescribePrice", **params)
        price = (reply.get("PriceInfo") or {}).get("Price") or {}
        rows = {str(r.get("Resource")): float(r.get("TradePrice") or 0)
                for r in (price.get("DetailInfos") or {}).get("DetailInfo") or []}
        compute = rows.get("instanceType", float(price.get("TradePrice") or 0) - rows.get("systemDisk", 0.0))
        return ListPrice(instance_type=instance_type, price=compute, currency=str(price.get("Currency") or "?"),
                         disk_price=rows.get("systemDisk"), source="Alibaba Cloud DescribePrice",
                         at=datetime.now(timezone.utc))

    def disk_price(self, region: str, disk_gb: int, *, zone: str | None = None) -> DiskPrice:
        """The system disk's category and size priced alone, per hour now: DescribePrice with ResourceType disk, which
        "must also specify DataDisk.1.Category and DataDisk.1.Size" and answers pay-as-you-go only, PriceUnit Hour
        (DescribePrice API reference, help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-describeprice,
        read 2026-12-04). A disk is billed by category and size whether it was made as a system or a data disk, so
        the answer's total is what the stopped node's disk costs."""
        params: dict[str, Any] = {"ResourceType": "disk", "DataDisk": [{"Category": DISK, "Size": disk_gb}],
                                  "PriceUnit": "Hour"}
        if zone:
            params["ZoneId"] = zone
        price = ((self._call(region, "DescribePrice", **params).get("PriceInfo") or {}).get("Price") or {})
        return DiskPrice(gb=disk_gb, price=float(price.get("TradePrice") or 0), currency=str(price.get("Currency") or "?"),
                         source="Alibaba Cloud DescribePrice", at=datetime.now(timezone.utc))

    def gpu_instance_types(self, region: str) -> list[InstanceTypeInfo]:
        """DescribeInstanceTypes' GPU types (GPUAmount > 0: GPUSpec "NVIDIA A10", CpuCoreCount, MemorySize GiB;
        GPUMemorySize read as each GPU's GiB); where it lists none, the documented families (plan/catalog_alibaba.py)."""
        raws = self._pages(region, "DescribeInstanceTypes", ("InstanceTypes", "InstanceType"))
        out = []
        for raw in raws:
            gpus = int(raw.get("GPUAmount") or 0)
            if gpus <= 0:
                continue
            out.append(_type_info(str(raw["InstanceTypeId"]), _gpu_name(str(raw.get("GPUSpec") or "")), gpus,
                                  float(raw.get("GPUMemorySize") or 0), int(raw.get("CpuCoreCount") or 0),
                                  float(raw.get("MemorySize") or 0), raw.get("CpuArchitecture") == "ARM",
                                  f"{raw.get('InstanceBandwidthRx') or 0} Kbit/s"))
        return out or [_type_info(t.instance_type, t.gpu, t.gpus, t.gpu_memory_gib, t.vcpu, t.memory_gib, False, "")
                       for t in facts().gpu_types]

    def quota(self, region: str, code: str) -> float | None:
        """An account attribute (DescribeAccountAttributes: max-postpaid-instance-vcpu-count,
        max-spot-instance-vcpu-count …); None when ECS does not answer it."""
        reply = self._call(region, "DescribeAccountAttributes", AttributeName=[code])
        for item in (reply.get("AccountAttributeItems") or {}).get("AccountAttributeItem") or []:
            for value in (item.get("AttributeValues") or {}).get("ValueItem") or []:
                if value.get("Value") is not None:
                    return float(value["Value"])
        return None

    def instance_store(self, instance_type: str, region: str) -> InstanceStore | None:
        raws = self._pages(region, "DescribeInstanceTypes", ("InstanceTypes", "InstanceType"),
                           InstanceTypes=[instance_type])
        for raw in raws:
            count, size = int(raw.get("LocalStorageAmount") or 0), int(raw.get("LocalStorageCapacity") or 0)
            if count and size:
                return InstanceStore(total_gb=count * size, disks=((count, size),))
        return None


def _type_info(name: str, gpu: str, gpus: int, gpu_gib: float, vcpu: int, memory_gib: float, arm: bool,
               network: str) -> InstanceTypeInfo:
    return InstanceTypeInfo(name=name, gpu=gpu, gpu_manufacturer="NVIDIA", gpus=gpus,
                            gpu_memory_mib=int(gpu_gib * 1024), vcpu=vcpu, memory_mib=int(memory_gib * 1024),
                            efa=False, efa_interfaces=None, network_cards=1, efa_card_indexes=(),
                            network_performance=network, cpu_archs=("arm64",) if arm else ("x86_64",))


def _gpu_name(spec: str) -> str:
    """ECS's GPUSpec ("NVIDIA A10", "NVIDIA V100", "NVIDIA T4") as the catalog names it ("A10")."""
    return spec.removeprefix("NVIDIA").strip().split(" ")[0] if spec else ""
