"""Getting capacity (issue 27) through the real CLI against moto behind the fault proxy: `up --wait` asking again
until capacity appears (nothing left between passes), `status` while it waits, a SIGTERM mid-wait."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from tests.aws.cli import gp, nothing_left, up_args

NO_WAIT = ("--no-bootstrap", "--no-wait")
ONE_TYPE = ("--gpu", "T4", "--max-hourly", "0.6")  # g4dn.xlarge ($0.526/h) alone: one candidate per zone
ICE = {"action": "RunInstances", "code": "InsufficientInstanceCapacity",
       "message": "We currently do not have sufficient g4dn.xlarge capacity in the Availability Zone you requested."}


def _zones(aws, instance_type: str = "g4dn.xlarge") -> list[str]:
    found = aws.ec2().describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}])
    return sorted(o["Location"] for o in found["InstanceTypeOfferings"])


def _done(aws, action: str) -> list[dict]:
    return [e for e in aws.log(action) if e["status"] == 200]


def test_up_wait_asks_again_until_capacity_appears_and_leaves_nothing_between_passes(aws, env):
    zones = _zones(aws)
    aws.faults({**ICE, "times": 3 * len(zones)})  # three whole passes refused, the fourth's first ask granted
    result = gp({**env, "GPUPROV_WAIT_BACKOFF_SECONDS": "0.05"},
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


def test_status_shows_a_waiting_up_and_sigterm_mid_wait_leaves_nothing(aws, env):
    aws.faults(ICE)  # no capacity at all
    proc = subprocess.Popen([sys.executable, "-m", "gpuprov", *up_args("waits", *ONE_TYPE, "--wait", "2h", *NO_WAIT)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "GPUPROV_WAIT_BACKOFF_SECONDS": "60"})
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
