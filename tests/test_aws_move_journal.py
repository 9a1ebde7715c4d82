"""A `start --move` killed mid-way (issue 35 §2): its journal tells the next command whether to finish the move or
undo it. The real CLI against moto behind the fault proxy, killed (SIGKILL, SIGTERM) at a chosen request: once the
new instance runs, it is kept and the move finished (`status --refresh` names it, `stop` stops it, `start`
finishes), `down` never advised; before, what the move made is taken back and the node stays stopped where it was.
A `start` (resized first) killed once EC2 started the instance: `stop` stops it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests import forkcli
from tests.aws.cli import gp, nothing_left, up_args

NO_WAIT = ("--no-bootstrap", "--no-wait")
ONE_TYPE = ("--gpu", "T4", "--max-hourly", "0.6")  # g4dn.xlarge alone


def _instances(aws, region: str = "us-east-1") -> dict[str, dict]:
    return {i["InstanceId"]: i for r in aws.ec2(region).describe_instances()["Reservations"] for i in r["Instances"]}


def _images(aws, region: str) -> list[str]:
    return [i["ImageId"] for i in aws.ec2(region).describe_images(Owners=["self"])["Images"]]


def _row(env, name: str) -> dict:
    (found,) = [n for n in json.loads(gp(env, "status", "--refresh", "--json").stdout) if n["name"] == name]
    return found


def _stopped_node(aws, env, name: str) -> dict:
    made = gp(env, *up_args(name, *ONE_TYPE, *NO_WAIT))
    assert made.returncode == 0, made.stdout + made.stderr
    assert gp(env, "stop", name).returncode == 0
    (old,) = [i for i in _instances(aws).values() if i["State"]["Name"] == "stopped"]
    return old


def _killed(aws, env, sig: signal.Signals, *start: str) -> tuple[int, str]:
    """`start NAME …` run until the paused (or held) request is on its way, then sent `sig`; its exit code and
    output."""
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "start", *start, "--no-bootstrap"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        aws.wait_held(1, timeout=180)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return proc.returncode, out + err


@pytest.mark.parametrize(("sig", "region"), [(signal.SIGKILL, None), (signal.SIGTERM, None),
                                             (signal.SIGKILL, "us-west-2")],
                         ids=["sigkill-zone", "sigterm-zone", "sigkill-region"])
def test_a_move_killed_once_its_new_instance_runs_is_finished_never_undone(aws, env, sig, region):
    name = "mv"
    old = _stopped_node(aws, env, name)
    home = old["Placement"]["AvailabilityZone"]
    to = region or "us-east-1"
    # the old instance's retirement is paused on its way: the new one runs, the old one is not yet terminated
    aws.faults({"action": "TerminateInstances", "pause": True, "times": 1, "match": {"InstanceId.1": old["InstanceId"]}})
    flags = ("--region", region) if region else ()
    code, said = _killed(aws, env, sig, name, "--move", *flags)
    assert code == -signal.SIGKILL if sig == signal.SIGKILL else code == 128 + signal.SIGTERM, said
    assert "Traceback" not in said, said
    if sig == signal.SIGTERM:  # the last line says the move is half done, and how to go on
        assert f"run: gpuprov start {name} (finishes the move)" in said, said
    (new,) = [i for i in _instances(aws, to).values() if i["State"]["Name"] == "running"]
    assert _instances(aws)[old["InstanceId"]]["State"]["Name"] == "stopped"  # not yet retired

    # status --refresh names the move and the running instance (not `stopped`, nor `gone`)
    row = _row(env, name)
    assert row["state"] == "moving", row
    assert f"new instance {new['InstanceId']} running in {new['Placement']['AvailabilityZone']}" in row["state_reason"]
    assert "old one not yet retired" in row["state_reason"]
    assert row["journal"]["new_instance"] == new["InstanceId"] and row["journal"]["old_instance"] == old["InstanceId"]
    table = gp(env, "status", "--refresh")
    assert "moving" in table.stdout and "gpuprov down" not in table.stdout + table.stderr

    # stop stops the instance that runs: the new one, kept; nothing is said to be stopped that runs
    stopped = gp(env, "stop", name)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "already stopped" not in stopped.stdout and f"gpuprov start {name}" in stopped.stdout
    assert "gpuprov down" not in stopped.stdout + stopped.stderr
    assert _instances(aws, to)[new["InstanceId"]]["State"]["Name"] == "stopped"
    assert _instances(aws)[old["InstanceId"]]["State"]["Name"] == "stopped"
    row = _row(env, name)
    assert row["state"] == "moving" and f"{new['InstanceId']} stopped" in row["state_reason"], row

    # its new zone is full when it starts again: refused, the new instance kept, stopped; never `down`
    aws.faults({"action": "StartInstances", "code": "InsufficientInstanceCapacity", "times": 1,
                "message": "We currently do not have sufficient g4dn.xlarge capacity in the Availability Zone you "
                           "requested."})
    refused = gp(env, "start", name, "--no-bootstrap")
    assert refused.returncode == 1 and f"{name} stays moving, its new instance stopped and kept" in refused.stderr, \
        refused.stdout + refused.stderr
    assert "gpuprov down" not in refused.stdout + refused.stderr and "Traceback" not in refused.stderr
    assert _instances(aws, to)[new["InstanceId"]]["State"]["Name"] == "stopped"

    # start finishes the move: the new instance (its disk the copy) started and kept, the old one retired
    started = gp(env, "start", name, "--no-bootstrap")
    assert started.returncode == 0, started.stdout + started.stderr
    assert "gpuprov down" not in started.stdout + started.stderr
    now = _instances(aws, to)
    assert now[new["InstanceId"]]["State"]["Name"] == "running"
    assert [i for i in now.values() if i["State"]["Name"] != "terminated"] == [now[new["InstanceId"]]]
    assert _instances(aws)[old["InstanceId"]]["State"]["Name"] == "terminated"
    assert _images(aws, "us-east-1") == [] and _images(aws, to) == []  # the move's image (and copy) gone
    row = _row(env, name)
    assert (row["state"], row["region"], row["zone"], row["journal"]) == \
        ("ready", to, new["Placement"]["AvailabilityZone"], None)
    assert row["zone"] != home or region
    aws.clear_faults()  # the paused request goes on: its instance is terminated already
    assert gp(env, "down", name, "--yes").returncode == 0
    nothing_left(aws)
    assert aws.leftovers(regions=("us-west-2",))["instances"] == []


def test_a_move_killed_before_its_new_instance_runs_is_undone_and_the_node_stays_where_it_was(aws, env):
    name = "mv"
    old = _stopped_node(aws, env, name)
    home = old["Placement"]["AvailabilityZone"]
    images = _images(aws, "us-east-1")
    aws.faults({"action": "CreateImage", "pause": True, "times": 1})  # the image of its disk, on its way
    code, said = _killed(aws, env, signal.SIGKILL, name, "--move")
    assert code == -signal.SIGKILL, said
    aws.release()  # the request reaches EC2 after all: an image nobody recorded the id of, named as the journal knows
    aws.clear_faults()
    row = _row(env, name)
    assert row["state"] == "moving" and "no new instance runs yet" in row["state_reason"], row
    assert f"`gpuprov stop {name}` takes the copy back" in row["state_reason"]
    assert "down" not in row["state_reason"]

    stopped = gp(env, "stop", name)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"{name}: stopped in {home}, as it was" in stopped.stdout, stopped.stdout
    assert _images(aws, "us-east-1") == images  # the image found by its name and deleted
    assert [i["State"]["Name"] for i in _instances(aws).values()] == ["stopped"]  # nothing left billing
    row = _row(env, name)
    assert (row["state"], row["zone"], row["journal"]) == ("stopped", home, None)
    started = gp(env, "start", name, "--no-bootstrap")
    assert started.returncode == 0, started.stdout + started.stderr
    assert _instances(aws)[old["InstanceId"]]["State"]["Name"] == "running"
    assert gp(env, "down", name, "--yes").returncode == 0
    nothing_left(aws)


def test_gc_names_a_killed_move_and_down_settles_it_before_taking_all_of_it(aws, env):
    name = "mv"
    old = _stopped_node(aws, env, name)
    aws.faults({"action": "TerminateInstances", "pause": True, "times": 1, "match": {"InstanceId.1": old["InstanceId"]}})
    code, said = _killed(aws, env, signal.SIGKILL, name, "--move")
    assert code == -signal.SIGKILL, said
    (new,) = [i for i in _instances(aws).values() if i["State"]["Name"] == "running"]

    # status in 80 columns: the state column says the move, wrapped, nothing cut
    table = gp({**env, "COLUMNS": "80"}, "status")
    assert table.returncode == 0 and "moving" in table.stdout, table.stdout + table.stderr
    assert max(len(line) for line in table.stdout.splitlines()) <= 80, table.stdout
    assert new["InstanceId"] in table.stdout.replace("\n", " ").replace("│", " ").replace(" ", ""), table.stdout

    # gc leaves it (its new instance is the node's, no orphan) and names it with the next step
    listed = gp(env, "gc")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert f"{name} is moving" in listed.stdout and f"`gpuprov start {name}` finishes the move first" in listed.stdout
    assert _instances(aws)[new["InstanceId"]]["State"]["Name"] == "running"

    # down settles the move first (the old instance retired, the image gone), then takes the node down whole
    down = gp(env, "down", name, "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    aws.clear_faults()
    assert _images(aws, "us-east-1") == []
    nothing_left(aws)


def test_stop_stops_the_instance_a_killed_resize_and_start_left_running(aws, env):
    name = "rs"
    old = _stopped_node(aws, env, name)
    aws.faults({"action": "StartInstances", "hold": True, "times": 1})  # EC2 starts it; the answer never arrives
    code, said = _killed(aws, env, signal.SIGKILL, name, "--instance-type", "g5.xlarge", "--yes")
    assert code == -signal.SIGKILL, said
    aws.release()
    aws.clear_faults()
    assert _instances(aws)[old["InstanceId"]]["State"]["Name"] in ("pending", "running")
    row = _row(env, name)
    assert row["state"] == "starting" and row["journal"]["op"] == "resize", row
    assert f"resize g4dn.xlarge -> g5.xlarge interrupted at start, its instance {old['InstanceId']} running" in \
        row["state_reason"] and f"`gpuprov stop {name}` stops it" in row["state_reason"], row

    # stop stops whatever instance of the node runs (it refused a `starting` node before)
    stopped = gp(env, "stop", name)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    now = _instances(aws)[old["InstanceId"]]
    assert (now["State"]["Name"], now["InstanceType"]) == ("stopped", "g5.xlarge")
    row = _row(env, name)
    assert (row["state"], row["instance_type"], row["journal"]) == ("stopped", "g5.xlarge", None), row
    started = gp(env, "start", name, "--no-bootstrap")
    assert started.returncode == 0, started.stdout + started.stderr
    assert _row(env, name)["state"] == "ready"
    assert gp(env, "down", name, "--yes").returncode == 0
    nothing_left(aws)


def test_a_move_killed_while_its_launch_is_on_its_way_keeps_the_instance_ec2_made_of_it(aws, env):
    name = "mv"
    old = _stopped_node(aws, env, name)
    aws.faults({"action": "RunInstances", "pause": True, "times": 1})  # the move's launch, on its way
    code, said = _killed(aws, env, signal.SIGKILL, name, "--move")
    assert code == -signal.SIGKILL, said
    aws.release()  # it reaches EC2 after all: an instance nobody recorded the id of, its ClientToken recorded first
    deadline = time.monotonic() + 30
    while len([e for e in aws.log("RunInstances") if e["status"] == 200]) < 2:  # `up`'s, then the move's
        assert time.monotonic() < deadline, aws.log("RunInstances")
        time.sleep(0.05)
    aws.clear_faults()
    (new,) = [i for i in _instances(aws).values() if i["InstanceId"] != old["InstanceId"]]

    # status --refresh finds it by its ClientToken and names it; it is never taken for nothing
    row = _row(env, name)
    assert row["state"] == "moving" and f"new instance {new['InstanceId']} running" in row["state_reason"], row
    started = gp(env, "start", name, "--no-bootstrap")
    assert started.returncode == 0, started.stdout + started.stderr
    now = _instances(aws)
    assert now[new["InstanceId"]]["State"]["Name"] == "running"
    assert now[old["InstanceId"]]["State"]["Name"] == "terminated" and _images(aws, "us-east-1") == []
    assert (_row(env, name)["state"], _row(env, name)["zone"]) == ("ready", new["Placement"]["AvailabilityZone"])
    assert gp(env, "down", name, "--yes").returncode == 0
    nothing_left(aws)


@pytest.mark.parametrize("settled_by", ["stop", "gc"])
def test_a_killed_move_that_start_finishes_reaches_the_disk_on_the_new_instance(aws, env, aws_hosts, gp_home,
                                                                                settled_by):
    """Real SSH hosts at the instances' addresses: the disk's marker, written before the move, is on the new
    instance kept (stopped by `stop`, or the move finished by `gc --yes`) and started by `start`, reached with its
    new host key pinned."""
    from tests.aws.cli import copy_disk
    from tests.test_aws_capacity import NET, _reaches_the_disk, _subnet_node, _zones

    pool = aws_hosts
    _subnet_node(aws, env, pool, gp_home, "sub")
    (old,) = [i for i in _instances(aws).values() if i["State"]["Name"] == "stopped"]
    other = next(z for z in _zones(aws) if z != "us-east-1a")
    aws.subnet_for_hosts(f"{NET}.128/25", other)  # the same VPC: its first instance gets .132
    copy_disk(pool, 0, 1)  # what an instance launched from the image of its disk sees
    aws.faults({"action": "TerminateInstances", "pause": True, "times": 1, "match": {"InstanceId.1": old["InstanceId"]}})
    with pool.also_at(1, f"{NET}.132"):
        code, said = _killed(aws, env, signal.SIGKILL, "sub", "--move")
        assert code == -signal.SIGKILL, said
        settled = gp(env, *(("stop", "sub") if settled_by == "stop" else ("gc", "--yes")))
        assert settled.returncode == 0, settled.stdout + settled.stderr
        started = gp(env, "start", "sub", "--no-bootstrap")
        assert started.returncode == 0, started.stdout + started.stderr
        _reaches_the_disk(env, gp_home, pool, "sub")
    assert _instances(aws)[old["InstanceId"]]["State"]["Name"] == "terminated"
    aws.clear_faults()
    assert gp(env, "down", "sub", "--yes").returncode == 0
    nothing_left(aws)
