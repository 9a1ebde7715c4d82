"""Getting capacity (issue 27) through the real CLI against moto behind the fault proxy: `up --wait` asking again
until capacity appears (nothing left between passes), `status` while it waits, a SIGTERM mid-wait; `start --move`
to another zone or region, of a node in the default VPC and of one in a subnet of its own (real SSH hosts at the
new instance's address: its disk's marker file is there)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import forkcli, testnet
from tests.aws.cli import EMPTY, copy_disk, gp, launch_site, nothing_left, up_args

NO_WAIT = ("--no-bootstrap", "--no-wait")
ONE_TYPE = ("--gpu", "T4", "--max-hourly", "0.6")  # g4dn.xlarge ($0.526/h) alone: one candidate per zone
ICE = {"action": "RunInstances", "code": "InsufficientInstanceCapacity",
       "message": "We currently do not have sufficient g4dn.xlarge capacity in the Availability Zone you requested."}


def _zones(aws, instance_type: str = "g4dn.xlarge") -> list[str]:
    return _zones_in(aws, "us-east-1", instance_type)


def _zones_in(aws, region: str, instance_type: str = "g4dn.xlarge") -> list[str]:
    found = aws.ec2(region).describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}])
    return sorted(o["Location"] for o in found["InstanceTypeOfferings"])


def _done(aws, action: str) -> list[dict]:
    return [e for e in aws.log(action) if e["status"] == 200]


def test_up_wait_asks_again_until_capacity_appears_and_leaves_nothing_between_passes(aws, env):
    zones = _zones(aws)
    aws.faults({**ICE, "times": 3 * len(zones)})  # three whole passes refused, the fourth's first ask granted
    result = gp({**env, "GPUPROV_TEST_WAIT_BACKOFF_SECONDS": "0.05"},
                *up_args("patient", *ONE_TYPE, "--wait", "10m", *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("pass ")]
    assert [line.split(":")[0] for line in lines] == ["pass 1", "pass 2", "pass 3"]
    assert all("InsufficientInstanceCapacity" in line and "next pass in" in line for line in lines), result.stdout
    assert result.stdout.count("asking for") == len(zones) + 1  # pass 1 speaks; passes 2-3 keep to their line
    runs = aws.log("RunInstances")
    assert len([e for e in runs if e["outcome"] == "fault"]) == 3 * len(zones)
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]
               if i["State"]["Name"] != "terminated"]
    assert inst["InstanceType"] == "g4dn.xlarge"
    # nothing between passes: each pass's security group was deleted before the next one was made
    made = [(e["seq"], "+") for e in _done(aws, "CreateSecurityGroup")]
    gone = [(e["seq"], "-") for e in _done(aws, "DeleteSecurityGroup")]
    assert "".join(sign for _seq, sign in sorted(made + gone)) == "+-+-+-+"
    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert node["name"] == "patient" and node["state"] == "ready"
    assert gp(env, "down", "patient", "--yes").returncode == 0
    nothing_left(aws)


def test_a_cluster_waits_for_a_zone_that_holds_it_whole_and_leaves_nothing_between_passes(aws, env):
    zones = _zones(aws, "g5.12xlarge")
    aws.faults({**ICE, "message": "no g5.12xlarge capacity", "times": len(zones)})  # pass 1 refused in every zone
    result = gp({**env, "GPUPROV_TEST_WAIT_BACKOFF_SECONDS": "0.05"}, *up_args(
        "crowd", "--gpu", "A10G:4", "--instance-type", "g5.12xlarge", "--nodes", "2", "--wait", "10m", *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("pass ")]
    assert line.startswith("pass 1:") and "InsufficientInstanceCapacity" in line and "next pass in" in line, line
    (granted,) = _done(aws, "RunInstances")  # one launch of the whole cluster, in one zone
    assert (granted["form"]["MinCount"], granted["form"]["MaxCount"]) == ("2", "2")
    # the refused pass took back its security group and placement group before the next pass made its own
    for create, delete in (("CreateSecurityGroup", "DeleteSecurityGroup"), ("CreatePlacementGroup", "DeletePlacementGroup")):
        made = [(e["seq"], "+") for e in _done(aws, create)]
        gone = [(e["seq"], "-") for e in _done(aws, delete)]
        assert "".join(sign for _seq, sign in sorted(made + gone)) == "+-+", create
    assert len([i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]
                if i["State"]["Name"] != "terminated"]) == 2
    assert gp(env, "down", "crowd", "--yes").returncode == 0
    nothing_left(aws)


def test_status_shows_a_waiting_up_and_sigterm_mid_wait_leaves_nothing(aws, env):
    aws.faults(ICE)  # no capacity at all
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args("waits", *ONE_TYPE, "--wait", "2h", *NO_WAIT)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**env, "GPUPROV_TEST_WAIT_BACKOFF_SECONDS": "60"})
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the pass line is printed once the record says `waiting`
            if line.startswith("pass 1:"):
                break
        else:
            raise AssertionError(proc.stderr.read() if proc.stderr else "no pass line")
        (node,) = json.loads(gp(env, "status", "--json").stdout)
        assert node["name"] == "waits" and node["state"] == "waiting"
        assert "next pass at" in node["state_reason"]
        table = gp(env, "status").stdout
        assert "waiting" in table and "pass 1" in table
        assert gp(env, *up_args("waits", *ONE_TYPE, *NO_WAIT)).returncode == 2  # the name is held while it waits
        held = gp(env, "gc")
        assert "waits" in held.stdout + held.stderr and "up --wait" in held.stdout + held.stderr  # left alone, named
        asked = len(aws.log("RunInstances"))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    assert "stopped waiting for capacity: nothing of waits is left" in out + err
    assert "Traceback" not in err
    assert len(aws.log("RunInstances")) == asked  # no pass after the signal
    assert json.loads(gp(env, "status", "--json").stdout) == []
    nothing_left(aws)
    again = gp(env, *up_args("waits", *ONE_TYPE, *NO_WAIT))  # the name is free again
    assert again.returncode == 1 and "no capacity anywhere" in again.stderr
    nothing_left(aws)


def test_gc_stopped_for_lists_what_each_stopped_disk_cost_status_flags_it_and_yes_takes_it_down(aws, env, gp_home,
                                                                                                 tmp_path):
    import time as clock

    from gpuprov.state import open_store

    for name in ("old", "young"):
        made = gp(env, *up_args(name, *ONE_TYPE, "--disk", "150", *NO_WAIT))
        assert made.returncode == 0, made.stdout + made.stderr
    stopped = gp(env, "stop", "old", "young")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    now = clock.time()
    store = open_store()  # time passes: one was stopped 20 days ago, the other yesterday
    store.update_node("old", stopped_at=now - 20 * 86400)
    store.update_node("young", stopped_at=now - 86400)

    listed = gp(env, "gc", "--stopped-for", "14d")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    # 150 GB of gp3 at $0.08/GB-month is $12/month; 20 of a 30-day month: $8.00
    assert "old (us-east-1): stopped 20d; its 150 GB disk cost $8.00 while stopped ($12.00/month)" in listed.stdout
    assert "young" not in listed.stdout and "rerun with --yes" in listed.stdout
    live = [i["InstanceId"] for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] == "stopped"]
    assert len(live) == 2  # listing takes nothing

    rows = {n["name"]: n for n in json.loads(gp(env, "status", "--json").stdout)}
    assert rows["old"]["stopped_too_long"] and not rows["young"]["stopped_too_long"]
    assert rows["old"]["disk_usd_while_stopped"] == 8.0
    table = {line.split()[0]: line for line in gp(env, "status").stdout.splitlines() if line.strip()}
    assert "stopped 20d ($8.00): gc --stopped-for" in table["old"]
    assert "gc --stopped-for" not in table["young"]

    config = tmp_path / "config.toml"
    config.write_text('stopped_for = "14d"\n')
    taken = gp({**env, "GPUPROV_CONFIG": str(config)}, "gc", "--yes", "--json")  # the config's default
    assert taken.returncode == 0, taken.stdout + taken.stderr
    report = json.loads(taken.stdout)
    assert [s["name"] for s in report["stopped"]] == ["old"] and report["left"] == []
    assert [n["name"] for n in json.loads(gp(env, "status", "--json").stdout)] == ["young"]
    states = {i["InstanceId"]: i["State"]["Name"] for r in aws.ec2().describe_instances()["Reservations"]
              for i in r["Instances"]}
    assert sorted(states.values()) == ["stopped", "terminated"]
    bad = gp({**env, "GPUPROV_CONFIG": str(config)}, "gc", "--stopped-for", "soon")
    assert bad.returncode == 2 and "error: --stopped-for: 'soon' is not a duration" in bad.stderr
    assert gp(env, "down", "young", "--yes").returncode == 0
    nothing_left(aws)


def _instances(aws) -> dict[str, dict]:
    return {i["InstanceId"]: i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]}


def test_start_move_after_ice_takes_the_disk_to_another_zone_and_a_failed_move_touches_nothing(aws, env):
    made = gp(env, *up_args("mover", *ONE_TYPE, "--disk", "120", *NO_WAIT))
    assert made.returncode == 0, made.stdout + made.stderr
    assert gp(env, "stop", "mover").returncode == 0
    (old,) = [i for i in _instances(aws).values() if i["State"]["Name"] == "stopped"]
    home = old["Placement"]["AvailabilityZone"]
    aws.faults({**ICE, "action": "StartInstances", "times": 1})
    refused = gp(env, "start", "mover", "--no-bootstrap")
    assert refused.returncode == 1 and "gpuprov start mover --move" in refused.stderr, refused.stderr

    # every other zone full: the move takes back what it made; the old node is not touched
    snapshots = {s["SnapshotId"] for s in aws.ec2().describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    aws.faults(ICE)
    failed = gp(env, "start", "mover", "--move", "--no-bootstrap")
    assert failed.returncode == 1 and "no other zone had capacity" in failed.stderr, failed.stdout + failed.stderr
    assert f"stays stopped in {home}, untouched" in failed.stdout
    assert _instances(aws)[old["InstanceId"]]["State"]["Name"] == "stopped"
    touched = [e for e in aws.log() if e["action"] in ("TerminateInstances", "StopInstances", "StartInstances",
                                                      "ModifyInstanceAttribute")
               and old["InstanceId"] in json.dumps(e["form"]) and e["seq"] > aws.log("CreateImage")[0]["seq"]]
    assert touched == []
    assert aws.ec2().describe_images(Owners=["self"])["Images"] == []  # the image went, its snapshot too
    assert {s["SnapshotId"] for s in aws.ec2().describe_snapshots(OwnerIds=["self"])["Snapshots"]} == snapshots
    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert node["state"] == "stopped" and node["zone"] == home

    # one other zone full, the next has room: moved there, the old instance retired only after
    aws.clear_faults()  # (the log too)
    others = [z for z in _zones(aws) if z != home]
    defaults = {s["AvailabilityZone"]: s["SubnetId"] for s in aws.ec2().describe_subnets(
        Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]}
    aws.faults({**ICE, "match": {"SubnetId": defaults[others[0]]}})
    moved = gp(env, "start", "mover", "--move", "--no-bootstrap")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert {e["form"]["InstanceId"] for e in aws.log("CreateImage")} == {old["InstanceId"]}  # its disk, imaged
    ubuntu = old["ImageId"]  # what `up` launched from
    launched = [e for e in aws.log("RunInstances") if e["form"].get("ImageId") != ubuntu]
    assert len({e["form"]["ImageId"] for e in launched[-2:]}) == 1  # this move's image, in each zone it asked
    # each zone's default subnet: of its VPC, as `up` without --subnet got its own
    assert [e["form"]["SubnetId"] for e in launched][-2:] == [defaults[z] for z in others[:2]]
    ends = [e for e in aws.log("TerminateInstances") if old["InstanceId"] in json.dumps(e["form"])]
    assert ends and ends[0]["seq"] > launched[-1]["seq"]  # the old one goes once the new one is there
    now = _instances(aws)
    assert now[old["InstanceId"]]["State"]["Name"] == "terminated"
    (new,) = [i for i in now.values() if i["State"]["Name"] == "running"]
    assert new["Placement"]["AvailabilityZone"] == others[1] and new["InstanceType"] == "g4dn.xlarge"
    assert new["ImageId"] == launched[-1]["form"]["ImageId"]
    (root,) = aws.ec2().describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [new["InstanceId"]]}])[
        "Volumes"]
    assert root["Size"] == 120 and root["AvailabilityZone"] == others[1]
    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert (node["name"], node["state"], node["zone"], node["disk_gb"]) == ("mover", "ready", others[1], 120)
    assert aws.ec2().describe_images(Owners=["self"])["Images"] == []
    assert {s["SnapshotId"] for s in aws.ec2().describe_snapshots(OwnerIds=["self"])["Snapshots"]} == snapshots
    assert gp(env, "down", "mover", "--yes").returncode == 0
    nothing_left(aws)


NOT_OFFERED = ('<DescribeInstanceTypeOfferingsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
               '<requestId>r</requestId><instanceTypeOfferingSet/></DescribeInstanceTypeOfferingsResponse>')


def _images_and_snapshots(aws, region: str) -> tuple[list[str], set[str]]:
    ec2 = aws.ec2(region)
    return ([i["ImageId"] for i in ec2.describe_images(Owners=["self"])["Images"]],
            {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]})


def test_start_move_region_takes_the_disk_to_another_region_and_leaves_nothing_behind(aws, env):
    made = gp(env, *up_args("far", *ONE_TYPE, "--disk", "120", *NO_WAIT))
    assert made.returncode == 0, made.stdout + made.stderr
    assert gp(env, "stop", "far").returncode == 0
    (old,) = [i for i in _instances(aws).values() if i["State"]["Name"] == "stopped"]
    east = _images_and_snapshots(aws, "us-east-1")
    west = _images_and_snapshots(aws, "us-west-2")

    # refused with one error line, nothing made: its own region; a type the region does not offer
    aws.faults({"action": "DescribeInstanceTypeOfferings", "region": "us-west-2", "body": NOT_OFFERED})
    for region, says in (("us-east-1", "far is already in us-east-1"),
                         ("us-west-2", "g4dn.xlarge is not offered in us-west-2")):
        refused = gp(env, "start", "far", "--move", "--region", region, "--no-bootstrap")
        assert refused.returncode == 2 and refused.stderr.startswith(f"error: --region: {says}"), refused.stderr
        assert refused.stderr.count("error:") == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert aws.log("CreateImage") == [] and aws.log("CreateSecurityGroup")[-1]["seq"] < aws.log("StopInstances")[0]["seq"]
    aws.clear_faults()

    # no zone of us-west-2 has room: what the move made goes in both regions; the old node is not touched
    aws.faults({**ICE, "region": "us-west-2"})
    failed = gp(env, "start", "far", "--move", "--region", "us-west-2", "--no-bootstrap")
    assert failed.returncode == 1 and "no zone of us-west-2 had capacity" in failed.stderr, failed.stdout + failed.stderr
    assert "stays stopped in" in failed.stdout and aws.log("CopyImage") and aws.log("CreateSecurityGroup")[-1]["region"] \
        == "us-west-2"
    assert aws.leftovers(regions=("us-west-2",)) == EMPTY  # its instance (none ran), group and key pair there: gone
    assert (_images_and_snapshots(aws, "us-east-1"), _images_and_snapshots(aws, "us-west-2")) == (east, west)
    assert _instances(aws)[old["InstanceId"]]["State"]["Name"] == "stopped"
    assert [e for e in aws.log() if e["action"] in ("TerminateInstances", "StartInstances", "ModifyInstanceAttribute",
                                                    "DeleteSecurityGroup") and e["region"] == "us-east-1"] == []
    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert (node["state"], node["region"]) == ("stopped", "us-east-1")

    # SIGTERM while CopyImage's answer is on its way: the copy (found by its recorded name) and the image go
    aws.clear_faults()
    aws.faults({"action": "CopyImage", "hold": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "start", "far", "--move", "--region", "us-west-2",
                          "--no-bootstrap"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        aws.wait_held(1, timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        aws.release()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, out + err
    assert aws.leftovers(regions=("us-west-2",)) == EMPTY
    assert (_images_and_snapshots(aws, "us-east-1"), _images_and_snapshots(aws, "us-west-2")) == (east, west)
    assert _instances(aws)[old["InstanceId"]]["State"]["Name"] == "stopped"
    aws.clear_faults()

    moved = gp(env, "start", "far", "--move", "--region", "us-west-2", "--no-bootstrap")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    (created,) = [e for e in aws.log("CreateImage") if e["status"] == 200]
    (copied,) = [e for e in aws.log("CopyImage") if e["status"] == 200]
    assert (created["region"], created["form"]["InstanceId"]) == ("us-east-1", old["InstanceId"])  # its disk
    assert (copied["region"], copied["form"]["SourceRegion"]) == ("us-west-2", "us-east-1")
    assert copied["form"]["ClientToken"]
    (run,) = [e for e in aws.log("RunInstances") if e["status"] == 200 and e["region"] == "us-west-2"]
    ends = [e for e in aws.log("TerminateInstances") if old["InstanceId"] in json.dumps(e["form"])]
    assert ends and ends[0]["seq"] > run["seq"]  # the old one goes once the new one is there
    (new,) = [i for r in aws.ec2("us-west-2").describe_instances()["Reservations"] for i in r["Instances"]]
    assert new["State"]["Name"] == "running" and new["InstanceType"] == "g4dn.xlarge"
    assert new["ImageId"] == run["form"]["ImageId"] != old["ImageId"]  # launched from the copy of its disk
    (root,) = aws.ec2("us-west-2").describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [new["InstanceId"]]}])["Volumes"]
    assert root["Size"] == 120
    (group,) = new["SecurityGroups"]
    (rule,) = aws.ec2("us-west-2").describe_security_groups(GroupIds=[group["GroupId"]])["SecurityGroups"][0][
        "IpPermissions"]
    assert (rule["FromPort"], [r["CidrIp"] for r in rule["IpRanges"]]) == (22, ["198.51.100.7/32"])  # as it was
    # nothing of it left in its old region, nor the images (or their snapshots) in either
    assert aws.leftovers(regions=("us-east-1",)) == EMPTY
    assert (_images_and_snapshots(aws, "us-east-1"), _images_and_snapshots(aws, "us-west-2")) == (east, west)
    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert (node["name"], node["state"], node["region"], node["zone"], node["disk_gb"]) == \
        ("far", "ready", "us-west-2", new["Placement"]["AvailabilityZone"], 120)
    # `ssh gpuprov-far` reaches it with us-west-2's key, the one its key pair there holds
    home = Path(env["GPUPROV_HOME"])
    (pair,) = aws.ec2("us-west-2").describe_key_pairs(IncludePublicKey=True)["KeyPairs"]
    assert new["KeyName"] == pair["KeyName"]
    assert pair["PublicKey"].split()[1] == (home / "keys/us-west-2/id_ed25519.pub").read_text().split()[1]
    entry = (home / "ssh_config").read_text().split("Host gpuprov-far\n")[1].split("Host ")[0]
    assert f"HostName {new['PublicIpAddress']}" in entry and f"IdentityFile {home}/keys/us-west-2/id_ed25519" in entry
    assert gp(env, "down", "far", "--yes").returncode == 0
    nothing_left(aws)


NET = testnet.subnet("10.220.0")  # the aws_hosts' /24: a /25 at .0 gives its first instance .4 (pool[0]), at .128 .132
MARKER = "/var/lib/gpuprov-shim/root/work/marker"  # on the node's disk (the shims' sysroot stands for its /)
PRIVATE = ("--connect", "private", "--ssh-user", "root", "--no-bootstrap")


def _subnet_node(aws, env, pool, gp_home, name: str, *up: str, regions: tuple[str, ...] = ("us-east-1",)) -> str:
    """A node `up` put in a pinned subnet (NET.0/25 of a VPC of its own, us-east-1a: pool[0]) and reaches on its
    private address, a marker written on its disk, stopped; returns the subnet."""
    first = launch_site(aws, pool, gp_home, ".0/25", regions)
    made = gp(env, *(up or up_args(name)), *ONE_TYPE, "--subnet", first, *PRIVATE)
    assert made.returncode == 0, made.stdout + made.stderr
    pool.exec_in(0, f"mkdir -p {MARKER.rsplit('/', 1)[0]} && echo 'written before the move' > {MARKER}", check=True)
    assert gp(env, "stop", name).returncode == 0
    return first


def _reaches_the_disk(env, gp_home, pool, name: str) -> None:
    """`gpuprov exec NAME` reaches the new instance's host (pool[1] at NET.132) with its new host key pinned, and
    the disk's marker file is there."""
    ran = gp(env, "exec", name, "--", "cat", MARKER)
    assert ran.returncode == 0 and "written before the move" in ran.stdout, ran.stdout + ran.stderr
    pinned = (gp_home / "nodes" / name / "known_hosts").read_text()
    assert f"{NET}.132 " in pinned and pool[1].host_key_pub.split()[1] in pinned, pinned
    assert pool[0].host_key_pub.split()[1] not in pinned  # the old instance's key went with it
    entry = (gp_home / "ssh_config").read_text().split(f"Host gpuprov-{name}\n")[1].split("Host ")[0]
    assert f"HostName {NET}.132" in entry


