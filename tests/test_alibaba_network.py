"""An Alibaba Cloud launch's own network and spot options, through the CLI against the ECS imitation in this process
(the fast lane: tests/alibaba/inprocess_cli.py): --subnet takes a vSwitch and refuses AWS's subnet ids, the config's
AWS subnet stays AWS's, and --spot-duration (ECS's spot protection period) reaches RunInstances, the record and the
plan, refused off Alibaba Cloud or without --spot; --persistent (a spot node that stops when reclaimed) refused on
Alibaba Cloud; and gpuprov's own VPC and vSwitches where the region has no default VPC."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.alibaba.inprocess_cli import error_line

ZONE = "cn-hangzhou-h"


def _config(home: Path, monkeypatch: Any, text: str) -> None:
    path = home.parent / "config.toml"
    path.write_text(text)
    monkeypatch.setenv("GPUPROV_CONFIG", str(path))


def test_subnet_is_a_vswitch_on_alibaba_and_the_configs_aws_subnet_stays_off(ecs_cli, monkeypatch) -> None:
    line = error_line(ecs_cli.gp("up", "n1", "--gpu", "A10", "--subnet", "subnet-0123456789abcdef0", "--yes"))
    assert line == ("error: --subnet: subnet-0123456789abcdef0 is an AWS subnet id, and this node is launched on "
                    "alibaba")
    assert ecs_cli.cloud.instances == {}

    _config(ecs_cli.home, monkeypatch, 'subnet = "subnet-0123456789abcdef0"\n')
    ecs_cli.up("n1")  # the config's AWS subnet is not this launch's: the zone's default vSwitch
    (row,) = ecs_cli.cloud.instances.values()
    assert row.raw["VpcAttributes"]["VSwitchId"] == f"vsw-{ZONE}"

    ecs_cli.up("n2", "--subnet", f"vsw-{ZONE}")
    assert {r.raw["VpcAttributes"]["VSwitchId"] for r in ecs_cli.cloud.instances.values()} == {f"vsw-{ZONE}"}
    line = error_line(ecs_cli.gp("up", "n3", "--gpu", "A10", "--subnet", "vsw-nothere1234", "--yes",
                                 "--ssh-cidr", "198.51.100.7/32", "--no-bootstrap", "--no-wait"))
    assert line.startswith("error: --subnet: no vSwitch vsw-nothere1234 in cn-hangzhou")


def test_spot_duration_reaches_runinstances_the_record_and_the_plan(ecs_cli) -> None:
    planned = ecs_cli.gp("plan", "--gpu", "A10", "--spot", "--spot-duration", "0")
    assert planned.exit_code == 0, planned.output
    assert "spot (protection period 0 h)" in planned.stdout

    ecs_cli.up("n1", "--spot", "--spot-duration", "0")
    (row,) = ecs_cli.cloud.instances.values()
    assert row.raw["SpotStrategy"] == "SpotAsPriceGo" and row.raw["SpotDuration"] == 0
    shown = ecs_cli.gp("status", "n1", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)[0]["spot_duration_hours"] == 0

    ecs_cli.up("n2", "--spot")  # none asked: ECS's own (1 hour), and nothing recorded
    assert sorted(r.raw["SpotDuration"] for r in ecs_cli.cloud.instances.values()) == [0, 1]


def test_spot_duration_is_refused_without_spot_or_off_alibaba(ecs_cli) -> None:
    line = error_line(ecs_cli.gp("up", "n1", "--gpu", "A10", "--spot-duration", "1", "--yes"))
    assert line == "error: --spot-duration: applies to spot requests only"
    line = error_line(ecs_cli.gp("plan", "--cloud", "aws", "--gpu", "A10", "--spot", "--spot-duration", "1"))
    assert line == "error: --spot-duration: is Alibaba Cloud's spot protection period; aws has none"
    line = error_line(ecs_cli.gp("up", "n1", "--gpu", "A10", "--spot-duration", "2", "--yes"))
    assert "--spot-duration" in line and "'2'" in line
    # a spot node that stops when ECS reclaims it (SpotInterruptionBehavior=Stop) is not one gpuprov follows yet
    line = error_line(ecs_cli.gp("up", "n1", "--gpu", "A10", "--spot", "--persistent", "--yes", "--ssh-cidr",
                                 "198.51.100.7/32", "--no-bootstrap", "--no-wait"))
    assert line == "error: --persistent: Alibaba Cloud has no stop modes in gpuprov yet"
    assert ecs_cli.cloud.instances == {}


def _own(ecs_cli) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """gpuprov's own VPCs and vSwitches in the imitation (by the mark in their descriptions)."""
    cloud = ecs_cli.cloud
    return ([v for v in cloud.vpcs if str(v.get("Description", "")).startswith("gpuprov network:")],
            [s for s in cloud.switches if str(s.get("Description", "")).startswith("gpuprov network:")])


