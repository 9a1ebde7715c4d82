"""The fault proxy keeps EC2's contracts that moto 5.2 does not (tests/aws/ec2_contracts.py): AssociateAddress on
multi-interface instances, the Elastic IP quota, the root volume against the image's snapshot, IPv6 at launch,
a security group and a subnet of different VPCs, instance profiles, pages of N and deregistered images still
listed. Driven with real boto3 clients through the proxy, each contract checked against what moto alone says."""

from __future__ import annotations

import ipaddress

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.aws.fixture import AwsEndpoint, ubuntu_ami

UBUNTU = ubuntu_ami("24.04")


def _ec2():
    return boto3.client("ec2", region_name="us-east-1")


def _error(call) -> tuple[str, str, int]:
    with pytest.raises(ClientError) as info:
        call()
    err = info.value.response
    return err["Error"]["Code"], err["Error"]["Message"], err["ResponseMetadata"]["HTTPStatusCode"]


def _subnet(ec2, zone: str = "us-east-1a") -> str:
    return ec2.describe_subnets(Filters=[{"Name": "availability-zone", "Values": [zone]},
                                         {"Name": "default-for-az", "Values": ["true"]}])["Subnets"][0]["SubnetId"]


def _efa_nics(subnet: str, cards: int = 32) -> list[dict]:
    nics = [{"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "interface"},
            {"NetworkCardIndex": 0, "DeviceIndex": 1, "InterfaceType": "efa-only"}]
    nics += [{"NetworkCardIndex": c, "DeviceIndex": 0, "InterfaceType": "efa-only"} for c in range(1, cards)]
    return [{**n, "SubnetId": subnet} for n in nics]


def ipv6_subnet(aws: AwsEndpoint, zone: str = "us-east-1b") -> str:
    """A VPC with Amazon's IPv6 block and a subnet with a /64 of it, made straight in moto."""
    ec2 = aws.ec2(zone[:-1])
    vpc = ec2.create_vpc(CidrBlock="10.77.0.0/16", AmazonProvidedIpv6CidrBlock=True)["Vpc"]
    block = vpc["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"]
    first = next(ipaddress.ip_network(block).subnets(new_prefix=64))
    return ec2.create_subnet(VpcId=vpc["VpcId"], CidrBlock="10.77.1.0/24", AvailabilityZone=zone,
                             Ipv6CidrBlock=str(first))["Subnet"]["SubnetId"]


def big_image(aws: AwsEndpoint, size: int, name: str = "big", tags: list[dict] | None = None) -> tuple[str, str]:
    """An image whose root snapshot is `size` GB: a volume and its snapshot made straight in moto, the image
    registered through the proxy (moto alone gives every image a 15 GB snapshot): (image id, snapshot id)."""
    ec2 = aws.ec2()
    volume = ec2.create_volume(Size=size, AvailabilityZone="us-east-1a")["VolumeId"]
    snap = ec2.create_snapshot(VolumeId=volume)["SnapshotId"]
    ec2.delete_volume(VolumeId=volume)
    image = _ec2().register_image(Name=name, RootDeviceName="/dev/sda1", Architecture="x86_64", VirtualizationType="hvm",
                               BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"SnapshotId": snap, "VolumeSize": size}}],
                               )["ImageId"]
    if tags:  # moto's RegisterImage drops its TagSpecifications
        ec2.create_tags(Resources=[image], Tags=tags)
    return image, snap


# --- Elastic IPs -------------------------------------------------------------------------------------------


