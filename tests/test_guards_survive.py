"""A running node has exactly the guards its record shows after every operation that touches them (issue 35 §4):
`image bake` (whose clean-up moves the guards and the monitoring aside), `start`, a resize (`start
--instance-type`) and a zone move (`start --move`: a new instance from an image of the disk). One node is taken
through all four, with a look at the host after each, and a persistent spot node (its spot watch, a health watch
without metrics) through a bake and a start: the real CLI against moto behind the fault proxy, the nodes on the SSH
test hosts (`aws_hosts`), whose fake systemd keeps each enabled unit as a file.

What the record implies is `cloud/guards.recorded_guards`, the same function bake's put-back runs; the look at the
host checks it against what the test asked for, the deadline the node keeps against the record's (what `status`
shows), the autostop window, and the metrics exporter there if and only if the record says so.
"""

from __future__ import annotations

import json
import time

from tests import testnet
from tests.aws.cli import copy_disk, gp, launch_site, nothing_left, up_args
from tests.node_guards import SYSROOT, OnNode, on_node

ON_HOST = ("--connect", "private", "--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11")
NET = testnet.subnet("10.220.0")  # a /25 at .0 gives the first instance .4 (pool[0]), one at .128 gives .132 (pool[1])


def as_recorded(env, pool, i: int, name: str, asked: set[str]) -> OnNode:
    """Host i has exactly the guards node `name`'s record shows (and the test asked for), its deadline and window."""
    from gpuprov.cloud.guards import recorded_guards
    from gpuprov.state import open_store

    node = open_store().node(name)
    recorded = recorded_guards(node)
    assert set(recorded.names) == asked, recorded.names
    found = on_node(pool, i)
    assert found.steps == asked, (found, asked)
    (row,) = json.loads(gp(env, "status", name, "--json").stdout)
    assert row["state"] == "ready" and row["autostop_seconds"] == found.idle_seconds == node.autostop_seconds, row
    assert recorded.deadline is not None and found.deadline is not None
    # the node's own clock set it a second or so after the record's
    assert abs(found.deadline - recorded.deadline) <= 5, (found.deadline, recorded.deadline)
    assert abs(found.deadline - row["ttl_deadline"]) <= 5, (found.deadline, row["ttl_deadline"])  # what status shows
    assert found.exporter == (node.plan["monitoring"]["metrics"] != "off")
    return found


def test_bake_start_resize_and_a_move_leave_the_node_exactly_the_guards_its_record_shows(aws, env, aws_hosts, gp_home):
    pool = aws_hosts
    first = launch_site(aws, pool, gp_home, ".0/25")
    # a $3 budget lasts about 4h at g4dn.2xlarge's $0.752/h: sooner than the 5h TTL, so the node's deadline is the
    # budget's, and a start keeps what is left of it; the resize to g4dn.xlarge ($0.526/h) makes the rest last about
    # 5.7h, past the TTL's own deadline, which then decides (it is never moved past the --ttl given)
    up = gp(env, *up_args("g", "--gpu", "T4", "--instance-type", "g4dn.2xlarge", "--subnet", first, *ON_HOST, "--ttl", "5h",
                          "--budget", "3", "--autostop", "2h", "--metrics", "textfile"))
    assert up.returncode == 0, up.stdout + up.stderr
    ttl_end = time.time() + 5 * 3600  # the --ttl's own deadline is no later than this
    asked = {"autostop", "ttl", "metrics", "health"}
    made = as_recorded(env, pool, 0, "g", asked)
    assert made.idle_seconds == 7200

    baked = gp(env, "image", "bake", "g", "--name", "g-stack", "--yes")
    assert baked.returncode == 0, baked.stdout + baked.stderr
    assert "g: its guards are back (autostop, ttl, metrics, health)" in baked.stdout
    after_bake = as_recorded(env, pool, 0, "g", asked)
    assert abs(after_bake.deadline - made.deadline) <= 5  # the recorded deadline, not a new one

    for step, start in (("start", ()), ("resize", ("--instance-type", "g4dn.xlarge", "--yes"))):
        stop = gp(env, "stop", "g")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        started = gp(env, "start", "g", *start)
        assert started.returncode == 0, step + started.stdout + started.stderr
        as_recorded(env, pool, 0, "g", asked)
        (row,) = json.loads(gp(env, "status", "g", "--json").stdout)
        assert row["ttl_deadline"] <= ttl_end + 5, (step, row["ttl_deadline"] - ttl_end)  # never past the --ttl
    assert row["instance_type"] == "g4dn.xlarge" and row["budget_usd"] == 3
    assert row["ttl_deadline"] >= ttl_end - 600  # the TTL's own deadline decides now, not the budget's

    # a zone move: the new instance (pool[1], at .132 in the VPC's subnet of another zone) boots from the disk's image
    assert gp(env, "stop", "g").returncode == 0
    offered = aws.ec2().describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": ["g4dn.xlarge"]}])
    other = sorted(o["Location"] for o in offered["InstanceTypeOfferings"] if o["Location"] != "us-east-1a")[0]
    aws.subnet_for_hosts(f"{NET}.128/25", other)
    copy_disk(pool, 0, 1)
    with pool.also_at(1, f"{NET}.132"):
        moved = gp(env, "start", "g", "--move", "--zone", other)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        as_recorded(env, pool, 1, "g", asked)
        (row,) = json.loads(gp(env, "status", "g", "--json").stdout)
        assert (row["zone"], row["address"]) == (other, f"{NET}.132")
        assert gp(env, "down", "g", "--yes").returncode == 0
    assert gp(env, "image", "rm", "g-stack", "--yes").returncode == 0
    nothing_left(aws)


def test_a_persistent_spot_nodes_watch_and_health_survive_a_bake_and_a_start(aws, env, aws_hosts, gp_home):
    """The spot watch and a health watch without metrics (so no exporter) come back after a bake and a start."""
    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)
    aws.set_spot_prices({("g4dn.xlarge", "us-east-1a"): 0.25})
    up = gp(env, *up_args("s", "--gpu", "T4", "--spot", "--persistent", "--subnet", subnet, *ON_HOST, "--ttl", "6h",
                          "--on-interrupt", "touch /tmp/interrupted", "--health"))
    assert up.returncode == 0, up.stdout + up.stderr
    asked = {"ttl", "spot-interrupt", "health"}
    made = as_recorded(env, pool, 0, "s", asked)
    assert not made.exporter and made.idle_seconds is None
    baked = gp(env, "image", "bake", "s", "--name", "s-stack", "--yes")
    assert baked.returncode == 0, baked.stdout + baked.stderr
    assert "s: its guards are back (ttl, spot-interrupt, health)" in baked.stdout
    after_bake = as_recorded(env, pool, 0, "s", asked)
    assert abs(after_bake.deadline - made.deadline) <= 5  # the record's deadline again (its whole seconds)
    assert "touch /tmp/interrupted" in pool.exec_in(0, f"cat {SYSROOT}/etc/gpuprov/on-interrupt", check=True).stdout
    assert gp(env, "stop", "s").returncode == 0
    started = gp(env, "start", "s")
    assert started.returncode == 0, started.stdout + started.stderr
    assert as_recorded(env, pool, 0, "s", asked).deadline == after_bake.deadline  # a TTL alone keeps its deadline
    assert gp(env, "down", "s", "--yes").returncode == 0
    assert gp(env, "image", "rm", "s-stack", "--yes").returncode == 0
    nothing_left(aws)
