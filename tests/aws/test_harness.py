"""The fake-AWS harness itself: moto_server behind the fault proxy, driven with real boto3 clients.

Tests start in the proxy's "realistic" kind (EC2's eventual consistency for ids created through it).
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.aws import fault_proxy
from tests.aws.fixture import CANONICAL, SSM_PREFIX, AwsEndpoint, ssm_name, ubuntu_ami

UBUNTU = ubuntu_ami("24.04")
TAGS = [{"Key": "gpuprov:node", "Value": "n1"}, {"Key": "gpuprov:cluster", "Value": "c1"}]


def _ec2(region: str = "us-east-1"):  # plain client: everything from the env the `aws` fixture set
    return boto3.client("ec2", region_name=region)


def _run(ec2, az: str = "us-east-1b", itype: str = "g5.xlarge", spot: bool = False, **kw):
    args = dict(ImageId=UBUNTU, InstanceType=itype, MinCount=1, MaxCount=1, Placement={"AvailabilityZone": az}, **kw)
    if spot:
        args["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}}
    return ec2.run_instances(**args)


def test_env_points_at_proxy(aws: AwsEndpoint) -> None:
    env = aws.env()
    assert env["AWS_ENDPOINT_URL"] == aws.url != aws.moto_url
    assert env["AWS_MAX_ATTEMPTS"] == "2" and env["AWS_RETRY_MODE"] == "standard"
    assert env["GPUPROV_TEST_UBUNTU_SSM_PREFIX"] == SSM_PREFIX
    r = _run(_ec2(), spot=True)
    iid = r["Instances"][0]["InstanceId"]
    got = aws.ec2().describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert got["InstanceLifecycle"] == "spot" and got["Placement"]["AvailabilityZone"] == "us-east-1b"
    (entry,) = aws.log("RunInstances")
    assert entry["status"] == 200 and entry["region"] == "us-east-1" and entry["service"] == "ec2"
    assert entry["form"]["InstanceMarketOptions.MarketType"] == "spot"
    assert entry["form"]["Placement.AvailabilityZone"] == "us-east-1b"


def test_validation_is_on(aws: AwsEndpoint) -> None:
    ec2 = _ec2()
    for kw, code in ((dict(ImageId="ami-0123456789abcdef0"), "InvalidAMIID.NotFound"),
                     (dict(InstanceType="g99.huge"), "InvalidInstanceType.NotFound"),
                     (dict(KeyName="nope"), "InvalidKeyPair.NotFound")):
        args = dict(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1) | kw
        with pytest.raises(ClientError) as e:
            ec2.run_instances(**args)
        assert e.value.response["Error"]["Code"] == code


def test_ice_in_one_az_retried_then_other_az_ok(aws: AwsEndpoint) -> None:
    aws.faults([{"action": "RunInstances", "match": {"Placement.AvailabilityZone": "us-east-1a",
                                                     "InstanceMarketOptions.MarketType": "spot"},
                 "status": 500, "code": "InsufficientInstanceCapacity",
                 "message": "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested "
                            "(us-east-1a)."}])
    ec2 = _ec2()
    with pytest.raises(ClientError) as e:
        _run(ec2, az="us-east-1a", spot=True)
    assert e.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert e.value.response["ResponseMetadata"]["RetryAttempts"] == 1  # AWS_MAX_ATTEMPTS=2
    (rule,) = aws.rules()
    assert rule["hits"] == 2
    assert [x["status"] for x in aws.log("RunInstances")] == [500, 500]
    _run(ec2, az="us-east-1a")  # on-demand does not match the rule
    _run(ec2, az="us-east-1b", spot=True)
    assert aws.rules()[0]["hits"] == 2
    assert len(aws.ec2().describe_instances()["Reservations"]) == 2


def test_times_one_fires_once(aws: AwsEndpoint) -> None:
    aws.faults({"action": "RunInstances", "times": 1, "status": 400, "code": "VcpuLimitExceeded",
                "message": "You have requested more vCPU capacity than your current vCPU limit of 0 allows"})
    ec2 = _ec2()
    with pytest.raises(ClientError) as e:
        _run(ec2)
    assert e.value.response["Error"]["Code"] == "VcpuLimitExceeded"
    assert e.value.response["ResponseMetadata"]["RetryAttempts"] == 0  # 400: not retried
    _run(ec2)
    assert aws.rules()[0]["hits"] == 1
    assert [x["status"] for x in aws.log("RunInstances")] == [400, 200]


def test_json_protocol_error(aws: AwsEndpoint) -> None:
    aws.faults({"target": "AmazonSSM.GetParameter", "match": {"Name": ssm_name("22.04")}, "status": 400,
                "code": "AccessDeniedException", "message": "no"})
    ssm = boto3.client("ssm")
    with pytest.raises(ClientError) as e:
        ssm.get_parameter(Name=ssm_name("22.04"))
    assert e.value.response["Error"]["Code"] == "AccessDeniedException"
    assert ssm.get_parameter(Name=ssm_name("24.04"))["Parameter"]["Value"] == UBUNTU
    assert aws.log("GetParameter")[0]["json"] == {"Name": ssm_name("22.04")}


def test_spot_prices(aws: AwsEndpoint) -> None:
    aws.set_spot_prices({("g5.xlarge", "us-east-1a"): 0.4523, ("g5.xlarge", "us-east-1b"): 0.3911,
                         ("p4d.24xlarge", "us-east-1a"): 9.87})
    aws.set_spot_prices({("g5.xlarge", "us-west-2a"): 0.5}, region="us-west-2")
    ec2 = _ec2()
    rows = ec2.describe_spot_price_history(InstanceTypes=["g5.xlarge"], ProductDescriptions=["Linux/UNIX"],
                                           StartTime=dt.datetime.now(dt.timezone.utc))["SpotPriceHistory"]
    assert {(r["AvailabilityZone"], r["SpotPrice"]) for r in rows} == {("us-east-1a", "0.452300"),
                                                                     ("us-east-1b", "0.391100")}
    r = rows[0]
    assert r["InstanceType"] == "g5.xlarge" and r["ProductDescription"] == "Linux/UNIX"
    assert abs((dt.datetime.now(dt.timezone.utc) - r["Timestamp"]).total_seconds()) < 60
    assert r["AvailabilityZoneId"].startswith("use1-az")
    rows = ec2.describe_spot_price_history(Filters=[{"Name": "availability-zone", "Values": ["us-east-1a"]}])
    assert sorted(x["InstanceType"] for x in rows["SpotPriceHistory"]) == ["g5.xlarge", "p4d.24xlarge"]
    w2 = _ec2("us-west-2").describe_spot_price_history(InstanceTypes=["g5.xlarge"])["SpotPriceHistory"]
    assert [(x["AvailabilityZone"], float(x["SpotPrice"])) for x in w2] == [("us-west-2a", 0.5)]
    aws.set_spot_prices({("g5.xlarge", "us-east-1a"): 1.0})  # replaces the us-east-1 table
    rows = ec2.describe_spot_price_history(InstanceTypes=["g5.xlarge"])["SpotPriceHistory"]
    assert [float(x["SpotPrice"]) for x in rows] == [1.0]


def test_service_quota(aws: AwsEndpoint) -> None:
    aws.set_quota("L-34B43A08", 64)
    sq = boto3.client("service-quotas")
    q = sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-34B43A08")["Quota"]
    assert q["Value"] == 64.0 and q["QuotaCode"] == "L-34B43A08" and "Spot" in q["QuotaName"]
    with pytest.raises(ClientError) as e:  # not canned -> moto's answer
        sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-1216C47A")
    assert e.value.response["Error"]["Code"] == "NoSuchResourceException"


def test_hold_and_release(aws: AwsEndpoint) -> None:
    aws.faults({"action": "RunInstances", "hold": True, "times": 1})
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", _run(_ec2(), TagSpecifications=[
        {"ResourceType": "instance", "Tags": TAGS}])))
    t.start()
    try:
        aws.wait_held(1)
        # the cloud has done the work, the client has no answer yet
        assert aws.rules()[0]["held"] == 1 and aws.log("RunInstances")[0]["status"] == 200
        assert aws.leftovers()["instances"] and "r" not in out
    finally:
        assert aws.release() == 1
        t.join(10)
    assert out["r"]["Instances"][0]["InstanceId"] in aws.leftovers()["instances"]
    assert aws.log("RunInstances")[0]["outcome"] == "released"


def test_hold_client_gone(aws: AwsEndpoint) -> None:
    aws.faults({"action": "RunInstances", "hold": True})
    u = urllib.parse.urlsplit(aws.url)
    body = urllib.parse.urlencode({"Action": "RunInstances", "Version": "2016-11-15", "ImageId": UBUNTU,
                                   "InstanceType": "g5.xlarge", "MinCount": "1", "MaxCount": "1"}).encode()
    s = socket.create_connection((u.hostname, u.port))
    s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
              b"Authorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/ec2/aws4_request, "
              b"SignedHeaders=host, Signature=0\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    aws.wait_held(1)
    s.close()  # what SIGKILL of the client does
    end = time.monotonic() + 5
    while aws.log("RunInstances")[0]["outcome"] != "client-gone":
        assert time.monotonic() < end
        time.sleep(0.02)
    assert len(aws.ec2().describe_instances()["Reservations"]) == 1


def test_ssm_parameter_resolves_to_ubuntu_image(aws: AwsEndpoint) -> None:
    ssm, ec2 = boto3.client("ssm", region_name="us-west-2"), _ec2("us-west-2")
    for release, codename in (("22.04", "jammy"), ("24.04", "noble")):
        for vol in ("ebs-gp3", "ebs-gp2"):
            name = f"{SSM_PREFIX}/{release}/stable/current/amd64/hvm/{vol}/ami-id"
            p = ssm.get_parameter(Name=name)["Parameter"]
            assert p["DataType"] == "aws:ec2:image"
            (img,) = ec2.describe_images(ImageIds=[p["Value"]])["Images"]
            assert img["OwnerId"] == CANONICAL and img["Architecture"] == "x86_64"
            flavour = "hvm-ssd-gp3" if vol == "ebs-gp3" else "hvm-ssd"
            assert img["Name"] == f"ubuntu/images/{flavour}/ubuntu-{codename}-{release}-amd64-server-20261101"
    imgs = ec2.describe_images(Owners=[CANONICAL], Filters=[
        {"Name": "name", "Values": ["ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"]}])["Images"]
    assert max(imgs, key=lambda i: i["CreationDate"])["ImageId"] == UBUNTU and len(imgs) == 2


def test_subnet_ips_in_order(aws: AwsEndpoint) -> None:
    sub = aws.subnet_for_hosts()
    ec2 = _ec2()
    r = ec2.run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=3, MaxCount=3, SubnetId=sub)
    ips = [i["PrivateIpAddress"] for i in r["Instances"]]
    r = _run(ec2, az="us-east-1a", SubnetId=sub)
    ips.append(r["Instances"][0]["PrivateIpAddress"])
    assert ips == ["10.220.0.4", "10.220.0.5", "10.220.0.6", "10.220.0.7"]
    assert all(not i.get("PublicIpAddress") for res in aws.ec2().describe_instances()["Reservations"]
               for i in res["Instances"])
    sub2 = aws.subnet_for_hosts("10.220.1.0/24", az="us-east-1b")
    r = ec2.run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, SubnetId=sub2)
    assert r["Instances"][0]["PrivateIpAddress"] == "10.220.1.4"


@pytest.mark.instant_aws  # about leftovers, not eventual consistency: deletes right after creating
def test_leftovers(aws: AwsEndpoint) -> None:
    assert not any(aws.leftovers().values())
    ec2 = _ec2()
    w2 = _ec2("us-west-2")
    sg = ec2.create_security_group(GroupName="gp", Description="gp", TagSpecifications=[
        {"ResourceType": "security-group", "Tags": TAGS}])["GroupId"]
    w2.create_key_pair(KeyName="gp-key", KeyType="ed25519", TagSpecifications=[{"ResourceType": "key-pair", "Tags": TAGS}])
    iid = _run(ec2, TagSpecifications=[{"ResourceType": "instance", "Tags": TAGS},
                                       {"ResourceType": "volume", "Tags": TAGS}])["Instances"][0]["InstanceId"]
    _run(ec2)  # untagged: not ours
    left = aws.leftovers()
    assert left["instances"] == [iid] and left["security_groups"] == [sg] and left["key_pairs"] == ["gp-key"]
    assert len(left["volumes"]) == 1
    assert aws.leftovers(tag_key="gpuprov:other") == {k: [] for k in left}
    ec2.terminate_instances(InstanceIds=[iid])
    ec2.delete_security_group(GroupId=sg)
    w2.delete_key_pair(KeyName="gp-key")
    assert not any(aws.leftovers().values()), aws.leftovers()


def test_delay_with_in_process_proxy(aws: AwsEndpoint) -> None:
    srv = fault_proxy.make_server(0, aws.moto_url)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        fault_proxy.wait_ready(url)
        fault_proxy.add_rules(url, [{"action": "DescribeAvailabilityZones", "delay": 0.3}])
        ec2 = boto3.client("ec2", endpoint_url=url)
        t = time.monotonic()
        assert len(ec2.describe_availability_zones()["AvailabilityZones"]) == 6
        assert time.monotonic() - t >= 0.3
        st = fault_proxy.get_state(url)
        assert st["rules"][0]["hits"] == 1 and st["log"][0]["outcome"] == "forwarded"
        assert aws.log() == []  # the session proxy saw nothing
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)


def _err(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, str, int]:
    r = exc.value.response
    return r["Error"]["Code"], r["Error"]["Message"], r["ResponseMetadata"]["HTTPStatusCode"]


def _refused(call, *args, **kw) -> tuple[str, str, int]:
    with pytest.raises(ClientError) as e:
        call(*args, **kw)
    return _err(e)


def test_capacity_and_throttling_codes_get_ec2_status(aws: AwsEndpoint) -> None:
    ec2 = aws.client("ec2", via_proxy=True)
    expected = {"InsufficientInstanceCapacity": 500, "InsufficientCapacity": 500, "InsufficientHostCapacity": 500,
                "InsufficientReservedInstanceCapacity": 500, "InternalError": 500, "RequestLimitExceeded": 503,
                "Unavailable": 503, "AuthFailure": 401, "UnauthorizedOperation": 403, "VcpuLimitExceeded": 400}
    for code, status in expected.items():
        aws.faults({"name": "capacity", "action": "RunInstances", "code": code})
        assert _refused(_run, ec2)[::2] == (code, status)
    aws.faults({"name": "capacity", "action": "RunInstances", "code": "InsufficientInstanceCapacity", "status": 400})
    assert _refused(_run, ec2)[::2] == ("InsufficientInstanceCapacity", 400)  # an explicit status wins
    assert not aws.ec2().describe_instances()["Reservations"]


# ---------------------------------------------------------------------------------------- EC2 realism (kinds)
OWNED = [{"Name": "tag-key", "Values": ["gpuprov:node"]}]
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHd0fFvQHVu1sw7cUqfNQuGpwDvHYsWwgq4tGv6tO5rJ test"


def test_fresh_instance_not_found_twice_then_described(aws: AwsEndpoint) -> None:
    ec2 = aws.client("ec2", via_proxy=True)
    iid = _run(ec2)["Instances"][0]["InstanceId"]
    for _ in range(2):
        assert _refused(ec2.describe_instances, InstanceIds=[iid]) == (
            "InvalidInstanceID.NotFound", f"The instance ID '{iid}' does not exist", 400)
    (res,) = ec2.describe_instances(InstanceIds=[iid])["Reservations"]
    assert res["Instances"][0]["InstanceId"] == iid
    entries = aws.log("DescribeInstances")
    assert [(e["rule"], e["outcome"], e["status"], e["fresh"]) for e in entries] == [
        ("fresh", "fresh-notfound", 400, [iid]), ("fresh", "fresh-notfound", 400, [iid]), (None, "forwarded", 200, [])]
    assert aws.ec2().describe_instances(InstanceIds=[iid])["Reservations"]  # moto had it all along


def test_fresh_instance_terminate_and_several_ids(aws: AwsEndpoint) -> None:
    ec2 = aws.client("ec2", via_proxy=True)
    old = aws.ec2().run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1,
                                  MaxCount=1)["Instances"][0]["InstanceId"]  # straight in moto: never fresh
    a, b = (i["InstanceId"] for i in ec2.run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=2,
                                                        MaxCount=2)["Instances"])
    assert ec2.describe_instances(InstanceIds=[old])["Reservations"]
    assert _refused(ec2.describe_instances, InstanceIds=[old, a, b]) == (
        "InvalidInstanceID.NotFound", f"The instance IDs '{a}, {b}' do not exist", 400)
    assert _refused(ec2.terminate_instances, InstanceIds=[a])[0] == "InvalidInstanceID.NotFound"
    ec2.terminate_instances(InstanceIds=[a])  # a: two look-ups spent
    assert _refused(ec2.terminate_instances, InstanceIds=[b])[0] == "InvalidInstanceID.NotFound"  # b: one left
    ec2.terminate_instances(InstanceIds=[b])
    assert aws.log("TerminateInstances")[0]["fresh"] == [a]


def test_fresh_security_group_refuses_ingress_twice(aws: AwsEndpoint) -> None:
    ec2 = aws.client("ec2", via_proxy=True)
    sg = ec2.create_security_group(GroupName="gp", Description="gp")["GroupId"]
    perms = [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "198.51.100.7/32"}]}]
    for _ in range(2):
        assert _refused(ec2.authorize_security_group_ingress, GroupId=sg, IpPermissions=perms) == (
            "InvalidGroup.NotFound", f"The security group '{sg}' does not exist", 400)
    ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=perms)
    (g,) = aws.ec2().describe_security_groups(GroupIds=[sg])["SecurityGroups"]
    assert g["IpPermissions"][0]["IpRanges"][0]["CidrIp"] == "198.51.100.7/32"
    assert [e["outcome"] for e in aws.log("AuthorizeSecurityGroupIngress")] == ["fresh-notfound"] * 2 + ["forwarded"]
    sg2 = ec2.create_security_group(GroupName="gp2", Description="gp")["GroupId"]
    assert _refused(ec2.describe_security_groups, GroupIds=[sg2])[0] == "InvalidGroup.NotFound"
    assert _refused(ec2.delete_security_group, GroupId=sg2)[0] == "InvalidGroup.NotFound"
    ec2.delete_security_group(GroupId=sg2)


def test_run_instances_naming_fresh_group_or_key(aws: AwsEndpoint) -> None:
    ec2 = aws.client("ec2", via_proxy=True)
    sg = ec2.create_security_group(GroupName="gp", Description="gp")["GroupId"]
    assert _refused(_run, ec2, SecurityGroupIds=[sg]) == (
        "InvalidGroup.NotFound", f"The security group '{sg}' does not exist", 400)
    assert not aws.ec2().describe_instances()["Reservations"]  # refused before moto saw it
    key = ec2.import_key_pair(KeyName="gp-key", PublicKeyMaterial=PUBKEY.encode())
    assert key["KeyName"] == "gp-key"
    # one request naming both: the group's error; one look-up counted for each
    assert _refused(_run, ec2, SecurityGroupIds=[sg], KeyName="gp-key")[0] == "InvalidGroup.NotFound"
    assert aws.log("RunInstances")[-1]["fresh"] == [sg, "gp-key"]
    assert _refused(_run, ec2, KeyName="gp-key") == (
        "InvalidKeyPair.NotFound", "The key pair 'gp-key' does not exist", 400)
    _run(ec2, SecurityGroupIds=[sg], KeyName="gp-key")
    assert len(aws.ec2().describe_instances()["Reservations"]) == 1


def test_fresh_key_pair_by_name_or_id_and_fresh_volume(aws: AwsEndpoint) -> None:
    ec2 = aws.client("ec2", via_proxy=True)
    kid = ec2.create_key_pair(KeyName="gp-key", KeyType="ed25519")["KeyPairId"]
    assert _refused(ec2.describe_key_pairs, KeyNames=["gp-key"]) == (
        "InvalidKeyPair.NotFound", "The key pair 'gp-key' does not exist", 400)
    assert _refused(ec2.describe_key_pairs, KeyPairIds=[kid]) == (
        "InvalidKeyPair.NotFound", f"The key pair ID '{kid}' does not exist", 400)
    assert ec2.describe_key_pairs(KeyNames=["gp-key"])["KeyPairs"][0]["KeyPairId"] == kid  # name and id: one budget
    vol = ec2.create_volume(Size=1, AvailabilityZone="us-east-1a")["VolumeId"]
    for _ in range(2):
        assert _refused(ec2.describe_volumes, VolumeIds=[vol]) == (
            "InvalidVolume.NotFound", f"The volume '{vol}' does not exist.", 400)
    assert ec2.describe_volumes(VolumeIds=[vol])["Volumes"][0]["VolumeId"] == vol


def test_tag_filter_misses_a_new_instance_once(aws: AwsEndpoint) -> None:
    ec2 = aws.client("ec2", via_proxy=True)
    tags = [{"ResourceType": "instance", "Tags": TAGS}]
    old = aws.ec2().run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                                  TagSpecifications=tags)["Instances"][0]["InstanceId"]  # not fresh
    new = [i["InstanceId"] for i in ec2.run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=2,
                                                      MaxCount=2, TagSpecifications=tags)["Instances"]]
    by_node = [{"Name": "tag:gpuprov:node", "Values": ["n1"]}]
    (res,) = ec2.describe_instances(Filters=by_node)["Reservations"]  # the new reservation is left out whole
    (inst,) = res["Instances"]
    assert inst["InstanceId"] == old and {"Key": "gpuprov:node", "Value": "n1"} in inst["Tags"]  # XML still parses
    assert aws.log("DescribeInstances")[-1]["hidden"] == new
    assert aws.log("DescribeInstances")[-1]["outcome"] == "forwarded"
    got = {i["InstanceId"] for r in ec2.describe_instances(Filters=by_node)["Reservations"] for i in r["Instances"]}
    assert got == {old, *new}
    assert aws.log("DescribeInstances")[-1]["hidden"] == []
    # an unfiltered or other-filtered Describe shows them at once
    aws.realism(tag_lag=1)
    late = ec2.run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)["Instances"][0]
    running = [{"Name": "instance-type", "Values": ["g5.xlarge"]}]
    assert late["InstanceId"] in {i["InstanceId"] for r in ec2.describe_instances(Filters=running)["Reservations"]
                                  for i in r["Instances"]}


def test_tag_filter_lag_for_groups_keys_volumes_spot_requests(aws: AwsEndpoint) -> None:
    ec2 = aws.client("ec2", via_proxy=True)
    sg = ec2.create_security_group(GroupName="gp", Description="gp", TagSpecifications=[
        {"ResourceType": "security-group", "Tags": TAGS}])["GroupId"]
    ec2.import_key_pair(KeyName="gp-key", PublicKeyMaterial=PUBKEY.encode(), TagSpecifications=[
        {"ResourceType": "key-pair", "Tags": TAGS}])
    vol = ec2.create_volume(Size=1, AvailabilityZone="us-east-1a", TagSpecifications=[
        {"ResourceType": "volume", "Tags": TAGS}])["VolumeId"]
    sir = ec2.request_spot_instances(InstanceCount=1, LaunchSpecification={"ImageId": UBUNTU, "InstanceType": "g5.xlarge"},
                                     TagSpecifications=[{"ResourceType": "spot-instances-request", "Tags": TAGS}],
                                     )["SpotInstanceRequests"][0]["SpotInstanceRequestId"]
    assert ec2.describe_security_groups(Filters=OWNED)["SecurityGroups"] == []
    assert ec2.describe_key_pairs(Filters=OWNED)["KeyPairs"] == []
    assert ec2.describe_volumes(Filters=OWNED)["Volumes"] == []
    assert ec2.describe_spot_instance_requests(Filters=OWNED)["SpotInstanceRequests"] == []
    assert [e["hidden"] for e in aws.log() if e["hidden"]] == [[sg], ["gp-key"], [vol], [sir]]
    assert [g["GroupId"] for g in ec2.describe_security_groups(Filters=OWNED)["SecurityGroups"]] == [sg]
    assert [k["KeyName"] for k in ec2.describe_key_pairs(Filters=OWNED)["KeyPairs"]] == ["gp-key"]
    assert [v["VolumeId"] for v in ec2.describe_volumes(Filters=OWNED)["Volumes"]] == [vol]
    assert [r["SpotInstanceRequestId"] for r in
            ec2.describe_spot_instance_requests(Filters=OWNED)["SpotInstanceRequests"]] == [sir]


@pytest.mark.instant_aws
def test_instant_passes_everything_through(aws: AwsEndpoint) -> None:
    assert aws.realism_state()["kind"] == "instant"
    ec2 = aws.client("ec2", via_proxy=True)
    sg = ec2.create_security_group(GroupName="gp", Description="gp", TagSpecifications=[
        {"ResourceType": "security-group", "Tags": TAGS}])["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "198.51.100.7/32"}]}])
    ec2.import_key_pair(KeyName="gp-key", PublicKeyMaterial=PUBKEY.encode())
    assert ec2.describe_key_pairs(KeyNames=["gp-key"])["KeyPairs"]
    iid = _run(ec2, SecurityGroupIds=[sg], KeyName="gp-key", TagSpecifications=[
        {"ResourceType": "instance", "Tags": TAGS}])["Instances"][0]["InstanceId"]
    assert ec2.describe_instances(InstanceIds=[iid])["Reservations"]
    assert [i["InstanceId"] for r in ec2.describe_instances(Filters=OWNED)["Reservations"] for i in r["Instances"]] == [iid]
    vol = ec2.create_volume(Size=1, AvailabilityZone="us-east-1a")["VolumeId"]
    assert ec2.describe_volumes(VolumeIds=[vol])["Volumes"]
    ec2.terminate_instances(InstanceIds=[iid])
    assert all(e["outcome"] == "forwarded" and e["rule"] is None and not e["hidden"] for e in aws.log())
    assert aws.realism_state()["known"] == []  # nothing learnt while instant


def test_kind_switch_and_reset(aws: AwsEndpoint) -> None:
    assert aws.realism_state() == {"kind": "realistic", "fresh_lookups": 2, "tag_lag": 1, "image_pending": 2, "token_lag": 1,
                                   "known": []}
    aws.instant()
    ec2 = aws.client("ec2", via_proxy=True)
    early = _run(ec2)["Instances"][0]["InstanceId"]  # created while instant: never fresh
    assert aws.realism(fresh_lookups=1, tag_lag=0) == {"kind": "realistic", "fresh_lookups": 1, "tag_lag": 0,
                                                       "image_pending": 2, "token_lag": 1}
    late = _run(ec2, TagSpecifications=[{"ResourceType": "instance", "Tags": TAGS}])["Instances"][0]["InstanceId"]
    assert ec2.describe_instances(InstanceIds=[early])["Reservations"]
    assert _refused(ec2.describe_instances, InstanceIds=[late])[0] == "InvalidInstanceID.NotFound"
    assert ec2.describe_instances(InstanceIds=[late])["Reservations"]  # fresh_lookups=1
    aws.realism(fresh_lookups=0)
    sg = ec2.create_security_group(GroupName="gp", Description="gp")["GroupId"]
    ec2.delete_security_group(GroupId=sg)
    aws.reset()  # what the `aws` fixture does before every test
    assert aws.realism_state() == {"kind": "realistic", "fresh_lookups": 2, "tag_lag": 1, "image_pending": 2, "token_lag": 1,
                                   "known": []}
    assert aws.log() == []


def test_kind_control_api(aws: AwsEndpoint) -> None:
    assert fault_proxy.get_kind(aws.url) == {"kind": "realistic", "fresh_lookups": 2, "tag_lag": 1, "image_pending": 2,
                                             "token_lag": 1}
    assert fault_proxy.set_kind(aws.url, tag_lag=3) == {"kind": "realistic", "fresh_lookups": 2, "tag_lag": 3,
                                                        "image_pending": 2, "token_lag": 1}
    for bad in ({"kind": "eventual"}, {"fresh_lookups": -1}, {"tag_lag": "1"}, {"lag": 1}, [1]):
        req = urllib.request.Request(aws.url + "/__faults__/kind", data=json.dumps(bad).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 400
    assert fault_proxy.get_kind(aws.url)["tag_lag"] == 3
    fault_proxy.clear(aws.url)
    assert fault_proxy.get_kind(aws.url) == {"kind": "realistic", "fresh_lookups": 2, "tag_lag": 1, "image_pending": 2,
                                             "token_lag": 1}


def test_fixture_setup_is_never_fresh(aws: AwsEndpoint) -> None:
    sub = aws.subnet_for_hosts()
    vpc = aws.ec2().describe_subnets(SubnetIds=[sub])["Subnets"][0]["VpcId"]
    sg = aws.ec2().create_security_group(GroupName="direct", Description="d", VpcId=vpc)["GroupId"]
    ec2 = aws.client("ec2", via_proxy=True)
    r = ec2.run_instances(ImageId=UBUNTU, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, SubnetId=sub,
                          SecurityGroupIds=[sg])
    assert r["Instances"][0]["PrivateIpAddress"] == "10.220.0.4"
    assert ec2.describe_security_groups(GroupIds=[sg])["SecurityGroups"]


@pytest.mark.parametrize("kind", ["realistic", "instant"])
def test_client_token_launches_once_and_is_a_describe_filter(aws: AwsEndpoint, kind: str) -> None:
    """EC2 answers a repeated ClientToken with the first launch and filters by client-token; moto does neither."""
    aws.realism(kind)
    ec2 = aws.client("ec2", via_proxy=True)
    first = _run(ec2, ClientToken="tok-A")["Instances"][0]["InstanceId"]
    again = _run(ec2, ClientToken="tok-A")["Instances"][0]["InstanceId"]
    other = _run(ec2, ClientToken="tok-B")["Instances"][0]["InstanceId"]
    assert again == first and other != first
    assert len([i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]) == 2

    def by_token(*tokens: str) -> list[str]:
        reply = ec2.describe_instances(Filters=[{"Name": "client-token", "Values": list(tokens)}])
        return sorted(i["InstanceId"] for r in reply["Reservations"] for i in r["Instances"])

    if kind == "realistic":  # the filter lags like every filtered Describe (token_lag: one look-up per launch)
        assert by_token("tok-A", "tok-B") == []
    assert by_token("tok-A") == [first]
    assert by_token("tok-A", "tok-B") == sorted([first, other])
    assert by_token("never-used") == []
