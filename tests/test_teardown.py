"""Teardown by records, in-process against a scripted provider (the moto tests in test_aws_* prove it through the
CLI; these pin each rule where mutation testing can see it): order, settle, lost launches, never half-way."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuprov.cloud import destroy
from gpuprov.cloud import settle as st
from gpuprov.cloud import teardown as td
from gpuprov.cloud.providers.base import CloudResource, Instance, NotFound
from gpuprov.errors import GpuprovError
from gpuprov.state import Store, locks
from gpuprov.state.sqlite import SqliteStore

R = "us-east-1"


@pytest.fixture(autouse=True)
def _ec2s_own_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests count EC2's own settle window; a shell's GPUPROV_TEST_SETTLE_SECONDS would change it."""
    monkeypatch.delenv("GPUPROV_TEST_SETTLE_SECONDS", raising=False)


@pytest.fixture(autouse=True)
def _gate_open(gp_home: Path) -> Iterator[None]:
    """teardown destroys only inside the destroy gate (cloud/destroy.py): the node's lock held, the gate open."""
    with locks.hold(locks.node("n1"), "test"), destroy.take_back("n1", "test"):
        yield


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
    regions: set[str] = field(default_factory=set)  # every region a call named

    def find_launched(self, region: str, client_token: str) -> list[Instance]:
        self.regions.add(region)
        self.calls.append(("find_launched", client_token))
        return [_instance(i) for i in self.launched.get(client_token, [])]

    tagged_instances: list[Instance] = field(default_factory=list)  # instances carrying a node tag
    list_error: GpuprovError | None = None

    def instances(self, region: str, *, ids: Sequence[str] = (), node: str | None = None) -> list[Instance]:
        self.calls.append(("instances", region, node))
        if self.list_error:
            raise self.list_error
        return [i for i in self.tagged_instances if i.region == region and (node is None or i.node == node)
                and (not ids or i.id in ids)]

    def terminate(self, region: str, ids: Sequence[str], settle: float) -> None:
        self.regions.add(region)
        self.calls.append(("terminate", tuple(ids), settle))
        for i in ids:
            if i in self.fail:
                raise self.fail[i]
            if i not in self.live:
                raise NotFound("instance", i, "InvalidInstanceID.NotFound")

    def wait_terminated(self, region: str, ids: Sequence[str], timeout: float = 900) -> None:
        self.regions.add(region)
        self.calls.append(("wait_terminated", tuple(ids)))
        if self.wait_error:
            raise self.wait_error
        self.live -= set(ids)

    def find_security_group(self, region: str, name: str) -> str | None:
        self.regions.add(region)
        return self.groups.get(name)

    def delete(self, resource: CloudResource, settle: float = 0) -> None:
        self.regions.add(resource.region)
        self.calls.append(("delete", resource.kind, resource.id, settle))
        if resource.id in self.fail:
            raise self.fail[resource.id]
        if resource.id not in self.live:
            raise NotFound(resource.kind, resource.id, "NotFound")
        self.live.discard(resource.id)

    def tagged(self, region: str) -> list[CloudResource]:
        return [r for r in self.extra_tagged if r.id in self.live and r.region == region]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = SqliteStore(tmp_path / "state.sqlite")
    s.create_node("n1", "aws", R)
    return s


def _run(cloud: FakeCloud, store: Store, said: list[str] | None = None) -> td.Teardown:
    result = td.teardown("n1", R, cloud, store, (said if said is not None else []).append, poll=0)  # type: ignore[arg-type]
    assert result.node == "n1" and cloud.regions <= {R}
    return result


def _live(store: Store) -> list[tuple[str, str | None]]:
    return [(r.kind, r.cloud_id) for r in store.resources("n1", region=R)]