@pytest.mark.instant_aws
def test_associate_address_by_instance_id_is_refused_for_an_instance_with_several_interfaces(aws):
    ec2 = _ec2()
    (efa,) = ec2.run_instances(ImageId=UBUNTU, InstanceType="p5.48xlarge", MinCount=1, MaxCount=1,
                               NetworkInterfaces=_efa_nics(_subnet(ec2)))["Instances"]
    (plain,) = ec2.run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)["Instances"]
    first, second = (ec2.allocate_address(Domain="vpc")["AllocationId"] for _ in range(2))
    code, message, status = _error(lambda: ec2.associate_address(AllocationId=first, InstanceId=efa["InstanceId"]))
    assert (code, status) == ("InvalidInstanceID", 400)
    assert message == (f"There are multiple interfaces attached to instance '{efa['InstanceId']}'. "
                       "Please specify an interface ID for the operation instead.")
    aws.ec2().associate_address(AllocationId=first, InstanceId=efa["InstanceId"])  # moto alone takes it
    aws.ec2().disassociate_address(AssociationId=aws.ec2().describe_addresses(
        AllocationIds=[first])["Addresses"][0]["AssociationId"])
    (nic,) = [n for n in ec2.describe_instances(InstanceIds=[efa["InstanceId"]])["Reservations"][0]["Instances"][0][
        "NetworkInterfaces"] if (n["Attachment"]["NetworkCardIndex"], n["Attachment"]["DeviceIndex"]) == (0, 0)]
    ec2.associate_address(AllocationId=first, NetworkInterfaceId=nic["NetworkInterfaceId"])
    ec2.associate_address(AllocationId=second, InstanceId=plain["InstanceId"])  # one interface: by id is fine
    assert {a["InstanceId"] for a in ec2.describe_addresses()["Addresses"]} == {efa["InstanceId"], plain["InstanceId"]}


@pytest.mark.instant_aws
def test_allocate_address_stops_at_the_quota_counting_addresses_already_held(aws):
    ec2 = _ec2()
    aws.ec2().allocate_address(Domain="vpc")  # an address the account already holds (not through the proxy)
    for _ in range(4):
        ec2.allocate_address(Domain="vpc")
    assert _error(lambda: ec2.allocate_address(Domain="vpc")) == (
        "AddressLimitExceeded", "The maximum number of addresses has been reached.", 400)
    assert len(aws.ec2().allocate_address(Domain="vpc")["AllocationId"]) > 0  # moto alone has no limit
    aws.set_quota("L-0263D0A3", 8)  # the quota raised: the canned Service Quotas answer is the limit
    assert boto3.client("service-quotas", region_name="us-east-1").get_service_quota(
        ServiceCode="ec2", QuotaCode="L-0263D0A3")["Quota"]["Value"] == 8
    ec2.allocate_address(Domain="vpc")
    ec2.allocate_address(Domain="vpc")
    assert _error(lambda: ec2.allocate_address(Domain="vpc"))[0] == "AddressLimitExceeded"
    assert aws.ec2("us-west-2").describe_addresses()["Addresses"] == []  # per region
    boto3.client("ec2", region_name="us-west-2").allocate_address(Domain="vpc")


# --- root volume, IPv6, instance profiles ------------------------------------------------------------------


@pytest.mark.instant_aws
def test_a_root_volume_smaller_than_the_image_snapshot_is_refused(aws):
    image, snap = big_image(aws, 150)
    ec2 = _ec2()

    def run(size: int):
        return ec2.run_instances(ImageId=image, InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                                 BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": size}}])

    assert _error(lambda: run(100)) == (
        "InvalidBlockDeviceMapping", f"Volume of size 100GB is smaller than snapshot '{snap}', expect size>= 150GB", 400)
    (listed,) = ec2.describe_images(ImageIds=[image])["Images"]
    assert listed["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 150
    assert aws.ec2().describe_images(ImageIds=[image])["Images"][0]["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 15
    assert run(150)["Instances"]
    (inst,) = aws.ec2().run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, BlockDeviceMappings=[
        {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 200}}])["Instances"]
    baked = ec2.create_image(InstanceId=inst["InstanceId"], Name="baked-200")["ImageId"]  # CreateImage: the volume's size
    assert ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": ["baked-200"]}])["Images"][0][
        "BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 200
    assert _error(lambda: ec2.run_instances(ImageId=baked, InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                                            BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 100}}]))[0] \
        == "InvalidBlockDeviceMapping"
    assert aws.ec2().run_instances(ImageId=image, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, BlockDeviceMappings=[
        {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 100}}])["Instances"]  # moto alone takes it


