"""The order `up` asks for capacity in, and the price cap that keeps failover from climbing.

Pure: the plan's instance types (cheapest first) x the zones that offer them x the markets asked
for become an ordered list of candidates; types over the hourly cap are set aside with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.cloud.providers.base import Market
from gpuprov.plan.plan import Plan

CAP_FACTOR = 2.0  # default --max-hourly: this times the cheapest fitting type's on-demand list price


@dataclass(frozen=True)
class Candidate:
    instance_type: str
    zone: str
    market: Market
    price_usd_hour: float | None  # on-demand list price (spot costs less)


@dataclass(frozen=True)
class Skipped:
    instance_type: str
    reason: str


@dataclass(frozen=True)
class Order:
    candidates: tuple[Candidate, ...]
    skipped: tuple[Skipped, ...]
    max_hourly: float | None


def default_cap(plan: Plan) -> float | None:
    known = [c.price_usd_hour for c in plan.candidates if c.price_usd_hour is not None]
    return round(CAP_FACTOR * min(known), 2) if known else None


def candidates(plan: Plan, offerings: dict[str, list[str]], spot: bool, fallback_on_demand: bool,
               zone: str | None = None, max_hourly: float | None = None) -> Order:
    """Every (instance type, zone, market) to try, in order: spot first (all types and zones, cheapest
    type first), then on-demand only with the fallback. Types over `max_hourly` (on-demand list price)
    or with no known price while a cap holds are skipped, each with its reason."""
    markets: list[Market] = ["spot", "on-demand"] if spot and fallback_on_demand else ["spot"] if spot else ["on-demand"]
    kept, skipped = [], []
    for it in plan.candidates:
        if max_hourly is not None and it.price_usd_hour is None:
            skipped.append(Skipped(it.name, f"no list price known (over --max-hourly ${max_hourly:.2f} cannot be ruled out)"))
        elif max_hourly is not None and it.price_usd_hour is not None and it.price_usd_hour > max_hourly:
            skipped.append(Skipped(it.name, f"${it.price_usd_hour:.2f}/h is over --max-hourly ${max_hourly:.2f}"))
        else:
            kept.append(it)
    found = [Candidate(it.name, z, market, it.price_usd_hour)
             for market in markets for it in kept for z in offerings.get(it.name, []) if zone is None or z == zone]
    return Order(tuple(found), tuple(skipped), max_hourly)
