"""`up NAME --nodes N` on Alibaba Cloud against the ECS imitation (tests/alibaba/server.py). In the fast lane
(in-process): the provider's deployment set, a refusal through the CLI, a spot cluster and gc; one whole cluster in
the heavy lane, its two nodes landing on `aws_hosts`' two real SSH hosts (tests/alibaba/cli.py), bootstrapped, wired
and checked as a cluster, then taken down to nothing."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gpuprov.cloud.providers.alibaba_base import EcsError
from gpuprov.cloud.providers.base import CloudResource, LaunchError, NotFound
from tests.alibaba.cli import EMPTY, ali_site, leftovers
from tests.alibaba.server import Ecs, Fault
from tests.aws.cli import CLI_SETTINGS, gp
from tests.test_alibaba import REGION, ZONE_I, _access, _request

ON_HOST = ("--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11")
T4 = "ecs.gn6i-c4g1.xlarge"
SYSROOT = "/var/lib/gpuprov-shim/root"  # the test hosts' GPUPROV_SYSROOT (tests/conftest.py aws_hosts)


def _gp(*args: str) -> Any:
    """`gpuprov ARGS` in this process on Alibaba Cloud (the imitation's endpoint is in the environment)."""
    from click.testing import CliRunner

    from gpuprov.cli import main
    from gpuprov.settings import reset

    reset()
    return CliRunner().invoke(main, list(args), prog_name="gpuprov", env={"GPUPROV_CLOUD": "alibaba", **CLI_SETTINGS})


def test_a_deployment_set_is_made_once_holds_one_zone_and_no_spot_and_is_deleted_only_empty(ecs_cloud, alibaba):
    access = _access(alibaba)
    ecs_cloud.faults.append(Fault("CreateDeploymentSet", lose=True))  # made, the answer lost: sent again, one set
    made = alibaba.create_placement_group(REGION, "c", "gpuprov-c-1")
    assert list(ecs_cloud.sets) == [made] and ecs_cloud.sets[made]["Strategy"] == "LowLatency"
    pair = dataclasses.replace(_request(access, market="on-demand", node="c"), count=2, min_count=2,
                               placement_group=made)
    launched = alibaba.launch_group(pair, settle=5)
    assert {ecs_cloud.instances[i.id].raw["DeploymentSetId"] for i in launched} == {made}
    for other, code in ((dataclasses.replace(pair, zone=ZONE_I, client_token="t-i"), "InvalidParameter"),
                        (dataclasses.replace(pair, market="spot", client_token="t-s"), "InvalidParameter"),
                        (dataclasses.replace(pair, count=19, min_count=19, client_token="t-20"),
                         "QuotaExceed.DeploymentSetInstanceQuotaFull")):
        with pytest.raises(LaunchError) as refused:
            alibaba.launch_group(other, settle=5)
        assert refused.value.code == code
    with pytest.raises(EcsError) as busy:  # ECS keeps a set that still holds instances
        alibaba._call(REGION, "DeleteDeploymentSet", DeploymentSetId=made)
    assert busy.value.code == "DependencyViolation.NotEmpty"
    assert [(r.kind, r.id, r.node, r.owner) for r in alibaba.tagged(REGION) if r.kind == "placement-group"] == \
        [("placement-group", made, "c", "me@host/abc")]  # gpuprov's tags, read from the set's description
    alibaba.terminate(REGION, [i.id for i in launched], settle=1)
    alibaba.delete(CloudResource("placement-group", made, REGION, "c"), settle=1)
    assert not ecs_cloud.sets
    with pytest.raises(NotFound):
        alibaba.delete(CloudResource("placement-group", made, REGION, "c"))


def test_a_cluster_no_zone_can_hold_whole_is_refused_in_alibabas_words_and_leaves_nothing(ecs_cloud: Ecs,
                                                                                         gp_home: Any) -> None:
    for where in ecs_cloud.stock:  # every zone has one T4 left: Amount 2 (MinAmount 2) launches none anywhere
        ecs_cloud.stock[where] = 1
    result = _gp("up", "c", "--gpu", "T4", "--nodes", "2", "--ssh-cidr", "198.51.100.7/32", "--yes", "--no-bootstrap",
                 *ON_HOST)
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert "no zone could hold all 2 nodes of the cluster" in result.output
    assert f"{T4}/cn-hangzhou-h/on-demand: OperationDenied.NoStock" in result.output
    assert f"{T4}/cn-hangzhou-i/on-demand: OperationDenied.NoStock" in result.output
    runs = [flat for action, flat in ecs_cloud.calls if action == "RunInstances"]
    assert [(r["ZoneId"], r["Amount"], r["MinAmount"]) for r in runs] == [("cn-hangzhou-h", "2", "2"),
                                                                          ("cn-hangzhou-i", "2", "2")]
    (made,) = [flat for action, flat in ecs_cloud.calls if action == "CreateDeploymentSet"]  # one set, both zones
    (answer,) = [body for action, body in ecs_cloud.answers if action == "CreateDeploymentSet"]
    assert made["Strategy"] == "LowLatency" and {r["DeploymentSetId"] for r in runs} == {answer["DeploymentSetId"]}
    assert leftovers(ecs_cloud) == EMPTY
    assert json.loads(_gp("status", "--json").stdout) == []


def test_a_spot_cluster_goes_in_one_zone_without_a_deployment_set_and_gc_takes_an_orphan_set(ecs_cloud: Ecs,
                                                                                            gp_home: Any) -> None:
    result = _gp("up", "s", "--gpu", "T4", "--spot", "--nodes", "2", "--ssh-cidr", "198.51.100.7/32", "--yes",
                 "--no-wait", "--no-bootstrap", *ON_HOST)
    assert result.exit_code == 0, result.output
    assert f"asking for 2 × {T4} in cn-hangzhou-h (spot, no deployment set (LowLatency), TCP: no RDMA fabric)" \
        in result.output
    (run,) = [flat for action, flat in ecs_cloud.calls if action == "RunInstances"]
    assert "DeploymentSetId" not in run and not ecs_cloud.sets and len(ecs_cloud.instances) == 2
    assert _gp("down", "s", "--yes").exit_code == 0
    from gpuprov.cloud.providers.alibaba import AlibabaProvider
    from gpuprov.cloud.tags import owner

    # a set whose `up` died before it was recorded as made: its description names this install, gc takes it
    orphan = AlibabaProvider(owner(), poll=0.01).create_placement_group("cn-hangzhou", "lost", "gpuprov-lost-0")
    listed = _gp("gc")
    assert listed.exit_code == 0 and orphan in listed.output, listed.output
    assert _gp("gc", "--yes").exit_code == 0
    assert leftovers(ecs_cloud) == EMPTY


def test_two_nodes_up_wired_checked_and_down_on_alibaba(ecs_cloud, ali_env, aws_hosts, gp_home) -> None:
    ali_site(ecs_cloud, aws_hosts, gp_home, hosts=(0, 1))
    up = gp(ali_env, "up", "c", "--gpu", "T4", "--nodes", "2", "--ssh-cidr", "198.51.100.7/32", "--yes", *ON_HOST)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "deployment set (LowLatency) gpuprov-c-" in up.stdout
    assert f"asking for 2 × {T4} in cn-hangzhou-h (on-demand, TCP: no RDMA fabric)" in up.stdout
    assert up.stdout.count("verify: ok") == 2 and "wiring 2 nodes as cluster c" in up.stdout
    (run,) = [flat for action, flat in ecs_cloud.calls if action == "RunInstances"]
    (ds,) = ecs_cloud.sets
    assert (run["Amount"], run["MinAmount"], run["DeploymentSetId"]) == ("2", "2", ds)
    (group,) = ecs_cloud.groups.values()
    assert {"IpProtocol": "ALL", "PortRange": "-1/-1", "SourceGroupId": group["SecurityGroupId"]}.items() <= \
        next(r for r in group["rules"] if r["SourceGroupId"]).items()
    for i in (0, 1):  # each host knows the cluster: node 0's address as MASTER_ADDR, both in the hostfile
        env = aws_hosts.exec_in(i, f"cat {SYSROOT}/etc/gpuprov/cluster.env {SYSROOT}/etc/gpuprov/hostfile",
                                check=True).stdout
        assert f"MASTER_ADDR={aws_hosts[0].address}" in env and aws_hosts[1].address in env
    check = gp(ali_env, "check", "c", "--cluster")
    assert check.returncode == 0, check.stdout + check.stderr
    (node,) = json.loads(gp(ali_env, "status", "--json").stdout)
    assert (node["name"], node["state"], node["cluster_size"], len(node["members"])) == ("c", "ready", 2, 2)
    down = gp(ali_env, "down", "c", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"removed placement-group {ds}" in down.stdout
    assert leftovers(ecs_cloud) == EMPTY
    assert json.loads(gp(ali_env, "status", "--json").stdout) == []
