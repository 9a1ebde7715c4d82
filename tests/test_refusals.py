"""The EC2 refusal table and the quota table, checked row by row against their sources."""

from __future__ import annotations

import pytest

from gpuprov.cloud.providers.aws_base import retry_config
from gpuprov.cloud.providers.aws_refusals import classify
from gpuprov.cloud.quotas import increase_command, quota_for, quotas
from gpuprov.plan import catalog

# EC2 API reference, "Error codes for the Amazon EC2 API"; EC2 user guide, "Troubleshoot Amazon EC2
# instance launch issues" (read 2026-12-01). (code, message, market) -> what the failover does next.
CASES = [
    ("InsufficientInstanceCapacity", "We currently do not have sufficient p5.48xlarge capacity", "spot", "next-candidate"),
    ("InsufficientCapacity", "Insufficient capacity.", "on-demand", "next-candidate"),
    ("Unsupported", "Your requested instance type (p5.48xlarge) is not supported in your requested Availability Zone",
     "spot", "next-candidate"),
    ("InvalidInput", "No default subnet for availability zone: 'us-east-1e'.", "on-demand", "next-candidate"),
    ("InvalidInput", "Value () for parameter groupId is invalid.", "on-demand", "stop"),
    ("InsufficientFreeAddressesInSubnet", "There are not enough free addresses", "spot", "next-candidate"),
    ("VolumeTypeNotAvailableInZone", "The volume type gp3 is not available", "spot", "next-candidate"),
    ("SpotMaxPriceTooLow", "Your Spot request price of 0.1 is lower than the minimum", "spot", "next-candidate"),
    ("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit", "spot", "next-market"),
    ("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit", "on-demand", "stop"),
    ("MaxSpotInstanceCountExceeded", "Max spot instance count exceeded", "spot", "next-market"),
    ("AuthFailure.ServiceLinkedRoleCreationNotPermitted", "no permission to create the service-linked role", "spot",
     "next-market"),
    ("UnauthorizedOperation", "You are not authorized to perform this operation. Encoded authorization failure message",
     "on-demand", "stop"),
    ("OptInRequired", "You are not subscribed to this service.", "on-demand", "stop"),
    ("InstanceLimitExceeded", "You have requested more instances than your current instance limit", "on-demand", "stop"),
    ("RequestLimitExceeded", "Request limit exceeded.", "spot", "retry"),
    ("Unavailable", "The server is overloaded", "on-demand", "retry"),
    ("InternalError", "An internal error has occurred", "on-demand", "retry"),
    ("InvalidAMIID.NotFound", "The image id '[ami-1]' does not exist", "on-demand", "stop"),
]


@pytest.mark.parametrize(("code", "message", "market", "then"), CASES)
def test_each_refusal_is_classified(code, message, market, then):
    assert classify(code, message, market).then == then


@pytest.mark.parametrize("code", ["UnauthorizedOperation", "OptInRequired", "InstanceLimitExceeded",
                                  "AuthFailure.ServiceLinkedRoleCreationNotPermitted", "MaxSpotInstanceCountExceeded"])
def test_every_stop_without_a_quota_says_the_fix(code):
    assert classify(code, "", "spot").fix


# AWS documentation, "Amazon EC2 instance type quotas" (On-Demand and Spot tables), read 2026-12-01.
@pytest.mark.parametrize(("instance_type", "market", "code"), [
    ("p5.48xlarge", "spot", "L-C4BD4855"),
    ("p5en.48xlarge", "spot", "L-C4BD4855"),
    ("p4d.24xlarge", "spot", "L-7212CCBC"),
    ("p3.2xlarge", "spot", "L-7212CCBC"),
    ("p5.48xlarge", "on-demand", "L-417A185B"),
    ("p6-b200.48xlarge", "on-demand", "L-417A185B"),
    ("g6e.xlarge", "on-demand", "L-DB2E81BA"),
    ("g4dn.xlarge", "spot", "L-3819A6DF"),
    ("c7i.8xlarge", "on-demand", "L-1216C47A"),  # CPU-only: the Standard quotas
    ("r7i.large", "spot", "L-34B43A08"),
])
def test_quota_per_family_and_market(instance_type, market, code):
    assert quota_for(instance_type, market).code == code


def test_every_catalog_type_has_a_quota_in_both_markets():
    missing = [(it.name, m) for it in catalog.load().instance_types for m in ("spot", "on-demand")
               if quota_for(it.name, m) is None]
    assert missing == []
    # what AWS's table does not settle
    assert [q.families for q in quotas() if q.unverified] == [("p6-b200", "p6-b300", "p6e-gb200", "p6e-gb300")]


def test_increase_asks_for_more_than_the_current_value():
    q = quota_for("p5.48xlarge", "spot")
    assert "--quota-code L-C4BD4855 --desired-value 256 " in increase_command(q, "us-east-1", 64, 192)
    assert "--desired-value 192 " in increase_command(q, "us-east-1", None, 192)


def test_aws_max_attempts_is_the_total(monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    assert retry_config().retries == {"mode": "standard", "total_max_attempts": 3}
    assert retry_config(attempts=1).retries["total_max_attempts"] == 1
