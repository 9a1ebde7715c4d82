"""What `up` does with each error ECS can answer RunInstances (or StartInstances) with: one table, one lookup.

Each row names Alibaba Cloud's error code, what the failover does next (the same four answers as
providers/aws_refusals.py), and the fix printed when it stops. Sources, as read:
  RunInstances API reference, error codes (alibabacloud.com/help/en/ecs/developer-reference/api-runinstances; its
  table read whole in a copy of Alibaba's English API documents kept in a public repository: the HTTP status,
  code and message of NoStock, Zone.NotOnSale, InvalidInstanceType.ZoneNotSupported, NotEnoughBalance,
  LowerThanPublicPrice, Account.Arrearage);
  "Troubleshoot API error codes" (alibabacloud.com/help/en/ecs/developer-reference/error-code-error-code-troubleshooting-ideas);
  "How to ensure idempotence" (alibabacloud.com/help/en/doc-detail/25693.html): retry only after 500 InternalError,
  503 ServiceUnavailable or no answer, with the same ClientToken;
  the codes' messages as gardener/machine-controller-manager-provider-alicloud pkg/alicloud/errors lists them
  (OperationDenied.NoStock, Zone.NotOnSale, QuotaExceed.ElasticQuota, OperationDenied.ZoneNotAllowed).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.cloud.providers.base import Market, Then


@dataclass(frozen=True)
class Refusal:
    code: str
    then: Then
    fix: str = ""
    market: Market | None = None  # the row holds for this market only
    quota: bool = False  # a vCPU quota of the zone: name it and the increase to ask for
    prefix: bool = False  # the row holds for every code that starts with `code` (QuotaExceed.*)


QUOTA_FIX = ("ask for a higher vCPU quota of the instance family in Quota Center (ECS > Privileges & Quotas), "
             "or free some of the account's vCPUs")

REFUSALS: tuple[Refusal, ...] = (
    # this zone or type, now: "The requested resource is sold out in the specified zone; try other types of
    # resources or other regions and zones." (RunInstances, 403)
    Refusal("OperationDenied.NoStock", "next-candidate"),
    # "The resource in the specified zone is no longer available for sale. Please try other regions and zones."
    Refusal("Zone.NotOnSale", "next-candidate"),
    Refusal("InvalidInstanceType.ZoneNotSupported", "next-candidate"),  # "...zone does not support this instancetype"
    Refusal("InstanceType.Offline", "next-candidate"),
    Refusal("OperationDenied.ZoneNotAllowed", "next-candidate"),
    Refusal("OperationDenied.ZoneSystemCategoryNotMatch", "next-candidate"),
    Refusal("InvalidInstanceType.NotSupported", "next-candidate"),
    Refusal("InvalidResourceType.NotSupported", "next-candidate"),
    Refusal("InvalidVSwitchId.NotFound", "next-candidate"),  # the zone has no (default) vSwitch
    # "The specified SpotPriceLimit is lower than the current public price": this zone's price, now
    Refusal("InvalidSpotPriceLimit.LowerThanPublicPrice", "next-candidate"),
    Refusal("InvalidSpotPriceLimit", "stop", fix="--max-price must be a positive price in $/h, as ECS reads it"),
    # the zone's vCPU quota (QuotaExceed.ElasticQuota: "The number of vCPUs assigned to the ECS instances has
    # exceeded the quota in the zone"): on-demand may still be under its own, spot may not
    Refusal("QuotaExceed.ElasticQuota", "next-market", market="spot", quota=True, fix=QUOTA_FIX),
    Refusal("QuotaExceed.ElasticQuota", "stop", market="on-demand", quota=True, fix=QUOTA_FIX),
    Refusal("QuotaExceed", "stop", prefix=True, fix="a quota of the account: see Alibaba Cloud's words above and "
            "raise it in Quota Center"),
    # stop: nothing else would fare better
    Refusal("InvalidAccountStatus.NotEnoughBalance", "stop",
            fix="the account's balance is too low for pay-as-you-go resources: top it up in the Billing console"),
    Refusal("Account.Arrearage", "stop", fix="the account is in arrears: settle it in the Billing console"),
    Refusal("RealNameAuthenticationError", "stop", fix="the account has not passed real-name verification: "
            "complete it in the Alibaba Cloud console"),
    Refusal("InvalidAccountStatus", "stop", prefix=True,
            fix="the account's status forbids new resources: see Alibaba Cloud's words above"),
    Refusal("Forbidden.RAM", "stop", fix="the RAM identity may not do this: grant it AliyunECSFullAccess or a "
            "policy allowing the action"),
    # the node's RAM role (cloud/stop_role.py), RunInstances' error table: 404 InvalidRamRole.NotFound past the
    # settle time a fresh role gets, 403 InvalidUser.PassRoleForbidden "The RAM user does not have the privilege to
    # pass a RAM role.", 401 InvalidRamRole.NotEcsRole "The specified ram role is not authorized for ecs"
    Refusal("InvalidRamRole.NotFound", "stop", fix="the RAM role gpuprov made for the node's guards is not there "
            "(deleted by hand?): the next `up` looks for it and makes it again"),
    Refusal("InvalidUser.PassRoleForbidden", "stop", fix="the RAM identity may not pass the node's RAM role to ECS: "
            "grant it ram:PassRole (docs/alibaba-ram-policy.json)"),
    Refusal("InvalidRamRole.NotEcsRole", "stop", fix="the node's RAM role does not trust ECS: delete it in the RAM "
            "console (`gpuprov gc --cloud alibaba`), and the next `up` makes it again"),
    Refusal("InvalidAccessKeyId.NotFound", "stop", fix="check ALIBABA_CLOUD_ACCESS_KEY_ID or the profile"),
    Refusal("SignatureDoesNotMatch", "stop", fix="check ALIBABA_CLOUD_ACCESS_KEY_SECRET or the profile"),
    # the token of an earlier request with other parameters ("How to ensure idempotence"): a gpuprov bug, never
    # a reason to launch again under another token
    Refusal("IdempotentParameterMismatch", "stop", fix="a ClientToken was reused for another request: report this"),
    # transient: the same request again (same ClientToken, so never twice launched)
    Refusal("Throttling", "retry", prefix=True),  # Throttling, Throttling.User, Throttling.Api
    Refusal("ServiceUnavailable", "retry"),
    Refusal("InternalError", "retry"),
    Refusal("UnknownError", "retry"),
)


def classify(code: str, market: Market) -> Refusal:
    """The row for this error; a code the table does not know stops the launch with Alibaba Cloud's own words."""
    for row in REFUSALS:
        if row.market is not None and row.market != market:
            continue
        if row.code == code or (row.prefix and code.startswith(row.code)):
            return row
    return Refusal(code, "stop")
