"""`up NAME --nodes N` on the local AWS endpoint (moto behind the fault proxy, which plays what EC2 does for
clusters and moto does not: tests/aws/ec2_cluster.py). Each test ends with nothing tagged as ours left."""

from __future__ import annotations

import json

from tests.aws.cli import gp, nothing_left, up_args
from tests.aws.fault_proxy import placement_groups


def _cluster(env, name: str = "train") -> dict:
    (row,) = [n for n in json.loads(gp(env, "status", "--json").stdout) if n["name"] == name]
    return row


def test_two_node_cluster_one_launch_placement_group_first_self_rule_then_down(aws, env):
    result = gp(env, *up_args("train", "--gpu", "A10G:4", "--nodes", "2", "--no-bootstrap", "--no-wait"))
    assert result.returncode == 0, result.stdout + result.stderr
    actions = [e["action"] for e in aws.log()]
    assert actions.index("CreatePlacementGroup") < actions.index("RunInstances")
    (create,) = aws.log("CreatePlacementGroup")
    assert create["form"]["Strategy"] == "cluster" and create["form"]["TagSpecification.1.ResourceType"] == "placement-group"
    (run,) = [e for e in aws.log("RunInstances") if e["status"] == 200]
    assert run["form"]["MinCount"] == run["form"]["MaxCount"] == "2"
    assert run["form"]["Placement.GroupName"] == create["form"]["GroupName"]
    (group,) = placement_groups(aws.url)
    assert len(group["instances"]) == 2 and group["tags"]["gpuprov:node"] == "train"
    sg = aws.ec2().describe_security_groups(Filters=[{"Name": "tag:gpuprov:node", "Values": ["train"]}])["SecurityGroups"][0]
    selfrule = [p for p in sg["IpPermissions"] if p["IpProtocol"] == "-1"]
    assert [pair["GroupId"] for pair in selfrule[0]["UserIdGroupPairs"]] == [sg["GroupId"]]
    insts = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert len({i["Placement"]["AvailabilityZone"] for i in insts}) == 1 and len(insts) == 2
    row = _cluster(env)
    assert [m["rank"] for m in row["members"]] == [0, 1]
    assert "node 0" in result.stdout and "node 1" in result.stdout
    down = gp(env, "down", "train", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    nothing_left(aws)