def test_start_move_of_a_subnet_node_goes_to_its_vpcs_subnet_in_another_zone_and_its_disk_is_there(
        aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    first = _subnet_node(aws, env, pool, gp_home, "sub")
    vpc = aws.ec2().describe_subnets(SubnetIds=[first])["Subnets"][0]["VpcId"]
    aws.faults({**ICE, "action": "StartInstances", "times": 1})
    refused = gp(env, "start", "sub", "--no-bootstrap")
    assert refused.returncode == 1 and "gpuprov start sub --move" in refused.stderr, refused.stderr

    # its VPC has no subnet in another zone: refused before anything is made, naming --subnet
    lonely = gp(env, "start", "sub", "--move", "--no-bootstrap")
    assert lonely.returncode == 2 and lonely.stderr.startswith(f"error: --subnet: sub's VPC {vpc} has no subnet in"), \
        lonely.stdout + lonely.stderr
    other = next(z for z in _zones(aws) if z != "us-east-1a")
    default = aws.ec2().describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}, {
        "Name": "availability-zone", "Values": [other]}])["Subnets"][0]["SubnetId"]
    for subnet, says in ((first, f"{first} is in us-east-1a, where sub already is"),
                         (default, f"{default} is in vpc-")):  # the default VPC's: not its group's
        wrong = gp(env, "start", "sub", "--move", "--subnet", subnet, "--no-bootstrap")
        assert wrong.returncode == 2 and wrong.stderr.startswith(f"error: --subnet: {says}"), wrong.stderr
    assert aws.log("CreateImage") == []

    second = aws.subnet_for_hosts(f"{NET}.128/25", other)  # the same VPC: its first instance gets .132
    for flags, says in ((("--subnet", second, "--zone", "us-east-1a"), f"{second} is in {other}, not us-east-1a"),
                        (("--zone", "us-east-1a"), "sub is already in us-east-1a")):
        wrong = gp(env, "start", "sub", "--move", *flags, "--no-bootstrap")
        assert wrong.returncode == 2 and wrong.stderr.startswith(f"error: --zone: {says}"), wrong.stderr
    assert aws.log("CreateImage") == []
    copy_disk(pool, 0, 1)  # what an instance launched from the image of its disk sees
    with pool.also_at(1, f"{NET}.132"):
        moved = gp(env, "start", "sub", "--move", "--no-bootstrap")
        assert moved.returncode == 0, moved.stdout + moved.stderr
        skipped = [z for z in _zones(aws) if z not in ("us-east-1a", other)]
        assert all(f"{z}: skipped: {vpc} has no subnet there" in moved.stdout for z in skipped), moved.stdout
        assert "disk image" in moved.stdout  # the timeline's phase for imaging it
        up, run = [e for e in aws.log("RunInstances") if e["status"] == 200]
        assert run["form"]["SubnetId"] == second and run["form"]["ImageId"] != up["form"]["ImageId"]
        assert run["form"]["SecurityGroupId.1"] == up["form"]["SecurityGroupId.1"]  # its own group, of its VPC
        _reaches_the_disk(env, gp_home, pool, "sub")
    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert (node["state"], node["zone"], node["address"]) == ("ready", other, f"{NET}.132")
    timeline = json.loads(gp(env, "status", "sub", "--timeline", "--json").stdout)
    assert [p["name"] for p in timeline["phases"]][:3] == ["checks", "disk image", "capacity search"]
    assert gp(env, "down", "sub", "--yes").returncode == 0
    nothing_left(aws)


