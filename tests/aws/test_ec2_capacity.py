"""The fault proxy plays Capacity Reservations and Capacity Blocks for ML as EC2 documents them (tests/aws/
ec2_capacity.py; moto has none): reservation listings, RunInstances targeting and its refusals, block offerings
and their purchase, a block's window on the proxy's clock. Real boto3 clients, instant kind."""

from __future__ import annotations

import time

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.aws.fixture import ubuntu_ami

UBUNTU = ubuntu_ami("24.04")
pytestmark = pytest.mark.instant_aws


def _ec2():
    return boto3.client("ec2", region_name="us-east-1")


def _code(call) -> str:
    with pytest.raises(ClientError) as info:
        call()
    return str(info.value.response["Error"]["Code"])


def _run(ec2, target: str | None = None, itype: str = "p5.48xlarge", zone: str = "us-east-1a", **kw):
    extra = {"CapacityReservationSpecification": {"CapacityReservationTarget": {"CapacityReservationId": target}}} \
        if target else {}
    return ec2.run_instances(ImageId=UBUNTU, InstanceType=itype, MinCount=1, MaxCount=1,
                             Placement={"AvailabilityZone": zone}, **extra, **kw)


def test_a_targeted_reservation_takes_its_type_and_zone_counts_down_and_gets_its_room_back(aws):
    state = aws.capacity(reservations=[{"id": "cr-0123456789abcdef0", "instance_type": "p5.48xlarge",
                                        "zone": "us-east-1a", "count": 1, "match": "targeted"}])
    assert state["reservations"][0]["state_now"] == "active"
    ec2 = _ec2()
    (listed,) = ec2.describe_capacity_reservations()["CapacityReservations"]
    assert (listed["CapacityReservationId"], listed["InstanceType"], listed["AvailableInstanceCount"],
            listed["State"], listed["InstanceMatchCriteria"]) == ("cr-0123456789abcdef0", "p5.48xlarge", 1, "active",
                                                                  "targeted")
    assert _code(lambda: ec2.describe_capacity_reservations(CapacityReservationIds=["cr-00000000000000000"])) == \
        "InvalidCapacityReservationId.NotFound"
    assert _code(lambda: _run(ec2, "cr-00000000000000000")) == "InvalidCapacityReservationId.NotFound"
    assert _code(lambda: _run(ec2, "cr-0123456789abcdef0", itype="p4d.24xlarge")) == "InvalidParameterCombination"
    assert _code(lambda: _run(ec2, "cr-0123456789abcdef0", zone="us-east-1b")) == "InvalidParameterCombination"
    (inst,) = _run(ec2, "cr-0123456789abcdef0")["Instances"]
    assert inst.get("InstanceLifecycle") is None  # moto did not make it spot
    assert ec2.describe_capacity_reservations()["CapacityReservations"][0]["AvailableInstanceCount"] == 0
    assert _code(lambda: _run(ec2, "cr-0123456789abcdef0")) == "ReservationCapacityExceeded"
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    assert ec2.describe_capacity_reservations()["CapacityReservations"][0]["AvailableInstanceCount"] == 1


def test_open_preference_uses_an_open_reservation_with_room_and_launches_without_one(aws):
    aws.capacity(reservations=[{"id": "cr-0000000000000open", "instance_type": "g5.xlarge", "zone": "us-east-1a"}])
    ec2 = _ec2()
    spec = {"CapacityReservationSpecification": {"CapacityReservationPreference": "open"}}
    _run(ec2, itype="g5.xlarge", **spec)
    assert aws.capacity()["reservations"][0]["used"] == 1
    _run(ec2, itype="g5.xlarge", **spec)  # no room left: an ordinary on-demand launch
    assert aws.capacity()["reservations"][0]["used"] == 1


def test_block_offerings_need_a_duration_in_ec2s_steps_and_match_the_window(aws):
    now = time.time()
    aws.capacity(offerings=[{"id": "cb-offer-1", "instance_type": "p5.48xlarge", "zone": "us-east-1a", "count": 2,
                             "start": now + 86400, "hours": 24, "fee": "1572.48"}])
    ec2 = _ec2()
    assert _code(lambda: ec2.describe_capacity_block_offerings(CapacityDurationHours=36)) == "InvalidParameterValue"
    (offer,) = ec2.describe_capacity_block_offerings(InstanceType="p5.48xlarge", InstanceCount=2,
                                                      CapacityDurationHours=24)["CapacityBlockOfferings"]
    assert (offer["CapacityBlockOfferingId"], offer["UpfrontFee"], offer["CapacityBlockDurationHours"]) == (
        "cb-offer-1", "1572.48", 24)
    assert (offer["EndDate"] - offer["StartDate"]).total_seconds() == 24 * 3600
    assert ec2.describe_capacity_block_offerings(InstanceType="p5.48xlarge", InstanceCount=1,
                                                 CapacityDurationHours=24)["CapacityBlockOfferings"] == []
    from datetime import datetime, timezone

    late = datetime.fromtimestamp(now + 3 * 86400, timezone.utc)
    assert ec2.describe_capacity_block_offerings(CapacityDurationHours=24, StartDateRange=late)[
        "CapacityBlockOfferings"] == []


def test_a_bought_block_is_scheduled_refuses_launches_until_it_starts_and_in_its_last_half_hour(aws):
    now = time.time()
    aws.capacity(offerings=[{"id": "cb-offer-2", "instance_type": "p5.48xlarge", "zone": "us-east-1a", "count": 1,
                             "start": now + 3600, "hours": 24, "fee": "786.24"}])
    ec2 = _ec2()
    block = ec2.purchase_capacity_block(CapacityBlockOfferingId="cb-offer-2", InstancePlatform="Linux/UNIX")[
        "CapacityReservation"]
    assert (block["State"], block["ReservationType"], block["InstanceMatchCriteria"]) == (
        "scheduled", "capacity-block", "targeted")
    assert block["CapacityBlockId"].startswith("cb-")
    assert _code(lambda: ec2.purchase_capacity_block(CapacityBlockOfferingId="cb-offer-2",
                                                     InstancePlatform="Linux/UNIX")) == "InvalidParameterValue"
    cr = block["CapacityReservationId"]
    block_market = {"InstanceMarketOptions": {"MarketType": "capacity-block"}}
    assert _code(lambda: _run(ec2, cr)) == "InvalidParameterCombination"  # a block needs its market type
    assert _code(lambda: _run(ec2, cr, **block_market)) == "InsufficientInstanceCapacity"  # not started
    aws.capacity(advance=3600)
    (inst,) = _run(ec2, cr, **block_market)["Instances"]
    assert ec2.describe_capacity_reservations(CapacityReservationIds=[cr])["CapacityReservations"][0]["State"] == \
        "active"
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    aws.capacity(advance=24 * 3600 - 20 * 60)  # 20 minutes before its end: EC2 is ending its instances
    assert _code(lambda: _run(ec2, cr, **block_market)) == "InsufficientInstanceCapacity"
    aws.capacity(advance=20 * 60)
    assert ec2.describe_capacity_reservations(CapacityReservationIds=[cr])["CapacityReservations"][0]["State"] == \
        "expired"
