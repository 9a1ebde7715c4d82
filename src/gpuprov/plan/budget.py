"""A dollar budget (--budget) as a guard's deadline: how long it lasts at a price, and whether a guard can enforce
it. Pure."""

from __future__ import annotations

import math

from gpuprov.errors import UserInputError
from gpuprov.plan.spec import MAX_DURATION_S, MIN_DURATION_S

__all__ = ["NO_PRICE_BELOW", "budget_seconds", "check_budget", "priced"]

# an hourly price under this is no price (gpuprov prints $/h to 4 places: it would read $0.0000): no market sells
# compute for it, and a budget turned into time at it would last for ever (a local endpoint answers 0.00001)
NO_PRICE_BELOW = 0.0001


def budget_seconds(budget_usd: float, price_usd_hour: float) -> int:
    """How long a dollar budget lasts at a price ($/h), whole seconds, rounded down, within what a guard can
    enforce (1m to 90d, as --ttl): at launch the price obtained may differ from the list price `plan`
    checked the budget against."""
    if budget_usd <= 0:
        raise UserInputError("--budget", f"{budget_usd:g} is not a budget", "dollars above 0, e.g. 50")
    _priced(price_usd_hour)
    return min(max(int(budget_usd / price_usd_hour * 3600), MIN_DURATION_S), MAX_DURATION_S)


def check_budget(budget_usd: float, price_usd_hour: float) -> None:
    """A budget that runs out within a guard's reach at the list price: at least a minute (the guards tick
    once a minute) and at most 90 days (the longest --ttl); else a refusal with the budgets that would do."""
    _priced(price_usd_hour)
    seconds = budget_usd / price_usd_hour * 3600
    if seconds < MIN_DURATION_S:
        least = math.ceil(price_usd_hour * MIN_DURATION_S / 3600 * 100) / 100
        raise UserInputError("--budget", f"${budget_usd:g} lasts {seconds:.0f}s at ${price_usd_hour:.4g}/h, under the "
                             "1m a guard can enforce", f"at least ${least:.2f} at this price, or --ttl for a deadline")
    if seconds > MAX_DURATION_S:
        most = math.floor(price_usd_hour * MAX_DURATION_S / 3600 * 100) / 100
        raise UserInputError("--budget", f"${budget_usd:,.2f} lasts {seconds / 86400:,.0f} days at ${price_usd_hour:.4g}/h, "
                             "past the 90-day cap (the longest --ttl)",
                             f"at most ${most:,.2f} at this price; leave --budget out for no dollar cap")


def priced(price_usd_hour: float) -> bool:
    """Whether an hourly price is one an estimate may use."""
    return math.isfinite(price_usd_hour) and price_usd_hour >= NO_PRICE_BELOW


def _priced(price_usd_hour: float) -> None:
    """A budget is turned into time at a real price only: at $0 (no price known) it would never run out."""
    if not priced(price_usd_hour):
        raise UserInputError("--budget", f"no price to turn a budget into a deadline (${price_usd_hour:g}/h)",
                             "--ttl for a deadline instead")