def test_start_move_region_of_a_subnet_node_needs_a_subnet_there_and_its_disk_is_there(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    # without --ssh-cidr: SSH open to its VPC's CIDR (10.220.0.0/16), which the move makes the new VPC's
    _subnet_node(aws, env, pool, gp_home, "far", "up", "far", "--yes", regions=("us-east-1", "us-west-2"))
    refused = gp(env, "start", "far", "--move", "--region", "us-west-2", "--no-bootstrap")
    assert refused.returncode == 2 and refused.stderr.startswith(
        "error: --subnet: far is reached on its private address"), refused.stderr
    assert refused.stderr.count("error:") == 1 and aws.log("CreateImage") == []
    nowhere = gp(env, "start", "far", "--move", "--region", "mars-1", "--no-bootstrap")  # the region, named first
    assert nowhere.returncode == 2 and nowhere.stderr.startswith("error: --region: unknown AWS region 'mars-1'"), \
        nowhere.stderr

    west = aws.ec2("us-west-2")
    zone = _zones_in(aws, "us-west-2")[0]
    vpc = west.create_vpc(CidrBlock=f"{NET}.0/24")["Vpc"]["VpcId"]
    subnet = west.create_subnet(VpcId=vpc, CidrBlock=f"{NET}.128/25", AvailabilityZone=zone)["Subnet"]["SubnetId"]
    copy_disk(pool, 0, 1)
    with pool.also_at(1, f"{NET}.132"):
        moved = gp(env, "start", "far", "--move", "--region", "us-west-2", "--subnet", subnet, "--no-bootstrap")
        assert moved.returncode == 0, moved.stdout + moved.stderr
        (run,) = [e for e in aws.log("RunInstances") if e["status"] == 200 and e["region"] == "us-west-2"]
        assert run["form"]["SubnetId"] == subnet
        _reaches_the_disk(env, gp_home, pool, "far")
    (new,) = [i for r in west.describe_instances()["Reservations"] for i in r["Instances"]]
    (group,) = west.describe_security_groups(GroupIds=[new["SecurityGroups"][0]["GroupId"]])["SecurityGroups"]
    assert group["VpcId"] == vpc and [r["CidrIp"] for r in group["IpPermissions"][0]["IpRanges"]] == [f"{NET}.0/24"]
    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert (node["state"], node["region"], node["zone"]) == ("ready", "us-west-2", zone)
    assert gp(env, "down", "far", "--yes").returncode == 0
    nothing_left(aws)


def test_a_cluster_launched_into_a_reservation_makes_no_placement_group_of_its_own(aws, env):
    """A reservation made outside a placement group cannot be used from one (and a block needs none): the cluster
    goes into the reservation's own group, or none."""
    aws.capacity(reservations=[{"id": "cr-0c1b2c3d4e5f60718", "instance_type": "p5.48xlarge", "zone": "us-east-1a",
                                "count": 2, "match": "targeted"}])
    up = gp(env, *up_args("pair", "--gpu", "H100:8", "--nodes", "2", "--reservation", "cr-0c1b2c3d4e5f60718", *NO_WAIT))
    assert up.returncode == 0, up.stdout + up.stderr
    (run,) = [e["form"] for e in aws.log("RunInstances") if e["status"] == 200]
    assert "Placement.GroupName" not in run and not aws.log("CreatePlacementGroup")
    assert len(aws.log("DescribeCapacityReservations")) == 1  # read once: narrowed to, launched into, recorded
    assert gp(env, "down", "pair", "--yes").returncode == 0

    proxied = aws.client("ec2", via_proxy=True)  # placement groups live in the proxy (moto has none)
    proxied.create_placement_group(GroupName="pg-held", Strategy="cluster")
    for _ in range(3):  # known to EC2 everywhere before the launch names it
        with contextlib.suppress(Exception):
            proxied.describe_placement_groups(GroupNames=["pg-held"])
    aws.capacity(reservations=[{"id": "cr-0d1b2c3d4e5f60718", "instance_type": "p5.48xlarge", "zone": "us-east-1a",
                                "count": 2, "match": "targeted", "placement_group": "pg-held"}])
    held = gp(env, *up_args("held", "--gpu", "H100:8", "--nodes", "2", "--reservation", "cr-0d1b2c3d4e5f60718",
                            *NO_WAIT))
    assert held.returncode == 0, held.stdout + held.stderr
    into = [e["form"] for e in aws.log("RunInstances") if e["status"] == 200][-1]
    assert into["Placement.GroupName"] == "pg-held"
    assert [e["form"]["GroupName"] for e in aws.log("CreatePlacementGroup")] == ["pg-held"]  # the test's, alone
    assert gp(env, "down", "held", "--yes").returncode == 0
    proxied.delete_placement_group(GroupName="pg-held")  # the account's own, not gpuprov's
    nothing_left(aws)


def _waits_then_launches(aws, env, args: list[str], refused: str, advance: float) -> None:
    """`up --wait` in the background: its first pass refused with `refused`, then the proxy's clock moved on by
    `advance` seconds, and the next pass launches."""
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**env, "GPUPROV_TEST_WAIT_BACKOFF_SECONDS": "0.5"})
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("pass 1:"):
                assert refused in line
                break
        aws.capacity(advance=advance)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err


