"""The cloud commands through the CLI in the fast lane: `up`, `status`, `stop`/`start`, `down`, `gc` and their
refusals, in-process on the fake cloud (tests/aws/inprocess.py: the real AwsProvider against moto's in-process
mock), with moto's own records as the ground truth. The same commands against the moto server behind the fault
proxy (eventual consistency, faults, lost answers, spot requests) and on SSH hosts are the heavy lane's
(test_aws_lifecycle.py, test_aws_stop_start.py)."""

from __future__ import annotations

import json
import re
import stat

from tests.aws.cli import EMPTY
from tests.aws.fixture import ubuntu_ami

CIDR = "198.51.100.7/32"
NO_SSH = ("--ssh-cidr", CIDR, "--yes", "--no-bootstrap", "--no-wait")


def up(cloud, name: str, *extra: str) -> None:
    result = cloud.gp("up", name, "--gpu", "T4", *NO_SSH, *extra)
    assert result.exit_code == 0, result.output


def instances(cloud, node: str | None = None) -> list[dict]:
    """moto's instances (a node's, by its tag), terminated ones included."""
    filters = [{"Name": "tag:gpuprov:node", "Values": [node]}] if node else []
    return [i for r in cloud.ec2().describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def status(cloud, *extra: str) -> list[dict]:
    result = cloud.gp("status", "--json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_error_line(result, needle: str) -> None:
    """Bad input: exit 2, one `error: <where>: …` line naming it, no traceback."""
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert needle in line, result.stderr
    assert "Traceback" not in result.output and "hit a bug" not in result.output


def test_up_records_the_node_and_tags_a_running_instance(fake_cloud, gp_home):
    up(fake_cloud, "n1")
    (inst,) = instances(fake_cloud)
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert inst["State"]["Name"] == "running" and inst["InstanceType"] == "g4dn.xlarge"
    assert tags["gpuprov:node"] == "n1" and tags["gpuprov:owner"]
    (group,) = fake_cloud.ec2().describe_security_groups(
        Filters=[{"Name": "tag:gpuprov:node", "Values": ["n1"]}])["SecurityGroups"]
    (rule,) = group["IpPermissions"]
    assert (rule["FromPort"], [r["CidrIp"] for r in rule["IpRanges"]]) == (22, [CIDR])
    assert stat.S_IMODE((gp_home / "keys" / "us-east-1" / "id_ed25519").stat().st_mode) == 0o600
    (node,) = status(fake_cloud)
    assert (node["name"], node["state"], node["instance_type"], node["market"], node["zone"]) == (
        "n1", "ready", "g4dn.xlarge", "on-demand", inst["Placement"]["AvailabilityZone"])
    assert node["address"] == inst["PublicIpAddress"]


def test_status_lists_the_node_and_refresh_reads_what_ec2_did_behind_its_back(fake_cloud):
    up(fake_cloud, "sp", "--spot")
    table = fake_cloud.gp("status")
    assert table.exit_code == 0 and "sp" in table.stdout and "g4dn.xlarge" in table.stdout and "ready" in table.stdout
    (inst,) = instances(fake_cloud, "sp")
    fake_cloud.ec2().terminate_instances(InstanceIds=[inst["InstanceId"]])  # stands in for a spot interruption
    assert status(fake_cloud)[0]["state"] == "ready"  # the record, until asked to look
    (node,) = status(fake_cloud, "--refresh")
    assert node["state"] == "interrupted" and node["state_reason"]
    assert "interrupted" in fake_cloud.gp("status").stdout


def test_stop_then_start_keeps_the_instance_and_its_disk(fake_cloud):
    up(fake_cloud, "n1")
    (before,) = instances(fake_cloud, "n1")
    stopped = fake_cloud.gp("stop", "n1")
    assert stopped.exit_code == 0, stopped.output
    (inst,) = instances(fake_cloud, "n1")
    assert inst["State"]["Name"] == "stopped"
    assert status(fake_cloud)[0]["state"] == "stopped"
    started = fake_cloud.gp("start", "n1", "--no-bootstrap")
    assert started.exit_code == 0, started.output
    (inst,) = instances(fake_cloud, "n1")
    assert inst["InstanceId"] == before["InstanceId"] and inst["State"]["Name"] == "running"
    (node,) = status(fake_cloud)
    assert node["state"] == "ready" and node["address"] == inst["PublicIpAddress"]


def test_down_leaves_nothing_in_the_cloud(fake_cloud, monkeypatch):
    """... also after a first `down` a SIGTERM stopped (its Interrupted, raised where the signal lands) as it reached
    the security group: its last line names what is left and the `down` that finishes it."""
    import signal

    from gpuprov.cloud import destroy
    from gpuprov.errors import Interrupted

    up(fake_cloud, "n1")
    (inst,) = instances(fake_cloud, "n1")
    group_ids = [g["GroupId"] for g in inst["SecurityGroups"]]
    real = destroy.remove

    def remove(provider, res, settle=0.0):
        if res.kind == "security-group":
            raise Interrupted(signal.SIGTERM, "SIGTERM")
        real(provider, res, settle=settle)

    monkeypatch.setattr(destroy, "remove", remove)
    stopped = fake_cloud.gp("down", "n1", "--yes")
    assert stopped.exit_code == 143, stopped.output
    last = stopped.stderr.rstrip().splitlines()[-1]
    assert last.startswith("error: interrupted by SIGTERM: still there: n1: ") and f"security-group {group_ids[0]}" in last
    assert last.endswith("; run: gpuprov down n1"), last
    monkeypatch.setattr(destroy, "remove", real)
    down = fake_cloud.gp("down", "n1", "--yes")
    assert down.exit_code == 0, down.output
    ec2 = fake_cloud.ec2()
    assert [i["State"]["Name"] for i in instances(fake_cloud)] == ["terminated"]
    assert ec2.describe_volumes()["Volumes"] == []
    assert not [g for g in ec2.describe_security_groups()["SecurityGroups"] if g["GroupId"] in group_ids]
    assert fake_cloud.leftovers() == EMPTY
    assert status(fake_cloud) == []


def test_gc_finds_an_instance_tagged_as_ours_that_no_record_owns_and_removes_it_with_yes(fake_cloud):
    up(fake_cloud, "keep")
    ec2 = fake_cloud.ec2()
    owner = next(t["Value"] for t in instances(fake_cloud, "keep")[0]["Tags"] if t["Key"] == "gpuprov:owner")
    (ghost,) = ec2.run_instances(ImageId=ubuntu_ami(), InstanceType="t3.micro", MinCount=1, MaxCount=1,
                                 TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                     {"Key": "gpuprov:node", "Value": "ghost"},
                                     {"Key": "gpuprov:owner", "Value": owner}]}])["Instances"]
    listed = fake_cloud.gp("gc")
    assert listed.exit_code == 0, listed.output
    assert ghost["InstanceId"] in listed.stdout and "--yes" in listed.stdout
    assert instances(fake_cloud, "ghost")[0]["State"]["Name"] == "running"  # listed only
    removed = fake_cloud.gp("gc", "--yes")
    assert removed.exit_code == 0, removed.output
    assert instances(fake_cloud, "ghost")[0]["State"]["Name"] == "terminated"
    assert instances(fake_cloud, "keep")[0]["State"]["Name"] == "running"  # a recorded node is no orphan
    assert status(fake_cloud)[0]["state"] == "ready"


