"""AWS EC2 behind the provider protocol. boto3 is imported under cloud/providers/ only, when a command needs AWS.

`AwsProvider` is the protocol's one AWS implementation, put together from its parts: aws_base.py (clients,
the error path, eventual consistency), aws_instances.py (launch and the instance lifecycle), aws_images.py
(AMIs); this module adds discovery (offerings, Ubuntu's image, the network), access (key pair, security
group, placement group, Elastic IPs), what is tagged as ours and its removal (gc, teardown), and prices.

The network read is the VPC's CIDR, whether the subnet maps public IPs and whether it has an IPv6 block. The
security group opens SSH from one IPv4 or IPv6 CIDR; an IPv6 one asks for an IPv6 address at launch
(`Ipv6AddressCount` on the primary interface or the instance) and the node is reached on it. Placement groups and
Elastic IPs are created with TagSpecifications; a cluster's group gets a self-referencing rule. Every paginated
Describe is read through botocore's paginator (`_pages`: spot price history, spot requests, volumes, images,
snapshots). Each removal is NotFound-tolerant within `settle`; the tagged-resource listing for gc includes images
and snapshots.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from gpuprov.cloud.providers.aws_base import NOT_FOUND, AwsError, tag_value
from gpuprov.cloud.providers.aws_capacity import AwsCapacity
from gpuprov.cloud.providers.aws_iam import AwsIam
from gpuprov.cloud.providers.aws_images import AwsImages
from gpuprov.cloud.providers.aws_instances import AwsInstances
from gpuprov.cloud.providers.base import (
    IMAGES,
    SHARED,
    TAG_IMAGE,
    TAG_MEMBER,
    TAG_OWNER,
    TAG_TEAM,
    CloudResource,
    InstanceStore,
    InstanceTypeInfo,
    Network,
    SpotPrice,
)
from gpuprov.cloud.providers.capabilities import ALL
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.plan.budget import priced
from gpuprov.settings import settings

UBUNTU_SSM_PREFIX = "/aws/service/canonical/ubuntu/server"
ADDRESS_QUOTA_CODE = "L-0263D0A3"
ADDRESS_QUOTA_NAME = "EC2-VPC Elastic IPs"
ADDRESS_QUOTA_DEFAULT = 5


class AwsProvider(AwsInstances, AwsImages, AwsCapacity, AwsIam):
    name = "aws"
    capabilities = frozenset(c.flag for c in ALL)  # every one gpuprov knows
    address_name = "Elastic IP"

    # --- discovery -----------------------------------------------------------------------

    def offerings(self, region: str, instance_types: Sequence[str]) -> dict[str, list[str]]:
        ec2 = self._client("ec2", region)
        found: dict[str, list[str]] = {}
        for offer in self._pages(ec2, "DescribeInstanceTypeOfferings", "InstanceTypeOfferings",
                                 LocationType="availability-zone",
                                 Filters=[{"Name": "instance-type", "Values": list(instance_types)}]):
            found.setdefault(offer["InstanceType"], []).append(offer["Location"])
        return {t: sorted(zones) for t, zones in found.items()}

    def image(self, region: str, os_name: str, arch: str = "x86_64") -> str:
        if not os_name.startswith("ubuntu-"):
            return self.os_image(region, os_name, arch)
        release = os_name.removeprefix("ubuntu-")
        canonical = "arm64" if arch == "arm64" else "amd64"  # Canonical's names: amd64 for x86_64
        prefix = settings().test_ubuntu_ssm_prefix or UBUNTU_SSM_PREFIX
        ssm = self._client("ssm", region)
        tried = []
        for volume in ("ebs-gp3", "ebs-gp2"):
            name = f"{prefix}/{release}/stable/current/{canonical}/hvm/{volume}/ami-id"
            tried.append(name)
            try:
                reply = self._call("ssm:GetParameter", functools.partial(ssm.get_parameter, Name=name))
                return str(reply["Parameter"]["Value"])
            except AwsError as exc:
                if exc.code != "ParameterNotFound":
                    raise
        raise UserInputError("--image", f"no Ubuntu {release} {arch} image published in {region} (looked up {tried[0]})",
                             "pass --image ami-... explicitly")

    def enabled_regions(self, region: str) -> list[str]:
        """The regions enabled for the account, asked in `region`: DescribeRegions without AllRegions leaves out
        the opt-in regions it has not enabled, where every call would answer AuthFailure."""
        ec2 = self._client("ec2", region)
        reply = self._call("DescribeRegions", lambda: ec2.describe_regions())
        return sorted(str(r["RegionName"]) for r in reply["Regions"])

    def network(self, region: str, subnet: str | None) -> Network:
        """The pinned subnet's VPC and zone, or the region's default VPC (any zone); whether the subnet (every
        default subnet, since the launch picks the zone) has an IPv6 CIDR block to give a node an address from."""
        ec2 = self._client("ec2", region)
        if subnet:
            try:
                (found,) = self._call("DescribeSubnets", lambda: ec2.describe_subnets(SubnetIds=[subnet]))["Subnets"]
            except AwsError as exc:
                raise UserInputError("--subnet", f"{subnet}: {exc.code}: {exc.message}",
                                     "list subnets with `aws ec2 describe-subnets`") from None
            vpc = self._call("DescribeVpcs", lambda: ec2.describe_vpcs(VpcIds=[found["VpcId"]]))["Vpcs"][0]
            return _subnet_network(found, str(vpc["CidrBlock"]))
        vpcs = self._call("DescribeVpcs", lambda: ec2.describe_vpcs(
            Filters=[{"Name": "is-default", "Values": ["true"]}]))["Vpcs"]
        if not vpcs:
            raise UserInputError("--subnet", f"{region} has no default VPC", "pass --subnet subnet-... to launch into")
        defaults = self._call("DescribeSubnets", lambda: [s for page in ec2.get_paginator("describe_subnets").paginate(
            Filters=[{"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]}, {"Name": "default-for-az", "Values": ["true"]}])
            for s in page["Subnets"]])
        # default subnets give instances a public address (EC2 guide, "Default VPCs")
        return Network(vpc_id=str(vpcs[0]["VpcId"]), vpc_cidr=str(vpcs[0]["CidrBlock"]),
                       ipv6=bool(defaults) and all(_has_ipv6(s) for s in defaults))

    def subnets(self, region: str, vpc_id: str, zones: Sequence[str]) -> list[Network]:
        """The VPC's subnets in these zones: DescribeSubnets filtered by vpc-id and availability-zone (where a move
        launches: the node's security group belongs to its VPC, and EC2 refuses a subnet of another, InvalidParameter
        "Security group … and subnet … belong to different networks")."""
        if not zones:
            return []
        ec2 = self._client("ec2", region)
        found = self._call("DescribeSubnets", lambda: [s for page in ec2.get_paginator("describe_subnets").paginate(
            Filters=[{"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "availability-zone", "Values": list(zones)}])
            for s in page["Subnets"]])
        if not found:
            return []
        vpc = self._call("DescribeVpcs", lambda: ec2.describe_vpcs(VpcIds=[vpc_id]))["Vpcs"][0]
        return [_subnet_network(s, str(vpc["CidrBlock"])) for s in found]

    # --- key pair, security group, placement group, Elastic IPs ------------------------------

    def key_pair_exists(self, region: str, name: str) -> bool:
        ec2 = self._client("ec2", region)
        try:
            return bool(self._call("DescribeKeyPairs", lambda: ec2.describe_key_pairs(KeyNames=[name]))["KeyPairs"])
        except AwsError as exc:
            if exc.code != NOT_FOUND["key-pair"]:
                raise
            return False

    def import_key_pair(self, region: str, name: str, public_key: str) -> str:
        """ImportKeyPair has no ClientToken (mutations.py: LOOK): sent with retries off; after a lost answer the key
        pair is looked for by its name before it is asked again, and a Duplicate then is the first one, made after
        all. The name is this owner's (keys.key_name) and is asked for under the region's lock."""
        ec2 = self._client("ec2", region, retries=False)
        return self._create_once("ImportKeyPair", lambda: str(ec2.import_key_pair(
            KeyName=name, PublicKeyMaterial=public_key.encode(),
            TagSpecifications=[{"ResourceType": "key-pair", "Tags": self._tags(SHARED)}]).get("KeyPairId") or name),
            lambda: self._key_pair_id(region, name), duplicate="InvalidKeyPair.Duplicate")

    def _key_pair_id(self, region: str, name: str) -> str | None:
        ec2 = self._client("ec2", region)
        try:
            found = self._call("DescribeKeyPairs", lambda: ec2.describe_key_pairs(KeyNames=[name]))["KeyPairs"]
        except AwsError as exc:
            if exc.code != NOT_FOUND["key-pair"]:
                raise
            return None
        return str(found[0].get("KeyPairId") or name) if found else None

    def delete_key_pair(self, region: str, name: str, settle: float = 0) -> None:
        ec2 = self._client("ec2", region)
        self._settle("DeleteKeyPair", lambda: ec2.delete_key_pair(KeyName=name), "key-pair", name, settle)

    def create_security_group(self, region: str, node: str, vpc: str, name: str, description: str) -> str:
        """The node's group. Its name is the node's own (gpuprov-NODE-TIME): a Duplicate is our own create whose
        first answer was lost after EC2 made it (botocore sent it again), so that group is the answer."""
        ec2 = self._client("ec2", region)
        try:
            return str(self._call("CreateSecurityGroup", lambda: ec2.create_security_group(
                GroupName=name, Description=description, VpcId=vpc,
                TagSpecifications=[{"ResourceType": "security-group", "Tags": self._tags(node)}]))["GroupId"])
        except AwsError as exc:
            made = self.find_security_group(region, name) if exc.code == "InvalidGroup.Duplicate" else None
            if made is None:
                raise
            return made

    def find_security_group(self, region: str, name: str) -> str | None:
        """A group by name (for a create whose answer was lost); a name filter, which does not wait for tags."""
        ec2 = self._client("ec2", region)
        groups = self._call("DescribeSecurityGroups", lambda: ec2.describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [name]}]))["SecurityGroups"]
        return str(groups[0]["GroupId"]) if groups else None

    def ssh_cidrs(self, region: str, group_id: str) -> list[str]:
        """The CIDRs the group opens TCP 22 to (IPv4 and IPv6), as DescribeSecurityGroups lists them."""
        ec2 = self._client("ec2", region)
        groups = self._call("DescribeSecurityGroups", lambda: ec2.describe_security_groups(
            GroupIds=[group_id]))["SecurityGroups"]
        perms = [p for g in groups for p in g.get("IpPermissions") or []
                 if p.get("IpProtocol") == "tcp" and p.get("FromPort") == 22]
        return [str(r.get("CidrIp") or r.get("CidrIpv6")) for p in perms
                for r in [*(p.get("IpRanges") or []), *(p.get("Ipv6Ranges") or [])]]

    def authorize_ssh(self, region: str, group_id: str, cidr: str, settle: float) -> None:
        ec2 = self._client("ec2", region)
        ranges: dict[str, Any] = ({"Ipv6Ranges": [{"CidrIpv6": cidr, "Description": "gpuprov: SSH"}]} if ":" in cidr
                                  else {"IpRanges": [{"CidrIp": cidr, "Description": "gpuprov: SSH"}]})
        _granted(lambda: self._settle("AuthorizeSecurityGroupIngress", lambda: ec2.authorize_security_group_ingress(
            GroupId=group_id, IpPermissions=[{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges}]),
            "security-group", group_id, settle))

    def authorize_self(self, region: str, group_id: str, settle: float) -> None:
        """All protocols and ports from and to the group itself: a cluster's nodes reach each other on any port
        (NCCL's, the rendezvous). EFA needs both directions (EC2 guide, "Get started with EFA and NCCL": "allows
        all inbound and outbound traffic to and from the security group itself")."""
        ec2 = self._client("ec2", region)
        rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id, "Description": "gpuprov: cluster"}]}]
        _granted(lambda: self._settle("AuthorizeSecurityGroupIngress", lambda: ec2.authorize_security_group_ingress(
            GroupId=group_id, IpPermissions=rule), "security-group", group_id, settle))
        _granted(lambda: self._settle("AuthorizeSecurityGroupEgress", lambda: ec2.authorize_security_group_egress(
            GroupId=group_id, IpPermissions=rule), "security-group", group_id, settle))

    def create_placement_group(self, region: str, node: str, name: str) -> str:
        """A cluster group; its name is the node's own (gpuprov-NODE-RANDOM), so a Duplicate is our create sent
        again after a lost answer, and the group is there."""
        ec2 = self._client("ec2", region)
        try:
            self._call("CreatePlacementGroup", lambda: ec2.create_placement_group(
                GroupName=name, Strategy="cluster",
                TagSpecifications=[{"ResourceType": "placement-group", "Tags": self._tags(node)}]))
        except AwsError as exc:
            if exc.code != "InvalidPlacementGroup.Duplicate":
                raise
        return name

    def check_room(self, region: str, nodes: int, types: Sequence[str]) -> None:
        """EC2 gives no public address to an instance launched with more than one network interface, so each node of
        a public EFA cluster (p4d, p5, p5en, p6: several network cards) gets an Elastic IP after it runs. The account
        may hold 5 per region by default (EC2 user guide, "Elastic IP addresses", as of awsdocs/amazon-ec2-user-guide
        2023: "By default, all AWS accounts are limited to five (5) Elastic IP addresses per Region"), the quota
        "EC2-VPC Elastic IPs" (Service Quotas code L-0263D0A3, as public code pairs it with that name; not in the AWS
        pages read), shared with every address the account already holds there. Past it AllocateAddress answers
        AddressLimitExceeded."""
        value = self.quota(region, ADDRESS_QUOTA_CODE)
        limit = int(value) if value is not None else ADDRESS_QUOTA_DEFAULT
        held = self.address_count(region)
        if held + nodes <= limit:
            return
        which = "the default" if value is None else "Service Quotas says"
        raise UserInputError(
            "--nodes", f"{nodes} nodes of {' or '.join(types)} reached on public addresses need {nodes} Elastic "
            f"IPs (EC2 gives no public address to an instance with several network interfaces), and {region} has "
            f"{max(limit - held, 0)} of its {limit} free ({held} in use; quota '{ADDRESS_QUOTA_NAME}', "
            f"{ADDRESS_QUOTA_CODE}: {which})",
            f"raise it: aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
            f"{ADDRESS_QUOTA_CODE} --desired-value {held + nodes} --region {region}\n  or reach the nodes on their "
            "private addresses: --connect private (VPN or bastion); or release addresses you no longer use")

    def allocate_address(self, region: str, node: str, name: str) -> str:
        """An Elastic IP tagged with `name`. AllocateAddress has no ClientToken (mutations.py: LOOK): sent with
        retries off, and after a lost answer the tag `name` is looked for before it is asked again."""
        ec2 = self._client("ec2", region, retries=False)
        return self._create_once("AllocateAddress", lambda: str(ec2.allocate_address(
            Domain="vpc", TagSpecifications=[{"ResourceType": "elastic-ip", "Tags": self._tags(
                node, {"Name": name})}])["AllocationId"]), lambda: self.find_address(region, name))

    def find_address(self, region: str, name: str) -> str | None:
        ec2 = self._client("ec2", region)
        found = self._call("DescribeAddresses", lambda: ec2.describe_addresses(
            Filters=[{"Name": "tag:Name", "Values": [name]}, *self._owned()]))["Addresses"]
        return str(found[0]["AllocationId"]) if found else None

    def associate_address(self, region: str, allocation_id: str, instance_id: str, settle: float) -> str:
        """By the primary interface's id: EC2 refuses InstanceId for an instance with more than one interface
        (InvalidInstanceID, "There are multiple interfaces attached to instance"), every EFA node's case."""
        ec2 = self._client("ec2", region)
        (instance,) = self.describe(region, [instance_id], settle=settle)
        if instance.primary_interface is None:
            raise GpuprovError(f"{instance_id} has no primary network interface (card 0, device 0) to put an "
                               "Elastic IP on")
        eni = instance.primary_interface
        self._settle("AssociateAddress", lambda: ec2.associate_address(AllocationId=allocation_id, NetworkInterfaceId=eni),
                     "network-interface", eni, settle)
        (found,) = self._call("DescribeAddresses", lambda: ec2.describe_addresses(
            AllocationIds=[allocation_id]))["Addresses"]
        return str(found["PublicIp"])

    def address_count(self, region: str) -> int:
        ec2 = self._client("ec2", region)  # DescribeAddresses has no pages (botocore: no paginator)
        return len(self._call("DescribeAddresses", lambda: ec2.describe_addresses())["Addresses"])

    def instance_profile_exists(self, region: str, name: str) -> bool | None:
        iam = self._client("iam", region)
        try:
            self._call("iam:GetInstanceProfile", lambda: iam.get_instance_profile(InstanceProfileName=name))
        except AwsError as exc:
            if exc.code == "NoSuchEntity":
                return False
            if exc.code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
                return None
            raise
        return True

    def instance_store(self, instance_type: str, region: str) -> InstanceStore | None:
        ec2 = self._client("ec2", region)
        (found,) = self._call("DescribeInstanceTypes", lambda: ec2.describe_instance_types(
            InstanceTypes=[instance_type]))["InstanceTypes"]
        info = found.get("InstanceStorageInfo") if found.get("InstanceStorageSupported") else None
        if not info:
            return None
        return InstanceStore(int(info["TotalSizeInGB"]), tuple((int(d["Count"]), int(d["SizeInGB"]))
                                                                  for d in info.get("Disks") or []))

    # --- everything tagged as ours (gc) and its removal --------------------------------------

    def tagged(self, region: str, everyone: bool = False) -> list[CloudResource]:
        ec2 = self._client("ec2", region)
        owned = self._owned(everyone)
        found: list[CloudResource] = []
        for i in self.instances(region, everyone=everyone):
            if i.state != "terminated":
                found.append(CloudResource("instance", i.id, region, i.node, i.state, i.owner, i.team, i.member))
        for req in self._pages(ec2, "DescribeSpotInstanceRequests", "SpotInstanceRequests", Filters=owned):
            if req.get("State") in ("open", "active", "disabled"):  # disabled: its stopped instance's, still live
                found.append(CloudResource("spot-request", req["SpotInstanceRequestId"], region, tag_value(req), req["State"],
                                           tag_value(req, TAG_OWNER), tag_value(req, TAG_TEAM),
                                           tag_value(req, TAG_MEMBER)))
        for group in self._call("DescribeSecurityGroups", lambda: ec2.describe_security_groups(
                Filters=owned))["SecurityGroups"]:
            found.append(CloudResource("security-group", group["GroupId"], region, tag_value(group), "",
                                       tag_value(group, TAG_OWNER), tag_value(group, TAG_TEAM),
                                           tag_value(group, TAG_MEMBER)))
        for vol in self._pages(ec2, "DescribeVolumes", "Volumes", Filters=owned):
            if vol.get("State") not in ("deleting", "deleted"):
                found.append(CloudResource("volume", vol["VolumeId"], region, tag_value(vol), vol.get("State", ""),
                                           tag_value(vol, TAG_OWNER), tag_value(vol, TAG_TEAM),
                                           tag_value(vol, TAG_MEMBER)))
        for key in self._call("DescribeKeyPairs", lambda: ec2.describe_key_pairs(Filters=owned))["KeyPairs"]:
            found.append(CloudResource("key-pair", key["KeyName"], region, tag_value(key), "", tag_value(key, TAG_OWNER),
                                       tag_value(key, TAG_TEAM),
                                           tag_value(key, TAG_MEMBER)))
        for pg in self._call("DescribePlacementGroups", lambda: ec2.describe_placement_groups(
                Filters=owned))["PlacementGroups"]:
            if pg.get("State") not in ("deleting", "deleted"):
                found.append(CloudResource("placement-group", pg["GroupName"], region, tag_value(pg), pg.get("State", ""),
                                           tag_value(pg, TAG_OWNER), tag_value(pg, TAG_TEAM),
                                           tag_value(pg, TAG_MEMBER)))
        for eip in self._call("DescribeAddresses", lambda: ec2.describe_addresses(Filters=owned))["Addresses"]:
            found.append(CloudResource("address", eip["AllocationId"], region, tag_value(eip), eip.get("PublicIp", ""),
                                       tag_value(eip, TAG_OWNER), tag_value(eip, TAG_TEAM),
                                           tag_value(eip, TAG_MEMBER)))
        images = self.images(region, everyone=everyone)
        for image in images:
            found.append(CloudResource("image", image.id, region, IMAGES, f"{image.name} | {image.state}", image.owner,
                                       member=image.member))
        # a snapshot whose image is gone (a DeregisterImage whose DeleteSnapshot never came); its image's
        # name is its tag, since CreateImage tags the snapshots before the image id is known
        names = {i.name for i in images}
        for snap in self._pages(ec2, "DescribeSnapshots", "Snapshots", OwnerIds=["self"], Filters=owned):
            if tag_value(snap, TAG_IMAGE) not in names:
                found.append(CloudResource("snapshot", snap["SnapshotId"], region, IMAGES,
                                           f"of image {tag_value(snap, TAG_IMAGE)} (gone)", tag_value(snap, TAG_OWNER),
                                           member=tag_value(snap, TAG_MEMBER)))
        return found

    def delete(self, resource: CloudResource, settle: float = 0) -> None:
        if resource.kind == "instance-profile":  # IAM (aws_iam.py): `up --s3-access`
            self.delete_node_profile(resource.region, resource.id)
            return
        if resource.kind == "iam-role":
            self.delete_node_role(resource.region, resource.id)
            return
        ec2 = self._client("ec2", resource.region)
        if resource.kind == "image":
            self.delete_image(resource.region, resource.id, settle)
            return
        if resource.kind == "snapshot":
            self._settle("DeleteSnapshot", lambda: ec2.delete_snapshot(SnapshotId=resource.id), "snapshot",
                         resource.id, settle)
            return
        kind, rid, region = resource.kind, resource.id, resource.region
        if kind == "instance":
            self.terminate(region, [rid], settle)
            self.wait_terminated(region, [rid])
        elif kind == "spot-request":
            self._settle("CancelSpotInstanceRequests", lambda: ec2.cancel_spot_instance_requests(
                SpotInstanceRequestIds=[rid]), kind, rid, settle)
        elif kind == "security-group":
            self._while_in_use(lambda: self._settle("DeleteSecurityGroup", lambda: ec2.delete_security_group(GroupId=rid),
                                                    kind, rid, settle))
        elif kind == "volume":
            self._while_in_use(lambda: self._settle("DeleteVolume", lambda: ec2.delete_volume(VolumeId=rid),
                                                    kind, rid, settle))
        elif kind == "key-pair":
            self.delete_key_pair(region, rid, settle)
        elif kind == "placement-group":  # refused while an instance is in it (terminating ones too)
            self._while_in_use(lambda: self._settle("DeletePlacementGroup", lambda: ec2.delete_placement_group(
                GroupName=rid), kind, rid, settle))
        elif kind == "address":  # an association goes with its instance; a released address is gone for good
            self._while_in_use(lambda: self._settle("ReleaseAddress", lambda: ec2.release_address(AllocationId=rid),
                                                    kind, rid, settle))

    # --- prices and quotas -----------------------------------------------------------------

    def prices(self, region: str, instance_types: Sequence[str]) -> list[SpotPrice]:
        ec2 = self._client("ec2", region)
        rows = self._pages(ec2, "DescribeSpotPriceHistory", "SpotPriceHistory", InstanceTypes=list(instance_types),
                           ProductDescriptions=["Linux/UNIX"], StartTime=datetime.now(timezone.utc))
        latest: dict[tuple[str, str], SpotPrice] = {}
        for row in rows:
            price = SpotPrice(row["InstanceType"], row["AvailabilityZone"], float(row["SpotPrice"]), row.get("Timestamp"))
            if not priced(price.price):  # $0.0000 (a local endpoint's answer) is no price, never an estimate's
                continue
            key = (price.instance_type, price.zone)
            if key not in latest or (price.at and latest[key].at and price.at > latest[key].at):  # type: ignore[operator]
                latest[key] = price
        return sorted(latest.values(), key=lambda p: p.price)

    def gpu_instance_types(self, region: str) -> list[InstanceTypeInfo]:
        ec2 = self._client("ec2", region)
        pages = self._call("DescribeInstanceTypes", lambda: list(ec2.get_paginator("describe_instance_types").paginate()))
        return sorted((_type_info(row) for page in pages for row in page["InstanceTypes"]), key=lambda info: info.name)

    def quota(self, region: str, code: str) -> float | None:
        try:
            reply = self._client("service-quotas", region).get_service_quota(ServiceCode="ec2", QuotaCode=code)
            return float(reply["Quota"]["Value"])
        # reading the quota is a courtesy; the refusal said enough
        except (ClientError, BotoCoreError, ResponseParserError, KeyError):
            return None


