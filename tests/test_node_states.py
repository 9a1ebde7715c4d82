"""A node's states and the writes of its record, below the CLI: the one table of moves (state/machine.py), the
typed fields both stores take, and what a store's failure is called (damage, or gpuprov's own bug).

The bucket's store is tested the same way in test_team_store.py (against moto)."""

from __future__ import annotations

import json
import sqlite3
import textwrap
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from gpuprov.errors import GpuprovBug, GpuprovError
from gpuprov.state import NodeState, NodeUpdate
from gpuprov.state.errors import StateBug, StateError, StateUnavailable, explain
from gpuprov.state.machine import TEARDOWN, TRANSITIONS, IllegalTransition, check_move
from gpuprov.state.records import Node, NodeFields
from gpuprov.state.sqlite import SqliteStore

S = NodeState
# every move the commands make (cloud/), as (from, to): the table must hold each
WRITTEN = [
    (S.LAUNCHING, S.RUNNING),  # up: the instance runs (node.py; cluster.py's _record)
    (S.RUNNING, S.BOOTSTRAPPING), (S.BOOTSTRAPPING, S.READY), (S.RUNNING, S.READY),  # up, with and without bootstrap
    (S.READY, S.STOPPING), (S.RUNNING, S.STOPPING), (S.BOOTSTRAPPING, S.STOPPING), (S.STOPPING, S.STOPPED),  # stop
    (S.READY, S.STOPPED), (S.READY, S.INTERRUPTED), (S.STOPPED, S.INTERRUPTED), (S.INTERRUPTED, S.READY),  # refresh
    (S.READY, S.GONE),  # refresh: an on-demand instance terminated outside gpuprov
    (S.STOPPED, S.RESIZING), (S.RESIZING, S.STOPPED), (S.RESIZING, S.STARTING), (S.STOPPED, S.STARTING),  # start
    (S.STARTING, S.RESIZING),  # a killed `start` rerun with --instance-type
    (S.STARTING, S.RUNNING), (S.RUNNING, S.READY), (S.STARTING, S.STOPPED), (S.RUNNING, S.STOPPED),  # came up; refused
    (S.STARTING, S.GONE),  # start: its instance was terminated
    (S.STOPPED, S.MOVING), (S.MOVING, S.STARTING), (S.MOVING, S.STOPPED),  # start --move: finished, or undone
    (S.READY, S.BAKING), (S.BAKING, S.READY), (S.BAKING, S.STOPPED),  # image bake: done or put back; settled
    (S.TERMINATED, S.WAITING), (S.WAITING, S.TERMINATED),  # up --wait between passes
    (S.FAILED, S.TERMINATING), (S.TERMINATING, S.TERMINATED), (S.TERMINATED, S.TERMINATING),  # take-back; down again
]


def test_every_state_has_its_row_and_every_move_the_commands_make_is_in_the_table() -> None:
    assert set(TRANSITIONS) == set(NodeState)
    assert all(to <= set(NodeState) for to in TRANSITIONS.values())
    assert {s for to in TRANSITIONS.values() for s in to} | set(TRANSITIONS) == set(NodeState)
    for old, new in WRITTEN:
        check_move("n", old, new)


@pytest.mark.parametrize("old", list(NodeState))
def test_a_teardown_is_never_refused(old: NodeState) -> None:
    for new in TEARDOWN:
        check_move("n", old, new)
    check_move("n", old, old)  # the same state again is no change


@pytest.mark.parametrize(("old", "new"), [(S.LAUNCHING, S.STOPPED), (S.STOPPED, S.BOOTSTRAPPING), (S.TERMINATED, S.READY),
                                          (S.FAILED, S.READY), (S.READY, S.STARTING), (S.GONE, S.RUNNING)])
def test_a_move_the_table_lacks_is_a_bug_naming_the_node_and_both_states(old: NodeState, new: NodeState) -> None:
    with pytest.raises(IllegalTransition) as refused:
        check_move("train", old, new)
    assert isinstance(refused.value, GpuprovBug) and not isinstance(refused.value, GpuprovError)
    assert "'train'" in str(refused.value) and f"from {old} to {new}" in str(refused.value)


def test_a_state_is_its_plain_word_in_text_json_and_sqlite() -> None:
    assert f"{S.READY}" == str(S.READY) == "ready" == S.READY and f"{S.READY:>7}" == "  ready"
    assert json.dumps({"state": S.STOPPED}) == '{"state": "stopped"}'
    assert S.READY in {"ready"} and "ready" in {S.READY}
    assert sqlite3.connect(":memory:").execute("SELECT ?", (S.GONE,)).fetchone() == ("gone",)


