"""The Alibaba Cloud ECS alibaba against the ECS imitation (tests/alibaba/server.py), in-process: the official SDK
sends every call over HTTP to a loopback server in a thread (the fast lane: no root, no sshd)."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request

import pytest

from gpuprov.cloud.providers.alibaba import AlibabaProvider
from gpuprov.cloud.providers.base import Access, ImageRequest, LaunchError, LaunchRequest, NotFound
from gpuprov.errors import UserInputError
from tests.alibaba.server import Ecs, Fault

REGION, ZONE_H, ZONE_I = "cn-hangzhou", "cn-hangzhou-h", "cn-hangzhou-i"
A10 = "ecs.gn7i-c8g1.2xlarge"


def _access(alibaba: AlibabaProvider, node: str = "n1") -> Access:
    vpc = alibaba.network(REGION, None).vpc_id
    alibaba.import_key_pair(REGION, "gpuprov-me", "ssh-ed25519 AAAAC3Nz me")
    group = alibaba.create_security_group(REGION, node, vpc, f"gpuprov-{node}", "gpuprov node")
    alibaba.authorize_ssh(REGION, group, "198.51.100.7/32", settle=1)
    return Access("gpuprov-me", group, None, public_ip=True)


def _request(access: Access, *, market: str = "spot", zone: str = ZONE_H, token: str = "tok-1",
             max_price: float | None = None, node: str = "n1") -> LaunchRequest:
    return LaunchRequest(node=node, region=REGION, zone=zone, instance_type=A10, market=market,  # type: ignore[arg-type]
                         image_id=provider_image, access=access, disk_gb=60, client_token=token, max_price=max_price)


provider_image = "ubuntu_22_04_x64_20G_alibase_20250101.vhd"


def _sent(ecs_cloud: Ecs, action: str) -> list[dict[str, str]]:
    return [params for name, params in ecs_cloud.calls if name == action]


def test_spot_launch_asks_as_price_go_with_a_client_token_and_tags_on_every_resource(ecs_cloud, alibaba):
    access = _access(alibaba)
    instance = alibaba.launch(_request(access), settle=5)
    assert (instance.market, instance.zone, instance.node, instance.owner) == ("spot", ZONE_H, "n1", "me@host/abc")
    assert instance.public_ip and instance.private_ip and instance.subnet_id == f"vsw-{ZONE_H}"
    run = _sent(ecs_cloud, "RunInstances")[0]
    assert run["SpotStrategy"] == "SpotAsPriceGo" and run["InstanceChargeType"] == "PostPaid"
    assert run["ClientToken"] == "tok-1" and int(run["InternetMaxBandwidthOut"]) > 0
    assert run["VSwitchId"] == f"vsw-{ZONE_H}" and run["SystemDisk.Size"] == "60"
    tags = {run[k]: run[k.replace(".Key", ".Value")] for k in run if k.startswith("Tag.") and k.endswith(".Key")}
    assert tags["gpuprov:node"] == "n1" and tags["gpuprov:owner"] == "me@host/abc" and tags["gpuprov:token"] == "tok-1"
    for action in ("CreateSecurityGroup", "ImportKeyPair"):  # tagged at creation, not after
        assert _sent(ecs_cloud, action)[0]["Tag.1.Key"] == "gpuprov:node"
    assert alibaba.ssh_cidrs(REGION, access.security_group_id) == ["198.51.100.7/32"]
    assert alibaba.image(REGION, "ubuntu-22.04") == provider_image  # the newest of that name


def test_pay_as_you_go_is_no_spot_and_a_max_price_is_a_price_limit(ecs_cloud, alibaba):
    access = _access(alibaba)
    assert alibaba.launch(_request(access, market="on-demand", token="od"), settle=5).market == "on-demand"
    assert _sent(ecs_cloud, "RunInstances")[0]["SpotStrategy"] == "NoSpot"
    alibaba.launch(_request(access, token="limit", max_price=0.91666), settle=5)  # ECS takes 3 decimals
    run = _sent(ecs_cloud, "RunInstances")[1]
    assert run["SpotStrategy"] == "SpotWithPriceLimit" and run["SpotPriceLimit"] == "0.917"


@pytest.mark.parametrize(("arrange", "market", "code", "then"), [
    (lambda e: e.stock.update({(ZONE_H, A10): 0}), "spot", "OperationDenied.NoStock", "next-candidate"),
    (lambda e: e.not_on_sale.add(ZONE_H), "spot", "Zone.NotOnSale", "next-candidate"),
    (lambda e: e.spot_price.update({(ZONE_H, A10): 2.0}), "spot", "InvalidSpotPriceLimit.LowerThanPublicPrice",
     "next-candidate"),
    (lambda e: e.vcpu_quota.update(Spot=4), "spot", "QuotaExceed.ElasticQuota", "next-market"),
    (lambda e: e.vcpu_quota.update(PostPaid=4), "on-demand", "QuotaExceed.ElasticQuota", "stop"),
    (lambda e: setattr(e, "balance_ok", False), "on-demand", "InvalidAccountStatus.NotEnoughBalance", "stop"),
])
def test_each_documented_refusal_is_a_launch_error_in_alibabas_words(ecs_cloud, alibaba, arrange, market, code, then):
    access = _access(alibaba)
    arrange(ecs_cloud)
    with pytest.raises(LaunchError) as refused:
        alibaba.launch(_request(access, market=market, max_price=1.0 if market == "spot" else None), settle=5)
    assert (refused.value.code, refused.value.then) == (code, then)
    assert refused.value.message and refused.value.message != code  # Alibaba Cloud's own message
    assert alibaba.instances(REGION) == []
    # the next zone serves: what the failover does with next-candidate
    if then == "next-candidate":
        assert alibaba.launch(_request(access, market=market, zone=ZONE_I, token="t2"), settle=5).zone == ZONE_I


def test_throttling_is_asked_again_with_the_same_token(ecs_cloud, alibaba):
    access = _access(alibaba)
    ecs_cloud.faults.append(Fault("RunInstances", code="Throttling.User", message="Request was denied due to user flow "
                            "control.", times=2))
    instance = alibaba.launch(_request(access), settle=5)
    runs = _sent(ecs_cloud, "RunInstances")
    assert len(runs) == 3 and {r["ClientToken"] for r in runs} == {"tok-1"}
    assert [i.id for i in alibaba.instances(REGION)] == [instance.id]


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_a_lost_run_instances_answer_is_looked_for_by_its_token_and_launches_once(ecs_cloud, alibaba, delay):
    """The server launches and drops the answer; the alibaba looks for the token's tag, and (while the new
    instance is not listed yet) sends the same ClientToken again, which ECS answers with the first launch."""
    access = _access(alibaba)
    ecs_cloud.listing_delay = delay
    ecs_cloud.faults.append(Fault("RunInstances", lose=True))
    instance = alibaba.launch(_request(access), settle=5)
    assert len(ecs_cloud.instances) == 1 and instance.id in ecs_cloud.instances
    assert len(_sent(ecs_cloud, "RunInstances")) == (1 if delay == 0 else 2)
    assert [i.id for i in alibaba.find_launched(REGION, "tok-1")] == [instance.id]


def test_a_new_instance_is_not_listed_for_a_moment_and_launch_settles(ecs_cloud, alibaba):
    access = _access(alibaba)
    ecs_cloud.listing_delay = 0.3
    instance = alibaba.launch(_request(access), settle=5)  # described once it was listed
    assert instance.id in ecs_cloud.instances
    assert len(_sent(ecs_cloud, "DescribeInstances")) > 1 and len(_sent(ecs_cloud, "RunInstances")) == 1


def test_describe_raises_not_found_after_its_settle_time(ecs_cloud, alibaba):
    access = _access(alibaba)
    ecs_cloud.listing_delay = 5
    ids = alibaba._send(REGION, "RunInstances", alibaba._run_params(_request(access)))["InstanceIdSets"]
    with pytest.raises(NotFound):
        alibaba.describe(REGION, ids["InstanceIdSet"], settle=0.05)
    assert alibaba.instances(REGION) == []  # a filter: absent, not an error


def test_stop_is_economical_mode_and_start_needs_stock_again(ecs_cloud, alibaba):
    access = _access(alibaba)
    instance = alibaba.launch(_request(access, market="on-demand"), settle=5)
    alibaba.stop(REGION, [instance.id], settle=1)
    assert alibaba.wait_stopped(REGION, [instance.id], timeout=5)[0].state == "stopped"
    assert _sent(ecs_cloud, "StopInstances")[0]["StoppedMode"] == "StopCharging"
    assert ecs_cloud.instances[instance.id].raw["StoppedMode"] == "StopCharging"
    ecs_cloud.stock[(ZONE_H, A10)] = 0  # economical mode gave the compute back: someone took the last one
    with pytest.raises(LaunchError) as refused:
        alibaba.start(REGION, [instance.id], settle=1)
    assert (refused.value.code, refused.value.then) == ("OperationDenied.NoStock", "next-candidate")
    ecs_cloud.stock[(ZONE_H, A10)] = 1
    alibaba.start(REGION, [instance.id], settle=1)
    assert alibaba.wait_running(REGION, instance.id, timeout=5, settle=1).state == "running"


def test_terminate_releases_and_tagged_lists_what_gc_removes(ecs_cloud, alibaba):
    access = _access(alibaba)
    instance = alibaba.launch(_request(access), settle=5)
    other = AlibabaProvider("me@host/other", poll=0.01, legacy="me@host")
    other.import_key_pair(REGION, "theirs", "ssh-ed25519 AAAA them")
    mine = {(r.kind, r.id, r.node) for r in alibaba.tagged(REGION)}
    assert mine == {("instance", instance.id, "n1"), ("security-group", access.security_group_id, "n1"),
                    ("key-pair", "gpuprov-me", "(shared)")}
    assert ("key-pair", "theirs") in {(r.kind, r.id) for r in other.tagged(REGION)}
    assert ("key-pair", "theirs") not in {(r.kind, r.id) for r in alibaba.tagged(REGION)}
    for resource in sorted(alibaba.tagged(REGION), key=lambda r: r.kind != "instance"):
        alibaba.delete(resource, settle=1)
    assert alibaba.tagged(REGION) == [] and ecs_cloud.instances == {}
    with pytest.raises(NotFound):
        alibaba.terminate(REGION, [instance.id], settle=0.05)


def test_images_are_made_tagged_listed_and_removed_with_their_snapshots(ecs_cloud, alibaba):
    access = _access(alibaba)
    instance = alibaba.launch(_request(access), settle=5)
    request = ImageRequest(REGION, instance.id, "gpuprov-n1-abc", "baked", "n1", "abc", "ubuntu-22.04")
    image_id = alibaba.create_image(request)
    assert alibaba.create_image(request) == image_id  # the same ClientToken: the first image
    image = alibaba.wait_image(REGION, image_id, timeout=5, settle=1)
    assert (image.stack, image.os, image.source_node, image.owner) == ("abc", "ubuntu-22.04", "n1", "me@host/abc")
    assert [i.id for i in alibaba.images(REGION)] == [image_id]
    assert ("image", image_id) in {(r.kind, r.id) for r in alibaba.tagged(REGION)}
    assert alibaba.delete_image(REGION, image_id) == [image_id, *image.snapshot_ids]
    assert alibaba.images(REGION) == [] and ecs_cloud.snapshots == {}


def test_an_image_of_a_stopped_instance_leaves_it_stopped(ecs_cloud, alibaba):
    """`start --move` images a stopped node's disk: the reboot a running instance's image gets would start it (found
    by the randomized walk: a killed move left the node `stopped` with its instance running)."""
    instance = alibaba.launch(_request(_access(alibaba)), settle=5)
    alibaba.stop(REGION, [instance.id], settle=1)
    alibaba.wait_stopped(REGION, [instance.id], timeout=5)
    alibaba.create_image(ImageRequest(REGION, instance.id, "gpuprov-move-n1-1", "moved", "n1", "m", "ubuntu-22.04"))
    assert ecs_cloud.instances[instance.id].raw["Status"] == "Stopped"
    assert "StartInstances" not in [a for a, _ in ecs_cloud.calls]


def test_a_teams_image_is_the_teams_listed_by_name_and_its_snapshots_kept(ecs_cloud):
    """A team member's provider lists the team's images (by gpuprov:team, as its other resources): it listed none, so
    a killed move's image, recorded by name alone, was dropped untracked, and gc took a live image's snapshots for a
    gone image's (found by the randomized walk on Alibaba Cloud)."""
    team = AlibabaProvider("me@host/abc", poll=0.01, team={"gpuprov:team": "t1", "gpuprov:member": "m1"})
    instance = team.launch(_request(_access(team)), settle=5)
    image_id = team.create_image(ImageRequest(REGION, instance.id, "gpuprov-move-n1-1", "moved", "n1", "m",
                                              "ubuntu-22.04", no_reboot=True))
    assert [i.id for i in team.images(REGION, name="gpuprov-move-n1-1")] == [image_id]
    listed = {(r.kind, r.id) for r in team.tagged(REGION)}
    assert ("image", image_id) in listed and not any(kind == "snapshot" for kind, _ in listed)