def _granted(call: Any) -> None:
    """An ingress or egress rule: InvalidPermission.Duplicate means it is there (our own request, sent again by
    botocore after a lost answer, or a rerun), which is what was asked."""
    try:
        call()
    except AwsError as exc:
        if exc.code != "InvalidPermission.Duplicate":
            raise


def _type_info(row: dict[str, Any]) -> InstanceTypeInfo:
    """One DescribeInstanceTypes row: its GPUs are the first GPU entry (no EC2 type mixes models); a CPU-only type has
    no GpuInfo, so no GPU name and 0 GPUs."""
    gpu = ((row.get("GpuInfo") or {}).get("Gpus") or [{}])[0]
    net = row.get("NetworkInfo") or {}
    cards = net.get("NetworkCards") or []
    return InstanceTypeInfo(
        name=str(row["InstanceType"]), gpu=str(gpu.get("Name", "")), gpu_manufacturer=str(gpu.get("Manufacturer", "")),
        gpus=int(gpu.get("Count", 0)), gpu_memory_mib=int((gpu.get("MemoryInfo") or {}).get("SizeInMiB", 0)),
        vcpu=int((row.get("VCpuInfo") or {}).get("DefaultVCpus", 0)),
        memory_mib=int((row.get("MemoryInfo") or {}).get("SizeInMiB", 0)),
        efa=bool(net.get("EfaSupported")), efa_interfaces=(net.get("EfaInfo") or {}).get("MaximumEfaInterfaces"),
        network_cards=int(net.get("MaximumNetworkCards") or 1),
        efa_card_indexes=tuple(sorted(int(c["NetworkCardIndex"]) for c in cards if "efa" in (c.get("InterfaceTypes") or []))),
        network_performance=str(net.get("NetworkPerformance", "")),
        cpu_archs=tuple(str(a) for a in (row.get("ProcessorInfo") or {}).get("SupportedArchitectures") or ()),
        gpu_partition=float(gpu.get("GpuPartitionSize") or 1.0))


def _subnet_network(found: dict[str, Any], vpc_cidr: str) -> Network:
    """One subnet of DescribeSubnets as where a node launches."""
    return Network(vpc_id=str(found["VpcId"]), vpc_cidr=vpc_cidr, subnet_id=str(found["SubnetId"]),
                   zone=str(found["AvailabilityZone"]), maps_public_ip=bool(found.get("MapPublicIpOnLaunch")),
                   ipv6=_has_ipv6(found), default_for_az=bool(found.get("DefaultForAz")),
                   free_addresses=int(found.get("AvailableIpAddressCount") or 0))


def _has_ipv6(subnet: dict[str, Any]) -> bool:
    """An IPv6 CIDR block associated with the subnet (EC2 API reference, SubnetIpv6CidrBlockAssociation)."""
    return any((a.get("Ipv6CidrBlockState") or {}).get("State") in ("associating", "associated")
               for a in subnet.get("Ipv6CidrBlockAssociationSet") or [])