@pytest.mark.instant_aws
def test_copy_image_to_another_region_as_ec2_does_it(aws):
    """CopyImage (asked in the destination region): the copy's root snapshot is the source's size, its
    TagSpecifications tag the copy and its snapshots, and a repeated ClientToken answers the first copy."""
    (inst,) = aws.ec2().run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, BlockDeviceMappings=[
        {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 200}}])["Instances"]
    source = _ec2().create_image(InstanceId=inst["InstanceId"], Name="to-copy")["ImageId"]
    west = boto3.client("ec2", region_name="us-west-2")

    def copy():
        return west.copy_image(SourceRegion="us-east-1", SourceImageId=source, Name="to-copy", ClientToken="tok-1",
                               TagSpecifications=[{"ResourceType": "image", "Tags": [{"Key": "k", "Value": "image"}]},
                                                  {"ResourceType": "snapshot", "Tags": [{"Key": "k", "Value": "snap"}]}])

    first = copy()["ImageId"]
    assert copy()["ImageId"] == first  # the same token: the first copy, no second one
    assert [i["ImageId"] for i in west.describe_images(Owners=["self"])["Images"]] == [first]
    (image,) = west.describe_images(ImageIds=[first])["Images"]
    assert image["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 200
    assert {t["Key"]: t["Value"] for t in image["Tags"]} == {"k": "image"}
    snap = image["BlockDeviceMappings"][0]["Ebs"]["SnapshotId"]
    (listed,) = west.describe_snapshots(SnapshotIds=[snap])["Snapshots"]
    assert {t["Key"]: t["Value"] for t in listed["Tags"]} == {"k": "snap"}


@pytest.mark.instant_aws
def test_ipv6_at_launch_as_ec2_assigns_it(aws):
    ec2 = _ec2()
    subnet = ipv6_subnet(aws)
    (found,) = ec2.describe_subnets(SubnetIds=[subnet])["Subnets"]
    assert found["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlockState"]["State"] == "associated"  # moto: "{'State': …}"
    code, _, status = _error(lambda: ec2.run_instances(
        ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, Ipv6AddressCount=1,
        NetworkInterfaces=[{"DeviceIndex": 0, "SubnetId": subnet}]))
    assert (code, status) == ("InvalidParameterCombination", 400)
    assert _error(lambda: ec2.run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                                            Ipv6AddressCount=1, Placement={"AvailabilityZone": "us-east-1a"}))[0] \
        == "InvalidParameterValue"  # the default subnet has no IPv6 block
    (inst,) = ec2.run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, NetworkInterfaces=[
        {"DeviceIndex": 0, "SubnetId": subnet, "Ipv6AddressCount": 1, "AssociatePublicIpAddress": True}])["Instances"]
    (described,) = ec2.describe_instances(InstanceIds=[inst["InstanceId"]])["Reservations"][0]["Instances"]
    (address,) = described["NetworkInterfaces"][0]["Ipv6Addresses"]
    block = ipaddress.ip_network(found["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"])
    assert ipaddress.ip_address(address["Ipv6Address"]) in block
    (alone,) = aws.ec2().run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, NetworkInterfaces=[
        {"DeviceIndex": 0, "SubnetId": subnet, "Ipv6AddressCount": 1}])["Instances"]
    assert alone["NetworkInterfaces"][0]["Ipv6Addresses"] == []  # moto alone ignores the interface's count


@pytest.mark.instant_aws
def test_a_security_group_of_another_vpc_than_the_subnet_is_refused_as_ec2_does(aws):
    ec2 = _ec2()
    subnet = aws.subnet_for_hosts("10.78.1.0/24", "us-east-1b")  # a VPC of its own
    vpc = aws.ec2().describe_subnets(SubnetIds=[subnet])["Subnets"][0]["VpcId"]
    mine = aws.ec2().create_security_group(GroupName="in-vpc", Description="x", VpcId=vpc)["GroupId"]
    default = aws.ec2().create_security_group(GroupName="in-default", Description="x")["GroupId"]
    launch = {"ImageId": UBUNTU, "InstanceType": "g5.xlarge", "MinCount": 1, "MaxCount": 1}
    # no subnet named: EC2 takes the zone's default subnet, of the default VPC
    code, message, status = _error(lambda: ec2.run_instances(
        **launch, SecurityGroupIds=[mine], Placement={"AvailabilityZone": "us-east-1b"}))
    assert (code, status) == ("InvalidParameter", 400)
    assert message == f"Security group {mine} and subnet {_subnet(ec2, 'us-east-1b')} belong to different networks."
    assert _error(lambda: ec2.run_instances(**launch, SecurityGroupIds=[default], SubnetId=subnet))[:2] == (
        "InvalidParameter", f"Security group {default} and subnet {subnet} belong to different networks.")
    assert _error(lambda: ec2.run_instances(**launch, NetworkInterfaces=[
        {"DeviceIndex": 0, "SubnetId": subnet, "Groups": [default]}]))[0] == "InvalidParameter"
    ec2.run_instances(**launch, SecurityGroupIds=[mine], SubnetId=subnet)  # each of its own VPC: launched
    ec2.run_instances(**launch, SecurityGroupIds=[default], Placement={"AvailabilityZone": "us-east-1b"})
    aws.ec2().run_instances(**launch, SecurityGroupIds=[default], SubnetId=subnet)  # moto alone takes it


