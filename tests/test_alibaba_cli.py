"""`up`, `status` and `down` on Alibaba Cloud: the real CLI against the ECS imitation (tests/alibaba/server.py),
its launched node bootstrapped and verified over SSH on a real test host (tests/alibaba/cli.py)."""

from __future__ import annotations

import json

from tests.alibaba.cli import EMPTY, ali_site, leftovers
from tests.aws.cli import gp

ON_HOST = ("--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11")


def test_up_status_down_on_alibaba(ecs_cloud, ali_env, aws_hosts, gp_home) -> None:
    ali_site(ecs_cloud, aws_hosts, gp_home)
    up = gp(ali_env, "up", "t4", "--gpu", "T4", "--spot", "--ssh-cidr", "198.51.100.7/32", "--yes", *ON_HOST)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "asking for ecs.gn6i-c4g1.xlarge in cn-hangzhou-h (spot)" in up.stdout and "verify: ok" in up.stdout
    (run,) = [i.raw for i in ecs_cloud.instances.values()]
    assert run["SpotStrategy"] == "SpotAsPriceGo" and run["InstanceType"] == "ecs.gn6i-c4g1.xlarge"
    (node,) = json.loads(gp(ali_env, "status", "--json").stdout)
    assert (node["name"], node["state"], node["region"], node["zone"]) == ("t4", "ready", "cn-hangzhou", "cn-hangzhou-h")
    down = gp(ali_env, "down", "t4", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert leftovers(ecs_cloud) == EMPTY
    assert json.loads(gp(ali_env, "status", "--json").stdout) == []
