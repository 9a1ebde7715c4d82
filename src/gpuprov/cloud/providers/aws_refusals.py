"""What `up` does with each error EC2 can answer a launch with: one table, one lookup.

Each row names AWS's error code (and, where one code means several things, a pattern of its
message), what the failover does next, and the fix printed when it stops. Codes and meanings:
EC2 API reference "Error codes for the Amazon EC2 API" and the EC2 user guide's
"Troubleshoot Amazon EC2 instance launch issues".

  next-candidate  this zone/type cannot serve now: try the next zone or instance type
  next-market     spot as a whole is closed to this account: go on with on-demand when
                  `--fallback on-demand` was given, else stop with the fix
  stop            nothing else would fare better: stop at once with the fix
  retry           transient: the same request again (same ClientToken, so never twice launched)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuprov.cloud.providers.base import Market, Then


@dataclass(frozen=True)
class Refusal:
    code: str
    then: Then
    fix: str = ""
    message: str | None = None  # regex on AWS's message, for codes that mean several things
    market: Market | None = None  # the row holds for this market only
    quota: bool = False  # a vCPU quota: name it, its current value and the increase to ask for


SPOT_ROLE_FIX = ("create the Spot service-linked role once per account: "
                 "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com")

REFUSALS: tuple[Refusal, ...] = (
    # this zone or type, now: try the next candidate
    Refusal("InsufficientInstanceCapacity", "next-candidate"),
    Refusal("InsufficientCapacity", "next-candidate"),
    Refusal("InsufficientHostCapacity", "next-candidate"),
    Refusal("InsufficientReservedInstanceCapacity", "next-candidate"),
    Refusal("UnfulfillableCapacity", "next-candidate"),
    # a reservation or Capacity Block with no free instance now: in use, or still being cleaned up after one of its
    # instances stopped or ended ("it takes several minutes to clean up your instance before you can launch another
    # instance to replace it", EC2 user guide, "Launch instances using Capacity Blocks"); `up --wait` waits for it
    Refusal("ReservationCapacityExceeded", "next-candidate",
            fix="the reservation's instances are in use, or one that ended is still being cleaned up (EC2 takes "
                "several minutes); `up --wait DURATION` asks again until it is free"),
    # `Unsupported` is a zone or type that cannot serve the request ("Your requested instance type (X) is not
    # supported in your requested Availability Zone (Y)...") or a configuration no zone would take ("The requested
    # configuration is currently not supported. Please check the documentation..."): only the first moves on
    Refusal("Unsupported", "next-candidate", message=r"(?i)availability zone|instance type|not supported in"),
    Refusal("Unsupported", "stop", fix="AWS says no zone takes this configuration: see AWS's words above"),
    Refusal("InvalidInput", "next-candidate", message=r"(?i)no default subnet"),
    Refusal("InsufficientFreeAddressesInSubnet", "next-candidate"),
    Refusal("VolumeTypeNotAvailableInZone", "next-candidate"),
    Refusal("SpotMaxPriceTooLow", "next-candidate"),
    # spot closed to this account: on-demand may still work
    Refusal("VcpuLimitExceeded", "next-market", market="spot", quota=True),
    Refusal("MaxSpotInstanceCountExceeded", "next-market",
            fix="too many open spot requests or spot instances in this region: cancel unused ones, or raise "
                "the spot quota"),
    Refusal("AuthFailure.ServiceLinkedRoleCreationNotPermitted", "next-market", fix=SPOT_ROLE_FIX),
    # stop: nothing else would fare better
    Refusal("VcpuLimitExceeded", "stop", market="on-demand", quota=True),
    Refusal("InstanceLimitExceeded", "stop",
            fix="this is the account's limit on the number of instances (not vCPUs) in the region: "
                "terminate unused instances or ask AWS support to raise it"),
    Refusal("UnauthorizedOperation", "stop",
            fix="the IAM identity may not do this; AWS's message holds an encoded reason: "
                "aws sts decode-authorization-message --encoded-message <message>"),
    Refusal("OptInRequired", "stop",
            fix="this region is not enabled for the account (or the account is not subscribed to EC2 there): "
                "enable it under Account > AWS Regions, or pick another --region"),
    Refusal("AuthFailure", "stop", fix="check the credentials: aws sts get-caller-identity"),
    # transient: the same request again
    Refusal("RequestLimitExceeded", "retry"),
    Refusal("Unavailable", "retry"),
    Refusal("InternalError", "retry"),
    Refusal("ServiceUnavailable", "retry"),
)


def classify(code: str, message: str, market: Market) -> Refusal:
    """The row for this error; a code the table does not know stops the launch with AWS's own words."""
    for row in REFUSALS:
        if row.code != code or (row.market is not None and row.market != market):
            continue
        if row.message is not None and not re.search(row.message, message):
            continue
        return row
    return Refusal(code, "stop")
