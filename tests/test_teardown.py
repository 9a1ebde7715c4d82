"""Teardown by records, in-process against a scripted provider (the moto tests in test_aws_* prove it through the
CLI; these pin each rule where mutation testing can see it): order, settle, lost launches, never half-way."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuprov.cloud import teardown as td
from gpuprov.errors import GpuprovError
from gpuprov.providers.base import CloudResource, Instance, NotFound
from gpuprov.state import Store

R = "us-east-1"


def _instance(iid: str, state: str = "running", node: str = "n1") -> Instance:
    return Instance(iid, R, "us-east-1a", "g4dn.xlarge", state, "on-demand", None, None, None, node=node)


@dataclass
class FakeCloud:
    """Records every call; `fail` maps a resource id to the error its delete/terminate raises."""

    live: set[str] = field(default_factory=set)
    launched: dict[str, list[str]] = field(default_factory=dict)  # client token -> instance ids
    groups: dict[str, str] = field(default_factory=dict)  # name -> id
    fail: dict[str, GpuprovError] = field(default_factory=dict)
    extra_tagged: list[CloudResource] = field(default_factory=list)
    wait_error: GpuprovError | None = None
    calls: list[tuple] = field(default_factory=list)

    def find_launched(self, region: str, client_token: str) -> list[Instance]:
        self.calls.append(("find_launched", client_token))
        return [_instance(i) for i in self.launched.get(client_token, [])]

    def instances(self, region: str, *, ids: Sequence[str] = (), node: str | None = None) -> list[Instance]:
        return [_instance(i) for i in sorted(self.live) if i.startswith("i-")]

    def terminate(self, region: str, ids: Sequence[str], settle: float) -> None:
        self.calls.append(("terminate", tuple(ids), settle))
        for i in ids:
            if i in self.fail:
                raise self.fail[i]
            if i not in self.live:
                raise NotFound("instance", i, "InvalidInstanceID.NotFound")

    def wait_terminated(self, region: str, ids: Sequence[str], timeout: float = 900) -> None:
        self.calls.append(("wait_terminated", tuple(ids)))
        if self.wait_error:
            raise self.wait_error
        self.live -= set(ids)

    def find_security_group(self, region: str, name: str) -> str | None:
        return self.groups.get(name)

    def delete(self, resource: CloudResource, settle: float = 0) -> None:
        self.calls.append(("delete", resource.kind, resource.id, settle))
        if resource.id in self.fail:
            raise self.fail[resource.id]
        if resource.id not in self.live:
            raise NotFound(resource.kind, resource.id, "NotFound")
        self.live.discard(resource.id)

    def tagged(self, region: str) -> list[CloudResource]:
        return [r for r in self.extra_tagged if r.id in self.live]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "state.sqlite")
    s.create_node("n1", "aws", R)
    return s


def _run(cloud: FakeCloud, store: Store) -> td.Teardown:
    said: list[str] = []
    return td.teardown("n1", R, cloud, store, said.append, poll=0)  # type: ignore[arg-type]


def _live(store: Store) -> list[tuple[str, str | None]]:
    return [(r.kind, r.cloud_id) for r in store.resources("n1", region=R)]


def test_instances_first_then_spot_volumes_and_the_group_and_rows_marked_gone(store: Store) -> None:
    sg = store.intend("n1", "security-group", R, "gpuprov-n1")
    store.created(sg, "sg-1")
    inst = store.intend("n1", "instance", R, "tok-1")
    store.created(inst, "i-1")
    store.add_resource("n1", "volume", R, "vol-1")
    store.add_resource("n1", "spot-request", R, "sir-1")
    cloud = FakeCloud(live={"i-1", "vol-1", "sir-1", "sg-1"})
    result = _run(cloud, store)
    assert result.complete and _live(store) == []
    assert result.removed == ["instance i-1", "spot-request sir-1", "volume vol-1", "security-group sg-1"]
    order = [c[0] if c[0] != "delete" else c[1] for c in cloud.calls]
    assert order == ["terminate", "wait_terminated", "spot-request", "volume", "security-group"]


def test_a_fresh_resources_notfound_is_looked_at_again_an_old_ones_means_gone(store: Store) -> None:
    fresh = store.intend("n1", "instance", R, "tok-1")
    store.created(fresh, "i-1")
    learned = store.add_resource("n1", "volume", R, "vol-1")  # no ClientToken: EC2 told us of it
    cloud = FakeCloud(live={"i-1"})
    _run(cloud, store)
    (terminate,) = [c for c in cloud.calls if c[0] == "terminate"]
    assert 170 < terminate[2] <= td.SETTLE_SECONDS  # created a moment ago: look again for ~3 minutes
    (delete,) = [c for c in cloud.calls if c[0] == "delete"]
    assert delete[3] == 0.0  # learned from EC2's answer: its NotFound is believed at once
    assert learned not in [r.id for r in store.resources("n1")]  # NotFound on delete: gone


def test_settle_counts_down_from_the_create() -> None:
    from gpuprov.state import Resource

    row = Resource(1, "n1", "instance", R, "tok", "i-1", "created", 1000.0, None)
    assert td.settle(row, now=1000.0) == td.SETTLE_SECONDS
    assert td.settle(row, now=1100.0) == td.SETTLE_SECONDS - 100
    assert td.settle(row, now=1000.0 + td.SETTLE_SECONDS + 5) == 0.0
    assert td.settle(Resource(2, "n1", "volume", R, None, "vol-1", "created", 1000.0, None), now=1000.0) == 0.0


def test_a_lost_launch_is_found_by_its_client_token_and_terminated(store: Store) -> None:
    store.intend("n1", "instance", R, "tok-lost")  # the answer never came: no id recorded
    cloud = FakeCloud(live={"i-9", "i-10"}, launched={"tok-lost": ["i-9", "i-10"]})
    result = _run(cloud, store)
    assert result.complete and ("terminate", ("i-9",), pytest.approx(td.SETTLE_SECONDS, abs=10)) in cloud.calls
    assert {"instance i-9", "instance i-10"} <= set(result.removed)


def test_a_launch_that_made_nothing_is_looked_for_a_few_times_then_dropped(store: Store) -> None:
    store.intend("n1", "instance", R, "tok-none")
    cloud = FakeCloud()
    result = _run(cloud, store)
    assert [c for c in cloud.calls if c[0] == "find_launched"] == [("find_launched", "tok-none")] * td.LOOKS_FOR_LOST_LAUNCH
    assert result.complete and _live(store) == [] and not any(c[0] == "terminate" for c in cloud.calls)


def test_the_group_waits_while_an_instance_is_left_and_nothing_is_marked_gone_unconfirmed(store: Store) -> None:
    inst = store.intend("n1", "instance", R, "tok-1")
    store.created(inst, "i-1")
    sg = store.intend("n1", "security-group", R, "gpuprov-n1")
    store.created(sg, "sg-1")
    cloud = FakeCloud(live={"i-1", "sg-1"}, wait_error=GpuprovError("still shutting-down"))
    result = _run(cloud, store)
    assert not result.complete
    assert result.left == ["instance i-1: termination asked, not yet confirmed (still shutting-down)",
                           "security-group sg-1: waits for the instance"]
    assert sorted(_live(store)) == [("instance", "i-1"), ("security-group", "sg-1")]
    assert not any(c[0] == "delete" for c in cloud.calls)


def test_a_refused_delete_is_left_and_the_rest_still_goes(store: Store) -> None:
    store.add_resource("n1", "volume", R, "vol-1")
    store.add_resource("n1", "volume", R, "vol-2")
    cloud = FakeCloud(live={"vol-1", "vol-2"}, fail={"vol-1": GpuprovError("VolumeInUse")})
    result = _run(cloud, store)
    assert result.left == ["volume vol-1: VolumeInUse"] and result.removed == ["volume vol-2"]
    assert _live(store) == [("volume", "vol-1")]


def test_a_group_whose_create_answer_was_lost_is_found_by_its_name(store: Store) -> None:
    store.intend("n1", "security-group", R, "gpuprov-n1")
    cloud = FakeCloud(live={"sg-7"}, groups={"gpuprov-n1": "sg-7"})
    result = _run(cloud, store)
    assert result.removed == ["security-group sg-7"] and _live(store) == []


def test_other_tagged_resources_go_only_after_the_records_all_went(store: Store) -> None:
    orphan = CloudResource("volume", "vol-orphan", R, "n1")
    other_node = CloudResource("volume", "vol-other", R, "n2")
    cloud = FakeCloud(live={"vol-orphan", "vol-other"}, extra_tagged=[orphan, other_node])
    assert _run(cloud, store).removed == ["volume vol-orphan"]
    assert "vol-other" in cloud.live
