"""The price cap of the launch order, in-process (test_aws_ec2_behaviour.py shows it through `up`)."""

from __future__ import annotations

from types import SimpleNamespace

from gpuprov.cloud.failover import CAP_FACTOR, candidates, default_cap
from gpuprov.plan.plan import NodeRequest, make_plan


def _plan(*types: tuple[str, float | None]) -> SimpleNamespace:
    return SimpleNamespace(candidates=[SimpleNamespace(name=n, price_usd_hour=p) for n, p in types])


ZONES = {"a.x": ["z1"], "b.x": ["z1", "z2"], "c.x": ["z2"]}


def test_the_default_cap_is_twice_the_cheapest_known_list_price() -> None:
    assert CAP_FACTOR == 2.0
    assert default_cap(_plan(("a.x", 1.006), ("b.x", 3.0), ("c.x", None))) == 2.01
    assert default_cap(_plan(("a.x", None))) is None
    real = make_plan(NodeRequest(gpu="A10G"))
    cheapest = min(c.price_usd_hour for c in real.candidates if c.price_usd_hour is not None)
    assert default_cap(real) == round(2 * cheapest, 2)


def test_types_over_the_cap_are_skipped_with_the_reason_and_the_cap_itself_is_allowed() -> None:
    order = candidates(_plan(("a.x", 1.0), ("b.x", 2.0), ("c.x", 2.01)), ZONES, False, False, max_hourly=2.0)
    assert [(c.instance_type, c.zone, c.price_usd_hour) for c in order.candidates] == [
        ("a.x", "z1", 1.0), ("b.x", "z1", 2.0), ("b.x", "z2", 2.0)]
    assert [(s.instance_type, s.reason) for s in order.skipped] == [("c.x", "$2.01/h is over --max-hourly $2.00")]
    assert order.max_hourly == 2.0


def test_a_type_without_a_price_is_skipped_only_while_a_cap_holds() -> None:
    capped = candidates(_plan(("a.x", None), ("b.x", 1.0)), ZONES, True, False, max_hourly=5.0)
    assert [s.instance_type for s in capped.skipped] == ["a.x"]
    assert capped.skipped[0].reason == "no list price known (over --max-hourly $5.00 cannot be ruled out)"
    assert {c.instance_type for c in capped.candidates} == {"b.x"}
    free = candidates(_plan(("a.x", None), ("b.x", 1.0)), ZONES, True, False)
    assert free.skipped == () and [c.instance_type for c in free.candidates] == ["a.x", "b.x", "b.x"]
    assert {c.market for c in free.candidates} == {"spot"} and free.max_hourly is None
