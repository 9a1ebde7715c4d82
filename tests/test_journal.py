"""A move's journal below the CLI (issue 35 §2): its record in the local store (a state file of schema 4 gains the
column), what it says in the node's state, the one decision (finish or undo), and what the destroy gate hears.
Through the CLI against the EC2 imitation, with the command killed mid-move: test_aws_move_journal.py."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

from gpuprov.cloud.destroy import in_flight as blocking
from gpuprov.cloud.journal import next_step
from gpuprov.cloud.providers.base import Instance
from gpuprov.state import Journal, NodeState
from gpuprov.state.sqlite import SCHEMA_VERSION, SqliteStore

MOVE = Journal(op="move", node="mv", step="image", region="us-east-1", zone="us-east-1a", old_instance="i-old")


def _instance(state: str) -> Instance:
    return Instance(id="i-new", region="us-east-1", zone="us-east-1b", instance_type="g4dn.xlarge", state=state,
                    market="on-demand", public_ip=None, private_ip=None, launched_at=None)


def test_a_journal_is_written_with_the_node_and_read_back_typed(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.sqlite")
    store.create_node("mv", "aws", "us-east-1", state=NodeState.STOPPED)
    assert store.node("mv").journal is None
    running = replace(MOVE, step="retire", new_instance="i-new", new_zone="us-east-1b", new_state="running")
    store.update_node("mv", state=NodeState.MOVING, journal_json=running.to_json(), state_reason=running.describe())
    node = store.node("mv")
    assert node.journal == running and node.state == "moving"
    assert node.state_reason == ("new instance i-new running in us-east-1b, old one not yet retired; "
                                 "`gpuprov start mv` finishes the move")
    store.update_node("mv", state=NodeState.STARTING, journal_json=None)
    assert store.node("mv").journal is None


def test_a_newer_gpuprovs_journal_keys_are_left() -> None:
    text = MOVE.to_json().replace('"op":', '"later": 1, "op":')
    assert Journal.from_json(text) == MOVE


def test_a_state_file_of_schema_4_gains_the_journal_column(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    SqliteStore(path).create_node("old", "aws", "us-east-1")
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE nodes DROP COLUMN journal_json")
    db.execute("PRAGMA user_version = 4")
    db.commit()
    db.close()
    assert SqliteStore(path).node("old").journal is None
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7


def test_a_new_instance_that_exists_is_kept_and_none_is_undone() -> None:
    for state in ("pending", "running", "stopping", "stopped"):
        assert next_step(MOVE, _instance(state)) == "finish"
    for gone in ("shutting-down", "terminated"):
        assert next_step(MOVE, _instance(gone)) == "undo"
    assert next_step(MOVE, None) == "undo"


def test_the_destroy_gate_hears_why_the_disk_must_stay_and_the_next_step() -> None:
    from gpuprov.state.records import Node

    node = Node(name="mv", provider="aws", region="us-east-1", zone="us-east-1a", gpu=None, gpu_count=None,
                instance_type=None, market="on-demand", state=NodeState.MOVING, state_reason=None, address=None,
                ssh_user=None, price_usd_hour=None, owner=None, plan_json=None, pid=None, host=None, created_at=0.0,
                ready_at=None, ended_at=None)
    assert blocking(node) is None
    imaging = replace(node, journal_json=MOVE.to_json())
    assert "`gpuprov stop mv` takes it back first" in (blocking(imaging) or "")
    launched = replace(node, journal_json=replace(MOVE, step="retire", new_instance="i-new", new_state="running")
                       .to_json())
    said = blocking(launched) or ""
    assert "may be only on its new instance i-new" in said and "`gpuprov start mv` finishes the move first" in said
    assert "gpuprov down" not in said


def test_a_bakes_journal_says_how_far_it_got_and_what_settles_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.sqlite")
    store.create_node("bk", "aws", "us-east-1", state=NodeState.READY)
    clean = Journal(op="bake", node="bk", step="clean", region="us-east-1", zone="us-east-1a", old_instance="i-0",
                    image_name="bk-stack")
    store.update_node("bk", state=NodeState.BAKING, journal_json=clean.to_json(), state_reason=clean.describe())
    node = store.node("bk")
    assert node.journal == clean and node.journal.is_bake and not node.journal.is_move and node.state == "baking"
    assert blocking(node) is None  # a bake copies no disk: the destroy gate lets `down` go on
    settles = "`gpuprov start bk` settles it (a stop and a start: new host keys, its guards back)"
    assert clean.describe().startswith("image bake interrupted at its clean-up") and settles in clean.describe()
    sent = replace(clean, step="image", image="ami-1", new_state="pending")
    assert "at CreateImage (image bk-stack ami-1 pending)" in sent.describe() and settles in sent.describe()
    assert "(image bk-stack not found)" in replace(clean, step="image", new_state="not found").describe()
    assert "putting its guards back (image bk-stack ami-1 made)" in replace(sent, step="guards").describe()
    store.update_node("bk", state=NodeState.READY, journal_json=None, state_reason=None)
    assert store.node("bk").journal is None