def test_facts_offerings_prices_types_and_quota_are_read_from_ecs(ecs_cloud, alibaba):
    ecs_cloud.stock[(ZONE_I, A10)] = 0
    assert alibaba.offerings(REGION, [A10, "ecs.nope"]) == {A10: [ZONE_H]}
    assert {(p.zone, p.price) for p in alibaba.prices(REGION, [A10])} == {(ZONE_H, 0.5), (ZONE_I, 0.5)}
    types = {t.name: t for t in alibaba.gpu_instance_types(REGION)}
    assert set(types) == {A10, "ecs.gn6i-c4g1.xlarge"}  # the CPU-only type is left out
    assert (types[A10].gpu, types[A10].gpus, types[A10].gpu_memory_mib, types[A10].vcpu) == ("A10", 1, 24576, 8)
    assert alibaba.quota(REGION, "max-spot-instance-vcpu-count") == 1000
    assert alibaba.enabled_regions(REGION) == [REGION]


def test_a_zone_without_a_default_vswitch_moves_on_naming_it(ecs_cloud, alibaba):
    access = _access(alibaba)
    ecs_cloud.switches = [s for s in ecs_cloud.switches if s["ZoneId"] != ZONE_H]
    with pytest.raises(LaunchError) as refused:
        alibaba.launch(_request(access), settle=5)
    assert refused.value.then == "next-candidate" and ZONE_H in refused.value.message


