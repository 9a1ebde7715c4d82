"""The RAM role an Alibaba node's guards stop it with, through the CLI in the fast lane (`ecs_cli`: the real `gpuprov`
in this process against the ECS imitation and RAM's beside it, tests/alibaba/ram.py): `up` records the role, then
makes it and launches with RunInstances' RamRoleName; a second node reuses it; `down` of the last node removes it; a
fresh role ECS does not know yet and a lost create answer; `gc` collects an orphan role; SIGKILL of `up` while
CreateRole's answer is held leaves nothing untracked. tests/test_alibaba_node.py has the node's side (the credentials
ECS gives the role stop it economically)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tests import forkcli
from tests.alibaba.cli import EMPTY, leftovers
from tests.alibaba.server import Fault

NO_SSH = ("--ssh-cidr", "198.51.100.7/32", "--yes", "--no-bootstrap", "--no-wait")
CREATES = ["CreatePolicy", "CreateRole", "AttachPolicyToRole"]


def _rows(ecs_cli) -> list[tuple[str | None, str, str, str | None, str | None]]:
    """The records' role rows: (node, region, status, client_token, cloud_id)."""
    with sqlite3.connect(ecs_cli.home / "state.sqlite") as db:
        return list(db.execute("SELECT node, region, status, client_token, cloud_id FROM resources "
                               "WHERE kind = 'ram-role' AND status != 'deleted'"))


def _ram_calls(ecs_cli) -> list[str]:
    return [action for action, _ in ecs_cli.cloud.ram.calls]


def test_up_records_the_role_then_makes_it_a_second_node_reuses_it_and_the_last_down_removes_it(ecs_cli) -> None:
    ecs, ram = ecs_cli.cloud, ecs_cli.cloud.ram
    first = ecs_cli.up("n1")
    assert _ram_calls(ecs_cli) == CREATES
    (role,) = ram.roles
    assert f"stop role {role}: the node's guards ask Alibaba Cloud to stop it with this role" in first.stdout
    assert _rows(ecs_cli) == [(None, "global", "created", role, role)]
    trust = json.loads(ram.roles[role]["AssumeRolePolicyDocument"])
    assert trust["Statement"][0]["Principal"] == {"Service": ["ecs.aliyuncs.com"]}  # ECS alone may assume it
    assert ram.allowed(role) == ("StopInstances",) and ram.attached == {(role, role)}
    assert ram.tags[role]["gpuprov:owner"] and ram.tags[role]["gpuprov:node"] == "(shared)"
    assert [p["RamRoleName"] for a, p in ecs.calls if a == "RunInstances"] == [role]

    ecs_cli.up("n2")  # the same role, not asked for again
    assert _ram_calls(ecs_cli) == CREATES
    assert [p["RamRoleName"] for a, p in ecs.calls if a == "RunInstances"] == [role, role]
    shown = {n["name"]: n for n in json.loads(ecs_cli.gp("status", "--json").stdout)}
    assert shown["n1"]["autostop_stop_mode"] == "economical"

    assert ecs_cli.gp("down", "n1", "--yes").exit_code == 0
    assert set(ram.roles) == {role} and _rows(ecs_cli)  # n2 still needs it
    last = ecs_cli.gp("down", "n2", "--yes")
    assert last.exit_code == 0, last.output
    assert f"removed the role {role} (no node uses it now)" in last.stdout
    assert _ram_calls(ecs_cli)[-3:] == ["DetachPolicyFromRole", "DeleteRole", "DeletePolicy"]
    assert leftovers(ecs) == EMPTY and _rows(ecs_cli) == []


