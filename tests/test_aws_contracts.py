"""Real EC2, second pass (issue 21): persistent spot requests, lost answers, opt-in regions, refusals that are not
capacity, interrupted spot nodes, cluster quotas, duplicates of creates sent twice, costs, resizes EC2 refuses, a
playbook file's node started again. Through the CLI against moto behind the imitation (tests/aws/ec2_spot.py and
fault_proxy.py know these contracts); each money test ends with nothing of ours left."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests import forkcli
from tests.aws import fault_proxy
from tests.aws.cli import gp, launch_site, nothing_left, up_args

QUICK = ("--no-bootstrap", "--no-wait")
ON_HOST = ("--connect", "private", "--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11")


def instances(aws, region: str = "us-east-1") -> list[dict]:
    return [i for r in aws.ec2(region).describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] != "terminated"]


def spot_requests(aws) -> list[dict]:
    return fault_proxy.spot_requests(aws.url)


def node(env, name: str) -> dict:
    (found,) = [n for n in json.loads(gp(env, "status", "--json").stdout) if n["name"] == name]
    return found


# --- 1-3. persistent spot requests and lost answers --------------------------------------------------------


def test_gc_of_a_crashed_persistent_spot_up_cancels_the_request_first_so_nothing_is_launched_again(aws, env):
    aws.faults({"action": "DescribeInstances", "hold": True, "times": 1})  # after RunInstances: the up waits here
    up = forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args("psp", "--gpu", "T4", "--spot", "--persistent",
                                                                       *QUICK)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    aws.wait_held(1, timeout=60)
    up.send_signal(signal.SIGKILL)  # the request and its instance exist; the up is gone
    up.wait(10)
    aws.release()
    assert [r["state"] for r in spot_requests(aws)] == ["active"]
    sweep = gp(env, "gc", "--yes")
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    actions = [e["action"] for e in aws.log() if e["action"] in ("CancelSpotInstanceRequests", "TerminateInstances")]
    assert actions[0] == "CancelSpotInstanceRequests"  # first, or EC2 would launch the node again
    assert instances(aws) == [] and [r["state"] for r in spot_requests(aws)] == ["cancelled"]
    nothing_left(aws)


def test_the_disabled_request_of_a_stopped_persistent_spot_node_is_found_and_collected(aws, env, tmp_path):
    aws.realism(tag_lag=0)  # tags settled at once: this is about the request's state, not about lag
    assert gp(env, *up_args("stopped", "--gpu", "T4", "--spot", "--persistent", *QUICK)).returncode == 0
    assert gp(env, "stop", "stopped").returncode == 0
    assert [r["state"] for r in spot_requests(aws)] == ["disabled"]
    lost = {**env, "GPUPROV_HOME": str(tmp_path / "lost-state")}  # its records are gone: tags are all there is
    listed = json.loads(gp(lost, "gc", "--json", "--all-installs").stdout)
    assert "spot-request" in {r["kind"] for r in listed["found"]}
    assert gp(lost, "gc", "--yes", "--all-installs").returncode == 0
    assert instances(aws) == [] and [r["state"] for r in spot_requests(aws)] == ["cancelled"]
    nothing_left(aws)


def test_a_spot_request_that_cannot_be_cancelled_keeps_its_instance_and_down_says_so(aws, env):
    assert gp(env, *up_args("stuck", "--gpu", "T4", "--spot", "--persistent", *QUICK)).returncode == 0
    (first,) = instances(aws)
    aws.faults({"action": "CancelSpotInstanceRequests", "code": "UnauthorizedOperation",
                "message": "You are not authorized to perform this operation."})
    down = gp(env, "down", "stuck", "--yes")
    assert down.returncode == 1, down.stdout + down.stderr
    assert "not terminated: its spot request could not be cancelled" in down.stderr
    assert "UnauthorizedOperation" in down.stderr and "EC2 would launch it again" in down.stderr
    assert [i["InstanceId"] for i in instances(aws)] == [first["InstanceId"]]  # not terminated, so not relaunched
    assert not aws.log("TerminateInstances")
    aws.clear_faults()
    assert gp(env, "down", "stuck", "--yes").returncode == 0
    nothing_left(aws)


def test_a_run_instances_answer_lost_after_the_launch_is_asked_again_with_its_token(aws, env):
    aws.faults({"action": "RunInstances", "lose": "drop", "times": 1})
    up = gp(env, *up_args("lossy", "--gpu", "T4", *QUICK))
    assert up.returncode == 0, up.stdout + up.stderr
    runs = [e for e in aws.log("RunInstances") if e["outcome"] != "fresh-notfound"]
    assert len({e["form"]["ClientToken"] for e in runs}) == 1 and len(runs) == 2  # the same token, asked again
    assert len(instances(aws)) == 1
    assert gp(env, "down", "lossy", "--yes").returncode == 0
    nothing_left(aws)


def test_a_launch_whose_answers_never_come_is_found_by_its_token_however_long_the_filter_lags(aws, env):
    aws.realism(token_lag=6)  # the client-token filter finds it only at the 7th look
    aws.faults({"action": "RunInstances", "lose": "drop"})
    up = gp(env, *up_args("never", "--gpu", "T4", *QUICK))
    assert up.returncode == 1, up.stdout + up.stderr
    assert "NoAnswer" in up.stderr
    assert instances(aws) == []  # the take-back looked until the filter showed it, and terminated it
    nothing_left(aws)


# --- 7. opt-in regions ------------------------------------------------------------------------------------


def test_gc_all_regions_sweeps_the_enabled_regions_and_one_regions_refusal_stops_no_other(aws, env):
    assert gp(env, *up_args("west", "--gpu", "T4", "--region", "us-west-2", *QUICK)).returncode == 0
    assert gp(env, *up_args("west", "--gpu", "T4", "--region", "us-west-2", *QUICK)).returncode == 2  # (taken)
    listed = gp(env, "gc", "--all-regions", "--json")
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    assert "ap-east-1" not in report["regions"] and "us-west-2" in report["regions"]  # not enabled: not swept
    assert "not enabled for this account, not swept: " in listed.stderr and "ap-east-1" in listed.stderr
    assert not [e for e in aws.log() if e["region"] == "ap-east-1" and e["action"] != "DescribeRegions"]
    # one region's refusal: named at the end; every other region still swept
    aws.faults({"action": "DescribeSpotInstanceRequests", "region": "eu-west-1", "code": "UnauthorizedOperation",
                "message": "not allowed here"})
    swept = gp(env, "gc", "--all-regions")
    assert swept.returncode == 1
    assert "could not sweep every region:" in swept.stderr and "eu-west-1:" in swept.stderr
    assert any(e["region"] == "us-west-2" and e["action"] == "DescribeInstances" for e in aws.log())
    assert gp(env, "down", "west", "--yes").returncode == 0
    nothing_left(aws)


# --- 10-12. refusals that are not capacity, a spot instance that dies on its way, an interrupted node ---------


def test_unsupported_for_a_configuration_stops_with_awss_words_not_no_capacity_anywhere(aws, env):
    aws.faults({"action": "RunInstances", "code": "Unsupported", "message": "The requested configuration is "
                "currently not supported. Please check the documentation for supported configurations."})
    up = gp(env, *up_args("conf", "--gpu", "T4", *QUICK))
    assert up.returncode == 1
    assert "AWS refused the launch: Unsupported: The requested configuration is currently not supported" in up.stderr
    assert "no capacity anywhere" not in up.stderr
    assert len([e for e in aws.log("RunInstances") if e["outcome"] == "fault"]) == 1  # not sent to every zone
    nothing_left(aws)


def test_a_spot_instance_that_goes_from_pending_to_terminated_moves_on_to_the_next_candidate(aws, env):
    aws.faults({"action": "RunInstances", "spot_dies": "Server.InsufficientInstanceCapacity", "times": 1})
    up = gp(env, *up_args("dies", "--gpu", "T4", "--spot", *QUICK))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "Server.InsufficientInstanceCapacity" in up.stdout
    assert len({e["form"]["ClientToken"] for e in aws.log("RunInstances")}) == 2  # the next candidate asked
    assert len(instances(aws)) == 1
    assert gp(env, "down", "dies", "--yes").returncode == 0
    nothing_left(aws)


def test_an_interrupted_persistent_spot_node_is_shown_so_and_start_says_ec2_restarts_it(aws, env):
    assert gp(env, *up_args("intr", "--gpu", "T4", "--spot", "--persistent", *QUICK)).returncode == 0
    (inst,) = instances(aws)
    assert aws.interrupt(inst["InstanceId"]) == "stopped"
    assert gp(env, "status", "--refresh").returncode == 0
    row = node(env, "intr")
    assert row["state"] == "interrupted" and row["state_reason"] == "EC2 restarts it when capacity returns"
    assert "interrupted (EC2 restarts it when capacity returns)" in gp(env, "status").stdout
    start = gp(env, "start", "intr")
    assert start.returncode == 2 and "which starts it again itself when capacity returns" in start.stderr
    assert not aws.log("StartInstances")
    assert gp(env, "down", "intr", "--yes").returncode == 0
    nothing_left(aws)


# --- 13-15. cluster quotas, creates sent twice, fresh placement groups ----------------------------------------


def test_the_quota_increase_for_a_cluster_is_sized_for_every_node(aws, env):
    aws.set_quota("L-417A185B", 384)  # on-demand P instances: enough for one p5.48xlarge, not four
    aws.faults({"action": "RunInstances", "code": "VcpuLimitExceeded", "message": "You have requested more vCPU "
                "capacity than your current vCPU limit of 384 allows"})
    up = gp(env, *up_args("big", "--gpu", "H100:8", "--nodes", "4", *QUICK))
    assert up.returncode == 1
    assert "4 × p5.48xlarge need 768" in up.stderr and "--desired-value 1152" in up.stderr
    nothing_left(aws)


@pytest.mark.parametrize("action", ["CreateSecurityGroup", "AuthorizeSecurityGroupIngress"])
def test_a_create_botocore_sends_again_after_an_answer_lost_past_the_work_is_taken_as_done(aws, env, action):
    aws.faults({"action": action, "lose": "500", "times": 1})  # botocore retries it; EC2 says Duplicate
    up = gp(env, *up_args("dup", "--gpu", "T4", *QUICK))
    assert up.returncode == 0, up.stdout + up.stderr
    assert len(aws.log(action)) >= 2
    assert len(aws.ec2().describe_security_groups(Filters=[{"Name": "tag:gpuprov:node", "Values": ["dup"]}])[
        "SecurityGroups"]) == 1
    assert gp(env, "down", "dup", "--yes").returncode == 0
    nothing_left(aws)


@pytest.mark.parametrize("lose", ["500", "drop"])
def test_an_import_key_pair_whose_answer_is_lost_is_looked_for_not_sent_again_blindly(aws, env, lose):
    """ImportKeyPair has no ClientToken (mutations.py LOOK): botocore used to send it again after a lost answer and
    the region's first `up` failed on InvalidKeyPair.Duplicate of its own key pair."""
    aws.faults({"action": "ImportKeyPair", "lose": lose, "times": 1})
    up = gp(env, *up_args("kp", "--gpu", "T4", *QUICK))
    assert up.returncode == 0, up.stdout + up.stderr
    assert len(aws.ec2().describe_key_pairs()["KeyPairs"]) == 1
    imports = aws.log("ImportKeyPair")
    # sent once; at most once more after the look, whose Duplicate is read as the first one made after all
    assert imports[0]["outcome"] == f"lost-{lose}" and len([e for e in imports if e["status"] == 200]) == 1
    assert gp(env, "down", "kp", "--yes").returncode == 0
    nothing_left(aws)