def test_the_imitation_refuses_an_unknown_or_missing_parameter_as_ecs_does(ecs_cloud):
    url = __import__("os").environ["GPUPROV_ALIBABA_ENDPOINT"]

    def ask(query: str) -> tuple[int, dict[str, str]]:
        request = urllib.request.Request(f"{url}/?{query}", method="POST", headers={"x-acs-action": "StopInstances"})
        try:
            with urllib.request.urlopen(request) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, body = ask("RegionId=cn-hangzhou&InstanceId.1=i-1&StopMode=x")
    assert (status, body["Code"]) == (400, "UnsupportedParameter") and "StopMode" in body["Message"]
    status, body = ask("RegionId=cn-hangzhou&InstanceId.1=i-1&ForceStop=maybe")
    assert (status, body["Code"]) == (400, "InvalidParameter") and "ForceStop" in body["Message"]
    status, body = ask("InstanceId.1=i-1")
    assert (status, body["Code"]) == (400, "MissingParameter") and "RegionId" in body["Message"]
    status, body = ask("RegionId=cn-hangzhou&InstanceId.1=i-nope")
    assert (status, body["Code"]) == (404, "InvalidInstanceId.NotFound")


def test_no_credentials_is_bad_input_naming_the_chain(ecs_cloud, monkeypatch, tmp_path):
    """The credentials SDK reads its environment once, when it is imported (alibabacloud_credentials.utils
    .auth_util): the chain's inputs are emptied there."""
    from alibabacloud_credentials.utils import auth_constant, auth_util

    for name in ("environment_access_key_id", "environment_access_key_secret", "environment_profile_name",
                 "environment_credentials_file"):
        monkeypatch.setattr(auth_util, name, None)
    monkeypatch.setattr(auth_util, "environment_ecs_metadata_disabled", "true")  # no metadata service to ask
    monkeypatch.setattr(auth_constant, "HOME", str(tmp_path))  # no ~/.aliyun/config.json
    with pytest.raises(UserInputError, match="Alibaba Cloud credentials"):
        AlibabaProvider("me@host/abc").enabled_regions(REGION)


