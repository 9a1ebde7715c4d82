"""Which EC2 vCPU quota an instance type counts against, and the increase to ask for.

The quota per family and market is data/quotas.yaml (from AWS's quota table); the increase command asks for the
current value plus what is needed.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict

from gpuprov.cloud.providers.base import Market
from gpuprov.resources import load_data


class Quota(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str
    name: str
    market: Market
    families: tuple[str, ...]
    unverified: str | None = None


@cache
def quotas() -> tuple[Quota, ...]:
    raw = load_data("quotas.yaml")
    return tuple(Quota.model_validate(q) for q in raw["quotas"])


def family(instance_type: str) -> str:
    """'p5en.48xlarge' -> 'p5en'."""
    return instance_type.split(".", 1)[0]


def quota_for(instance_type: str, market: Market) -> Quota | None:
    for q in quotas():
        if q.market == market and family(instance_type) in q.families:
            return q
    return None


def increase_command(q: Quota, region: str, current: float | None, vcpus: int) -> str:
    """Service Quotas refuses a desired value that is not above the current one: ask for current + needed."""
    desired = (current or 0) + vcpus
    return (f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {q.code} "
            f"--desired-value {desired:g} --region {region}")