def test_a_terminate_whose_answer_is_lost_is_harmless_to_send_again(aws, env):
    assert gp(env, *up_args("term", "--gpu", "T4", *QUICK)).returncode == 0
    aws.faults({"action": "TerminateInstances", "lose": "drop", "times": 1})
    down = gp(env, "down", "term", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert len(aws.log("TerminateInstances")) >= 2
    nothing_left(aws)


def test_cluster_creates_sent_twice_and_a_fresh_placement_group_end_in_one_of_each(aws, env):
    aws.faults([{"action": "CreatePlacementGroup", "lose": "500", "times": 1},
                {"action": "AllocateAddress", "lose": "drop", "times": 1}])
    up = gp(env, *up_args("pair", "--gpu", "H100:8", "--nodes", "2", *QUICK))
    assert up.returncode == 0, up.stdout + up.stderr
    assert [g["name"] for g in fault_proxy.placement_groups(aws.url)].__len__() == 1
    runs = aws.log("RunInstances")
    assert any("InvalidPlacementGroup.Unknown" in str(e) or e["outcome"] == "fresh-notfound" for e in runs) or \
        len(runs) >= 1
    assert len(aws.ec2().describe_addresses()["Addresses"]) == 2  # one Elastic IP a node, the lost one reused
    assert gp(env, "down", "pair", "--yes").returncode == 0
    nothing_left(aws)


# --- 17-19. costs, a refused resize, a node of a playbook file --------------------------------------------


def test_a_spot_nodes_cost_uses_the_price_it_got_and_stopped_time_costs_nothing(aws, env):
    aws.set_spot_prices({("g4dn.xlarge", "us-east-1a"): 0.25})
    assert gp(env, *up_args("cheap", "--gpu", "T4", "--spot", "--persistent", *QUICK)).returncode == 0
    row = node(env, "cheap")
    assert row["paid_usd_hour"] == 0.25 and row["price_usd_hour"] == pytest.approx(0.526)
    assert gp(env, "stop", "cheap").returncode == 0
    stopped = node(env, "cheap")["cost_so_far_usd"]
    time.sleep(1.2)
    assert node(env, "cheap")["cost_so_far_usd"] == stopped  # no compute billed while stopped
    assert gp(env, "down", "cheap", "--yes").returncode == 0
    nothing_left(aws)


def test_a_resize_ec2_refuses_leaves_the_node_stopped_as_it_was(aws, env):
    assert gp(env, *up_args("rs", "--gpu", "T4", *QUICK)).returncode == 0
    assert gp(env, "stop", "rs").returncode == 0
    aws.faults({"action": "ModifyInstanceAttribute", "code": "InvalidParameterValue",
                "message": "The instance type is not supported for this instance."})
    resize = gp(env, "start", "rs", "--instance-type", "g4dn.2xlarge", "--no-bootstrap", "--yes")
    assert resize.returncode == 1 and "rs stays stopped as g4dn.xlarge" in resize.stderr
    row = node(env, "rs")
    assert row["state"] == "stopped" and row["instance_type"] == "g4dn.xlarge"
    aws.clear_faults()
    assert gp(env, "start", "rs", "--no-bootstrap").returncode == 0  # not `resizing` forever
    assert gp(env, "down", "rs", "--yes").returncode == 0
    nothing_left(aws)


def test_start_of_a_node_brought_up_with_a_playbook_file_uses_the_playbook_it_had(aws, env, aws_hosts, gp_home,
                                                                                   tmp_path):
    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)
    book = tmp_path / "mine.yml"
    book.write_text("name: mine\nstack: none\nenv: null\nsteps:\n  - name: hello\n    run: echo hello > /tmp/hello\n")
    up = gp(env, *up_args("own", "--gpu", "T4", "--subnet", subnet, *ON_HOST, "-p", str(book)))
    assert up.returncode == 0, up.stdout + up.stderr
    assert gp(env, "stop", "own").returncode == 0
    book.unlink()  # gone by the time the node starts again
    start = gp(env, "start", "own")
    assert start.returncode == 0, start.stdout + start.stderr
    assert "hello: unchanged" in start.stdout  # the same step, its marker found
    assert gp(env, "down", "own", "--yes").returncode == 0
    nothing_left(aws)


@pytest.mark.parametrize("var", ["GPUPROV_TEST_SETTLE_SECONDS", "GPUPROV_TEST_POLL_SECONDS"])
def test_a_bad_timing_variable_is_named_before_any_cloud_call(aws, env, var):
    result = gp({**env, var: "soon"}, "gc")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: {var}: expected seconds (a number >= 0), got 'soon'" in result.stderr
    assert not [e for e in aws.log() if e["action"] != "DescribeRegions"]
