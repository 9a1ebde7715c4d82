"""A node's life on Alibaba Cloud: the real CLI against the ECS imitation (tests/alibaba/server.py), its launched
node bootstrapped and verified over SSH on a real test host (tests/alibaba/cli.py): up, status, a stop in economical
mode and a start (a new public address, the same host), an image bake (its reboot), a node launched from the baked image, down
and image rm, leaving nothing. The same without SSH, with failover, faults and signals: test_alibaba_lifecycle.py."""

from __future__ import annotations

import json

from tests.alibaba.cli import EMPTY, ali_site, leftovers
from tests.aws.cli import gp

ON_HOST = ("--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11")


def test_up_status_stop_start_bake_down_on_alibaba(ecs_cloud, ali_env, aws_hosts, gp_home) -> None:
    ali_site(ecs_cloud, aws_hosts, gp_home, hosts=(0, 1))
    up = gp(ali_env, "up", "t4", "--gpu", "T4", "--spot", "--ssh-cidr", "198.51.100.7/32", "--yes", *ON_HOST)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "asking for ecs.gn6i-c4g1.xlarge in cn-hangzhou-h (spot)" in up.stdout and "verify: ok" in up.stdout
    (run,) = [i.raw for i in ecs_cloud.instances.values()]
    assert run["SpotStrategy"] == "SpotAsPriceGo" and run["InstanceType"] == "ecs.gn6i-c4g1.xlarge"
    (node,) = json.loads(gp(ali_env, "status", "--json").stdout)
    assert (node["name"], node["state"], node["region"], node["zone"]) == ("t4", "ready", "cn-hangzhou", "cn-hangzhou-h")
    assert node["cloud"] == "alibaba"

    stopped = gp(ali_env, "stop", "t4")  # a spot node: ECS stops it in economical mode
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert run["Status"] == "Stopped" and run["StoppedMode"] == "StopCharging" and not run["PublicIpAddress"]["IpAddress"]
    assert "its compute is not billed" in stopped.stdout
    started = gp(ali_env, "start", "t4", "--no-bootstrap")  # its new address reaches the same host, key pinned
    assert started.returncode == 0, started.stdout + started.stderr

    baked = gp(ali_env, "image", "bake", "t4", "--name", "t4-stack", "--yes")
    assert baked.returncode == 0, baked.stdout + baked.stderr
    # ECS's CreateImage does not reboot: the provider does, in standard mode (address kept), as EC2's does
    after = [(a, p.get("StoppedMode")) for a, p in ecs_cloud.calls if a in ("CreateImage", "StopInstances",
                                                                          "StartInstances")][-3:]
    assert after == [("CreateImage", None), ("StopInstances", "KeepCharging"), ("StartInstances", None)]
    listed = gp(ali_env, "image", "list", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    (image,) = json.loads(listed.stdout)
    assert (image["name"], image["state"], image["recorded"]) == ("t4-stack", "available", True)
    assert image["id"].startswith("m-") and image["snapshot_ids"]
    assert gp(ali_env, "status", "--json").stdout.count('"state": "ready"') == 1
    down = gp(ali_env, "down", "t4", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert leftovers(ecs_cloud) == {**EMPTY, "images": [image["id"]], "snapshots": list(image["snapshot_ids"])}

    again = gp(ali_env, "up", "t4b", "--gpu", "T4", "--ssh-cidr", "198.51.100.7/32", "--yes", "--no-bootstrap",
               "--no-wait", *ON_HOST)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"image: baked image t4-stack ({image['id']}" in again.stdout
    assert [i.raw["ImageId"] for i in ecs_cloud.instances.values()] == [image["id"]]
    assert gp(ali_env, "down", "t4b", "--yes").returncode == 0
    removed = gp(ali_env, "image", "rm", "t4-stack", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert leftovers(ecs_cloud) == EMPTY
    assert json.loads(gp(ali_env, "status", "--json").stdout) == []