def _rows(ecs_cli, kind: str) -> list[tuple[str | None, str | None]]:
    import sqlite3

    with sqlite3.connect(ecs_cli.home / "state.sqlite") as db:
        return list(db.execute("SELECT node, cloud_id FROM resources WHERE kind = ? AND status != 'deleted'", (kind,)))


def test_a_region_with_no_default_vpc_gets_gpuprovs_own_until_its_last_node_goes(ecs_cli) -> None:
    ecs_cli.cloud.no_default_vpc()
    ecs_cli.cloud.pending = 2  # each new VPC and vSwitch is Pending for two looks: nothing launches into it before
    first = ecs_cli.up("n1")
    assert "cn-hangzhou has no default VPC: the launch uses gpuprov's own (made now)" in first.output
    (vpc,), switches = _own(ecs_cli)
    assert vpc["CidrBlock"] == "10.0.0.0/16" and "gpuprov:owner=" in vpc["Description"]
    assert sorted(s["ZoneId"] for s in switches) == ["cn-hangzhou-h", "cn-hangzhou-i"]  # each zone the launch may try
    assert sorted(s["CidrBlock"] for s in switches) == ["10.0.0.0/20", "10.0.16.0/20"]
    (row,) = ecs_cli.cloud.instances.values()
    assert row.raw["VpcAttributes"]["VpcId"] == vpc["VpcId"]
    assert row.raw["VpcAttributes"]["VSwitchId"] in {s["VSwitchId"] for s in switches}
    assert _rows(ecs_cli, "vpc") == [(None, vpc["VpcId"])] and len(_rows(ecs_cli, "vswitch")) == 2
    made = [a for a, _ in ecs_cli.cloud.calls if a.startswith("Create")]
    assert made.index("CreateVpc") < made.index("CreateVSwitch") < made.index("CreateSecurityGroup")

    ecs_cli.up("n2")  # the same VPC and vSwitches
    assert _own(ecs_cli) == ([vpc], switches)
    down = ecs_cli.gp("down", "n1", "--yes")
    assert down.exit_code == 0, down.output
    assert _own(ecs_cli) == ([vpc], switches)  # n2 is in it
    down = ecs_cli.gp("down", "n2", "--yes")
    assert down.exit_code == 0, down.output
    assert _own(ecs_cli) == ([], []) and ecs_cli.cloud.vpcs == []
    assert _rows(ecs_cli, "vpc") == [] and _rows(ecs_cli, "vswitch") == []
    order = [a for a, _ in ecs_cli.cloud.calls if a in ("DeleteVSwitch", "DeleteVpc")]
    assert order == ["DeleteVSwitch", "DeleteVSwitch", "DeleteVpc"]


def test_gpuprovs_own_network_is_collected_by_gc_once_its_records_are_gone(ecs_cli) -> None:
    from tests.alibaba.server import Fault

    ecs_cli.cloud.no_default_vpc()
    ecs_cli.cloud.faults.append(Fault("CreateVpc", lose=True))  # made, the answer lost: sent again, one VPC
    ecs_cli.up("n1")
    assert len(_own(ecs_cli)[0]) == 1
    ecs_cli.forget("n1")
    import sqlite3

    with sqlite3.connect(ecs_cli.home / "state.sqlite") as db:  # the whole state lost
        db.execute("DELETE FROM resources")
    listed = ecs_cli.gp("gc", "--json")
    assert listed.exit_code == 0, listed.output
    kinds = sorted(r["kind"] for r in json.loads(listed.stdout)["found"])
    assert kinds == ["instance", "key-pair", "ram-role", "security-group", "vpc", "vswitch", "vswitch"]
    taken = ecs_cli.gp("gc", "--yes")
    assert taken.exit_code == 0, taken.output
    assert "deleted vpc vpc-" in taken.stdout
    assert _own(ecs_cli) == ([], []) and ecs_cli.ours() == {} and ecs_cli.cloud.ram.roles == {}


def test_a_vswitch_never_made_after_its_record_leaves_nothing(ecs_cli) -> None:
    from tests.alibaba.server import Fault

    ecs_cli.cloud.no_default_vpc()
    # the second vSwitch's create refused after its row was written (as a kill between the two would leave it)
    ecs_cli.cloud.faults.append(Fault("CreateVSwitch", code="Forbidden.RAM", message="User not authorized.",
                                      status=403))
    result = ecs_cli.gp("up", "n1", "--gpu", "A10", "--ssh-cidr", "198.51.100.7/32", "--yes", "--no-bootstrap",
                        "--no-wait")
    assert result.exit_code != 0 and "Forbidden.RAM" in result.output
    assert _own(ecs_cli) == ([], []) and ecs_cli.ours() == {}
    assert _rows(ecs_cli, "vpc") == [] and _rows(ecs_cli, "vswitch") == []


