"""The AWS lifecycle through boto3 against a moto server behind the fault-injecting proxy.

Each test runs the real CLI in a subprocess and ends by asserting that nothing tagged as ours
is left in the endpoint.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import forkcli
from tests.aws.cli import EMPTY, gp, launch_site, nothing_left, up_args
from tests.conftest import sweep


def test_up_spot_bootstrap_check_status_down_leaves_nothing(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    keys = gp_home / "keys" / "us-east-1"
    subnet = launch_site(aws, pool, gp_home)

    result = gp(env, *up_args("demo", "--gpu", "T4", "--spot", "--subnet", subnet, "--connect", "private",
                              "--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo is ready" in result.stdout and "ssh gpuprov-demo" in result.stdout
    assert pool[0].address in result.stdout

    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert inst["InstanceLifecycle"] == "spot" and inst["InstanceType"] == "g4dn.xlarge"
    assert inst["MetadataOptions"]["HttpTokens"] == "required"
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags["gpuprov:node"] == "demo" and "gpuprov:owner" in tags
    run = aws.log("RunInstances")[0]["form"]
    assert run["ClientToken"].startswith("gpuprov-demo-")
    assert run["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert run["BlockDeviceMapping.1.Ebs.Encrypted"] == "true" and run["BlockDeviceMapping.1.Ebs.VolumeType"] == "gp3"
    (group,) = aws.ec2().describe_security_groups(Filters=[{"Name": "tag:gpuprov:node", "Values": ["demo"]}])[
        "SecurityGroups"]
    (rule,) = group["IpPermissions"]
    assert (rule["FromPort"], [r["CidrIp"] for r in rule["IpRanges"]]) == (22, ["198.51.100.7/32"])
    assert oct((keys / "id_ed25519").stat().st_mode & 0o777) == "0o600"

    status = json.loads(gp(env, "status", "--json").stdout)
    assert [(n["name"], n["state"], n["instance_type"], n["market"]) for n in status] == [
        ("demo", "ready", "g4dn.xlarge", "spot")]
    check = gp(env, "check", "demo", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)[0]["report"]["gpus"][0]["name"] == "Tesla T4"
    ssh_config = (gp_home / "ssh_config").read_text()
    assert "Host gpuprov-demo" in ssh_config and f"HostName {pool[0].address}" in ssh_config
    assert "Include" in (Path(env["HOME"]) / ".ssh" / "config").read_text()

    down = gp(env, "down", "demo", "--yes")
    assert down.returncode == 0, down.stderr
    nothing_left(aws)
    assert "gpuprov-demo" not in (gp_home / "ssh_config").read_text()
    again = gp(env, "down", "demo", "--yes")  # idempotent: the instance is already gone
    assert again.returncode == 0 and "0 resources removed" in again.stdout
    unknown = gp(env, "down", "nosuch", "--yes")
    assert unknown.returncode == 2 and "no node called 'nosuch'" in unknown.stderr
    assert json.loads(gp(env, "status", "--json").stdout) == []


def test_failover_prints_each_aws_code_and_lands_on_the_next_candidate(aws, env):
    aws.faults([
        {"action": "RunInstances", "match": {"Placement.AvailabilityZone": "us-east-1a"}, "status": 500,
         "code": "InsufficientInstanceCapacity",
         "message": "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested"},
        {"action": "RunInstances", "match": {"Placement.AvailabilityZone": "us-east-1b"}, "status": 400,
         "code": "SpotMaxPriceTooLow", "message": "Your Spot request price of 0.1 is lower than the minimum"},
    ])
    result = gp(env, *up_args("fo", "--gpu", "A10G", "--spot", "--no-bootstrap", "--no-wait"))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.index("InsufficientInstanceCapacity") < out.index("SpotMaxPriceTooLow")
    assert "sufficient g5.xlarge capacity" in out
    zones = [e["form"]["Placement.AvailabilityZone"] for e in aws.log("RunInstances")]
    assert zones[0] == "us-east-1a" and "us-east-1b" in zones and zones[-1] not in ("us-east-1a", "us-east-1b")
    assert json.loads(gp(env, "status", "--json").stdout)[0]["zone"] == zones[-1]
    assert gp(env, "down", "fo", "--yes").returncode == 0
    nothing_left(aws)


def test_spot_exhausted_falls_back_to_on_demand_only_when_asked(aws, env):
    aws.faults({"action": "RunInstances", "match": {"InstanceMarketOptions.MarketType": "spot"}, "status": 500,
                "code": "InsufficientInstanceCapacity", "message": "no spot capacity"})
    refused = gp(env, *up_args("sp", "--gpu", "L4", "--spot", "--no-bootstrap", "--no-wait"))
    assert refused.returncode == 1 and "--fallback on-demand" in refused.stderr
    nothing_left(aws)
    landed = gp(env, *up_args("sp", "--gpu", "L4", "--spot", "--fallback", "on-demand", "--no-bootstrap", "--no-wait"))
    assert landed.returncode == 0, landed.stderr
    markets = [e["form"].get("InstanceMarketOptions.MarketType", "on-demand") for e in aws.log("RunInstances")]
    assert markets[-1] == "on-demand" and "spot" in markets
    assert gp(env, "down", "--all", "--yes").returncode == 0
    nothing_left(aws)


def test_p5_spot_quota_error_names_the_p5_quota_and_stops(aws, env):
    # AWS's quota table: P5 spot is "All P5 Spot Instance Requests", L-C4BD4855; P4/P3/P2 spot has room
    aws.set_quota("L-C4BD4855", 0)
    aws.set_quota("L-7212CCBC", 1536)
    aws.faults({"action": "RunInstances", "status": 400, "code": "VcpuLimitExceeded",
                "message": "You have requested more vCPU capacity than your current vCPU limit of 0 allows"})
    result = gp(env, *up_args("q", "--gpu", "H100:8", "--spot", "--no-bootstrap", "--no-wait"))
    assert result.returncode == 1
    assert "All P5 Spot Instance Requests' (L-C4BD4855)" in result.stderr and "current value is 0" in result.stderr
    assert "--quota-code L-C4BD4855 --desired-value 192 " in result.stderr and "L-7212CCBC" not in result.stderr
    assert len(aws.log("RunInstances")) == 1  # no pointless failover
    nothing_left(aws)


def test_permission_error_stops_at_once_with_a_fix(aws, env):
    aws.faults({"action": "RunInstances", "status": 403, "code": "UnauthorizedOperation",
                "message": "You are not authorized to perform this operation."})
    result = gp(env, *up_args("p", "--gpu", "T4", "--no-bootstrap", "--no-wait"))
    assert result.returncode == 1
    assert "UnauthorizedOperation" in result.stderr and "IAM" in result.stderr
    assert len(aws.log("RunInstances")) == 1
    nothing_left(aws)


def test_throttling_is_retried_by_botocore(aws, env):
    aws.faults({"action": "DescribeInstanceTypeOfferings", "status": 503, "code": "RequestLimitExceeded",
                "message": "Request limit exceeded.", "times": 1})
    result = gp(env, *up_args("t", "--gpu", "T4", "--no-bootstrap", "--no-wait"))
    assert result.returncode == 0, result.stderr
    assert len(aws.log("DescribeInstanceTypeOfferings")) == 2
    assert gp(env, "down", "t", "--yes").returncode == 0
    nothing_left(aws)


@pytest.mark.parametrize(("args", "needle"), [
    (["--gpu", "T4", "--region", "us-east-9"], "--region"),
    (["--gpu", "A1000"], "--gpu"),
    (["--gpu", "V100", "--torch-cuda", "cu130"], "--torch-cuda"),
])
def test_bad_input_creates_nothing(aws, env, args, needle):
    result = gp(env, *up_args("bad", *args))
    assert result.returncode == 2 and result.stderr.startswith(f"error: {needle}")
    assert aws.log() == []  # not one AWS call
    nothing_left(aws)


def test_no_credentials_says_how_to_configure(aws, env):
    env = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    result = gp(env, *up_args("nc", "--gpu", "T4", "--no-bootstrap", "--no-wait"))
    assert result.returncode == 2
    assert "aws configure" in result.stderr and "Traceback" not in result.stderr
    nothing_left(aws)


def test_gpus_live_shows_spot_prices_cheapest_first_with_saving(aws, env):
    aws.set_spot_prices({("g5.xlarge", "us-east-1a"): 0.4521, ("g5.xlarge", "us-east-1b"): 0.3804,
                         ("g6.xlarge", "us-east-1a"): 0.2911})
    data = json.loads(gp(env, "gpus", "--live", "--json").stdout)
    assert [(r["instance_type"], r["zone"]) for r in data][:3] == [
        ("g6.xlarge", "us-east-1a"), ("g5.xlarge", "us-east-1b"), ("g5.xlarge", "us-east-1a")]
    assert data[0]["saving_pct"] == pytest.approx((1 - 0.2911 / 0.8048) * 100, abs=0.1)


# --- crash safety --------------------------------------------------------------------------------

CHECKPOINTS = ["ImportKeyPair", "CreateSecurityGroup", "AuthorizeSecurityGroupIngress", "RunInstances",
               "DescribeInstances"]


def _crash_then_clean(aws, env, name: str, kill: callable, cleanup: str) -> None:
    args = up_args(name, "--gpu", "T4", "--spot", "--no-bootstrap", "--no-wait")
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", *args], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        kill(proc)
    finally:
        proc.kill()
        proc.wait(10)
        aws.release()
    aws.clear_faults()
    result = gp(env, "down", name, "--yes") if cleanup == "down" else gp(env, "gc", "--yes")
    if cleanup == "down" and result.returncode == 2 and "no node called" in result.stderr:
        result = gp(env, "gc", "--yes")  # killed before it recorded the node: only gc can know
    if cleanup == "gc" and any(n["name"] == name for n in json.loads(gp(env, "status", "--json").stdout)):
        assert gc_kept_a_finished_node(env, name)
        result = gp(env, "down", name, "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    assert aws.leftovers() == EMPTY, f"leak after a crash ({cleanup}): {result.stdout}"


def gc_kept_a_finished_node(env, name: str) -> bool:
    """gc must not take a node whose `up` finished before the kill: it is live, not an orphan."""
    (node,) = [n for n in json.loads(gp(env, "status", "--json").stdout) if n["name"] == name]
    return node["state"] == "ready"


@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
@pytest.mark.parametrize("cleanup", ["down", "gc"])
def test_sigkill_at_every_checkpoint_leaves_nothing_after_down_or_gc(aws, env, checkpoint, cleanup):
    aws.faults({"action": checkpoint, "hold": True, "times": 1})

    def kill(proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + 60
        while not any(r["held"] for r in aws.rules()):  # the cloud has done the work; the answer never arrives
            if proc.poll() is not None:
                pytest.fail(f"`up` ended before reaching {checkpoint}: {proc.communicate()}")
            assert time.monotonic() < deadline, f"{checkpoint} never reached"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)

    _crash_then_clean(aws, env, f"crash-{checkpoint.lower()[:12]}", kill, cleanup)


@pytest.mark.parametrize("seed", sweep(list(range(1, 24)), 2))  # under the realistic proxy (fresh ids NotFound,
# lagging tags); the checkpoint test above stops at every call, these between them
def test_sigkill_at_random_instants_leaves_nothing(aws, env, seed):
    delay = random.Random(seed).uniform(0.3, 2.5)

    def kill(proc: subprocess.Popen) -> None:
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)

    _crash_then_clean(aws, env, f"rand-{seed}", kill, "down" if seed % 2 else "gc")


def test_concurrent_ups_share_one_key_pair_and_both_land(aws, env):
    procs = [forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args(f"c{i}", "--gpu", "T4", "--no-bootstrap", "--no-wait")],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert len(aws.log("ImportKeyPair")) == 1
    assert sorted(n["name"] for n in json.loads(gp(env, "status", "--json").stdout)) == ["c0", "c1", "c2"]
    assert gp(env, "down", "--all", "--yes").returncode == 0
    nothing_left(aws)


def test_status_refresh_shows_an_interrupted_spot_node_with_ec2_reason(aws, env):
    assert gp(env, *up_args("sp", "--gpu", "T4", "--spot", "--no-bootstrap", "--no-wait")).returncode == 0
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    aws.ec2().terminate_instances(InstanceIds=[inst["InstanceId"]])  # stands in for a spot interruption
    aws.ec2().describe_instances()  # moto moves shutting-down -> terminated on the next describe
    (node,) = json.loads(gp(env, "status", "--refresh", "--json").stdout)
    assert node["state"] == "interrupted" and node["state_reason"]
    human = gp(env, "status")
    assert "interrupted" in human.stdout
    assert gp(env, "down", "sp", "--yes").returncode == 0
    nothing_left(aws)


def test_gc_lists_without_yes_and_deletes_with_it(aws, env):
    assert gp(env, *up_args("keep", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    # a resource tagged as ours that no local node owns (another machine's lost state, say)
    ec2 = aws.ec2()
    owner = next(t["Value"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
                 for t in i["Tags"] if t["Key"] == "gpuprov:owner")
    stray = ec2.create_security_group(GroupName="stray", Description="x", TagSpecifications=[{
        "ResourceType": "security-group",
        "Tags": [{"Key": "gpuprov:node", "Value": "ghost"}, {"Key": "gpuprov:owner", "Value": owner}]}])["GroupId"]
    listed = gp(env, "gc")
    assert listed.returncode == 0 and stray in listed.stdout and "--yes" in listed.stdout
    assert "keep" not in listed.stdout  # a live node's resources are not orphans
    assert stray in aws.leftovers()["security_groups"]
    assert gp(env, "gc", "--yes").returncode == 0
    assert stray not in aws.leftovers()["security_groups"]
    assert json.loads(gp(env, "status", "--json").stdout)[0]["state"] == "ready"
    assert gp(env, "down", "keep", "--yes").returncode == 0
    nothing_left(aws)


def test_gpu_not_offered_where_asked_creates_nothing(aws, env):
    subnet = aws.subnet_for_hosts("10.221.0.0/24", "us-east-1e")  # p4d.24xlarge is offered in 1a-1d only
    result = gp(env, *up_args("nope", "--gpu", "A100:8", "--subnet", subnet, "--no-bootstrap", "--no-wait"))
    assert result.returncode == 2 and "us-east-1e" in result.stderr
    assert not aws.log("RunInstances") and not aws.log("CreateSecurityGroup")
    nothing_left(aws)


def test_up_with_guardrails_then_autostop_change_shows_in_status(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)
    result = gp(env, *up_args("guarded", "--gpu", "T4", "--spot", "--subnet", subnet, "--connect", "private",
                              "--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11", "--autostop", "30m",
                              "--ttl", "8h", "--on-interrupt", "echo saved"))
    assert result.returncode == 0, result.stdout + result.stderr
    sysroot = "/var/lib/gpuprov-shim/root"
    conf = pool.exec_in(0, f"cat {sysroot}/etc/gpuprov/autostop.conf", check=True).stdout
    assert "IDLE_SECONDS=1800" in conf
    assert pool.exec_in(0, f"test -s {sysroot}/var/lib/gpuprov/ttl-deadline").returncode == 0
    assert "echo saved" in pool.exec_in(0, f"cat {sysroot}/etc/gpuprov/on-interrupt", check=True).stdout

    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert node["autostop_seconds"] == 1800 and 8 * 3600 - 120 < node["ttl_left_seconds"] <= 8 * 3600
    changed = gp(env, "autostop", "guarded", "2h")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "IDLE_SECONDS=7200" in pool.exec_in(0, f"cat {sysroot}/etc/gpuprov/autostop.conf", check=True).stdout
    assert json.loads(gp(env, "status", "--json").stdout)[0]["autostop_seconds"] == 7200
    assert "2h" in gp(env, "status").stdout
    assert gp(env, "down", "guarded", "--yes").returncode == 0
    nothing_left(aws)
