"""`up NAME --nodes N` on the local AWS endpoint (moto behind the fault proxy, which plays what EC2 does for
clusters and moto does not: tests/aws/ec2_cluster.py). Each test ends with nothing tagged as ours left."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from tests import forkcli
from tests.aws.cli import EMPTY, gp, launch_site, nothing_left, up_args
from tests.aws.fault_proxy import placement_groups
from tests.conftest import sweep


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
    table = gp({**env, "COLUMNS": "80"}, "status").stdout
    lines = table.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["train"])
    assert "8× A10G (2 nodes)" in lines[at]
    assert [line.split()[:2] for line in lines[at + 1:at + 3]] == [["node", "0"], ["node", "1"]]
    refused = gp(env, "stop", "train")
    assert refused.returncode == 2 and "gpuprov down train" in refused.stderr
    down = gp(env, "down", "train", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    nothing_left(aws)


def test_efa_type_launches_with_aws_interface_layout_and_elastic_ips(aws, env):
    result = gp(env, *up_args("efa", "--gpu", "H100:8", "--nodes", "2", "--no-bootstrap", "--no-wait"))
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = [e for e in aws.log("RunInstances") if e["status"] == 200]
    form = run["form"]
    assert form["InstanceType"] == "p5.48xlarge"
    nics = {}
    for key, value in form.items():
        if key.startswith("NetworkInterface.") and key.count(".") == 2:
            _, n, field = key.split(".")
            nics.setdefault(n, {})[field] = value
    layout = sorted((int(n["NetworkCardIndex"]), int(n["DeviceIndex"]), n["InterfaceType"]) for n in nics.values())
    assert layout[:3] == [(0, 0, "interface"), (0, 1, "efa-only"), (1, 0, "efa-only")]
    assert len(layout) == 33 and {c for c, _, _ in layout} == set(range(32))
    assert not any("AssociatePublicIpAddress" in n for n in nics.values())  # EC2 refuses it with several interfaces
    eips = aws.ec2().describe_addresses()["Addresses"]
    assert len(eips) == 2 and all(a.get("InstanceId") for a in eips)
    row = _cluster(env, "efa")
    assert sorted(m["public_ip"] for m in row["members"]) == sorted(a["PublicIp"] for a in eips)
    assert "EFA" in result.stdout and "Elastic IP" in result.stdout
    assert gp(env, "down", "efa", "--yes").returncode == 0
    nothing_left(aws)


def test_tcp_type_says_so_in_the_plan_and_launches_without_efa(aws, env):
    plan = gp(env, "plan", "--gpu", "A10G", "--instance-type", "g5.4xlarge", "--nodes", "2")  # no EFA below 8xlarge
    assert plan.returncode == 0 and "network: TCP" in plan.stdout and "placement group: strategy cluster" in plan.stdout
    g5 = json.loads(gp(env, "plan", "--gpu", "A10G:4", "--nodes", "2", "--json").stdout)["cluster"]
    assert g5["transport"] == "efa" and not g5["device_rdma"] and g5["interfaces"] == [  # EFA without RDMA read
        {"network_card": 0, "device_index": 0, "type": "efa"}]
    efa = gp(env, "plan", "--gpu", "H100:8", "--nodes", "2", "--json")
    cluster = json.loads(efa.stdout)["cluster"]
    assert cluster["transport"] == "efa" and cluster["elastic_ip"] and len(cluster["interfaces"]) == 33
    assert "efa" in [s["name"] for s in json.loads(efa.stdout)["steps"]]
    assert aws.log() == []  # plan asks nothing of AWS


def test_a_zone_that_cannot_hold_the_whole_cluster_is_skipped_whole(aws, env):
    aws.faults({"action": "RunInstances", "match": {"Placement.AvailabilityZone": "us-east-1a"}, "capacity": 1})
    result = gp(env, *up_args("zone", "--gpu", "A10G:4", "--nodes", "2", "--no-bootstrap", "--no-wait", "--json"))
    assert result.returncode == 0, result.stdout + result.stderr
    runs = [e for e in aws.log("RunInstances") if e["outcome"] != "fresh-notfound"]  # EC2 may not know a fresh group yet
    assert runs[0]["form"]["Placement.AvailabilityZone"] == "us-east-1a" and runs[0]["status"] == 500
    assert "InsufficientInstanceCapacity" in result.stderr  # progress on stderr, the result as JSON on stdout
    out = json.loads(result.stdout)
    assert out["node"]["name"] == "zone" and [m["rank"] for m in out["node"]["members"]] == [0, 1]
    assert out["dropped"] == [] and out["timeline"]["outcome"] == "ok"
    insts = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    zones = {i["Placement"]["AvailabilityZone"] for i in insts}
    assert len(insts) == 2 and len(zones) == 1 and zones != {"us-east-1a"}  # nothing launched in 1a, none split
    assert _cluster(env, "zone")["zone"] in zones
    # the timeline, in the result and kept: the whole-cluster refusal, then the launch
    timeline = json.loads(gp(env, "status", "zone", "--timeline", "--json").stdout)
    assert timeline == out["timeline"]
    assert [p["name"] for p in timeline["phases"]] == ["checks", "key pair + security group", "capacity search",
                                                      "instance running"]
    attempts = timeline["phases"][2]["attempts"]
    first = attempts[0]
    assert (first["zone"], first["outcome"], first["code"]) == ("us-east-1a", "refused", "InsufficientInstanceCapacity")
    assert attempts[-1]["outcome"] == "launched" and attempts[-1]["zone"] in zones
    assert gp(env, "down", "zone", "--yes").returncode == 0
    nothing_left(aws)


def test_min_nodes_takes_what_a_zone_can_hold_above_the_minimum(aws, env):
    aws.faults({"action": "RunInstances", "capacity": 2})
    result = gp(env, *up_args("part", "--gpu", "A10G:4", "--nodes", "3", "--min-nodes", "2", "--no-bootstrap",
                              "--no-wait"))
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = [e for e in aws.log("RunInstances") if e["status"] == 200]
    assert (run["form"]["MinCount"], run["form"]["MaxCount"]) == ("2", "3")
    assert "EC2 launched 2 of 3" in result.stdout
    assert [m["rank"] for m in _cluster(env, "part")["members"]] == [0, 1]
    assert gp(env, "down", "part", "--yes").returncode == 0
    nothing_left(aws)


def test_no_zone_holds_the_cluster_nothing_is_left(aws, env):
    aws.faults({"action": "RunInstances", "capacity": 1})
    result = gp(env, *up_args("none", "--gpu", "A10G:4", "--nodes", "2", "--no-bootstrap", "--no-wait"))
    assert result.returncode == 1
    assert "no zone could hold all 2 nodes" in result.stderr
    assert all(e["status"] == 500 for e in aws.log("RunInstances") if e["outcome"] != "fresh-notfound")
    nothing_left(aws)


def _lose_node_while_starting(aws, env, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """Node 1 is terminated by EC2 (say, spot capacity taken back) while `up` waits for the nodes to run."""
    aws.faults({"action": "DescribeInstances", "hold": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args(name, "--gpu", "A10G:4", "--nodes", "3",
                                                                       "--no-bootstrap", "--no-wait", *extra)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        aws.wait_held(1, timeout=120)
        (run,) = [e for e in aws.log("RunInstances") if e["status"] == 200]
        ids = [i["InstanceId"] for r in aws.ec2().describe_instances(Filters=[
            {"Name": "tag:gpuprov:node", "Values": [name]}])["Reservations"] for i in r["Instances"]]
        assert len(ids) == 3, run
        ordered = sorted(ids, key=lambda i: next(e for r in aws.ec2().describe_instances(InstanceIds=[i])["Reservations"]
                                                 for e in r["Instances"])["AmiLaunchIndex"])
        aws.ec2().terminate_instances(InstanceIds=[ordered[1]])
        aws.release()
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_node_lost_while_starting_takes_the_whole_cluster_down(aws, env):
    result = _lose_node_while_starting(aws, env, "aon")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "node 1" in result.stderr and "removing what aon got (all of its nodes)" in result.stdout
    nothing_left(aws)
    assert json.loads(gp(env, "status", "--json").stdout) == []


def test_min_nodes_keeps_the_healthy_nodes_when_one_is_lost(aws, env):
    result = _lose_node_while_starting(aws, env, "keep", "--min-nodes", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dropping node 1" in result.stdout
    row = _cluster(env, "keep")
    assert [m["rank"] for m in row["members"]] == [0, 1] and row["state"] == "ready"
    live = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] != "terminated"]
    assert sorted(i["InstanceId"] for i in live) == sorted(m["instance_id"] for m in row["members"])
    assert gp(env, "down", "keep", "--yes").returncode == 0
    nothing_left(aws)


def test_cluster_bad_input_creates_nothing(aws, env):
    for args, field in ((["--nodes", "2", "--min-nodes", "3"], "--min-nodes"),
                        (["--nodes", "2", "--spot", "--persistent"], "--persistent"),
                        (["--nodes", "500"], "--nodes"),
                        (["--nodes", "2", "--budget", "50"], "--budget")):
        result = gp(env, *up_args("bad", "--gpu", "A10G:4", *args))
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 2 and errors[0].startswith(f"error: {field}:"), result.stderr
        assert "Traceback" not in result.stderr
    assert [(e["action"], e.get("region")) for e in aws.log()] == []
    nothing_left(aws)


def test_up_refuses_the_name_of_a_cluster_of_existing_hosts(aws, env):
    """One name, one cluster: `ssh pair:1` must not change meaning under the user's feet."""
    record = ("from gpuprov import cluster as c; c.save(c.Cluster(name='pair', master_addr='10.9.0.1', master_port=29500,"
              " members=[c.ClusterHost(host=h, address=h, gpus=1) for h in ('10.9.0.1', '10.9.0.2')]))")
    subprocess.run([sys.executable, "-c", record], env=env, check=True)
    result = gp(env, *up_args("pair", "--gpu", "A10G:4", "--nodes", "2"))
    assert result.returncode == 2 and "\nerror: NAME: " in result.stderr, result.stderr
    assert "cluster of existing hosts" in result.stderr and "gpuprov cluster rm pair" in result.stderr
    assert not aws.log("RunInstances")
    nothing_left(aws)
    assert json.loads(gp(env, "cluster", "list", "--json").stdout)[0]["members"][1]["host"] == "10.9.0.2"