def test_a_vpc_still_in_use_is_kept_with_its_record_until_gc_finds_it_empty(ecs_cli) -> None:
    ecs_cli.cloud.no_default_vpc()
    ecs_cli.up("n1")
    (vpc,), _ = _own(ecs_cli)
    ecs_cli.cloud.groups["sg-users"] = {"SecurityGroupId": "sg-users", "SecurityGroupName": "the user's own",
                                        "VpcId": vpc["VpcId"], "Description": "", "rules": []}
    down = ecs_cli.gp("down", "n1", "--yes")
    assert down.exit_code == 0, down.output
    assert f"kept the vpc {vpc['VpcId']}: Alibaba Cloud refused DeleteVpc: DependencyViolation" in down.output
    assert _own(ecs_cli) == ([vpc], []) and _rows(ecs_cli, "vpc") == [(None, vpc["VpcId"])]

    del ecs_cli.cloud.groups["sg-users"]
    taken = ecs_cli.gp("gc", "--yes")
    assert taken.exit_code == 0, taken.output
    assert f"deleted vpc {vpc['VpcId']} (cn-hangzhou, no node of the region uses it)" in taken.stdout
    assert _own(ecs_cli) == ([], []) and _rows(ecs_cli, "vpc") == []


def test_a_zone_of_the_default_vpc_with_no_default_vswitch_gets_gpuprovs_own_until_the_last_node_goes(ecs_cli) -> None:
    cloud = ecs_cli.cloud
    cloud.switches = [s for s in cloud.switches if s["ZoneId"] != ZONE]  # zone h: no default vSwitch
    cloud.stock[("cn-hangzhou-i", "ecs.gn7i-c8g1.2xlarge")] = 0  # only zone h has the type now
    ecs_cli.up("n1")
    vpcs, (switch,) = _own(ecs_cli)
    assert vpcs == [] and switch["VpcId"] == "vpc-default" and switch["ZoneId"] == ZONE
    assert switch["CidrBlock"] == "172.16.0.0/20"  # the default VPC's first free block (zone i's has 172.16.16.0/20)
    (row,) = cloud.instances.values()
    assert row.raw["VpcAttributes"]["VSwitchId"] == switch["VSwitchId"]
    assert _rows(ecs_cli, "vpc") == [] and _rows(ecs_cli, "vswitch") == [(None, switch["VSwitchId"])]
    down = ecs_cli.gp("down", "n1", "--yes")
    assert down.exit_code == 0, down.output
    assert _own(ecs_cli) == ([], []) and [v["VpcId"] for v in cloud.vpcs] == ["vpc-default"]
    assert _rows(ecs_cli, "vswitch") == []


@pytest.mark.parametrize("cleanup", ["down", "gc"])
def test_up_killed_at_create_vpc_in_a_region_with_no_default_one_leaves_nothing_untracked(ecs_cli, cleanup) -> None:
    """SIGKILL of `up` (its own process) once ECS has made gpuprov's VPC and holds CreateVpc's answer: its row was
    written first, so `down` of the node or `gc` finds it by its name and leaves nothing."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests import forkcli
    from tests.alibaba.cli import EMPTY, leftovers
    from tests.alibaba.server import Fault
    from tests.aws.cli import CLI_SETTINGS

    ecs = ecs_cli.cloud
    ecs.no_default_vpc()
    ecs.faults.append(Fault("CreateVpc", hold=True))
    env = {**os.environ, "GPUPROV_HOME": str(ecs_cli.home), "GPUPROV_CLOUD": "alibaba", **CLI_SETTINGS}
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "up", "kill", "--gpu", "A10", "--ssh-cidr",
                          "198.51.100.7/32", "--yes", "--no-bootstrap", "--no-wait"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ecs.held:
        if proc.poll() is not None:
            pytest.fail(f"`up` ended before CreateVpc: {proc.communicate()}")
        assert time.monotonic() < deadline, "CreateVpc was never held"
        time.sleep(0.02)
    assert leftovers(ecs)["networks"]  # made, the answer not yet given
    proc.send_signal(signal.SIGKILL)
    ecs.release()
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    cleaned = ecs_cli.gp(*(("down", "kill", "--yes") if cleanup == "down" else ("gc", "--yes")))
    assert cleaned.exit_code == 0, cleaned.output
    assert leftovers(ecs) == EMPTY and _rows(ecs_cli, "vpc") == []