def test_an_unknown_or_fresh_instance_profile_is_refused_as_ec2_does(aws):
    ec2 = _ec2()

    def run(name: str):
        return ec2.run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                                 IamInstanceProfile={"Name": name})

    want = ("InvalidParameterValue", "Value (nope) for parameter iamInstanceProfile.name is invalid. "
            "Invalid IAM Instance Profile name", 400)
    assert _error(lambda: run("nope")) == want  # moto alone: NoSuchEntity, 404
    boto3.client("iam", region_name="us-east-1").create_instance_profile(InstanceProfileName="fresh")
    for _ in range(2):  # realistic: IAM's new profile is not visible to EC2 for a moment
        assert _error(lambda: run("fresh"))[0] == "InvalidParameterValue"
    (inst,) = run("fresh")["Instances"]
    assert inst["IamInstanceProfile"]["Arn"].endswith("instance-profile/fresh")
    aws.instant()
    boto3.client("iam", region_name="us-east-1").create_instance_profile(InstanceProfileName="at-once")
    assert run("at-once")["Instances"]


# --- pages and deregistered images ------------------------------------------------------------------------


@pytest.mark.instant_aws
def test_describe_calls_answer_in_pages_of_n(aws):
    ec2 = _ec2()
    made = [aws.ec2().create_volume(Size=1, AvailabilityZone="us-east-1a")["VolumeId"] for _ in range(5)]
    assert len(ec2.describe_volumes()["Volumes"]) == 5  # off by default: one page
    first = ec2.describe_volumes(MaxResults=3)  # MaxResults is honoured (moto alone ignores it)
    assert len(first["Volumes"]) == 3 and first["NextToken"]
    aws.contracts(page_size=2)
    page = ec2.describe_volumes()
    assert [v["VolumeId"] for v in page["Volumes"]] == made[:2] and page["NextToken"]
    pages = list(ec2.get_paginator("describe_volumes").paginate())
    assert [len(p["Volumes"]) for p in pages] == [2, 2, 1]
    assert [v["VolumeId"] for p in pages for v in p["Volumes"]] == made
    aws.set_spot_prices({("g5.xlarge", z): 0.5 for z in ("us-east-1a", "us-east-1b", "us-east-1c")})
    spot = ec2.describe_spot_price_history(InstanceTypes=["g5.xlarge"])
    assert len(spot["SpotPriceHistory"]) == 2 and spot["NextToken"]
    rows = [r for p in ec2.get_paginator("describe_spot_price_history").paginate(InstanceTypes=["g5.xlarge"])
            for r in p["SpotPriceHistory"]]
    assert sorted(r["AvailabilityZone"] for r in rows) == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert _error(lambda: ec2.describe_volumes(NextToken="made-up"))[0] == "InvalidParameterValue"
    assert aws.contracts()["page_size"] == 2
    aws.clear_faults()
    assert aws.contracts()["page_size"] == 0


def test_a_deregistered_image_is_still_listed_for_a_while(aws):
    image, _ = big_image(aws, 20, "going", tags=[{"Key": "gpuprov:node", "Value": "(image)"}])
    other, _ = big_image(aws, 20, "staying")
    ec2 = _ec2()
    ec2.deregister_image(ImageId=image)
    assert aws.ec2().describe_images(ImageIds=[image])["Images"] == []  # moto forgets it at once
    assert ec2.describe_images(Filters=[{"Name": "name", "Values": ["staying"]}])["Images"][0]["ImageId"] == other
    shown = []
    for _ in range(4):
        listed = ec2.describe_images(Owners=["self"], Filters=[{"Name": "tag:gpuprov:node", "Values": ["(image)"]}])
        shown.append([(i["ImageId"], i["State"]) for i in listed["Images"]])
    assert shown == [[(image, "deregistered")]] * 3 + [[]]
    aws.instant()
    going, _ = big_image(aws, 20, "going-too")
    ec2.deregister_image(ImageId=going)
    assert ec2.describe_images(Owners=["self"], ImageIds=[going])["Images"] == []  # instant: moto as it is
