"""cloud/guards.recorded_guards: the guard and monitoring steps a node's record implies, in-process (the fast lane).
What bake puts back and what a check of the node expects; tests/test_guards_survive.py looks at real hosts."""

from __future__ import annotations

import time

import pytest

from gpuprov.cloud.guards import recorded_guards
from gpuprov.plan.monitoring import Monitoring
from gpuprov.state import Node, NodeState


def record(monitoring: Monitoring | None = None, spot: bool = False, **fields: object) -> Node:
    """A ready T4 node's record as `up` writes it (cloud/launch.plan_json), with `fields` over it."""
    from gpuprov.cloud.launch import plan_json
    from gpuprov.plan.plan import NodeRequest, make_plan
    from gpuprov.plan.stack import StackPins

    plan = make_plan(NodeRequest(gpu="T4", os="ubuntu-22.04", spot=spot, pins=StackPins(python="3.11"),
                                 monitoring=monitoring or Monitoring()))
    now = time.time()
    base: dict[str, object] = dict(
        name="g", provider="aws", region="us-east-1", zone="us-east-1a", gpu="T4", gpu_count=1,
        instance_type="g4dn.xlarge", market="spot" if spot else "on-demand", state=NodeState.READY, state_reason=None,
        address="10.0.0.4", ssh_user="ubuntu", price_usd_hour=0.526, owner="me", plan_json=plan_json(plan), pid=None,
        host=None, created_at=now, ready_at=now, ended_at=None, shutdown_action="terminate" if spot else "stop",
        spot_type="one-time" if spot else None)
    return Node(**{**base, **fields})  # type: ignore[arg-type]


def ttl_of(recorded) -> int:
    (step,) = [s for s in recorded.steps if s.name == "ttl"]
    return int(dict(step.extra)["guards"].ttl_seconds)


def test_a_bare_node_implies_no_step() -> None:
    recorded = recorded_guards(record())
    assert recorded.names == () and recorded.deadline is None and recorded.clock("ttl") == ""


def test_guards_then_monitoring_and_the_ttl_step_keeps_the_recorded_deadline() -> None:
    deadline = time.time() + 3 * 3600  # an 8h TTL set 5h ago
    node = record(Monitoring(metrics="textfile"), autostop_seconds=7200, ttl_seconds=8 * 3600, ttl_deadline=deadline)
    recorded = recorded_guards(node)
    assert recorded.names == ("autostop", "ttl", "metrics", "health")
    assert [s.kind for s in recorded.steps] == ["guard", "guard", "monitor", "monitor"]
    assert ttl_of(recorded) == 8 * 3600 and recorded.deadline == round(deadline)
    # run at its start, the step's new deadline is the recorded one, not eight hours from now
    assert recorded.ttl_started == round(deadline) - 8 * 3600
    assert recorded.clock("ttl") == f"GPUPROV_NOW={recorded.ttl_started} " and recorded.clock("autostop") == ""
    assert dict(recorded.steps[1].extra)["reset"] is True


def test_a_budget_sooner_than_the_ttl_is_the_deadline() -> None:
    soon = time.time() + 3600
    node = record(ttl_seconds=8 * 3600, ttl_deadline=time.time() + 6 * 3600, budget_usd=0.5, budget_price=0.526,
                  budget_deadline=soon)
    recorded = recorded_guards(node)
    assert recorded.names == ("ttl",) and recorded.deadline == round(soon)
    assert recorded.ttl_started is not None and recorded.ttl_started + ttl_of(recorded) == round(soon)
    assert 3500 <= ttl_of(recorded) <= 3601  # the rest of the budget, in whole seconds


@pytest.mark.parametrize(("monitoring", "names"), [
    (Monitoring(health=True), ("health",)),
    (Monitoring(metrics="textfile", health=False), ("metrics",)),
])
def test_monitoring_is_what_the_record_asked_for(monitoring: Monitoring, names: tuple[str, ...]) -> None:
    assert recorded_guards(record(monitoring)).names == names


def test_a_spot_node_keeps_its_watch_and_a_capacity_blocks_node_its_end() -> None:
    assert recorded_guards(record(spot=True)).names == ("spot-interrupt",)
    end = int(time.time()) + 86400
    (step,) = recorded_guards(record(reservation_end=float(end))).steps
    assert step.name == "spot-interrupt" and dict(step.extra)["guards"].block_end == end


def test_every_step_whose_files_the_bake_clean_up_moves_aside_loses_its_marker_with_them() -> None:
    """A step that writes under /etc/gpuprov or /usr/local/lib/gpuprov (what `image bake`'s clean-up moves aside)
    must lose its marker too, or a node from the image, or the baked node itself, skips the step while its files
    are gone (after a bake, `down` could not save a node's data: its save-data helper was gone, its marker kept)."""
    import re
    from pathlib import Path

    from gpuprov.cloud.images import GUARD_STEPS

    root = Path(__file__).resolve().parents[1]
    made = {template: name for source in (root / "src" / "gpuprov").rglob("*.py")
            for name, template in re.findall(r'StepPlan\(\s*"([a-z-]+)",\s*"([a-z_]+\.sh\.j2)"', source.read_text())}
    writes = {t for t in made if re.search(r"(etc|usr/local/lib)/gpuprov", (root / "templates" / t).read_text())}
    assert writes >= {"data_save.sh.j2", "guard_ttl.sh.j2"}  # the scan finds what it is for
    assert sorted(made[t] for t in writes if made[t] not in GUARD_STEPS) == []