def test_a_bad_endpoint_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("GPUPROV_ALIBABA_ENDPOINT", "127.0.0.1:8000")
    with pytest.raises(UserInputError, match="GPUPROV_ALIBABA_ENDPOINT"):
        AlibabaProvider("me@host/abc")


def test_a_client_token_sent_again_with_other_parameters_is_refused(ecs_cloud, alibaba):
    access = _access(alibaba)
    alibaba.launch(_request(access), settle=5)
    with pytest.raises(LaunchError) as refused:
        alibaba.launch(_request(access, zone=ZONE_I), settle=5)  # the same token, another zone
    assert (refused.value.code, refused.value.then) == ("IdempotentParameterMismatch", "stop")
    assert len(ecs_cloud.instances) == 1


def test_a_group_launch_asks_amount_and_min_amount(ecs_cloud, alibaba):
    access = _access(alibaba)
    ecs_cloud.stock[(ZONE_H, A10)] = 1
    group = dataclasses.replace(_request(access), count=2, min_count=2)
    with pytest.raises(LaunchError) as refused:
        alibaba.launch_group(group, settle=5)
    assert refused.value.code == "OperationDenied.NoStock"
    made = alibaba.launch_group(dataclasses.replace(group, min_count=1, client_token="t2"), settle=5)
    assert len(made) == 1 and (_sent(ecs_cloud, "RunInstances")[-1]["Amount"],
                               _sent(ecs_cloud, "RunInstances")[-1]["MinAmount"]) == ("2", "1")


