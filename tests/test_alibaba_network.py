"""An Alibaba Cloud launch's own network and spot options, through the CLI against the ECS imitation in this process
(the fast lane: tests/alibaba/inprocess_cli.py): --subnet takes a vSwitch and refuses AWS's subnet ids, the config's
AWS subnet stays AWS's, and --spot-duration (ECS's spot protection period) reaches RunInstances, the record and the
plan, refused off Alibaba Cloud or without --spot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ZONE = "cn-hangzhou-h"


def error_line(result: Any) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    return line


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
    assert ecs_cli.cloud.instances == {}
