"""`gpuprov state adopt` and a stopped node's price on Alibaba Cloud, in the fast lane (`ecs_cli`: the real CLI
against the ECS imitation in this process, no SSH): `state adopt` rebuilds the records from ECS's tags after the state
file is lost (a node and a cluster, their groups, the cluster's deployment set, the region's key pair and gpuprov's
own network), following `--cloud` or the config's `cloud`, and `down` then leaves nothing; AWS is never asked (the
fixture points it at a port nothing listens on). A stopped node's `$/h` is its disk's, as DescribePrice gave it at
the stop; where ECS gives none, the stop is done and says so."""

from __future__ import annotations

import json

from tests.alibaba.cli import EMPTY, leftovers


def _status(ecs_cli) -> dict[str, dict]:
    shown = ecs_cli.gp("status", "--json")
    assert shown.exit_code == 0, shown.output
    return {n["name"]: n for n in json.loads(shown.stdout)}


def test_adopt_after_the_state_file_is_lost_rebuilds_the_alibaba_node_and_down_leaves_nothing(ecs_cli) -> None:
    ecs = ecs_cli.cloud
    ecs.no_default_vpc()  # gpuprov's own VPC and vSwitches too: shared, released with the region's last node
    ecs_cli.up("n1", "--spot")
    before = _status(ecs_cli)["n1"]
    (iid,) = ecs.instances
    cluster = ecs_cli.gp("up", "c", "--gpu", "T4", "--nodes", "2", "--ssh-cidr", "198.51.100.7/32", "--yes",
                         "--no-wait", "--no-bootstrap")  # on-demand: in a deployment set (tagged in its description)
    assert cluster.exit_code == 0 and len(ecs.sets) == 1, cluster.output
    made = [a for a, _ in ecs.calls if a.startswith("Create") or a in ("RunInstances", "ImportKeyPair")]
    for lost in ecs_cli.home.glob("state.sqlite*"):  # a lost state file: nothing recorded, everything still in ECS
        lost.unlink()
    assert _status(ecs_cli) == {}

    adopted = ecs_cli.gp("state", "adopt")
    assert adopted.exit_code == 0, adopted.output
    assert "2 node(s) adopted: c, n1" in adopted.stdout and f"instance {iid}" in adopted.stdout
    assert f"placement-group {next(iter(ecs.sets))}" in adopted.stdout  # the cluster's deployment set
    assert _status(ecs_cli)["c"]["cluster_size"] == 2
    node = _status(ecs_cli)["n1"]
    for key in ("cloud", "region", "zone", "instance_type", "market", "address"):
        assert node[key] == before[key], key
    assert (node["state"], node["gpu"], node["gpu_count"]) == ("ready", "A10", 1)  # the catalog's, by its type
    table = ecs_cli.gp("status")  # the walk found the table's crash on a record with no GPU count
    assert table.exit_code == 0 and "1× A10" in table.stdout, table.output
    assert [a for a, _ in ecs.calls if a.startswith("Create") or a in ("RunInstances", "ImportKeyPair")] == made  # none anew
    again = ecs_cli.gp("state", "adopt", "--cloud", "alibaba", "--region", "cn-hangzhou")
    assert again.exit_code == 0 and "0 node(s) adopted" in again.stdout  # a recorded node is left as it is

    down = ecs_cli.gp("down", "n1", "c", "--yes")
    assert down.exit_code == 0, down.output
    assert leftovers(ecs) == EMPTY and ecs.vpcs == [] and _status(ecs_cli) == {}
    gc = ecs_cli.gp("gc", "--json")
    assert gc.exit_code == 0 and json.loads(gc.stdout)["found"] == [], gc.output


def test_adopt_follows_the_configs_cloud_and_names_an_unknown_alibaba_region_in_one_line(ecs_cli, monkeypatch) -> None:
    monkeypatch.delenv("GPUPROV_CLOUD")
    config = ecs_cli.home.parent / "config.toml"
    config.write_text('cloud = "alibaba"\n')
    monkeypatch.setenv("GPUPROV_CONFIG", str(config))
    ecs_cli.up("n1")
    ecs_cli.forget("n1")
    adopted = ecs_cli.gp("state", "adopt")  # AWS is never asked: it is pointed at a port nothing listens on
    assert adopted.exit_code == 0 and "1 node(s) adopted: n1" in adopted.stdout, adopted.output
    refused = ecs_cli.gp("state", "adopt", "--region", "us-east-1")
    assert refused.exit_code == 2
    assert refused.stderr.startswith("error: --region: unknown Alibaba Cloud region 'us-east-1'"), refused.stderr
    assert "Traceback" not in refused.output
    assert ecs_cli.gp("down", "n1", "--yes").exit_code == 0

    from gpuprov.cloud.providers.alibaba import AlibabaProvider
    from gpuprov.cloud.tags import owner

    # what an `up` killed before RunInstances leaves, its record lost: a group alone, adopted as a failed node
    AlibabaProvider(owner(), poll=0.01).create_security_group("cn-hangzhou", "x", ecs_cli.cloud.vpcs[0]["VpcId"],
                                                               "gpuprov-x-1", "gpuprov x")
    assert "1 node(s) adopted: x" in ecs_cli.gp("state", "adopt").stdout
    assert _status(ecs_cli)["x"]["state_reason"] == "adopted without an instance"
    (line,) = [x for x in ecs_cli.gp("status").stdout.splitlines() if x.lstrip().startswith("x ")]
    assert " - " in line and "failed" in line  # no GPU known: none shown (the walk found the table's crash)
    assert ecs_cli.gp("down", "x", "--yes").exit_code == 0
    assert leftovers(ecs_cli.cloud) == EMPTY


def test_a_stopped_nodes_dollars_an_hour_are_its_disks_and_a_price_ecs_will_not_say_leaves_none(ecs_cli) -> None:
    from tests.alibaba.server import Fault

    ecs = ecs_cli.cloud
    ecs.faults.append(Fault("DescribePrice", "Forbidden.RAM", "User not authorized to operate on the specified "
                            "resource.", status=403, times=2))  # neither at launch nor at the stop
    ecs_cli.up("n1")
    stopped = ecs_cli.gp("stop", "n1")
    assert stopped.exit_code == 0, stopped.output  # the stop is done whatever the price
    assert "could not read its disk's price (Alibaba Cloud refused DescribePrice: Forbidden.RAM" in \
        " ".join(stopped.output.split())
    assert "its compute is not billed, its 100 GB disk still is (no price known: " in stopped.stdout
    row = _status(ecs_cli)["n1"]
    assert row["disk_usd_hour"] is None and row["storage_usd_month"] is None and row["storage_unknown"]
    assert "stopped (compute $0/h, disk billed)" in ecs_cli.gp("status").stdout

    assert ecs_cli.gp("start", "n1", "--no-bootstrap").exit_code == 0
    ecs.disk_price_gb_hour = 0.0003
    assert ecs_cli.gp("stop", "n1").exit_code == 0  # ECS answers now: the disk's price is recorded at this stop
    row = _status(ecs_cli)["n1"]
    assert (row["state"], row["disk_usd_hour"], row["storage_usd_month"]) == ("stopped", 0.03, 21.6)
    (line,) = [x for x in ecs_cli.gp("status").stdout.splitlines() if x.lstrip().startswith("n1 ")]
    assert "$0.03" in line and "(compute $0/h, disk $0.0300/h)" in line
    assert ecs_cli.gp("down", "n1", "--yes").exit_code == 0
    assert leftovers(ecs) == EMPTY