def test_down_all_takes_every_node(fake_cloud):
    up(fake_cloud, "a")
    up(fake_cloud, "b", "--spot")
    down = fake_cloud.gp("down", "--all", "--yes")
    assert down.exit_code == 0, down.output
    assert fake_cloud.leftovers() == EMPTY
    assert status(fake_cloud) == []


def test_an_unknown_node_is_one_error_line(fake_cloud):
    up(fake_cloud, "n1")
    for command in (("down", "nosuch", "--yes"), ("stop", "nosuch"), ("start", "nosuch", "--no-bootstrap")):
        one_error_line(fake_cloud.gp(*command), "no node called 'nosuch'")
    assert instances(fake_cloud, "n1")[0]["State"]["Name"] == "running"


def test_stop_refuses_a_one_time_spot_node_and_leaves_it_running(fake_cloud):
    up(fake_cloud, "sp", "--spot")
    one_error_line(fake_cloud.gp("stop", "sp"), "one-time spot instance")
    assert instances(fake_cloud, "sp")[0]["State"]["Name"] == "running"
    assert status(fake_cloud)[0]["state"] == "ready"


def test_a_spot_price_of_0_0000_is_no_price_never_an_estimate(fake_cloud):
    """moto answers $0.00001/h for every spot offer: shown as $0.0000, "saving 100%", a $50 budget lasting
    5,000,000 h. No such price is listed, and a plan's estimate says there is none."""
    live = fake_cloud.gp("gpus", "--live", "--region", "us-east-1", "--json")
    assert live.exit_code == 0, live.output
    assert json.loads(live.stdout) == []
    # a sentence, not an empty table (what follows it, the Capacity Reservations, the in-process moto lacks: the
    # heavy lane's proxy answers them)
    said = fake_cloud.gp("gpus", "--live", "--region", "us-east-1")
    assert "no spot price in us-east-1 right now for the" in said.output, said.output
    plan = fake_cloud.gp("plan", "--gpu", "T4", "--spot", "--hours", "10", "--budget", "50", "--live")
    assert plan.exit_code == 0, plan.output
    assert "no spot price for g4dn.xlarge in us-east-1 right now" in plan.output and "$0.0000" not in plan.output
    assert re.search(r"budget \$50 lasts \d+\.\dh at \$0\.\d+/h", plan.output), plan.output  # on-demand's