def test_a_fresh_role_ecs_does_not_know_yet_and_lost_create_answers_make_one_role_and_one_instance(ecs_cli) -> None:
    ecs, ram = ecs_cli.cloud, ecs_cli.cloud.ram
    ram.lag = 2  # RunInstances refused InvalidRamRole.NotFound twice: RAM's create not yet seen by ECS
    ram.faults += [Fault("CreateRole", lose=True), Fault("AttachPolicyToRole", lose=True)]
    ecs_cli.up("n1")
    # each lost create looked for before it would be sent again (found: not sent again)
    assert _ram_calls(ecs_cli) == ["CreatePolicy", "CreateRole", "GetRole", "AttachPolicyToRole",
                                   "ListPoliciesForRole"]
    runs = [p["ClientToken"] for a, p in ecs.calls if a == "RunInstances"]
    assert len(runs) == 3 and len(set(runs)) == 1 and len(ecs.instances) == 1  # the same request, one instance
    assert ecs_cli.gp("down", "n1", "--yes").exit_code == 0
    assert leftovers(ecs) == EMPTY


def test_a_role_whose_delete_failed_or_whose_records_are_lost_is_collected_by_gc(ecs_cli) -> None:
    ecs, ram = ecs_cli.cloud, ecs_cli.cloud.ram
    ecs_cli.up("n1")
    ram.faults.append(Fault("DeleteRole", code="Throttling.User", message="Request was denied due to user flow "
                            "control.", status=400))
    down = ecs_cli.gp("down", "n1", "--yes")
    assert down.exit_code == 0, down.output  # the node is gone; the role is kept, said, its row kept
    assert "could not delete the role gpuprov-stop-" in down.stdout and ram.roles and _rows(ecs_cli)
    with sqlite3.connect(ecs_cli.home / "state.sqlite") as db:  # and then the whole state lost
        db.execute("DELETE FROM resources")
    listed = ecs_cli.gp("gc", "--json")
    assert listed.exit_code == 0, listed.output
    assert [(r["kind"], r["state"]) for r in json.loads(listed.stdout)["found"]] == [("ram-role", "no node uses it")]
    taken = ecs_cli.gp("gc", "--yes")
    assert taken.exit_code == 0, taken.output
    assert "deleted ram-role gpuprov-stop-" in taken.stdout
    assert leftovers(ecs) == EMPTY


def test_up_killed_while_create_roles_answer_is_held_leaves_nothing_untracked(ecs_cli, gp_home) -> None:
    import os

    from tests.aws.cli import CLI_SETTINGS

    ecs, ram = ecs_cli.cloud, ecs_cli.cloud.ram
    ram.faults.append(Fault("CreateRole", hold=True))
    env = {**os.environ, "GPUPROV_HOME": str(gp_home), "GPUPROV_CLOUD": "alibaba", **CLI_SETTINGS}
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "up", "kill", "--gpu", "T4", *NO_SSH], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ecs.held:
        if proc.poll() is not None:
            pytest.fail(f"`up` ended before CreateRole: {proc.communicate()}")
        assert time.monotonic() < deadline, "CreateRole was never held"
        time.sleep(0.02)
    assert ram.roles and _rows(ecs_cli)[0][2] == "intent"  # made, its answer not yet given: recorded before
    proc.send_signal(signal.SIGKILL)
    ecs.release()
    proc.communicate(timeout=60)
    cleaned = ecs_cli.gp("gc", "--yes")  # its `up` died before ready: the node, and the role with it
    assert cleaned.exit_code == 0, cleaned.output
    assert "deleted" in cleaned.stdout or "removed the role" in cleaned.stdout
    assert leftovers(ecs) == EMPTY and _rows(ecs_cli) == []


def test_a_moved_node_is_launched_with_the_role_too(ecs_cli) -> None:
    ecs = ecs_cli.cloud
    ecs_cli.up("n1")
    assert ecs_cli.gp("stop", "n1").exit_code == 0
    moved = ecs_cli.gp("start", "n1", "--move", "--no-bootstrap", "--yes")
    assert "n1: moved to " in moved.output  # (no SSH here: its wait for the new host key is not what is tested)
    (role,) = ecs.ram.roles
    assert [p.get("RamRoleName") for a, p in ecs.calls if a == "RunInstances"] == [role, role]
    assert _ram_calls(ecs_cli) == CREATES  # the same role
    assert ecs_cli.gp("down", "n1", "--yes").exit_code == 0
    assert leftovers(ecs) == EMPTY