def test_spot_requests_first_then_instances_volumes_and_the_group_and_rows_marked_gone(store: Store) -> None:
    """A persistent spot request relaunches a terminated instance, so it is cancelled before the terminate."""
    sg = store.intend("n1", "security-group", R, "gpuprov-n1")
    store.created(sg, "sg-1")
    inst = store.intend("n1", "instance", R, "tok-1")
    store.created(inst, "i-1")
    store.add_resource("n1", "volume", R, "vol-1")
    store.add_resource("n1", "spot-request", R, "sir-1")
    cloud = FakeCloud(live={"i-1", "vol-1", "sir-1", "sg-1"})
    result = _run(cloud, store)
    assert result.complete and _live(store) == []
    assert result.removed == ["spot-request sir-1", "instance i-1", "volume vol-1", "security-group sg-1"]
    order = [c[0] if c[0] != "delete" else c[1] for c in cloud.calls if c[0] != "instances"]
    assert order == ["spot-request", "terminate", "wait_terminated", "volume", "security-group"]


def test_a_fresh_resources_notfound_is_looked_at_again_an_old_ones_means_gone(store: Store) -> None:
    fresh = store.intend("n1", "instance", R, "tok-1")
    store.created(fresh, "i-1")
    learned = store.add_resource("n1", "volume", R, "vol-1")  # no ClientToken: EC2 told us of it
    cloud = FakeCloud(live={"i-1"})
    _run(cloud, store)
    (terminate,) = [c for c in cloud.calls if c[0] == "terminate"]
    assert 170 < terminate[2] <= st.DEFAULT_SETTLE_SECONDS  # created a moment ago: look again for ~3 minutes
    (delete,) = [c for c in cloud.calls if c[0] == "delete"]
    assert delete[3] == 0.0  # learned from EC2's answer: its NotFound is believed at once
    assert learned not in [r.id for r in store.resources("n1")]  # NotFound on delete: gone


def test_settle_counts_down_from_the_create() -> None:
    from gpuprov.state import Resource

    row = Resource(1, "n1", "instance", R, "tok", "i-1", "created", 1000.0, None)
    assert st.settle(row, now=1000.0) == st.DEFAULT_SETTLE_SECONDS
    assert st.settle(row, now=1100.0) == st.DEFAULT_SETTLE_SECONDS - 100
    assert st.settle(row, now=1000.0 + st.DEFAULT_SETTLE_SECONDS + 5) == 0.0
    assert st.settle(Resource(2, "n1", "volume", R, None, "vol-1", "created", 1000.0, None), now=1000.0) == 0.0


def test_a_lost_launch_is_found_by_its_client_token_and_terminated(store: Store) -> None:
    store.intend("n1", "instance", R, "tok-lost")  # the answer never came: no id recorded
    cloud = FakeCloud(live={"i-9", "i-10"}, launched={"tok-lost": ["i-9", "i-10"]})
    result = _run(cloud, store)
    assert result.complete and ("terminate", ("i-9",), pytest.approx(st.DEFAULT_SETTLE_SECONDS, abs=10)) in cloud.calls
    assert {"instance i-9", "instance i-10"} <= set(result.removed)