def test_up_that_would_reach_a_made_up_public_address_is_refused_before_anything_is_made(fake_cloud):
    """The fake cloud's endpoint is a loopback one, as the moto server's is: moto's public addresses are made up
    (real machines on the internet), so an `up` that would connect to one is refused, and nothing is created."""
    one_error_line(fake_cloud.gp("up", "x", "--gpu", "T4", "--ssh-cidr", CIDR, "--yes", "--no-bootstrap"),
                   "--connect")
    assert instances(fake_cloud) == [] and fake_cloud.leftovers() == EMPTY


def test_a_two_node_cluster_goes_into_its_placement_group_and_down_takes_the_group_too(fake_cloud):
    result = fake_cloud.gp("up", "train", "--gpu", "A10G:4", "--nodes", "2", *NO_SSH)
    assert result.exit_code == 0, result.output
    (group,) = fake_cloud.cluster.groups.values()  # moto has none: the proxy's ClusterEc2 keeps them, in-process
    members = instances(fake_cloud, "train")
    assert sorted(group["instances"]) == sorted(i["InstanceId"] for i in members) and len(members) == 2
    assert group["tags"]["gpuprov:node"] == "train"
    one_error_line(fake_cloud.gp("stop", "train"), "train")
    down = fake_cloud.gp("down", "train", "--yes")
    assert down.exit_code == 0, down.output
    assert fake_cloud.leftovers() == EMPTY


def test_a_resize_to_a_retired_type_is_refused_before_anything_changes(fake_cloud):
    """`start NODE --instance-type p3.2xlarge`: EC2 no longer describes P3, so the resize is refused by name, with
    the V100 type that replaces it, while the node is still stopped as it was (nothing modified, nothing started)."""
    up(fake_cloud, "n1")
    assert fake_cloud.gp("stop", "n1").exit_code == 0
    (inst,) = instances(fake_cloud, "n1")
    refused = fake_cloud.gp("start", "n1", "--instance-type", "p3.2xlarge", "--no-bootstrap")
    one_error_line(refused, "--instance-type: p3.2xlarge is retired: EC2 DescribeInstanceTypes no longer describes it")
    assert "other types with V100: p3dn.24xlarge" in refused.stderr
    (after,) = instances(fake_cloud, "n1")
    assert (after["State"]["Name"], after["InstanceType"]) == ("stopped", inst["InstanceType"]) == ("stopped", "g4dn.xlarge")
    (node,) = status(fake_cloud)
    assert (node["state"], node["instance_type"]) == ("stopped", "g4dn.xlarge")


