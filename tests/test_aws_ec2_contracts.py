"""Real EC2, second pass (issue 21): what EC2 refuses or answers that moto does not, each through the real CLI
against moto behind the fault proxy, which keeps those contracts (tests/aws/ec2_contracts.py): Elastic IPs on
multi-interface instances and their quota, SSH over IPv6, an image bigger than --disk, pages of N, the instance
store at `stop`, deregistered images, the instance profile and IMDS hop limit. Each ends with nothing of ours left.
"""

from __future__ import annotations

import ipaddress
import json

from tests.aws.cli import gp, nothing_left, up_args
from tests.aws.test_ec2_contracts import big_image, ipv6_subnet

NO_WAIT = ("--no-bootstrap", "--no-wait")


def owner() -> str:
    from gpuprov.cloud.tags import owner as this_install

    return this_install()  # GPUPROV_HOME is the test's gpuprov home (the gp_home fixture)


def node(env, name: str) -> dict:
    (found,) = [n for n in json.loads(gp(env, "status", "--json").stdout) if n["name"] == name]
    return found


def launched(aws) -> dict:
    """The form of the RunInstances EC2 took (the last one answered 200)."""
    return [e for e in aws.log("RunInstances") if e["status"] == 200][-1]["form"]


def refused_with(result, field: str) -> str:
    """Bad input's one `error: FIELD: …` line, exit 2, no traceback; returns stderr."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert any(line.startswith(f"error: {field}: ") for line in result.stderr.splitlines()), result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def ours(key: str, value: str) -> list[dict]:
    return [{"Key": "gpuprov:node", "Value": "(image)"}, {"Key": "gpuprov:owner", "Value": owner()},
            {"Key": key, "Value": value}]


# --- 5, 6: Elastic IPs --------------------------------------------------------------------------------------


def test_a_public_efa_cluster_gets_its_elastic_ips_on_each_primary_interface(aws, env):
    """EC2 refuses AssociateAddress by InstanceId for an instance with several interfaces (every p5 node)."""
    result = gp(env, *up_args("efa", "--gpu", "H100:8", "--nodes", "2", *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    associated = [e for e in aws.log("AssociateAddress") if e["status"] == 200]
    assert len(associated) == 2 and all("InstanceId" not in e["form"] for e in associated)
    enis = {e["form"]["NetworkInterfaceId"] for e in associated}
    instances = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    primary = {n["NetworkInterfaceId"] for i in instances for n in i["NetworkInterfaces"]
               if (n["Attachment"]["NetworkCardIndex"], n["Attachment"]["DeviceIndex"]) == (0, 0)}
    assert enis == primary
    eips = aws.ec2().describe_addresses()["Addresses"]
    assert {a["InstanceId"] for a in eips} == {i["InstanceId"] for i in instances}
    assert sorted(m["public_ip"] for m in node(env, "efa")["members"]) == sorted(a["PublicIp"] for a in eips)
    assert gp(env, "down", "efa", "--yes").returncode == 0
    nothing_left(aws)


def test_a_public_efa_cluster_past_the_elastic_ip_quota_is_refused_before_anything_is_made(aws, env):
    for _ in range(4):  # addresses the account already holds count against the same quota
        aws.ec2().allocate_address(Domain="vpc")
    refused = refused_with(gp(env, *up_args("big", "--gpu", "H100:8", "--nodes", "2", *NO_WAIT)), "--nodes")
    for words in ("2 Elastic IPs", "1 of its 5", "4 in use", "L-0263D0A3", "--connect private",
                  "request-service-quota-increase --service-code ec2 --quota-code L-0263D0A3 --desired-value 6"):
        assert words in " ".join(refused.split()), (words, refused)
    assert not {"CreateSecurityGroup", "RunInstances", "AllocateAddress"} & {e["action"] for e in aws.log()}
    nothing_left(aws)
    private = gp(env, *up_args("big", "--gpu", "H100:8", "--nodes", "2", "--connect", "private", *NO_WAIT))
    assert private.returncode == 0, private.stdout + private.stderr  # private addresses need no Elastic IP
    assert not aws.log("AllocateAddress")
    assert gp(env, "down", "big", "--yes").returncode == 0
    aws.set_quota("L-0263D0A3", 6)  # raised: the quota Service Quotas reports is the limit
    raised = gp(env, *up_args("big", "--gpu", "H100:8", "--nodes", "2", *NO_WAIT))
    assert raised.returncode == 0, raised.stdout + raised.stderr
    assert len([e for e in aws.log("AllocateAddress") if e["status"] == 200]) == 2
    assert gp(env, "down", "big", "--yes").returncode == 0
    nothing_left(aws)


# --- 8: SSH over IPv6 ---------------------------------------------------------------------------------------


def test_an_ipv6_ssh_cidr_is_refused_where_the_node_would_get_no_ipv6_address(aws, env):
    refused = refused_with(gp(env, "up", "v6", "--gpu", "T4", "--ssh-cidr", "2001:db8::7/128", "--yes", *NO_WAIT),
                           "--ssh-cidr")
    assert "no IPv6" in refused and "--subnet" in refused
    refused_with(gp(env, "up", "v6", "--gpu", "T4", "--ssh-cidr", "2001:db8::7/128", "--connect", "private", "--yes",
                    *NO_WAIT), "--ssh-cidr")
    assert not {"CreateSecurityGroup", "RunInstances"} & {e["action"] for e in aws.log()}
    nothing_left(aws)


def test_an_ipv6_ssh_cidr_on_an_ipv6_subnet_asks_for_an_ipv6_address_and_connects_over_it(aws, env):
    subnet = ipv6_subnet(aws)
    (found,) = aws.ec2().describe_subnets(SubnetIds=[subnet])["Subnets"]
    block = found["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"]
    result = gp(env, "up", "v6", "--gpu", "T4", "--subnet", subnet, "--ssh-cidr", "2001:db8::7/128", "--yes", *NO_WAIT)
    assert result.returncode == 0, result.stdout + result.stderr
    form = launched(aws)  # the subnet gives no public IPv4 by itself: one interface, asked for both
    assert form["NetworkInterface.1.Ipv6AddressCount"] == "1" and "Ipv6AddressCount" not in form
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    (v6,) = inst["NetworkInterfaces"][0]["Ipv6Addresses"]
    address = node(env, "v6")["address"]
    assert address == v6["Ipv6Address"] and ipaddress.ip_address(address) in ipaddress.ip_network(block)
    (group,) = aws.ec2().describe_security_groups(Filters=[{"Name": "tag:gpuprov:node", "Values": ["v6"]}])[
        "SecurityGroups"]
    (rule,) = group["IpPermissions"]
    assert rule["IpRanges"] == [] and [r["CidrIpv6"] for r in rule["Ipv6Ranges"]] == ["2001:db8::7/128"]
    assert gp(env, "stop", "v6").returncode == 0  # the IPv6 address persists across a stop; the public IPv4 does not
    started = gp(env, "start", "v6", "--no-bootstrap")
    assert started.returncode == 0, started.stdout + started.stderr
    assert node(env, "v6")["address"] == address

    # `start --move`: into its VPC's subnet with an IPv6 block in another zone (one without is skipped), asking for
    # an IPv6 address again, and reached on it
    vpc = aws.ec2().describe_vpcs(VpcIds=[found["VpcId"]])["Vpcs"][0]
    blocks = ipaddress.ip_network(vpc["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"]).subnets(new_prefix=64)
    next(blocks)  # the first subnet's
    zones = [o["Location"] for o in aws.ec2().describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": ["g4dn.xlarge"]}],
    )["InstanceTypeOfferings"] if o["Location"] != found["AvailabilityZone"]]
    plain, dual = sorted(zones)[:2]
    aws.ec2().create_subnet(VpcId=vpc["VpcId"], CidrBlock="10.77.2.0/24", AvailabilityZone=plain)
    there = aws.ec2().create_subnet(VpcId=vpc["VpcId"], CidrBlock="10.77.3.0/24", AvailabilityZone=dual,
                                    Ipv6CidrBlock=str(next(blocks)))["Subnet"]["SubnetId"]
    assert gp(env, "stop", "v6").returncode == 0
    moved = gp(env, "start", "v6", "--move", "--no-bootstrap")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert f"{plain}: skipped: {vpc['VpcId']} has no subnet there with an IPv6 CIDR block" in moved.stdout
    form = launched(aws)
    assert form["NetworkInterface.1.SubnetId"] == there and form["NetworkInterface.1.Ipv6AddressCount"] == "1"
    (now,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]
              if i["State"]["Name"] == "running"]
    assert node(env, "v6")["address"] == now["NetworkInterfaces"][0]["Ipv6Addresses"][0]["Ipv6Address"] != address
    assert gp(env, "down", "v6", "--yes").returncode == 0
    nothing_left(aws)


def test_an_ipv6_cluster_is_reached_over_ipv6_and_needs_no_elastic_ip(aws, env):
    subnet = ipv6_subnet(aws)
    iam = aws.client("iam")
    iam.create_instance_profile(InstanceProfileName="nodes")  # straight in moto: long visible to EC2
    result = gp(env, "up", "v6c", "--gpu", "H100:8", "--nodes", "2", "--subnet", subnet, "--ssh-cidr", "2001:db8::/64",
                "--instance-profile", "nodes", "--yes", *NO_WAIT)
    assert result.returncode == 0, result.stdout + result.stderr
    form = launched(aws)
    primary = next(k.split(".")[1] for k in form if k.endswith(".DeviceIndex") and form[k] == "0"
                   and form[k.replace("DeviceIndex", "NetworkCardIndex")] == "0")
    assert form[f"NetworkInterface.{primary}.Ipv6AddressCount"] == "1" and form["IamInstanceProfile.Name"] == "nodes"
    assert not aws.log("AllocateAddress") and not aws.log("AssociateAddress")
    members = node(env, "v6c")["members"]
    assert len(members) == 2 and all(":" in m["address"] for m in members)
    assert gp(env, "down", "v6c", "--yes").returncode == 0
    nothing_left(aws)


def test_an_ipv6_ssh_cidr_in_a_default_vpc_with_ipv6_asks_at_the_instance_level(aws, env):
    ec2 = aws.ec2()
    (vpc,) = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    block = ec2.associate_vpc_cidr_block(VpcId=vpc["VpcId"], AmazonProvidedIpv6CidrBlock=True)[
        "Ipv6CidrBlockAssociation"]["Ipv6CidrBlock"]
    blocks = ipaddress.ip_network(block).subnets(new_prefix=64)
    for sub in ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]:
        ec2.associate_subnet_cidr_block(SubnetId=sub["SubnetId"], Ipv6CidrBlock=str(next(blocks)))
    result = gp(env, "up", "v6", "--gpu", "T4", "--ssh-cidr", "2001:db8::7/128", "--yes", *NO_WAIT)
    assert result.returncode == 0, result.stdout + result.stderr
    form = launched(aws)
    assert form["Ipv6AddressCount"] == "1" and not any(k.startswith("NetworkInterface.") for k in form)
    assert ":" in node(env, "v6")["address"]
    assert gp(env, "down", "v6", "--yes").returncode == 0
    nothing_left(aws)


# --- 9: an image bigger than --disk -------------------------------------------------------------------------


def test_a_baked_image_bigger_than_disk_gets_a_root_volume_its_size(aws, env):
    from gpuprov.cloud.images import plan_stack
    from gpuprov.plan.plan import NodeRequest, make_plan

    stack = plan_stack(make_plan(NodeRequest(gpu="T4")))
    image, _ = big_image(aws, 150, "baked-150", tags=[*ours("gpuprov:stack", stack), {"Key": "gpuprov:os",
                                                                                       "Value": "ubuntu-24.04"}])
    result = gp(env, *up_args("big", "--gpu", "T4", "--disk", "100", *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "baked image baked-150" in result.stdout
    assert "root volume: 150 GB, not --disk 100: the image's root snapshot is 150 GB" in result.stdout
    form = launched(aws)
    assert (form["ImageId"], form["BlockDeviceMapping.1.Ebs.VolumeSize"]) == (image, "150")
    assert node(env, "big")["disk_gb"] == 150  # what the stopped node's disk costs follows it
    assert gp(env, "down", "big", "--yes").returncode == 0
    nothing_left(aws)


# --- 16: pages ------------------------------------------------------------------------------------------


def test_every_listing_reads_every_page(aws, env):
    aws.contracts(page_size=2)
    ec2 = aws.ec2()
    volumes = [ec2.create_volume(Size=1, AvailabilityZone="us-east-1a", TagSpecifications=[{"ResourceType": "volume",
               "Tags": [{"Key": "gpuprov:node", "Value": "gone"}, {"Key": "gpuprov:owner", "Value": owner()}]}])["VolumeId"]
               for _ in range(3)]
    snapshots = [ec2.create_snapshot(VolumeId=volumes[0], TagSpecifications=[{"ResourceType": "snapshot", "Tags": ours(
        "gpuprov:image", f"long-gone-{i}")}])["SnapshotId"] for i in range(3)]
    images = [big_image(aws, 20, f"lost-{i}", tags=ours("gpuprov:stack", "0" * 64))[0] for i in range(3)]
    requests = [ec2.request_spot_instances(
        InstanceCount=1, LaunchSpecification={"ImageId": images[0], "InstanceType": "g4dn.xlarge"},
        TagSpecifications=[{"ResourceType": "spot-instances-request", "Tags": [
            {"Key": "gpuprov:node", "Value": "gone"}, {"Key": "gpuprov:owner", "Value": owner()}]}])[
        "SpotInstanceRequests"][0]["SpotInstanceRequestId"] for _ in range(3)]
    listed = gp(env, "image", "list", "--json")
    assert sorted(i["id"] for i in json.loads(listed.stdout)) == sorted(images), listed.stdout
    found = json.loads(gp(env, "gc", "--json").stdout)["found"]
    by_kind = {kind: sorted(r["id"] for r in found if r["kind"] == kind) for kind in {r["kind"] for r in found}}
    assert by_kind.get("volume") == sorted(volumes) and by_kind.get("snapshot") == sorted(snapshots)
    assert by_kind.get("image") == sorted(images) and by_kind.get("spot-request") == sorted(requests)
    collected = gp(env, "gc", "--yes")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert gp(env, "gc").stdout.startswith("nothing to collect")
    assert [e for e in aws.log("DescribeVolumes") if e["form"].get("NextToken")]  # it did read page 2
    nothing_left(aws)


def test_status_refresh_of_more_instances_than_one_call_may_filter_asks_in_several_calls(aws, env, gp_home):
    """EC2 refuses a call whose filters carry more than 200 values (FilterLimitExceeded); `status --refresh` put
    every instance id of a region in one filter."""
    from gpuprov.state import NodeState, open_store

    image = aws.ec2().describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids = [i["InstanceId"] for i in aws.ec2().run_instances(ImageId=image, InstanceType="g4dn.xlarge", MinCount=201,
                                                            MaxCount=201)["Instances"]]
    store = open_store()
    for n, iid in enumerate(ids):
        store.create_node(f"n{n}", "aws", "us-east-1", state=NodeState.READY, instance_type="g4dn.xlarge")
        store.add_resource(f"n{n}", "instance", "us-east-1", iid)
    aws.ec2().stop_instances(InstanceIds=ids[-1:])
    refreshed = gp(env, "status", "--refresh", "--json")
    assert refreshed.returncode == 0, refreshed.stderr
    states = {row["name"]: row["state"] for row in json.loads(refreshed.stdout)}
    assert len(states) == 201 and states["n200"] == "stopped" and states["n0"] == "ready"
    asked = [e for e in aws.log("DescribeInstances") if any(k.startswith("Filter.") for k in e["form"])]
    assert asked and all(e["status"] == 200 for e in asked)  # none refused: no call carried more than 200 values


def test_filters_are_split_so_no_call_carries_more_than_200_values():
    from gpuprov.cloud.providers.aws_base import chunked

    owner = {"Name": "tag:gpuprov:owner", "Values": ["a", "b"]}
    ids = {"Name": "instance-id", "Values": [f"i-{n}" for n in range(450)]}
    calls = chunked([owner, ids])
    assert [sum(len(f["Values"]) for f in c["Filters"]) for c in calls] == [200, 200, 56]
    assert [v for c in calls for v in c["Filters"][1]["Values"]] == ids["Values"]
    assert all(c["Filters"][0] == owner for c in calls)
    assert chunked(None) == [{}] and chunked([owner]) == [{"Filters": [owner]}]


def test_live_prices_read_every_page_of_the_spot_price_history(aws, env):
    aws.contracts(page_size=2)
    aws.set_spot_prices({("g4dn.xlarge", "us-east-1a"): 0.30, ("g4dn.xlarge", "us-east-1b"): 0.25,
                         ("g4dn.xlarge", "us-east-1c"): 0.11})
    live = gp(env, "gpus", "T4", "--live", "--json")
    assert live.returncode == 0, live.stdout + live.stderr
    rows = [r for r in json.loads(live.stdout) if r["instance_type"] == "g4dn.xlarge"]
    assert sorted((r["zone"], r["spot_usd_hour"]) for r in rows) == [
        ("us-east-1a", 0.30), ("us-east-1b", 0.25), ("us-east-1c", 0.11)]
    plan = json.loads(gp(env, "plan", "--gpu", "T4", "--spot", "--hours", "10", "--live", "--json").stdout)
    assert "0.11" in json.dumps(plan["estimate"])  # the cheapest zone, on the second page


# --- 18: instance store at stop, deregistered images ---------------------------------------------------


def test_stop_says_the_instance_store_is_lost_and_asks_ec2_once_per_type(aws, env):
    for name in ("ns1", "ns2"):
        assert gp(env, *up_args(name, "--gpu", "T4", *NO_WAIT)).returncode == 0
    stopped = gp(env, "stop", "ns1")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    out = stopped.stdout + stopped.stderr
    assert "g4dn.xlarge has 125 GB of instance-store NVMe (1 × 125 GB)" in out
    assert "lost at stop" in out and "/opt/dlami/nvme" in out and "the EBS disk is kept" in out
    # `up` may have read every type once (the live catalog, cached a day): what `stop` asked names its type
    asked = [e for e in aws.log("DescribeInstanceTypes") if e["form"].get("InstanceType.1")]
    assert [e["form"]["InstanceType.1"] for e in asked] == ["g4dn.xlarge"]
    again = gp(env, "stop", "ns2")
    assert again.returncode == 0 and "125 GB of instance-store NVMe" in again.stdout + again.stderr
    assert len([e for e in aws.log("DescribeInstanceTypes") if e["form"].get("InstanceType.1")]) == 1  # kept
    assert gp(env, "down", "ns1", "ns2", "--yes").returncode == 0
    nothing_left(aws)


def test_a_deregistered_image_ec2_still_lists_is_neither_listed_chosen_nor_collected(aws, env):
    from gpuprov.cloud.images import plan_stack
    from gpuprov.plan.plan import NodeRequest, make_plan

    stack = plan_stack(make_plan(NodeRequest(gpu="T4")))
    image, snap = big_image(aws, 20, "old-bake", tags=[*ours("gpuprov:stack", stack), {"Key": "gpuprov:os",
                                                                                     "Value": "ubuntu-24.04"}])
    removed = gp(env, "image", "rm", "old-bake", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert f"image {image}" in removed.stdout and f"snapshot {snap}" in removed.stdout
    assert json.loads(gp(env, "image", "list", "--json").stdout) == []
    assert gp(env, "gc").stdout.startswith("nothing to collect")
    again = gp(env, "image", "rm", "old-bake", "--yes")
    assert again.returncode == 2 and "no image 'old-bake'" in again.stderr
    fresh = gp(env, *up_args("after", "--gpu", "T4", *NO_WAIT))
    assert fresh.returncode == 0 and launched(aws)["ImageId"] != image
    assert aws.contracts()["deregistered"][0]["left"] < 3  # EC2 did list it meanwhile
    assert gp(env, "down", "after", "--yes").returncode == 0
    nothing_left(aws)


# --- 20: instance profile, IMDS hop limit ---------------------------------------------------------------


def test_an_instance_profile_is_checked_passed_and_waited_for_with_a_hop_limit_of_two(aws, env):
    import boto3

    iam = boto3.client("iam", region_name="us-east-1")  # through the proxy: EC2 does not see the new profile yet
    iam.create_role(RoleName="ckpt", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}))
    iam.create_instance_profile(InstanceProfileName="ckpt")
    iam.add_role_to_instance_profile(InstanceProfileName="ckpt", RoleName="ckpt")
    result = gp(env, *up_args("prof", "--gpu", "T4", "--instance-profile", "ckpt", *NO_WAIT))
    assert result.returncode == 0, result.stdout + result.stderr
    runs = aws.log("RunInstances")
    assert [e["status"] for e in runs if e["rule"] != "fresh"][-3:] == [400, 400, 200]  # IAM's propagation, waited out
    form = launched(aws)
    assert form["IamInstanceProfile.Name"] == "ckpt"
    assert (form["MetadataOptions.HttpTokens"], form["MetadataOptions.HttpPutResponseHopLimit"]) == ("required", "2")
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert inst["IamInstanceProfile"]["Arn"].endswith("instance-profile/ckpt")
    assert inst["MetadataOptions"]["HttpPutResponseHopLimit"] == 2  # a container on the node reaches IMDSv2
    assert gp(env, "down", "prof", "--yes").returncode == 0
    nothing_left(aws)


def test_a_missing_instance_profile_is_refused_before_anything_is_made(aws, env):
    refused = refused_with(gp(env, *up_args("prof", "--gpu", "T4", "--instance-profile", "nope", *NO_WAIT)),
                           "--instance-profile")
    assert "'nope'" in refused and "aws iam create-instance-profile" in refused
    refused_with(gp(env, *up_args("prof", "--gpu", "T4", "--instance-profile", "no spaces", *NO_WAIT)),
                 "--instance-profile")
    assert not {"CreateSecurityGroup", "RunInstances", "ImportKeyPair"} & {e["action"] for e in aws.log()}
    nothing_left(aws)