def test_a_launch_that_made_nothing_is_looked_for_until_ec2s_settle_time_is_spent_then_dropped(store: Store,
                                                                                              monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(td.time, "sleep", slept.append)  # recorded, never waited
    store.intend("n1", "instance", R, "tok-none")
    cloud = FakeCloud()
    result = _run(cloud, store)
    looks = [c for c in cloud.calls if c[0] == "find_launched"]
    assert looks == [("find_launched", "tok-none")] * (len(slept) + 1)
    assert st.DEFAULT_SETTLE_SECONDS - 10 < sum(slept) <= st.DEFAULT_SETTLE_SECONDS  # the whole window, not a few seconds
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
    said: list[str] = []
    result = _run(cloud, store, said)
    assert result.left == ["volume vol-1: VolumeInUse"] and result.removed == ["volume vol-2"]
    assert said == ["  removed volume vol-2"]
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


def test_only_this_nodes_records_in_this_region_are_touched_and_each_removal_is_said(store: Store) -> None:
    store.create_node("n2", "aws", R)
    mine = store.intend("n1", "instance", R, "tok-1")
    store.created(mine, "i-1")
    theirs = store.intend("n2", "instance", R, "tok-2")
    store.created(theirs, "i-2")
    elsewhere = store.intend("n1", "volume", "eu-west-1", "tok-3")
    store.created(elsewhere, "vol-eu")
    store.created(store.intend("n1", "instance", "eu-west-1", "tok-4"), "i-eu")
    store.intend("n1", "instance", "eu-west-1", "tok-eu-lost")
    store.add_resource("n2", "volume", R, "vol-2")
    store.intend("n2", "instance", R, "tok-n2-lost")  # another node's lost launch is not ours to look for
    cloud = FakeCloud(live={"i-1", "i-2", "vol-eu", "vol-2"},
                      extra_tagged=[CloudResource("volume", "vol-eu", "eu-west-1", "n1")])
    said: list[str] = []
    result = _run(cloud, store, said)
    assert result.removed == ["instance i-1"] and said == ["  removed instance i-1"]
    assert {"i-2", "vol-eu", "vol-2"} <= cloud.live
    assert not any("i-eu" in str(c) or "tok-eu-lost" in str(c) or "tok-n2" in str(c) for c in cloud.calls)
    assert [(r.node, r.cloud_id) for r in store.resources()] == [
        ("n2", "i-2"), ("n1", "vol-eu"), ("n1", "i-eu"), ("n1", None), ("n2", "vol-2"), ("n2", None)]


def test_an_instance_only_its_tag_knows_is_recorded_and_terminated_a_terminated_one_is_not(store: Store) -> None:
    cloud = FakeCloud(live={"i-7"}, tagged_instances=[_instance("i-7"), _instance("i-8", state="terminated"),
                                                      _instance("i-9", node="n2")])
    result = _run(cloud, store)
    assert ("instances", R, "n1") in cloud.calls
    assert result.removed == ["instance i-7"]
    assert [(r.node, r.cloud_id, r.status) for r in store.resources("n1", live_only=False)] == [("n1", "i-7", "deleted")]


def test_a_failed_tag_listing_is_said_and_the_records_still_go(store: Store) -> None:
    inst = store.intend("n1", "instance", R, "tok-1")
    store.created(inst, "i-1")
    said: list[str] = []
    result = _run(FakeCloud(live={"i-1"}, list_error=GpuprovError("throttled")), store, said)
    assert said[0] == "  could not list n1's instances by tag: throttled" and result.removed == ["instance i-1"]


def test_every_problem_is_kept_a_refused_terminate_and_an_unconfirmed_one(store: Store) -> None:
    for token, iid in (("tok-1", "i-1"), ("tok-2", "i-2")):
        store.created(store.intend("n1", "instance", R, token), iid)
    cloud = FakeCloud(live={"i-1", "i-2"}, fail={"i-1": GpuprovError("UnauthorizedOperation")},
                      wait_error=GpuprovError("timeout"))
    result = _run(cloud, store)
    assert result.left == ["instance i-1: UnauthorizedOperation",
                           "instance i-2: termination asked, not yet confirmed (timeout)"]


def test_an_old_records_notfound_on_terminate_means_gone(store: Store, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_TEST_SETTLE_SECONDS", "0")
    store.created(store.intend("n1", "instance", R, "tok-1"), "i-gone")
    cloud = FakeCloud()
    result = _run(cloud, store)
    assert result.complete and result.removed == [] and _live(store) == []
    assert ("terminate", ("i-gone",), 0.0) in cloud.calls


def test_an_old_lost_launch_is_looked_for_once_and_every_instance_of_its_token_is_recorded(
        store: Store, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_TEST_SETTLE_SECONDS", "0")
    store.intend("n1", "instance", R, "tok-old")
    old = FakeCloud()
    _run(old, store)
    assert [c for c in old.calls if c[0] == "find_launched"] == [("find_launched", "tok-old")]  # once: believed
    store.intend("n1", "instance", R, "tok-three")
    cloud = FakeCloud(live={"i-1", "i-2", "i-3"}, launched={"tok-three": ["i-1", "i-2", "i-3"]})
    result = _run(cloud, store)
    assert [c for c in cloud.calls if c[0] == "find_launched"] == [("find_launched", "tok-three")]
    assert sorted(result.removed) == ["instance i-1", "instance i-2", "instance i-3"]
    rows = [(r.cloud_id, r.client_token) for r in store.resources("n1", live_only=False) if r.cloud_id]
    assert sorted(rows) == [("i-1", "tok-three"), ("i-2", "tok-three"), ("i-3", "tok-three")]


def test_lost_launch_look_ups_back_off_doubling_from_poll(store: Store, monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(td.time, "sleep", slept.append)  # recorded, never waited
    store.intend("n1", "instance", R, "tok-none")
    td.teardown("n1", R, FakeCloud(), store, [].append, poll=1.5)  # type: ignore[arg-type]
    assert slept[:5] == [1.5, 3.0, 6.0, 12.0, 12.0]  # doubling from poll, capped at 8 polls
    assert sum(slept) <= st.DEFAULT_SETTLE_SECONDS < sum(slept) + 12.0  # no sleep after the last look


def test_groups_wait_for_the_instance_each_one_and_a_fresh_groups_notfound_is_looked_at_again(store: Store) -> None:
    store.created(store.intend("n1", "instance", R, "tok-1"), "i-1")
    for name, gid in (("gpuprov-a", "sg-a"), ("gpuprov-b", "sg-b")):
        store.created(store.intend("n1", "security-group", R, name), gid)
    waiting = _run(FakeCloud(live={"i-1", "sg-a", "sg-b"}, wait_error=GpuprovError("t")), store)
    assert waiting.left[1:] == ["security-group sg-a: waits for the instance", "security-group sg-b: waits for the instance"]
    cloud = FakeCloud(live={"sg-a", "sg-b"})
    assert _run(cloud, store).complete
    assert [c[3] for c in cloud.calls if c[0] == "delete"] == [pytest.approx(st.DEFAULT_SETTLE_SECONDS, abs=10)] * 2


def test_a_group_never_made_is_dropped_and_leftovers_known_to_the_records_are_not_deleted_twice(store: Store) -> None:
    store.intend("n1", "security-group", R, "gpuprov-never")  # its create never answered, and made nothing
    gone = store.add_resource("n1", "volume", R, "vol-1")
    cloud = FakeCloud(live={"vol-1", "vol-x"}, extra_tagged=[CloudResource("volume", "vol-1", R, "n1"),
                                                             CloudResource("volume", "vol-x", R, "n1")])
    cloud.tagged = lambda region: [CloudResource("volume", "vol-1", R, "n1"),  # type: ignore[method-assign]
                                   CloudResource("volume", "vol-x", R, "n1")]  # tags lag: vol-1 still listed
    result = _run(cloud, store)
    assert result.removed == ["volume vol-1", "volume vol-x"] and _live(store) == []
    assert [c[2] for c in cloud.calls if c[0] == "delete"] == ["vol-1", "vol-x"]  # vol-1 once, by its record
    assert [c[3] for c in cloud.calls if c[0] == "delete"] == [0.0, 0.0]  # neither was created a moment ago
    assert gone not in [r.id for r in store.resources("n1")]


def test_only_a_security_group_is_looked_up_by_its_recorded_name(store: Store) -> None:
    store.intend("n1", "spot-request", R, "gpuprov-n1")  # an intent of another kind whose answer was lost
    cloud = FakeCloud(live={"sg-9"}, groups={"gpuprov-n1": "sg-9"})
    result = _run(cloud, store)
    assert result.removed == [] and "sg-9" in cloud.live and _live(store) == []


def test_a_settle_window_of_zero_believes_every_notfound_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprov.state import Resource

    row = Resource(1, "n1", "instance", R, "tok", "i-1", "created", 1000.0, None)
    monkeypatch.setenv("GPUPROV_TEST_SETTLE_SECONDS", "0")  # 0 once read as unset: EC2's three minutes
    assert st.settle(row, now=1000.0) == 0.0
    monkeypatch.setenv("GPUPROV_TEST_SETTLE_SECONDS", "15")  # read when asked, not when the module was imported
    assert st.settle(row, now=1000.0) == 15.0