def test_up_wait_into_a_block_waits_through_the_clean_up_of_its_last_instance(aws, env):
    """A Capacity Block answers ReservationCapacityExceeded for several minutes after its instance ended; `up --wait`
    gave up on the first one."""
    aws.capacity(reservations=[{"id": "cr-0e1b2c3d4e5f60718", "instance_type": "p5.48xlarge", "zone": "us-east-1a",
                                "count": 1, "match": "targeted", "kind": "capacity-block",
                                "block_id": "cb-0e1b2c3d4e5f60718", "end": time.time() + 86400}])
    block = ("--gpu", "H100:8", "--capacity-block", "cr-0e1b2c3d4e5f60718", *NO_WAIT)
    assert gp(env, *up_args("first", *block)).returncode == 0
    assert gp(env, "down", "first", "--yes").returncode == 0
    now = gp(env, *up_args("second", *block))  # without --wait: told why, nothing left
    assert now.returncode == 1 and "ReservationCapacityExceeded" in now.stderr + now.stdout
    assert "still being cleaned up" in now.stdout + now.stderr
    _waits_then_launches(aws, env, up_args("second", *block, "--wait", "2h"), "ReservationCapacityExceeded",
                         advance=301)  # the clean-up is over
    assert gp(env, "down", "second", "--yes").returncode == 0
    nothing_left(aws)