def _killed_bake(cloud, name: str, step: str) -> str:
    """What an `image bake` of `name` killed at `step` leaves: its journal and, once CreateImage was sent, an image
    whose answer was lost (EC2 made it, no record names it yet). Returns the image id, or "" when none."""
    from gpuprov.state import Journal, NodeState, open_store

    store = open_store()
    (inst,) = instances(cloud, name)
    journal = Journal(op="bake", node=name, step=step, region="us-east-1", zone=inst["Placement"]["AvailabilityZone"],
                      old_instance=inst["InstanceId"], image_name=f"{name}-stack")
    store.update_node(name, state=NodeState.BAKING, journal_json=journal.to_json(), state_reason=journal.describe())
    if step == "clean":
        return ""
    store.intend(None, "image", "us-east-1", f"{name}-stack")
    ours = [t for t in inst["Tags"] if t["Key"] == "gpuprov:owner"]  # tagged as CreateImage's ImageRequest tags it
    return cloud.ec2().create_image(InstanceId=inst["InstanceId"], Name=f"{name}-stack", TagSpecifications=[
        {"ResourceType": "image", "Tags": [*ours, {"Key": "gpuprov:node", "Value": "(image)"},
                                           {"Key": "gpuprov:image", "Value": f"{name}-stack"},
                                           {"Key": "gpuprov:source-node", "Value": name}]}])["ImageId"]


def test_a_killed_bake_is_shown_and_down_records_its_image_or_stop_settles_it(fake_cloud):
    up(fake_cloud, "bk")
    up(fake_cloud, "cl")
    image_id = _killed_bake(fake_cloud, "bk", "image")
    _killed_bake(fake_cloud, "cl", "clean")
    rows = {n["name"]: n for n in status(fake_cloud, "--refresh")}
    assert rows["bk"]["state"] == "baking" and f"image bk-stack {image_id}" in rows["bk"]["state_reason"]
    assert rows["cl"]["state"] == "baking" and "at its clean-up" in rows["cl"]["state_reason"]
    assert "`gpuprov start cl` settles it" in rows["cl"]["state_reason"]
    down = fake_cloud.gp("down", "bk", "--yes")
    assert down.exit_code == 0, down.output
    assert f"its interrupted bake made {image_id} (bk-stack), kept and recorded" in down.output
    (image,) = json.loads(fake_cloud.gp("image", "list", "--json").stdout)
    assert (image["id"], image["recorded"]) == (image_id, True)  # images outlive nodes, and are never unrecorded
    stopped = fake_cloud.gp("stop", "cl")
    assert stopped.exit_code == 0 and "cl: stopped (its interrupted bake settled)" in stopped.output, stopped.output
    (inst,) = instances(fake_cloud, "cl")
    (row,) = status(fake_cloud)
    assert inst["State"]["Name"] == "stopped" and (row["state"], row["journal"]) == ("stopped", None)
    assert fake_cloud.gp("start", "cl", "--no-bootstrap").exit_code == 0
    assert status(fake_cloud)[0]["state"] == "ready"
    assert fake_cloud.gp("down", "cl", "--yes").exit_code == 0
    assert fake_cloud.gp("image", "rm", "bk-stack", "--yes").exit_code == 0
    assert fake_cloud.leftovers() == EMPTY


def test_up_says_a_name_taken_and_a_missing_instance_profile_before_it_asks(fake_cloud):
    """The cheap checks come before `Launch …? [y/N]`: without --yes (and no terminal) the name taken or the
    missing profile is the error, not `--yes: no terminal to confirm on` (nor, on a terminal, the question)."""
    up(fake_cloud, "n1")
    asks = ("--ssh-cidr", CIDR, "--no-bootstrap", "--no-wait")
    one_error_line(fake_cloud.gp("up", "n1", "--gpu", "T4", *asks), "a node called 'n1' already exists")
    one_error_line(fake_cloud.gp("up", "n2", "--gpu", "T4", "--instance-profile", "nope", *asks),
                   "error: --instance-profile: no instance profile 'nope'")
    one_error_line(fake_cloud.gp("up", "n2", "--gpu", "T4", *asks), "error: --yes: no terminal to confirm on")
    assert len(instances(fake_cloud)) == 1


def test_a_resize_that_raises_the_price_asks_as_up_does(fake_cloud):
    up(fake_cloud, "n1")  # g4dn.xlarge
    assert fake_cloud.gp("stop", "n1").exit_code == 0
    dearer = ("start", "n1", "--instance-type", "g4dn.2xlarge", "--no-bootstrap")
    one_error_line(fake_cloud.gp(*dearer), "error: --yes: no terminal to confirm on")
    (inst,) = instances(fake_cloud, "n1")
    assert inst["InstanceType"] == "g4dn.xlarge" and inst["State"]["Name"] == "stopped"
    assert status(fake_cloud)[0]["state"] == "stopped"  # nothing recorded either: no resize to finish
    resized = fake_cloud.gp(*dearer, "--yes")
    assert resized.exit_code == 0, resized.output
    assert instances(fake_cloud, "n1")[0]["InstanceType"] == "g4dn.2xlarge"
    assert fake_cloud.gp("stop", "n1").exit_code == 0
    cheaper = fake_cloud.gp("start", "n1", "--instance-type", "g4dn.xlarge", "--no-bootstrap")  # asks nothing
    assert cheaper.exit_code == 0, cheaper.output
    assert instances(fake_cloud, "n1")[0]["InstanceType"] == "g4dn.xlarge"