def test_the_typed_fields_are_nodes_own() -> None:
    node = {f.name for f in fields(Node)}
    assert set(NodeUpdate.__optional_keys__) == node - {"name", "provider"}
    assert set(NodeFields.__optional_keys__) == node - {"name", "provider", "region"}
    hints = typing.get_type_hints(NodeFields)
    assert hints["state"] is NodeState


@pytest.fixture
def store(tmp_path: Path) -> SqliteStore:
    return SqliteStore(tmp_path / "state.sqlite")


def test_the_local_store_reads_the_state_back_as_the_enum_and_checks_every_change(store: SqliteStore) -> None:
    assert store.create_node("a", "aws", "us-east-1").state is S.LAUNCHING
    store.update_node("a", state=S.RUNNING, address="203.0.113.9")
    store.update_node("a", state="ready")  # type: ignore[arg-type]  # a word is taken too (tests, older callers)
    assert store.node("a").state is S.READY and store.nodes()[0].state is S.READY
    with pytest.raises(IllegalTransition, match="from ready to starting"):
        store.update_node("a", state=S.STARTING, address="198.51.100.1")
    assert store.node("a").state is S.READY and store.node("a").address == "203.0.113.9"  # nothing was written
    store.update_node("a", state=S.TERMINATING)
    store.update_node("a", state=S.TERMINATED)
    assert store.create_node("a", "aws", "us-east-1", state=S.STOPPED).state is S.STOPPED  # a new node: no move


def test_a_misspelt_field_is_a_type_error_naming_it_and_nothing_is_written(store: SqliteStore) -> None:
    store.create_node("a", "aws", "us-east-1")
    with pytest.raises(TypeError, match="'stat'"):
        store.update_node("a", stat="ready", address="203.0.113.9")  # type: ignore[call-arg]
    assert store.node("a").address is None
    with pytest.raises(TypeError, match="'adress'"):
        store.create_node("b", "aws", "us-east-1", adress="203.0.113.9")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'region'"):
        store.create_node("b", "aws", "us-east-1", region="us-west-2")  # type: ignore[misc]
    assert store.find_node("b") is None
    with pytest.raises(ValueError, match="'redy'"):
        store.update_node("a", state="redy")  # type: ignore[arg-type]
    assert store.node("a").state is S.LAUNCHING


def test_mypy_names_a_misspelt_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mypy import api

    monkeypatch.setenv("MYPYPATH", str(Path(__file__).resolve().parents[1] / "src"))  # the sources, typed

    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent("""
        from gpuprov.state import NodeState, Store

        def f(store: Store, name: str) -> None:
            store.update_node(name, state=NodeState.READY, ready_at=1.0)
            store.update_node(name, stat="ready")
            store.update_node(name, state="ready")
    """))
    out, err, status = api.run(["--strict", "--python-version", "3.10", "--follow-imports=silent",
                                "--cache-dir", str(tmp_path / "cache"), str(snippet)])
    assert status == 1, out + err
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 2, out
    assert '"stat"' in errors[0] and ":6:" in errors[0]
    assert "NodeState" in errors[1] and ":7:" in errors[1]


def test_a_statement_gpuprov_got_wrong_is_a_bug_never_damage(store: SqliteStore) -> None:
    store.create_node("a", "aws", "us-east-1")
    with pytest.raises(StateBug) as bug, store._tx() as db:
        db.execute("UPDATE nodes SET stat = 'ready' WHERE name = 'a'")
    assert isinstance(bug.value, GpuprovBug) and not isinstance(bug.value, GpuprovError)
    assert "no such column: stat" in str(bug.value) and "mv " not in str(bug.value)
    assert "gc --all-regions" not in str(bug.value)
    for mistake in (sqlite3.OperationalError("near \"UPDTE\": syntax error"),
                    sqlite3.OperationalError("table nodes has no column named stat"),
                    sqlite3.ProgrammingError("Incorrect number of bindings supplied"),
                    sqlite3.OperationalError("something SQLite never said before")):
        assert isinstance(explain(mistake, store.path), StateBug), mistake
    for damage in (sqlite3.DatabaseError("file is not a database"),
                   sqlite3.DatabaseError("database disk image is malformed")):
        said = explain(damage, store.path)
        assert isinstance(said, StateError) and "gc --all-regions" in str(said), damage
    assert isinstance(explain(sqlite3.OperationalError("database is locked"), store.path), StateUnavailable)
    assert store.node("a").state is S.LAUNCHING


def test_one_resource_kind_for_the_records_and_the_providers() -> None:
    from gpuprov.cloud.providers import base
    from gpuprov.kinds import ResourceKind
    from gpuprov.state import records

    assert records.ResourceKind is ResourceKind and base.ResourceKind is ResourceKind
    assert {"snapshot", "iam-role", "instance-profile", "key-pair"} <= set(typing.get_args(ResourceKind))
