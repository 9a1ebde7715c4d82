"""A cluster's own resources in teardown, in-process against the scripted provider of test_teardown.py: the
placement group and the Elastic IPs go only after every instance is gone (EC2 refuses both while an instance uses
them), and a create whose answer was lost is followed by its recorded name."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuprov.errors import GpuprovError
from gpuprov.state import Store
from gpuprov.state.sqlite import SqliteStore
from tests.test_teardown import (
    FakeCloud,
    R,
    _gate_open,  # noqa: F401 (autouse: the destroy gate open for n1)
    _live,
    _run,
)


@dataclass
class ClusterCloud(FakeCloud):
    addresses: dict[str, str] = field(default_factory=dict)  # recorded name (tag) -> allocation id
    capabilities: frozenset[str] = frozenset({"addresses"})  # find_address: capabilities.py's ADDRESSES
    name: str = "aws"
    address_name: str = "Elastic IP"

    def find_address(self, region: str, name: str) -> str | None:
        self.calls.append(("find_address", name))
        return self.addresses.get(name)

    # the rest of the capability (providers/capabilities.py Addresses), never asked here
    def allocate_address(self, region: str, node: str, name: str) -> str:
        raise AssertionError("allocate_address")

    def associate_address(self, region: str, allocation_id: str, instance_id: str, settle: float) -> str:
        raise AssertionError("associate_address")

    def address_count(self, region: str) -> int:
        raise AssertionError("address_count")

    def check_room(self, region: str, nodes: int, types: object) -> None:
        raise AssertionError("check_room")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = SqliteStore(tmp_path / "state.sqlite")
    s.create_node("n1", "aws", R, cluster_size=2)
    return s


def _cluster_rows(store: Store) -> None:
    pg = store.intend("n1", "placement-group", R, "gpuprov-n1-pg")
    store.created(pg, "gpuprov-n1-pg")
    for i in (1, 2):
        row = store.intend("n1", "instance", R, "tok-1") if i == 1 else None
        if row is not None:
            store.created(row, "i-1")
        else:
            store.add_resource("n1", "instance", R, "i-2", "tok-1")
        eip = store.intend("n1", "address", R, f"gpuprov-n1-{i}")
        store.created(eip, f"eipalloc-{i}")


def test_placement_group_and_elastic_ips_go_after_every_instance(store: Store) -> None:
    _cluster_rows(store)
    cloud = ClusterCloud(live={"i-1", "i-2", "gpuprov-n1-pg", "eipalloc-1", "eipalloc-2"})
    result = _run(cloud, store)
    assert result.complete and _live(store) == []
    order = [c[0] if c[0] != "delete" else c[1] for c in cloud.calls if c[0] not in ("instances", "find_launched")]
    assert order == ["terminate", "terminate", "wait_terminated", "address", "address", "placement-group"]


def test_they_wait_while_an_instance_is_left(store: Store) -> None:
    _cluster_rows(store)
    cloud = ClusterCloud(live={"i-1", "i-2", "gpuprov-n1-pg", "eipalloc-1", "eipalloc-2"},
                         wait_error=GpuprovError("still shutting-down"))
    result = _run(cloud, store)
    assert "placement-group gpuprov-n1-pg: waits for the instance" in result.left
    assert "address eipalloc-2: waits for the instance" in result.left
    assert not any(c[0] == "delete" for c in cloud.calls)
    assert ("placement-group", "gpuprov-n1-pg") in _live(store)


def test_lost_create_answers_are_followed_by_the_recorded_name(store: Store) -> None:
    store.intend("n1", "placement-group", R, "gpuprov-n1-pg")  # created, answer lost
    store.intend("n1", "address", R, "gpuprov-n1-0-ab")  # allocated, answer lost: found by its Name tag
    store.intend("n1", "address", R, "gpuprov-n1-1-cd")  # never allocated
    cloud = ClusterCloud(live={"gpuprov-n1-pg", "eipalloc-9"}, addresses={"gpuprov-n1-0-ab": "eipalloc-9"})
    result = _run(cloud, store)
    assert result.complete and _live(store) == [] and cloud.live == set()
    assert ("delete", "address", "eipalloc-9") in [c[:3] for c in cloud.calls]
    assert ("delete", "placement-group", "gpuprov-n1-pg") in [c[:3] for c in cloud.calls]


def test_a_placement_group_never_made_is_dropped(store: Store) -> None:
    store.intend("n1", "placement-group", R, "gpuprov-n1-pg")
    cloud = ClusterCloud()
    result = _run(cloud, store)
    assert result.complete and result.removed == [] and _live(store) == []