# --- crash safety -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("checkpoint", "gpu"), sweep([("RunInstances", "A10G:4"), ("AllocateAddress", "H100:8"),
                                                       ("CreatePlacementGroup", "A10G:4"),
                                                       ("AuthorizeSecurityGroupEgress", "A10G:4"),
                                                       ("AssociateAddress", "H100:8")], 3))
@pytest.mark.parametrize("cleanup", ["down", "gc"])
def test_sigkill_during_a_cluster_up_then_down_or_gc_leaves_nothing(aws, env, checkpoint, gpu, cleanup):
    aws.faults({"action": checkpoint, "hold": True, "times": 1})
    name = f"k{checkpoint.lower()[:8]}"
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args(name, "--gpu", gpu, "--nodes", "2",
                                                                       "--no-bootstrap", "--no-wait")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(r["held"] for r in aws.rules()):  # the cloud did the work; the answer never arrives
            if proc.poll() is not None:
                pytest.fail(f"`up` ended before reaching {checkpoint}: {proc.communicate()}")
            assert time.monotonic() < deadline, f"{checkpoint} never reached"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(10)
        aws.release()
    aws.clear_faults()
    assert aws.leftovers() != EMPTY  # the crash left something that costs or clutters
    result = gp(env, "down", name, "--yes") if cleanup == "down" else gp(env, "gc", "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    assert aws.leftovers() == EMPTY, f"leak after a crash ({cleanup}): {result.stdout}"


# --- bootstrap on real SSH hosts (tests/conftest.py aws_hosts: the addresses moto hands out) -------------------

def _two_hosts(aws, pool, gp_home, fail_node: int | None = None) -> str:
    subnet = launch_site(aws, pool, gp_home)  # node 0 lands on pool[0]
    pool.exec_in(1, "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/*; "
                    "echo 'export GPUPROV_SHIM_GPU=T4' > /var/lib/gpuprov-shim/env", check=True)
    if fail_node is not None:  # that node's GPU never answers: its verify step fails
        pool.exec_in(fail_node, "echo 'export GPUPROV_SHIM_FAIL=no-gpu' >> /var/lib/gpuprov-shim/env", check=True)
    return subnet


BOOT = ("--gpu", "T4", "--connect", "private", "--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11")


SYSROOT = "/var/lib/gpuprov-shim/root"  # tests/conftest.py aws_hosts: the hosts' GPUPROV_SYSROOT


def _wiring(pool, i: int) -> tuple[dict[str, str], list[str]]:
    """Host i's /etc/gpuprov/cluster.env (as KEY -> value) and hostfile lines."""
    env = pool.exec_in(i, f"cat {SYSROOT}/etc/gpuprov/cluster.env", check=True).stdout
    hostfile = pool.exec_in(i, f"cat {SYSROOT}/etc/gpuprov/hostfile", check=True).stdout
    return (dict(line.split("=", 1) for line in env.splitlines() if line and not line.startswith("#")),
            hostfile.splitlines())


def test_cluster_bootstraps_wires_and_checks_every_node_over_ssh_then_down(aws, env, aws_hosts, gp_home):
    subnet = _two_hosts(aws, aws_hosts, gp_home)
    result = gp(env, *up_args("train", *BOOT, "--nodes", "2", "--subnet", subnet), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[node 0]" in result.stdout and "[node 1]" in result.stdout
    assert "up train: ready after" in result.stdout  # where the time went, printed at the end
    row = _cluster(env, "train")
    timeline = json.loads(gp(env, "status", "train", "--timeline", "--json").stdout)
    boot = next(p for p in timeline["phases"] if p["name"] == "bootstrap")  # one row per node, bootstrapped together
    assert sorted(s["name"].split(" (")[0] for s in boot["steps"]) == ["node 0", "node 1"]
    assert {s["outcome"] for s in boot["steps"]} == {"ok"} and timeline["phases"][-1]["name"] == "cluster wiring"
    addresses = [h.address for h in aws_hosts.hosts]
    assert row["state"] == "ready" and [m["address"] for m in row["members"]] == addresses
    for i in range(2):  # each node bootstrapped and verified
        assert aws_hosts.exec_in(i, "ls /var/lib/gpuprov/markers/", check=True).stdout.count("sha256") >= 3
    known = (gp_home / "nodes" / "train" / "known_hosts").read_text()
    assert all(h.address in known for h in aws_hosts.hosts)  # both nodes' host keys pinned
    # wired as `bootstrap --cluster` wires: node 0's private address, the type's GPUs (g4dn: 1 T4) per node
    private = [m["private_ip"] for m in row["members"]]
    assert private == addresses  # the test hosts sit on moto's private addresses
    for i in range(2):
        cluster_env, hostfile = _wiring(aws_hosts, i)
        assert cluster_env == {"GPUPROV_CLUSTER": "train", "MASTER_ADDR": private[0], "MASTER_PORT": "29500",
                               "NNODES": "2", "NODE_RANK": str(i), "NPROC_PER_NODE": "1"}
        assert hostfile == [f"{a} slots=1" for a in private]
    ranks = gp(env, "exec", "train", "--", "echo rank=$NODE_RANK of $NNODES via $MASTER_ADDR")
    assert ranks.returncode == 0, ranks.stderr
    assert sorted(ranks.stdout.splitlines()) == [f"train:{k} | rank={k} of 2 via {private[0]}" for k in range(2)]
    one = gp(env, "exec", "train:1", "--", "hostname")
    assert (one.returncode, one.stdout.strip()) == (0, f"train:1 | {aws_hosts.hosts[1].name}"), one.stderr
    check = gp(env, "check", "train", "--cluster", "--json", "--port-timeout", "2", "--sizes", "64K", timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    out = json.loads(check.stdout)
    pairs = {(r["src"], r["dst"]) for r in out["connectivity"]["results"] if r["outcome"] == "ok"}
    assert pairs == {(0, 1), (1, 0)}  # real bytes both ways between the two hosts
    report = out["allreduce"]["report"]  # the fake torch's all-reduce moved real bytes between the hosts
    assert (report["world"], report["nnodes"], report["nproc_per_node"], report["correct"]) == (2, 2, 1, True)
    assert gp(env, "down", "train", "--yes").returncode == 0
    nothing_left(aws)
    assert not (gp_home / "nodes" / "train").exists() and not (gp_home / "nodes" / "train.1").exists()
    gone = gp(env, "exec", "train", "--", "true")  # the cluster's record went with it
    assert gone.returncode == 2, gone.stdout + gone.stderr


def test_a_node_failing_bootstrap_takes_the_whole_cluster_down(aws, env, aws_hosts, gp_home):
    subnet = _two_hosts(aws, aws_hosts, gp_home, fail_node=1)
    result = gp(env, *up_args("boot", *BOOT, "--nodes", "2", "--subnet", subnet), timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "node 1" in result.stderr and "all of its nodes" in result.stdout
    nothing_left(aws)


def test_min_nodes_drops_a_node_that_fails_bootstrap_and_rewires_the_rest(aws, env, aws_hosts, gp_home):
    subnet = _two_hosts(aws, aws_hosts, gp_home, fail_node=0)
    result = gp(env, *up_args("kept", *BOOT, "--nodes", "2", "--min-nodes", "1", "--subnet", subnet), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dropping node 0" in result.stdout
    (member,) = _cluster(env, "kept")["members"]
    assert member["rank"] == 0 and member["address"] == aws_hosts.hosts[1].address  # the survivor is node 0 now
    live = [i["InstanceId"] for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] != "terminated"]
    assert live == [member["instance_id"]]  # the failed node is gone, not billed
    cluster_env, hostfile = _wiring(aws_hosts, 1)
    assert (cluster_env["NODE_RANK"], cluster_env["NNODES"], cluster_env["MASTER_ADDR"]) == ("0", "1", member["private_ip"])
    assert hostfile == [f"{member['private_ip']} slots=1"]
    ssh = gp(env, "exec", "kept:0", "--", "echo $NODE_RANK/$NNODES")
    assert (ssh.returncode, ssh.stdout) == (0, "kept:0 | 0/1\n"), ssh.stderr
    assert gp(env, "down", "kept", "--yes").returncode == 0
    nothing_left(aws)


@pytest.mark.parametrize("seed", sweep(list(range(1, 7)), 1))  # under the realistic proxy (fresh ids NotFound,
# lagging tags)
def test_sigkill_at_random_instants_of_an_efa_cluster_up_leaves_nothing(aws, env, seed):
    delay = random.Random(seed).uniform(0.5, 4.0)
    name = f"r{seed}"
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args(name, "--gpu", "H100:8", "--nodes", "2",
                                                                       "--no-bootstrap", "--no-wait")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(10)
    result = gp(env, "down", name, "--yes") if seed % 2 else gp(env, "gc", "--yes")
    if seed % 2 and result.returncode == 2 and "no node called" in result.stderr:
        result = gp(env, "gc", "--yes")  # killed before it recorded the node: only gc can know
    if not seed % 2 and any(n["name"] == name for n in json.loads(gp(env, "status", "--json").stdout)):
        result = gp(env, "down", name, "--yes")  # `up` had finished: a live cluster, not an orphan
    assert result.returncode == 0, result.stdout + result.stderr
    assert aws.leftovers() == EMPTY, f"leak after a crash at {delay:.2f}s: {result.stdout}"


@pytest.mark.instant_aws  # about tags, not their lag (test_aws_ec2_behaviour.py covers lagging tag listings)
def test_gc_finds_a_cluster_whose_local_state_was_lost_by_its_tags(aws, env, tmp_path):
    assert gp(env, *up_args("lost", "--gpu", "H100:8", "--nodes", "2", "--no-bootstrap", "--no-wait")).returncode == 0
    elsewhere = {**env, "GPUPROV_HOME": str(tmp_path / "other-machine")}  # no records: tags are all there is
    listed = gp(elsewhere, "gc", "--json", "--all-installs")  # its install id went with the state folder
    kinds = sorted(r["kind"] for r in json.loads(listed.stdout)["found"] if r["node"] == "lost")
    assert kinds.count("instance") == 2 and "placement-group" in kinds and kinds.count("address") == 2, kinds
    result = gp(elsewhere, "gc", "--yes", "--all-installs")
    assert result.returncode == 0, result.stdout + result.stderr
    left = aws.leftovers()
    assert {k: v for k, v in left.items() if k != "key_pairs"} == {k: [] for k in left if k != "key_pairs"}
