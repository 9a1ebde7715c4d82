"""Keep the disk, stop the bill (issue 11): stop, start, resize, persistent spot, autostop that stops, a TTL
that changes, a budget. The real CLI against moto behind the realistic fault proxy; nodes that must be
reached land on the SSH test hosts (`aws_hosts` + `launch_site`). Each test ends with nothing left."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests import forkcli
from tests.aws.cli import gp, launch_site, nothing_left, up_args

NO_WAIT = ("--no-bootstrap", "--no-wait")
ON_HOST = ("--connect", "private", "--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11")
SYSROOT = "/var/lib/gpuprov-shim/root"


def node(env, name: str) -> dict:
    (found,) = [n for n in json.loads(gp(env, "status", "--json").stdout) if n["name"] == name]
    return found


def instance(aws) -> dict:
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]
               if i["State"]["Name"] != "terminated"]
    return inst


def test_stop_status_start_check_and_an_autostop_that_stops(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)
    up = gp(env, *up_args("day", "--gpu", "T4", "--subnet", subnet, *ON_HOST, "--autostop", "30m", "--locked"))
    assert up.returncode == 0, up.stdout + up.stderr
    run = aws.log("RunInstances")[-1]["form"]
    assert run["InstanceInitiatedShutdownBehavior"] == "stop"  # the guards' shutdown keeps the disk
    assert "the instance stops (its disk is kept)" in pool.exec_in(
        0, f"cat {SYSROOT}/etc/gpuprov/autostop.conf", check=True).stdout
    assert node(env, "day")["autostop_action"] == "stop"
    assert "30m idle → stop (locked)" in gp(env, "status").stdout
    # local state: the lock is this install's own (its owner id), so its own `ttl` below goes through
    locked = node(env, "day")
    assert locked["guards_locked_by"] == locked["owner"] and locked["owner"].endswith(
        (gp_home / "install-id").read_text().strip())
    # the on-node check, with its clock injected, calls for a shutdown after the idle window
    check = f"{SYSROOT}/usr/local/lib/gpuprov/autostop-check"
    for now in (3_000_000, 3_001_800):
        pool.exec_in(0, check, env={"GPUPROV_SYSROOT": SYSROOT, "GPUPROV_NOW": str(now)}, check=True)
    calls = pool.exec_in(0, "cat /var/lib/gpuprov-shim/calls.log").stdout.splitlines()
    assert "shutdown -h now gpuprov autostop: idle for 1800s" in calls

    # `gpuprov ttl` changes the deadline on the node
    ttl = gp(env, "ttl", "day", "4h")
    assert ttl.returncode == 0, ttl.stdout + ttl.stderr
    seconds, deadline = pool.exec_in(0, f"cat {SYSROOT}/var/lib/gpuprov/ttl-deadline", check=True).stdout.split()
    assert seconds == "14400" and abs(int(deadline) - (time.time() + 14400)) < 120
    assert 4 * 3600 - 120 < node(env, "day")["ttl_left_seconds"] <= 4 * 3600

    stop = gp(env, "stop", "day")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "day: stopped; its 100 GB disk costs $8.00/month while stopped" in stop.stdout
    assert aws.log("StopInstances") and instance(aws)["State"]["Name"] == "stopped"
    row = node(env, "day")
    assert row["state"] == "stopped" and row["storage_usd_month"] == 8.0
    assert "aws.amazon.com/ebs/pricing" in row["storage_price"]["source"]
    human = gp(env, "status").stdout
    assert "stopped (disk $8.00/month)" in " ".join(human.split()) and "gp3 $0.08/GB-month" in human
    assert gp(env, "ttl", "day", "1h").returncode == 2  # a stopped node cannot be reached

    start = gp(env, "start", "day")
    assert start.returncode == 0, start.stdout + start.stderr
    assert "day is ready: g4dn.xlarge" in start.stdout and "$0.53/h" in start.stdout
    assert "bootstrapping again" in start.stdout and "verify: ok" in start.stdout
    assert instance(aws)["State"]["Name"] == "running" and node(env, "day")["state"] == "ready"
    assert f"HostName {pool[0].address}" in (gp_home / "ssh_config").read_text()
    check = gp(env, "check", "day", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    assert gp(env, "down", "day", "--yes").returncode == 0
    nothing_left(aws)


def test_one_time_spot_node_cannot_stop_and_is_offered_down(aws, env):
    assert gp(env, *up_args("sp", "--gpu", "T4", "--spot", *NO_WAIT)).returncode == 0
    run = aws.log("RunInstances")[-1]["form"]
    assert run["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert run["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert node(env, "sp")["autostop_action"] == "terminate"
    refused = gp(env, "stop", "sp")
    assert refused.returncode == 2
    assert "one-time spot instance, which EC2 cannot stop" in refused.stderr
    assert "gpuprov down sp" in refused.stderr and "--spot --persistent" in refused.stderr
    assert not aws.log("StopInstances") and node(env, "sp")["state"] == "ready"
    stop_action = gp(env, "up", "x", "--yes", "--gpu", "T4", "--spot", "--autostop", "1h", "--autostop-action", "stop")
    assert stop_action.returncode == 2 and "--persistent" in stop_action.stderr
    assert gp(env, "down", "sp", "--yes").returncode == 0
    nothing_left(aws)


def test_persistent_spot_request_stops_and_a_budget_is_a_deadline_at_the_spot_price(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)
    aws.set_spot_prices({("g4dn.xlarge", "us-east-1a"): 0.25})
    up = gp(env, *up_args("keep", "--gpu", "T4", "--spot", "--persistent", "--budget", "5", "--subnet", subnet,
                          *ON_HOST))
    assert up.returncode == 0, up.stdout + up.stderr
    run = [e for e in aws.log("RunInstances") if e["status"] == 200][-1]["form"]
    assert run["InstanceMarketOptions.MarketType"] == "spot"
    assert run["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "persistent"
    assert run["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "stop"
    assert run["InstanceInitiatedShutdownBehavior"] == "stop"
    # $5 at the $0.25/h spot price obtained: 20 hours, kept on the node like a TTL
    assert "budget $5 at $0.25/h (spot): 20.0h" in up.stdout
    seconds, deadline = pool.exec_in(0, f"cat {SYSROOT}/var/lib/gpuprov/ttl-deadline", check=True).stdout.split()
    assert seconds == "72000" and abs(int(deadline) - (time.time() + 72000)) < 300
    row = node(env, "keep")
    assert row["budget_usd"] == 5 and 4.9 < row["budget_left_usd"] <= 5.0 and row["spot_type"] == "persistent"
    assert "of $5 left" in gp(env, "status").stdout
    stop = gp(env, "stop", "keep")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert node(env, "keep")["state"] == "stopped"
    resize = gp(env, "start", "keep", "--instance-type", "g5.xlarge")
    assert resize.returncode == 2 and "spot instance, whose type EC2 cannot change" in resize.stderr
    assert not aws.log("ModifyInstanceAttribute") and node(env, "keep")["state"] == "stopped"
    down = gp(env, "down", "keep", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    nothing_left(aws)  # moto makes no spot request for RunInstances: the cancel-first order is in test_lifecycle_unit


def test_plan_estimates_hours_and_a_budget_before_launch(aws, env):
    result = gp(env, "plan", "--gpu", "T4", "--hours", "10", "--budget", "50", "--json")
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)["estimate"]
    assert estimate["usd_on_demand"] == 5.26 and estimate["budget_hours"] == pytest.approx(95.06, abs=0.01)
    human = gp(env, "plan", "--gpu", "T4", "--spot", "--persistent", "--autostop", "30m", "--budget", "50")
    assert human.returncode == 0, human.stderr
    assert "budget $50 lasts 95.1h at $0.526/h; then the instance stops (its disk is kept)" in human.stdout
    assert "on spot the deadline comes from the spot price obtained at launch" in human.stdout
    guards = json.loads(gp(env, "plan", "--gpu", "T4", "--autostop", "30m", "--json").stdout)["guards"]
    assert guards["shutdown_action"] == "stop"
    assert aws.log() == []


def _stopped(env, name: str) -> None:
    assert gp(env, *up_args(name, "--gpu", "T4", *NO_WAIT)).returncode == 0
    stop = gp(env, "stop", name)
    assert stop.returncode == 0, stop.stdout + stop.stderr


def test_resize_is_refused_before_anything_changes_when_the_stack_cannot_serve(aws, env):
    _stopped(env, "rs")
    # the node has driver R595 (open module); V100 is capped at R580 and has no open module
    refused = gp(env, "start", "rs", "--instance-type", "p3dn.24xlarge")  # P3 itself is retired: refused for that
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "rs has driver R595 (open kernel module)" in refused.stderr and "V100" in refused.stderr
    assert "gpuprov up NAME --gpu V100" in refused.stderr
    by_gpu = gp(env, "start", "rs", "--gpu", "V100")  # the refusal blames the flag given
    assert by_gpu.returncode == 2 and by_gpu.stderr.startswith("error: --gpu: rs has driver R595"), by_gpu.stderr
    assert not aws.log("ModifyInstanceAttribute") and not aws.log("StartInstances")
    assert (node(env, "rs")["state"], instance(aws)["InstanceType"]) == ("stopped", "g4dn.xlarge")
    # A10G on g5: the same driver branch, module and wheel serve it
    resized = gp(env, "start", "rs", "--gpu", "A10G", "--no-bootstrap", "--yes")
    assert resized.returncode == 0, resized.stdout + resized.stderr
    assert "rs is ready: g5.xlarge (was g4dn.xlarge)" in resized.stdout and "$1.01/h" in resized.stdout
    assert aws.log("ModifyInstanceAttribute")[-1]["form"]["InstanceType.Value"] == "g5.xlarge"
    assert instance(aws)["InstanceType"] == "g5.xlarge"
    row = node(env, "rs")
    assert (row["state"], row["instance_type"], row["gpu"], row["price_usd_hour"]) == ("ready", "g5.xlarge", "A10G", 1.006)
    assert gp(env, "down", "rs", "--yes").returncode == 0
    nothing_left(aws)


def test_capacity_refusal_on_start_leaves_the_node_stopped_as_it_was(aws, env):
    _stopped(env, "cap")
    aws.faults({"action": "StartInstances", "code": "InsufficientInstanceCapacity",
                "message": "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested"})
    refused = gp(env, "start", "cap", "--instance-type", "g5.xlarge", "--no-bootstrap", "--yes")
    assert refused.returncode == 1
    assert "InsufficientInstanceCapacity: We currently do not have sufficient g5.xlarge capacity" in refused.stderr
    assert "cap stays stopped as g4dn.xlarge" in refused.stderr and "Traceback" not in refused.stderr
    assert len([e for e in aws.log("StartInstances") if e["outcome"] == "fault"]) == 1  # a 500, asked once
    assert (instance(aws)["State"]["Name"], instance(aws)["InstanceType"]) == ("stopped", "g4dn.xlarge")
    row = node(env, "cap")
    assert (row["state"], row["instance_type"]) == ("stopped", "g4dn.xlarge")
    aws.clear_faults()
    assert gp(env, "start", "cap", "--no-bootstrap").returncode == 0
    assert gp(env, "down", "cap", "--yes").returncode == 0
    nothing_left(aws)


@pytest.mark.parametrize("checkpoint", ["ModifyInstanceAttribute", "StartInstances"])
@pytest.mark.parametrize("then", ["start", "down"])
def test_sigkill_during_start_with_a_resize_leaves_a_node_start_or_down_completes(aws, env, checkpoint, then):
    name = f"k-{checkpoint[:5].lower()}-{then}"
    _stopped(env, name)
    aws.faults({"action": checkpoint, "hold": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "start", name, "--instance-type", "g5.xlarge", "--yes",
                             "--no-bootstrap"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(r["held"] for r in aws.rules()):  # EC2 did it; the answer never arrives
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"{checkpoint} never reached"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(10)
        aws.release()
    aws.clear_faults()
    assert node(env, name)["state"] in ("resizing", "starting")
    if then == "start":
        again = gp(env, "start", name, "--no-bootstrap")
        assert again.returncode == 0, again.stdout + again.stderr
        row = node(env, name)
        assert (row["state"], row["instance_type"]) == ("ready", "g5.xlarge")
        assert (instance(aws)["State"]["Name"], instance(aws)["InstanceType"]) == ("running", "g5.xlarge")
    assert gp(env, "gc").stdout.startswith("nothing to collect")  # a half-started node is not an orphan
    down = gp(env, "down", name, "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    nothing_left(aws)


def test_status_refresh_shows_a_node_its_guards_stopped_and_start_brings_it_back(aws, env):
    assert gp(env, *up_args("idle", "--gpu", "T4", *NO_WAIT)).returncode == 0
    aws.ec2().stop_instances(InstanceIds=[instance(aws)["InstanceId"]])  # the autostop's shutdown, behaviour stop
    (row,) = json.loads(gp(env, "status", "--refresh", "--json").stdout)
    assert row["state"] == "stopped" and row["storage_usd_month"] == 8.0
    start = gp(env, "start", "idle", "--no-bootstrap")
    assert start.returncode == 0, start.stdout + start.stderr
    assert node(env, "idle")["state"] == "ready" and instance(aws)["State"]["Name"] == "running"
    assert gp(env, "down", "idle", "--yes").returncode == 0
    nothing_left(aws)