def test_a_block_bought_moments_ago_is_waited_for_and_a_stopped_node_of_an_ended_block_is_not_started(aws, env):
    """payment-pending is waited through; a node stopped in a block that ended (or resized away from its type) is
    refused before StartInstances, with the move offered."""
    aws.capacity(offerings=[{"id": "cb-offer-now", "instance_type": "p5.48xlarge", "zone": "us-east-1a", "count": 1,
                             "start": time.time() - 60, "hours": 24, "fee": "786.24"}], payment_looks=2)
    assert gp(env, "capacity", "offers", "--gpu", "H100:8", "--hours", "24").returncode == 0
    block = json.loads(gp(env, "capacity", "buy", "cb-offer-now", "--yes", "--json").stdout)["reservation_id"]
    up = gp(env, *up_args("blk", "--gpu", "H100:8", "--capacity-block", block, *NO_WAIT))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "payment-pending (bought moments ago): waiting for EC2 to take the payment" in up.stdout
    assert gp(env, "stop", "blk").returncode == 0
    resized = gp(env, "start", "blk", "--instance-type", "p4d.24xlarge", "--no-bootstrap")
    assert resized.returncode == 2 and f"its Capacity Block {block} holds p5.48xlarge, not p4d.24xlarge" in \
        resized.stderr
    aws.capacity(advance=25 * 3600)  # the block is over
    ended = gp(env, "start", "blk", "--no-bootstrap")
    assert ended.returncode == 2, ended.stdout + ended.stderr
    assert f"blk cannot start: its Capacity Block {block} has ended" in ended.stderr
    assert "bills while it stays stopped" in ended.stderr and "`gpuprov start blk --move`" in ended.stderr
    assert "CapacityReservationPreference=open" in ended.stderr
    assert not aws.log("StartInstances") and not aws.log("ModifyInstanceAttribute")  # refused before asking
    assert gp(env, "down", "blk", "--yes").returncode == 0
    nothing_left(aws)


