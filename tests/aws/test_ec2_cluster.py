"""The fault proxy plays what EC2 does for clusters and moto 5.2 does not (tests/aws/ec2_cluster.py): placement
groups, MinCount/MaxCount with capacity, and the network-card rules for EFA. Driven with real boto3 clients, in
the instant kind (these are EC2's contracts, not its timing)."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.aws import fault_proxy
from tests.aws.fixture import AwsEndpoint, ubuntu_ami

UBUNTU = ubuntu_ami("24.04")
pytestmark = pytest.mark.instant_aws


def _ec2():
    return boto3.client("ec2", region_name="us-east-1")


def _run(ec2, itype: str = "g5.xlarge", count: int = 1, low: int | None = None, **kw):
    return ec2.run_instances(ImageId=UBUNTU, InstanceType=itype, MinCount=low or count, MaxCount=count,
                             Placement={"AvailabilityZone": "us-east-1a", **kw.pop("placement", {})}, **kw)


def _code(call) -> str:
    with pytest.raises(ClientError) as info:
        call()
    return info.value.response["Error"]["Code"]


def _efa_nics(cards: int, public: bool = False) -> list[dict]:
    nics = [{"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "interface"},
            {"NetworkCardIndex": 0, "DeviceIndex": 1, "InterfaceType": "efa-only"}]
    nics += [{"NetworkCardIndex": c, "DeviceIndex": 0, "InterfaceType": "efa-only"} for c in range(1, cards)]
    if public:
        nics[0]["AssociatePublicIpAddress"] = True
    return nics


def _with_subnet(ec2, nics: list[dict]) -> list[dict]:
    subnet = ec2.describe_subnets(Filters=[{"Name": "availability-zone", "Values": ["us-east-1a"]}])["Subnets"][0]
    return [{**n, "SubnetId": subnet["SubnetId"]} for n in nics]


def test_placement_group_create_describe_tag_filter_and_in_use(aws: AwsEndpoint) -> None:
    ec2 = _ec2()
    ec2.create_placement_group(GroupName="pg1", Strategy="cluster", TagSpecifications=[
        {"ResourceType": "placement-group", "Tags": [{"Key": "gpuprov:node", "Value": "c"}]}])
    assert _code(lambda: ec2.create_placement_group(GroupName="pg1", Strategy="cluster")) == \
        "InvalidPlacementGroup.Duplicate"
    (group,) = ec2.describe_placement_groups(Filters=[{"Name": "tag:gpuprov:node", "Values": ["c"]}])["PlacementGroups"]
    assert group["GroupName"] == "pg1" and group["Strategy"] == "cluster"
    assert ec2.describe_placement_groups(Filters=[{"Name": "tag:gpuprov:node", "Values": ["x"]}])["PlacementGroups"] == []
    ids = [i["InstanceId"] for i in _run(ec2, count=2, placement={"GroupName": "pg1"})["Instances"]]
    assert len(ids) == 2
    assert _code(lambda: ec2.delete_placement_group(GroupName="pg1")) == "InvalidPlacementGroup.InUse"
    ec2.terminate_instances(InstanceIds=ids)
    ec2.delete_placement_group(GroupName="pg1")
    assert _code(lambda: ec2.delete_placement_group(GroupName="pg1")) == "InvalidPlacementGroup.Unknown"
    assert _code(lambda: _run(ec2, placement={"GroupName": "pg1"})) == "InvalidPlacementGroup.Unknown"


def test_placement_group_refusals_ec2_documents(aws: AwsEndpoint) -> None:
    ec2 = _ec2()
    ec2.create_placement_group(GroupName="pg2", Strategy="cluster")
    assert _code(lambda: _run(ec2, "t2.micro", placement={"GroupName": "pg2"})) == "InvalidParameterCombination"
    stop_on_interruption = {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "persistent",
                                                                  "InstanceInterruptionBehavior": "stop"}}
    assert _code(lambda: _run(ec2, placement={"GroupName": "pg2"}, InstanceMarketOptions=stop_on_interruption)) == \
        "InvalidParameterCombination"
    assert [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]] == []


def test_min_count_is_all_or_nothing_and_max_count_takes_what_capacity_allows(aws: AwsEndpoint) -> None:
    ec2 = _ec2()
    assert len(_run(ec2, count=3)["Instances"]) == 3  # moto alone would launch MinCount; EC2 launches MaxCount
    fault_proxy.add_rules(aws.url, {"action": "RunInstances", "capacity": 2})
    with pytest.raises(ClientError) as info:
        _run(ec2, count=3)
    assert info.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert len(_run(ec2, count=3, low=1)["Instances"]) == 2
    live = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    assert len(live) == 5  # 3 + nothing + 2


def test_efa_interfaces_are_checked_as_ec2_does_then_only_the_primary_reaches_moto(aws: AwsEndpoint) -> None:
    ec2 = _ec2()
    # EC2's DescribeInstanceTypes (moto's copy): no EFA on g5.4xlarge; one card on g5.12xlarge; card 0 of
    # p6-b300.48xlarge carries no EFA
    assert _code(lambda: _run(ec2, "g5.4xlarge", NetworkInterfaces=_with_subnet(ec2, _efa_nics(1)))) == \
        "InvalidParameterCombination"
    assert _code(lambda: _run(ec2, "g5.12xlarge", NetworkInterfaces=_with_subnet(ec2, _efa_nics(2)))) == \
        "InvalidParameterValue"
    card0_efa = _with_subnet(ec2, [{"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "interface"},
                                   {"NetworkCardIndex": 0, "DeviceIndex": 1, "InterfaceType": "efa-only"}])
    assert _code(lambda: _run(ec2, "p6-b300.48xlarge", NetworkInterfaces=card0_efa)) == "InvalidParameterCombination"
    assert _code(lambda: _run(ec2, "p4d.24xlarge", NetworkInterfaces=_with_subnet(ec2, _efa_nics(5)))) == \
        "InvalidParameterValue"  # p4d has 4 network cards
    primary_efa_only = _with_subnet(ec2, [{"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "efa-only"}])
    assert _code(lambda: _run(ec2, "p4d.24xlarge", NetworkInterfaces=primary_efa_only)) == "InvalidParameterCombination"
    assert _code(lambda: _run(ec2, "p4d.24xlarge", NetworkInterfaces=_with_subnet(ec2, _efa_nics(4, public=True)))) == \
        "InvalidParameterCombination"  # no public address with several interfaces
    (inst,) = _run(ec2, "p4d.24xlarge", NetworkInterfaces=_with_subnet(ec2, _efa_nics(4)))["Instances"]
    assert len(inst["NetworkInterfaces"]) == 1  # moto has no network cards: the primary interface only
    (logged,) = [e for e in aws.log("RunInstances") if e["status"] == 200]
    assert logged["form"]["NetworkInterface.5.InterfaceType"] == "efa-only"  # the log keeps what was sent


def test_terminating_a_terminated_instance_succeeds_as_on_ec2(aws: AwsEndpoint) -> None:
    """EC2's TerminateInstances is idempotent; moto 5.2 fails the second call with InvalidNetworkInterfaceID.NotFound
    for an instance launched with NetworkInterfaces (an EFA type's), so the proxy answers it as EC2 does."""
    ec2 = _ec2()
    (inst,) = _run(ec2, "g5.12xlarge", NetworkInterfaces=_with_subnet(
        ec2, [{"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "efa"}]))["Instances"]
    (other,) = _run(ec2, "g5.12xlarge")["Instances"]
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    again = ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])["TerminatingInstances"]
    assert [(i["InstanceId"], i["CurrentState"]["Name"]) for i in again] == [(inst["InstanceId"], "terminated")]
    both = ec2.terminate_instances(InstanceIds=[inst["InstanceId"], other["InstanceId"]])  # the live one goes through
    assert other["InstanceId"] in [i["InstanceId"] for i in both["TerminatingInstances"]]