def test_nodes_and_clusters_of_hosts_share_one_namespace(fake_cloud):
    """`exec/ssh/check NAME` reach a cluster of that name and `down NAME` the node: neither takes the other's."""
    from gpuprov import cluster

    up(fake_cloud, "n1")
    cluster.save(cluster.Cluster(name="train", master_addr="10.0.0.1", master_port=29500, members=[
        cluster.ClusterHost(host="10.0.0.1", address="10.0.0.1", gpus=1)]))
    one_error_line(fake_cloud.gp("up", "train", "--gpu", "T4", *NO_SSH), "'train' is already a cluster of existing hosts")
    one_error_line(fake_cloud.gp("bootstrap", "root@10.0.0.1", "--cluster", "n1"),
                   "error: --cluster: 'n1' is already a node's name")
    assert [i["Tags"] for i in instances(fake_cloud) if {"Key": "gpuprov:node", "Value": "train"} in i["Tags"]] == []


def test_status_of_an_empty_team_bucket_names_it_and_the_local_files_nodes(fake_cloud, monkeypatch):
    """`no nodes` names the state it read; the bucket read while the local file has nodes says so."""
    import boto3

    from gpuprov.state import open_store
    from tests.aws.inprocess import ENDPOINT

    open_store().create_node("n1", "aws", "us-east-1", gpu="T4", gpu_count=1, instance_type="g4dn.xlarge",
                             market="on-demand", state="ready", address="10.0.0.5", ssh_user="ubuntu")
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=ENDPOINT)
    s3.create_bucket(Bucket="team-bucket")
    s3.put_bucket_versioning(Bucket="team-bucket", VersioningConfiguration={"Status": "Enabled"})
    monkeypatch.setenv("GPUPROV_STATE", "s3://team-bucket/gp")
    result = fake_cloud.gp("status")
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "no nodes in team state s3://team-bucket/gp/; the local file" in out and "has 1 node of its own" in out


def test_a_gc_listing_makes_no_state(fake_cloud, gp_home):
    """Read-only: `gc` without --yes leaves no state folder behind (the owner tag's install id was made to list
    what it finds); with none, it says there is nothing of this install to find, and lists other installs' as
    ever. (`capacity list`, which moto answers only behind the heavy lane's proxy: tests/test_aws_capacity.py.)"""
    fake_cloud.ec2().run_instances(ImageId=ubuntu_ami(), MinCount=1, MaxCount=1, InstanceType="t3.micro",
                                   TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                       {"Key": "gpuprov:node", "Value": "lost"},
                                       {"Key": "gpuprov:owner", "Value": _owner("0123456789ab")}]}])
    for args in (("gc",), ("gc", "--json", "--all-installs"), ("gc", "--stopped-for", "14d")):
        result = fake_cloud.gp(*args)
        assert result.exit_code == 0, (args, result.output)
        assert not gp_home.exists(), args
    said = " ".join(fake_cloud.gp("gc").output.split())
    assert f"nothing of this install to find: there is no state at {gp_home}" in said
    assert "1 resource(s) of other gpuprov installs" in said and "node=lost" in said
    assert [r["node"] for r in json.loads(fake_cloud.gp("gc", "--json", "--all-installs").stdout)["found"]] == ["lost"]
    # an install whose records are gone but whose id is kept: what it tagged is its orphan, and no state file is made
    gp_home.mkdir()
    (gp_home / "install-id").write_text("0123456789ab\n")
    listed = fake_cloud.gp("gc")
    assert listed.exit_code == 0 and f"owner {_owner('0123456789ab')}:" in listed.output, listed.output
    assert "node=lost" in listed.output and "rerun with --yes" in listed.output
    assert not (gp_home / "state.sqlite").exists()


def _owner(install: str) -> str:
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}/{install}"