def test_a_capacity_block_purchase_is_sent_once_and_after_a_lost_answer_looked_for(aws, env, gp_home):
    """PurchaseCapacityBlock has no ClientToken and cannot be undone (mutations.py ONCE): botocore used to send it
    again after a lost answer, which met the sold offering, and the bought block was recorded `failed`."""
    from gpuprov.cloud import capacity as blocks

    start = time.time() + 3600
    aws.capacity(offerings=[{"id": f"cb-offer-{x}", "instance_type": "p5.48xlarge", "zone": "us-east-1a", "count": 1,
                             "start": start, "hours": 24, "fee": "786.24"} for x in ("a", "b")])
    assert gp(env, "capacity", "offers", "--gpu", "H100:8", "--hours", "24").returncode == 0
    aws.faults({"action": "PurchaseCapacityBlock", "lose": "500", "times": 1})  # bought; the answer lost
    lost = gp(env, "capacity", "buy", "cb-offer-a", "--yes", "--json")
    assert lost.returncode == 0, lost.stdout + lost.stderr
    block = json.loads(lost.stdout)
    assert block["state"] == "bought" and block["reservation_id"].startswith("cr-")
    assert "the purchase's answer was lost (InternalError" in lost.stderr and block["reservation_id"] in lost.stderr
    assert len(aws.log("PurchaseCapacityBlock")) == 1  # asked for once
    held = [r for r in aws.capacity()["reservations"] if r["kind"] == "capacity-block"]
    assert [r["id"] for r in held] == [block["reservation_id"]]

    # a 500 for a purchase EC2 did not make: looked for, not found, not asked again; the record stays `buying`
    aws.faults({"action": "PurchaseCapacityBlock", "code": "InternalError", "times": 1})
    unsure = gp({**env, "GPUPROV_TEST_SETTLE_SECONDS": "1"}, "capacity", "buy", "cb-offer-b", "--yes")
    assert unsure.returncode == 1, unsure.stdout + unsure.stderr
    assert "no block it bought is listed" in unsure.stderr and "it is not asked for again" in unsure.stderr
    assert len(aws.log("PurchaseCapacityBlock")) == 2
    assert [b.state for b in blocks._read(blocks._blocks_file()) if b.offering == "cb-offer-b"] == ["buying"]
    again = gp(env, "capacity", "buy", "cb-offer-b", "--yes", "--json")  # looks first; not there: asks again
    assert again.returncode == 0, again.stdout + again.stderr
    assert "looking for it among the account's reservations first" in again.stderr and "asking for it again" in \
        again.stderr
    assert json.loads(again.stdout)["state"] == "bought" and len(aws.log("PurchaseCapacityBlock")) == 3
    assert gp(env, "capacity", "buy", "cb-offer-b", "--yes").returncode == 2  # bought: refused, nothing asked
    assert len(aws.log("PurchaseCapacityBlock")) == 3