def test_a_reclaimed_spot_instance_is_gone_or_stopped_as_its_interruption_behaviour_says(ecs_cloud, alibaba):
    access = _access(alibaba)
    gone = alibaba.launch(_request(access), settle=5)
    kept = alibaba.launch(dataclasses.replace(_request(access, token="p"), persistent=True), settle=5)
    ecs_cloud.reclaim(gone.id)
    ecs_cloud.reclaim(kept.id)
    assert [(i.id, i.state) for i in alibaba.instances(REGION)] == [(kept.id, "stopped")]
    assert _sent(ecs_cloud, "RunInstances")[1]["SpotInterruptionBehavior"] == "Stop"


def test_a_lost_answer_to_a_token_or_harmless_call_is_sent_again_and_makes_nothing_twice(ecs_cloud, alibaba):
    vpc = alibaba.network(REGION, None).vpc_id
    ecs_cloud.faults += [Fault("CreateSecurityGroup", lose=True), Fault("ImportKeyPair", lose=True)]
    group = alibaba.create_security_group(REGION, "n1", vpc, "gpuprov-n1", "gpuprov node")
    assert list(ecs_cloud.groups) == [group] and len(_sent(ecs_cloud, "CreateSecurityGroup")) == 2
    alibaba.import_key_pair(REGION, "gpuprov-me", "ssh-ed25519 AAAA me")  # the second meets KeyPair.AlreadyExist
    assert list(ecs_cloud.keys) == ["gpuprov-me"] and len(_sent(ecs_cloud, "ImportKeyPair")) == 2
    instance = alibaba.launch(_request(Access("gpuprov-me", group, None, public_ip=True), market="on-demand"), 5)
    ecs_cloud.faults.append(Fault("StopInstances", lose=True))
    alibaba.stop(REGION, [instance.id], settle=1)
    assert alibaba.wait_stopped(REGION, [instance.id], timeout=5)[0].state == "stopped"
    assert len(_sent(ecs_cloud, "StopInstances")) == 2


def test_gpu_types_come_from_the_documented_families_where_ecs_lists_none(ecs_cloud, alibaba):
    ecs_cloud.types = {}
    types = {t.name: t for t in alibaba.gpu_instance_types(REGION)}
    assert (types["ecs.gn7e-c16g1.32xlarge"].gpu, types["ecs.gn7e-c16g1.32xlarge"].gpus) == ("A100", 8)
    assert types["ecs.gn6i-c4g1.xlarge"].gpu_memory_mib == 16 * 1024
