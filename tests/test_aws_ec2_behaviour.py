"""Real EC2 is less kind than moto: eventual consistency, every class of refusal, quotas, regions,
network choices, price caps. Each test runs the real CLI against moto behind the fault proxy in its
default "realistic" kind (fresh ids answer NotFound twice, tag filters lag a look-up, capacity
errors come back as HTTP 500) and ends with nothing of ours left in the endpoint.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.aws.cli import gp, launch_site, nothing_left, up_args

NO_WAIT = ("--no-bootstrap", "--no-wait")


def refused(aws, code: str, message: str, **match) -> None:
    aws.faults({"action": "RunInstances", "code": code, "message": message, **({"match": match} if match else {})})


# --- eventual consistency --------------------------------------------------------------------------


def test_fresh_ids_answer_not_found_and_up_and_down_still_complete(aws, env):
    result = gp(env, *up_args("fresh", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    fresh = [(e["action"], e["fresh"]) for e in aws.log() if e["outcome"] == "fresh-notfound"]
    # what EC2 may say right after each create, and `up` waited through
    assert {a for a, _ in fresh} >= {"AuthorizeSecurityGroupIngress", "RunInstances", "DescribeInstances"}
    assert [a for a, _ in fresh].count("DescribeInstances") == 2
    down = gp(env, "down", "fresh", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    nothing_left(aws)


def test_tags_invisible_for_three_lookups_teardown_still_complete(aws, env):
    aws.realism(tag_lag=3)
    assert gp(env, *up_args("lag", "--gpu", "T4", "--spot", *NO_WAIT)).returncode == 0
    down = gp(env, "down", "lag", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert any(e["hidden"] for e in aws.log())  # the tag searches really came back short
    nothing_left(aws)


def test_failed_up_cleanup_survives_not_found_and_leaves_nothing(aws, env):
    aws.realism(fresh_lookups=3)  # the group and key answer NotFound for longer than the launch needs
    refused(aws, "InsufficientInstanceCapacity", "We currently do not have sufficient g4dn.xlarge capacity")
    result = gp(env, *up_args("gone", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 1 and "no capacity anywhere" in result.stderr
    assert any(e["action"] == "DeleteSecurityGroup" and e["outcome"] == "fresh-notfound" for e in aws.log()) or \
        any(e["action"] == "AuthorizeSecurityGroupIngress" and e["outcome"] == "fresh-notfound" for e in aws.log())
    assert json.loads(gp(env, "status", "--json").stdout) == []
    nothing_left(aws)


def test_throttled_describe_during_cleanup_still_terminates_the_instance(aws, env):
    aws.faults({"action": "DescribeInstances", "code": "RequestLimitExceeded", "message": "Request limit exceeded."})
    result = gp(env, *up_args("thr", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 1 and "RequestLimitExceeded" in result.stderr and "Traceback" not in result.stderr
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert inst["State"]["Name"] in ("shutting-down", "terminated")  # TerminateInstances went by the recorded id
    assert "rerun: gpuprov down thr" in result.stdout  # termination asked for, not yet confirmed
    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert node["name"] == "thr" and node["state"] == "terminating"
    aws.clear_faults()
    again = gp(env, "down", "thr", "--yes")
    assert again.returncode == 0, again.stdout + again.stderr
    nothing_left(aws)


def test_down_with_aws_unreachable_keeps_the_node_and_a_rerun_finishes(aws, env):
    assert gp(env, *up_args("net", "--gpu", "T4", *NO_WAIT)).returncode == 0
    offline = {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # nothing listens on the discard port
    down = gp(offline, "down", "net", "--yes")
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert "still there" in down.stderr and "rerun: gpuprov down net" in down.stderr
    assert [n["name"] for n in json.loads(gp(env, "status", "--json").stdout)] == ["net"]
    assert aws.leftovers()["instances"]  # nothing was touched
    again = gp(env, "down", "net", "--yes")
    assert again.returncode == 0, again.stdout + again.stderr
    nothing_left(aws)


# --- refusals, classified ----------------------------------------------------------------------------


def test_capacity_500_is_asked_once_per_zone_then_the_next_zone(aws, env):
    refused(aws, "InsufficientInstanceCapacity", "We currently do not have sufficient g4dn.xlarge capacity",
            **{"Placement.AvailabilityZone": "us-east-1a"})
    result = gp(env, *up_args("ice", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    zones = [e["form"].get("Placement.AvailabilityZone") for e in aws.log("RunInstances") if e["outcome"] == "fault"]
    assert zones == ["us-east-1a"]  # one attempt: botocore would retry a 500 in the same zone
    assert [e["status"] for e in aws.log("RunInstances") if e["outcome"] == "fault"] == [500]
    assert gp(env, "down", "ice", "--yes").returncode == 0
    nothing_left(aws)


@pytest.mark.parametrize(("code", "message"), [
    ("InvalidInput", "No default subnet for availability zone: 'us-east-1a'."),
    ("InsufficientFreeAddressesInSubnet", "There are not enough free addresses in subnet to satisfy the request."),
    ("VolumeTypeNotAvailableInZone", "The volume type gp3 is not available in us-east-1a."),
    ("Unsupported", "Your requested instance type (g4dn.xlarge) is not supported in your requested Availability Zone"),
])
def test_zone_refusals_move_to_the_next_zone(aws, env, code, message):
    refused(aws, code, message, **{"Placement.AvailabilityZone": "us-east-1a"})
    result = gp(env, *up_args("z", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{code}: {message}" in result.stdout
    assert json.loads(gp(env, "status", "--json").stdout)[0]["zone"] != "us-east-1a"
    assert gp(env, "down", "z", "--yes").returncode == 0
    nothing_left(aws)


def test_invalid_input_for_another_reason_stops(aws, env):
    refused(aws, "InvalidInput", "Something else entirely is wrong with the request.")
    result = gp(env, *up_args("ii", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 1 and "InvalidInput" in result.stderr
    assert len(aws.log("RunInstances")) <= 3  # the fresh key/group NotFounds, then the one refusal
    nothing_left(aws)


@pytest.mark.parametrize(("code", "message", "fix"), [
    ("MaxSpotInstanceCountExceeded", "Max spot instance count exceeded", "spot quota"),
    ("AuthFailure.ServiceLinkedRoleCreationNotPermitted",
     "The provided credentials do not have permission to create the service-linked role for EC2 Spot Instances.",
     "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com"),
])
def test_spot_closed_to_the_account_falls_back_to_on_demand_only_when_asked(aws, env, code, message, fix):
    refused(aws, code, message, **{"InstanceMarketOptions.MarketType": "spot"})
    stop = gp(env, *up_args("sp", "--gpu", "T4", "--spot", *NO_WAIT))
    assert stop.returncode == 1 and code in stop.stderr and fix in stop.stderr and "--fallback on-demand" in stop.stderr
    spot_tries = [e for e in aws.log("RunInstances") if e["outcome"] == "fault"]
    assert len(spot_tries) == 1  # the whole market is closed: no zone-by-zone failover
    nothing_left(aws)
    landed = gp(env, *up_args("sp", "--gpu", "T4", "--spot", "--fallback", "on-demand", *NO_WAIT))
    assert landed.returncode == 0, landed.stdout + landed.stderr
    assert "going on with on-demand" in landed.stdout
    (node,) = json.loads(gp(env, "status", "--json").stdout)
    assert node["market"] == "on-demand"
    assert gp(env, "down", "sp", "--yes").returncode == 0
    nothing_left(aws)


def test_on_demand_quota_names_the_quota_its_value_and_a_valid_increase(aws, env):
    aws.set_quota("L-DB2E81BA", 8)
    refused(aws, "VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit of 8 allows")
    result = gp(env, *up_args("q", "--gpu", "L4:4", *NO_WAIT))
    assert result.returncode == 1
    # g6.12xlarge: 48 vCPUs; Service Quotas refuses a desired value not above the current one
    assert "Running On-Demand G and VT instances' (L-DB2E81BA)" in result.stderr
    assert "current value is 8 vCPUs" in result.stderr and "--desired-value 56 " in result.stderr
    assert len([e for e in aws.log("RunInstances") if e["outcome"] == "fault"]) == 1
    nothing_left(aws)


@pytest.mark.parametrize(("code", "needle"), [
    ("UnauthorizedOperation", "aws sts decode-authorization-message"),
    ("OptInRequired", "region is not enabled"),
    ("InstanceLimitExceeded", "number of instances (not vCPUs)"),
])
def test_stopping_refusals_stop_at_once_with_their_fix(aws, env, code, needle):
    refused(aws, code, f"{code} message from EC2")
    result = gp(env, *up_args("st", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 1 and f"{code}: {code} message from EC2" in result.stderr and needle in result.stderr
    assert "Traceback" not in result.stderr
    assert len([e for e in aws.log("RunInstances") if e["outcome"] == "fault"]) == 1
    nothing_left(aws)


def test_internal_error_on_run_instances_is_retried_with_the_same_token(aws, env):
    aws.faults({"action": "RunInstances", "code": "InternalError", "message": "An internal error has occurred",
                "times": 1})
    result = gp(env, *up_args("ie", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    runs = aws.log("RunInstances")
    assert len({e["form"]["ClientToken"] for e in runs}) == 1 and runs[-1]["status"] == 200
    assert len(aws.leftovers()["instances"]) == 1
    assert gp(env, "down", "ie", "--yes").returncode == 0
    nothing_left(aws)


def test_aws_max_attempts_counts_every_attempt(aws, env):
    aws.faults({"action": "DescribeInstanceTypeOfferings", "code": "RequestLimitExceeded",
                "message": "Request limit exceeded."})
    result = gp({**env, "AWS_MAX_ATTEMPTS": "3"}, *up_args("t", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 1 and "RequestLimitExceeded" in result.stderr and "Traceback" not in result.stderr
    assert len(aws.log("DescribeInstanceTypeOfferings")) == 3
    nothing_left(aws)


# --- regions and credentials -------------------------------------------------------------------------


def test_region_follows_the_aws_chain(aws, env, tmp_path):
    base = {k: v for k, v in env.items() if k not in ("AWS_REGION", "AWS_DEFAULT_REGION")}
    config = tmp_path / "aws-config"
    config.write_text("[profile dev]\nregion = us-west-2\n[default]\nregion = eu-west-1\n")
    base["AWS_CONFIG_FILE"] = str(config)

    def region(extra: dict[str, str], *args: str) -> tuple[str, str]:
        r = gp({**base, **extra}, "plan", "--gpu", "T4", "--json", *args)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["region"], (r.stderr.strip().splitlines() or [""])[0]

    assert region({}) == ("eu-west-1", "region eu-west-1 (from profile 'default')")
    assert region({"AWS_PROFILE": "dev"}) == ("us-west-2", "region us-west-2 (from profile 'dev')")
    assert region({"AWS_PROFILE": "dev", "AWS_DEFAULT_REGION": "us-east-2"})[0] == "us-east-2"
    assert region({"AWS_DEFAULT_REGION": "us-east-2", "AWS_REGION": "eu-central-1"})[0] == "eu-central-1"
    assert region({"AWS_REGION": "eu-central-1"}, "--region", "us-west-2") == ("us-west-2", "")
    config.unlink()
    assert region({}) == ("us-east-1", "region us-east-1 (from default)")


def test_up_and_gc_use_the_chains_region(aws, env):
    west = {**env, "AWS_DEFAULT_REGION": "us-west-2"}
    result = gp(west, *up_args("w", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "region us-west-2 (from AWS_DEFAULT_REGION)" in result.stderr
    assert json.loads(gp(west, "status", "--json").stdout)[0]["region"] == "us-west-2"
    assert aws.leftovers(regions=("us-west-2",))["instances"]
    listed = gp(west, "gc")
    assert listed.returncode == 0 and "us-west-2" in listed.stdout + listed.stderr
    assert gp(west, "down", "w", "--yes").returncode == 0
    nothing_left(aws)


def test_missing_profile_is_bad_input(aws, env):
    result = gp({**env, "AWS_PROFILE": "nosuch"}, *up_args("np", "--gpu", "T4", *NO_WAIT))
    assert result.returncode == 2 and "AWS_PROFILE" in result.stderr and "nosuch" in result.stderr
    assert "Traceback" not in result.stderr and "configure list-profiles" in result.stderr
    assert aws.log() == []
    nothing_left(aws)


# --- network choices, before launch ------------------------------------------------------------------


@pytest.mark.parametrize(("args", "field"), [
    (["--ssh-cidr", ""], "--ssh-cidr"),
    (["--ssh-cidr", "10.0.0.0/33"], "--ssh-cidr"),
    (["--max-price", "0", "--spot"], "--max-price"),
    (["--max-price", "0.5"], "--max-price"),
    (["--fallback", "on-demand"], "--fallback"),
    (["--max-hourly", "-1"], "--max-hourly"),
    (["--no-wait"], "--no-wait"),
])
def test_bad_options_are_refused_before_any_call(aws, env, args, field):
    result = gp(env, "up", "bad", "--yes", "--gpu", "T4", *args)
    assert result.returncode == 2 and f"error: {field}" in result.stderr, result.stderr
    assert aws.log() == []
    nothing_left(aws)


def test_connect_private_without_cidr_opens_ssh_to_the_vpc_only(aws, env):
    subnet = aws.subnet_for_hosts("10.231.0.0/24", "us-east-1b")
    result = gp(env, "up", "pv", "--yes", "--gpu", "T4", "--subnet", subnet, "--connect", "private", *NO_WAIT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "VPC's CIDR 10.231.0.0/16" in result.stdout
    (group,) = aws.ec2().describe_security_groups(Filters=[{"Name": "tag:gpuprov:node", "Values": ["pv"]}])[
        "SecurityGroups"]
    assert [r["CidrIp"] for r in group["IpPermissions"][0]["IpRanges"]] == ["10.231.0.0/16"]
    assert gp(env, "down", "pv", "--yes").returncode == 0
    nothing_left(aws)


def test_public_connect_in_a_subnet_without_public_ips_asks_for_one(aws, env):
    subnet = aws.subnet_for_hosts("10.232.0.0/24", "us-east-1c")  # MapPublicIpOnLaunch off
    result = gp(env, *up_args("pub", "--gpu", "T4", "--subnet", subnet, *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    form = [e for e in aws.log("RunInstances") if e["status"] == 200][-1]["form"]
    assert form["NetworkInterface.1.AssociatePublicIpAddress"] == "true"
    assert form["NetworkInterface.1.SubnetId"] == subnet and "SubnetId" not in form
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert inst.get("PublicIpAddress")
    assert gp(env, "down", "pub", "--yes").returncode == 0
    nothing_left(aws)


# --- price -------------------------------------------------------------------------------------------


def test_failover_never_climbs_over_the_price_cap(aws, env):
    refused(aws, "InsufficientInstanceCapacity", "We currently do not have sufficient capacity")
    result = gp(env, *up_args("cap", "--gpu", "A10G", *NO_WAIT))
    assert result.returncode == 1
    # default cap: twice g5.xlarge's $1.006/h; g5.8xlarge ($2.448/h) and up are never asked for
    (skipped,) = [line for line in result.stdout.splitlines() if line.startswith("skipping ")]  # one line, not five
    assert skipped.startswith("skipping 5 instance types over the price cap (twice the cheapest type that fits; "
                              "--max-hourly to change it) $2.01/h: ") and "g5.8xlarge" in skipped
    asked = {e["form"]["InstanceType"] for e in aws.log("RunInstances")}
    assert asked == {"g5.xlarge", "g5.2xlarge", "g5.4xlarge"}
    aws.clear_faults()
    tight = gp(env, *up_args("cap", "--gpu", "A10G", "--max-hourly", "0.5", *NO_WAIT))
    assert tight.returncode == 2 and "error: --max-hourly" in tight.stderr
    nothing_left(aws)


# --- status and --no-bootstrap -----------------------------------------------------------------------


def test_status_refresh_follows_the_recorded_instance_not_a_terminated_namesake(aws, env):
    assert gp(env, *up_args("twin", "--gpu", "T4", *NO_WAIT)).returncode == 0
    ec2 = aws.ec2()
    (mine,) = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    tags = [t for t in mine["Tags"] if t["Key"] in ("gpuprov:node", "gpuprov:owner")]
    namesake = ec2.run_instances(ImageId=mine["ImageId"], InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1,
                                 TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])["Instances"][0]
    ec2.terminate_instances(InstanceIds=[namesake["InstanceId"]])
    ec2.describe_instances()  # moto moves shutting-down -> terminated on the next describe
    (node,) = json.loads(gp(env, "status", "--refresh", "--json").stdout)
    assert node["state"] == "ready"
    ec2.terminate_instances(InstanceIds=[mine["InstanceId"]])
    ec2.describe_instances()
    (node,) = json.loads(gp(env, "status", "--refresh", "--json").stdout)
    assert node["state"] == "gone"
    assert gp(env, "down", "twin", "--yes").returncode == 0
    nothing_left(aws)


def test_no_bootstrap_waits_for_ssh_and_pins_the_host_key(aws, env, aws_hosts, gp_home):
    subnet = launch_site(aws, aws_hosts, gp_home)
    result = gp(env, *up_args("nb", "--gpu", "T4", "--subnet", subnet, "--connect", "private", "--ssh-user", "root",
                              "--no-bootstrap"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "host key pinned for nb" in result.stdout and "ssh gpuprov-nb" in result.stdout
    pinned = (gp_home / "nodes" / "nb" / "known_hosts").read_text()
    assert aws_hosts[0].address in pinned and "ssh-ed25519" in pinned
    ran = gp(env, "exec", "nb", "--", "hostname")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert gp(env, "down", "nb", "--yes").returncode == 0
    nothing_left(aws)


def test_plan_hours_live_prices_the_estimate_at_todays_spot_price(aws, env):
    aws.set_spot_prices({("g4dn.xlarge", "us-east-1a"): 0.2104, ("g4dn.xlarge", "us-east-1c"): 0.1906})
    result = gp(env, "plan", "--gpu", "T4", "--spot", "--hours", "10", "--live", "--json")
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)["estimate"]
    assert (estimate["spot_zone"], estimate["usd_hour_spot"], estimate["usd_spot"]) == ("us-east-1c", 0.1906, 1.91)
    assert estimate["usd_on_demand"] == round(estimate["usd_hour_on_demand"] * 10, 2)
    human = gp(env, "plan", "--gpu", "T4", "--spot", "--hours", "10", "--live")
    assert "at today's spot price $0.1906/h (us-east-1c): $1.91" in human.stdout
    # reads only: today's prices, and which image `up` would take (a baked one of this stack, else Ubuntu's)
    assert [e["action"] for e in aws.log()] == ["DescribeSpotPriceHistory", "DescribeImages", "GetParameter"] * 2
    no_hours = gp(env, "plan", "--gpu", "T4", "--live")  # the image only: no estimate without --hours
    assert no_hours.returncode == 0, no_hours.stderr
    assert "image: Canonical's Ubuntu" in no_hours.stdout and "today's spot price" not in no_hours.stdout


# --- a local endpoint, and where new nodes go by the config file (`make sandbox`) ---------------------------------


def test_against_a_local_endpoint_up_never_connects_to_the_public_address_moto_made_up(aws, env):
    """moto hands out public addresses that are real machines on the internet: with a local endpoint, an `up`
    that would connect to one is refused before anything is created, saying what to pass."""
    result = gp(env, *up_args("pub", "--gpu", "T4", "--no-bootstrap"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: --connect: the AWS endpoint is a local one" in result.stderr
    assert "--connect private and --subnet" in result.stderr
    assert not aws.log("RunInstances") and not aws.log("CreateSecurityGroup") and not aws.log("ImportKeyPair")
    nothing_left(aws)


def test_a_node_launched_with_a_made_up_address_is_not_reached_by_ssh_or_exec(aws, env):
    assert gp(env, *up_args("pub", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    for args in (("exec", "pub", "--", "true"), ("check", "pub")):
        result = gp(env, *args)
        assert result.returncode == 1 and "comes from the local AWS endpoint" in result.stderr, result.stderr
    assert gp(env, "down", "pub", "--yes").returncode == 0
    nothing_left(aws)


def test_the_config_file_says_where_new_nodes_go(aws, env, tmp_path):
    subnet = aws.subnet_for_hosts("10.233.0.0/24", "us-east-1d")
    config = tmp_path / "config.toml"
    config.write_text(f'subnet = "{subnet}"\nconnect = "private"\nssh_user = "root"\nos = "ubuntu-22.04"\n')
    env = {**env, "GPUPROV_CONFIG": str(config)}
    result = gp(env, "up", "cfg", "--gpu", "T4", "--yes", *NO_WAIT)
    assert result.returncode == 0, result.stdout + result.stderr
    form = [e for e in aws.log("RunInstances") if e["status"] == 200][-1]["form"]
    assert subnet in (form.get("SubnetId"), form.get("NetworkInterface.1.SubnetId"))
    assert "VPC's CIDR 10.233.0.0/16" in result.stdout  # connect = private, from the file
    (row,) = json.loads(gp(env, "status", "--json").stdout)
    assert row["zone"] == "us-east-1d"
    from gpuprov.state import open_store

    os.environ["GPUPROV_HOME"] = env["GPUPROV_HOME"]
    assert open_store().node("cfg").ssh_user == "root"  # ssh_user, from the file
    assert gp(env, "down", "cfg", "--yes").returncode == 0
    nothing_left(aws)


def test_ssh_open_to_the_whole_internet_is_said_and_asked_for(aws, env):
    result = gp(env, "up", "open", "--gpu", "T4", "--ssh-cidr", "0.0.0.0/0", *NO_WAIT)  # no --yes, no terminal
    assert result.returncode == 2 and "opens SSH on open to the whole internet" in result.stderr
    assert not aws.log("RunInstances")
    result = gp(env, "up", "open", "--gpu", "T4", "--ssh-cidr", "0.0.0.0/0", "--yes", *NO_WAIT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "opens SSH on open to the whole internet" in result.stderr
    assert "SSH from 0.0.0.0/0: anywhere on the internet" in result.stdout and "0.0.0.0/0 only" not in result.stdout
    assert gp(env, "down", "open", "--yes").returncode == 0
    nothing_left(aws)