def test_reservations_and_a_capacity_block_bought_waited_for_and_launched_into(aws, env, gp_home):
    from gpuprov.cloud import capacity as blocks

    aws.capacity(reservations=[{"id": "cr-0a1b2c3d4e5f60718", "instance_type": "g4dn.xlarge", "zone": "us-east-1b",
                                "count": 1, "match": "targeted"}])
    held = gp(env, *up_args("held", *ONE_TYPE, "--reservation", "cr-0a1b2c3d4e5f60718", *NO_WAIT))
    assert held.returncode == 0, held.stdout + held.stderr
    (run,) = [e for e in aws.log("RunInstances") if e["status"] == 200]
    assert run["form"]["CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"] == \
        "cr-0a1b2c3d4e5f60718" and run["form"]["Placement.AvailabilityZone"] == "us-east-1b"
    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert (node["reservation_id"], node["zone"]) == ("cr-0a1b2c3d4e5f60718", "us-east-1b")
    listed = json.loads(gp(env, "capacity", "list", "--json").stdout)
    assert [(r["id"], r["available"]) for r in listed["reservations"]] == [("cr-0a1b2c3d4e5f60718", 0)]
    fresh = gp_home.parent / "fresh-home"  # the account's reservations, read with no state made for the look
    assert json.loads(gp({**env, "GPUPROV_HOME": str(fresh)}, "capacity", "list", "--json").stdout) == listed
    assert not fresh.exists()
    assert "cr-0a1b2c3d4e5f60718  g4dn.xlarge  us-east-1b  0/1 free" in gp(env, "gpus", "T4", "--live").stdout
    wrong = gp(env, *up_args("x", "--gpu", "A10G", "--reservation", "cr-0a1b2c3d4e5f60718", *NO_WAIT))
    assert wrong.returncode == 2 and "holds g4dn.xlarge, which does not carry 1× A10G" in wrong.stderr
    unknown = gp(env, *up_args("x", "--gpu", "T4", "--reservation", "cr-00000000000000000", *NO_WAIT))
    assert unknown.returncode == 2 and "InvalidCapacityReservationId.NotFound" in unknown.stderr
    block_typo = gp(env, *up_args("x", "--gpu", "T4", "--capacity-block", "cr-00000000000000000", *NO_WAIT))
    assert block_typo.returncode == 2 and "\nerror: --capacity-block: cr-00000000000000000: Invalid" in block_typo.stderr, \
        block_typo.stderr

    start = time.time() + 3600
    aws.capacity(offerings=[{"id": "cb-offer-h100", "instance_type": "p5.48xlarge", "zone": "us-east-1a",
                             "count": 1, "start": start, "hours": 24, "fee": "786.24"}])
    offers = json.loads(gp(env, "capacity", "offers", "--gpu", "H100:8", "--hours", "24", "--json").stdout)
    assert [(o["offering"], o["upfront_usd"], o["zone"]) for o in offers] == [("cb-offer-h100", 786.24, "us-east-1a")]
    asked = gp(env, "capacity", "buy", "cb-offer-h100")  # no terminal: told first, then refused without --yes
    assert asked.returncode == 2 and "cannot be cancelled" in asked.stdout and "--yes" in asked.stderr
    assert aws.log("PurchaseCapacityBlock") == []
    aws.faults({"action": "PurchaseCapacityBlock", "hold": True})  # EC2 at work on the purchase ...
    buying = forkcli.Popen([sys.executable, "-m", "gpuprov", "capacity", "buy", "cb-offer-h100", "--yes", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    aws.wait_held(1, timeout=60)
    assert [(b.offering, b.state) for b in blocks._read(blocks._blocks_file())] == [("cb-offer-h100", "buying")]
    aws.release()  # ... recorded before it was asked for
    out, err = buying.communicate(timeout=60)
    assert buying.returncode == 0, out + err
    block = json.loads(out)
    assert block["state"] == "bought" and block["reservation_id"].startswith("cr-")
    assert [b.state for b in blocks._read(blocks._blocks_file())] == ["bought"]
    aws.clear_faults()
    table = gp(env, "status").stdout
    assert f"block {block['reservation_id']}: 1 × p5.48xlarge us-east-1a" in table and "$786.24 (bought)" in table

    early = gp(env, *up_args("blk", "--gpu", "H100:8", "--capacity-block", block["reservation_id"], *NO_WAIT))
    assert early.returncode == 2 and "starts at" in early.stderr and "--wait" in early.stderr
    _waits_then_launches(aws, env, up_args("blk", "--gpu", "H100:8", "--capacity-block", block["reservation_id"],
                                           "--wait", "2h", *NO_WAIT), "InsufficientInstanceCapacity",
                         advance=3600)  # the block starts
    into = [e for e in aws.log("RunInstances") if e["status"] == 200][-1]["form"]
    assert into["InstanceMarketOptions.MarketType"] == "capacity-block"
    assert into["CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"] == \
        block["reservation_id"]
    rows = {n["name"]: n for n in json.loads(gp(env, "status", "--json").stdout)}
    assert rows["blk"]["reservation_end"] == pytest.approx(start + 24 * 3600, abs=1)
    assert "block ends" in gp(env, "status").stdout
    assert gp(env, "down", "held", "blk", "--yes").returncode == 0
    nothing_left(aws)
