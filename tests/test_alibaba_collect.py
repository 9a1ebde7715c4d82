"""`gc`, `gpus --live` and prices on Alibaba Cloud, through the CLI against the ECS imitation in this process (the
fast lane: tests/alibaba/inprocess_cli.py). gc's rules are cloud/gc.py's, the same as on AWS: these tests show that
they hold for ECS's tagged resources, and that nothing of AWS (its regions, its catalog, its endpoint) is read on the
way."""

from __future__ import annotations

import json

from tests.alibaba.inprocess_cli import error_line

A10 = "ecs.gn7i-c8g1.2xlarge"


def test_gc_never_takes_a_recorded_node_and_collects_it_once_its_record_is_gone(ecs_cli) -> None:
    looked = ecs_cli.gp("gc")  # no state yet: a look makes none
    assert looked.exit_code == 0, looked.output
    assert "nothing to collect in cn-hangzhou (" in looked.stdout and "us-east-1" not in looked.output
    assert not (ecs_cli.home / "state.sqlite").exists()

    ecs_cli.up("n1")
    ecs_cli.up("n2")
    made = ecs_cli.ours()
    assert len(made["instance"]) == 2 and len(made["securitygroup"]) == 2 and len(made["keypair"]) == 1
    kept = ecs_cli.gp("gc", "--yes")
    assert kept.exit_code == 0, kept.output
    assert "nothing to collect in cn-hangzhou (" in kept.stdout and ecs_cli.ours() == made

    n1 = [i for i in made["instance"] if ecs_cli.cloud.instances[i].tags["gpuprov:node"] == "n1"]
    ecs_cli.forget("n2")  # its record gone: what it made is an orphan, n1's is not
    listed = ecs_cli.gp("gc", "--json")
    assert listed.exit_code == 0, listed.output
    found = json.loads(listed.stdout)
    assert found["regions"] == ["cn-hangzhou"] and found["deleted"] is False
    n2 = {(r["kind"], r["node"]) for r in found["found"]}
    assert n2 == {("instance", "n2"), ("security-group", "n2")}
    assert ecs_cli.ours() == made  # listed only

    taken = ecs_cli.gp("gc", "--yes")
    assert taken.exit_code == 0, taken.output
    assert "deleted instance" in taken.stdout and "deleted security-group" in taken.stdout
    left = ecs_cli.ours()
    assert left["instance"] == n1
    assert len(left["securitygroup"]) == 1 and left["keypair"] == made["keypair"]  # n1 still uses the key pair
    assert ecs_cli.gp("status", "n1").exit_code == 0

    down = ecs_cli.gp("down", "n1", "--yes")
    assert down.exit_code == 0, down.output
    assert ecs_cli.ours() == {}


def test_gc_regions_are_alibabas_own(ecs_cli) -> None:
    line = error_line(ecs_cli.gp("gc", "--region", "us-east-2"))
    assert line == "error: --region: unknown Alibaba Cloud region 'us-east-2'"
    swept = ecs_cli.gp("gc", "--all-regions", "--json")
    assert swept.exit_code == 0, swept.output
    assert json.loads(swept.stdout)["regions"] == ["cn-hangzhou"]  # the only region the imitation enables
    assert "not enabled for this account, not swept: cn-shanghai, cn-beijing" in swept.stderr
    assert "us-east-1" not in swept.output
    given = ecs_cli.gp("gc", "--region", "cn-hangzhou")
    assert given.exit_code == 0 and "nothing to collect in cn-hangzhou (" in given.stdout


def test_gc_leaves_a_live_baked_images_snapshot_and_takes_one_whose_image_is_gone(ecs_cli) -> None:
    """ECS lists every tagged snapshot; a snapshot is an orphan only once its image is gone (as on AWS)."""
    from gpuprov.cloud.providers.alibaba import AlibabaProvider
    from gpuprov.cloud.providers.base import ImageRequest

    ecs_cli.up("n1")
    owner = ecs_cli.cloud.instances[next(iter(ecs_cli.cloud.instances))].tags["gpuprov:owner"]
    provider = AlibabaProvider(owner, poll=0.01)
    instance = next(iter(ecs_cli.cloud.instances))
    image = provider.create_image(ImageRequest("cn-hangzhou", instance, "baked-1", "d", "n1", "s", "ubuntu-24.04"))
    snapshot = ecs_cli.cloud.images[image]["DiskDeviceMappings"]["DiskDeviceMapping"][0]["SnapshotId"]
    listed = json.loads(ecs_cli.gp("gc", "--json").stdout)
    kinds = {(r["kind"], r["id"]) for r in listed["found"]}
    assert ("snapshot", snapshot) not in kinds
    assert ("image", image) in kinds  # no record names it: an orphan, as on AWS
    del ecs_cli.cloud.images[image]  # a DeleteImage whose DeleteSnapshot never came
    listed = json.loads(ecs_cli.gp("gc", "--json").stdout)
    assert ("snapshot", snapshot) in {(r["kind"], r["id"]) for r in listed["found"]}
    taken = ecs_cli.gp("gc", "--yes")
    assert taken.exit_code == 0, taken.output
    assert snapshot not in ecs_cli.cloud.snapshots


def test_gpus_live_shows_each_zones_stock_spot_and_pay_as_you_go_price_with_their_sources(ecs_cli) -> None:
    ecs_cli.cloud.stock[("cn-hangzhou-i", A10)] = 0
    ecs_cli.cloud.spot_price[("cn-hangzhou-h", A10)] = 0.61
    ecs_cli.cloud.list_price[A10] = 1.87
    shown = ecs_cli.gp("gpus", "--live", "A10", COLUMNS="80")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert [line.split() for line in lines if line.strip().startswith(A10)] == [
        [A10, "cn-hangzhou-h", "in", "stock", "$0.6100", "$1.8700"],
        [A10, "cn-hangzhou-i", "sold", "out", "$0.5000", "$1.8700"]]
    said = " ".join(shown.stdout.split())
    for source in ("stock: DescribeAvailableResource", "spot: DescribeSpotPriceHistory", "pay-as-you-go: DescribePrice"):
        assert source in said and said.split(source)[1].split(": ")[0].count(", read 20") == 1, source
    assert "not listed in cn-hangzhou: ecs.gn7i-c32g1.32xlarge" in said  # documented, not in this region
    assert "EC2" not in shown.output and "us-east-1" not in shown.output

    listed = ecs_cli.gp("gpus", "--live", "A10", "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)["rows"]
    sold = next(r for r in rows if r["zone"] == "cn-hangzhou-i")
    assert sold["stock"] == {"available": False, "status": "SoldOut", "source": "DescribeAvailableResource",
                             "read": sold["stock"]["read"]}
    assert sold["pay_as_you_go"]["price_hour"] == 1.87 and sold["pay_as_you_go"]["source"] == "DescribePrice"
    assert sold["spot"]["at"] == "2026-12-03 00:00:00 UTC" and sold["spot"]["currency"] == "USD"
    line = error_line(ecs_cli.gp("gpus", "--live", "--region", "us-east-2"))
    assert line == "error: --region: unknown Alibaba Cloud region 'us-east-2'"
    asked = [params for action, params in ecs_cli.cloud.calls if action == "DescribePrice"]
    assert asked and all(p["ResourceType"] == "instance" and p["PriceUnit"] == "Hour" for p in asked)


def test_gpus_live_says_ecss_own_code_and_message_when_it_refuses(ecs_cli) -> None:
    from tests.alibaba.server import Fault

    ecs_cli.cloud.faults.append(Fault("DescribeAvailableResource", "InvalidAccessKeyId.NotFound",
                                      "Specified access key is not found.", status=404))
    line = ecs_cli.gp("gpus", "--live")
    assert line.exit_code == 1, line.output
    assert line.stderr.splitlines()[-2:] == [
        "error: Alibaba Cloud refused DescribeAvailableResource: InvalidAccessKeyId.NotFound: Specified access key is "
        "not found.", "  fix: check ALIBABA_CLOUD_ACCESS_KEY_ID or the profile"]
    ecs_cli.cloud.faults.append(Fault("DescribePrice", "Throttling.User", "Request was denied due to user flow "
                                      "control.", times=9))
    throttled = ecs_cli.gp("gpus", "--live")
    assert throttled.exit_code == 1, throttled.output
    assert ("error: Alibaba Cloud refused DescribePrice: Throttling.User: Request was denied due to user flow "
            "control.") in throttled.stderr
    assert len([a for a, _ in ecs_cli.cloud.calls if a == "DescribePrice"]) == 4  # sent again, then said


def test_up_reads_and_records_the_price_and_status_shows_it_and_no_compute_while_stopped(ecs_cli) -> None:
    ecs_cli.cloud.list_price[A10] = 1.87
    ecs_cli.cloud.spot_price[("cn-hangzhou-h", A10)] = 0.61
    paygo = ecs_cli.up("n1")
    said = " ".join(paygo.output.split())
    assert "pay-as-you-go price $1.8700/h; its 100 GB disk $0.0100/h (Alibaba Cloud DescribePrice, read 20" in said
    assert "list price $1.87/h on-demand" in said
    spot = ecs_cli.up("s1", "--spot")
    assert "spot price $0.6100/h in cn-hangzhou-h" in " ".join(spot.output.split())
    rows = {r["name"]: r for r in json.loads(ecs_cli.gp("status", "--json").stdout)}
    assert (rows["n1"]["price_usd_hour"], rows["n1"]["paid_usd_hour"]) == (1.87, 1.87)
    assert (rows["s1"]["price_usd_hour"], rows["s1"]["paid_usd_hour"]) == (1.87, 0.61)

    ecs_cli.cloud.disk_price_gb_hour = 0.0002  # the disk is priced again at the stop: today's price is recorded
    stopped = ecs_cli.gp("stop", "n1")
    assert stopped.exit_code == 0, stopped.output
    assert "n1: stopped; its compute is not billed, its 100 GB disk is: $0.0200/h ($14.40/month)" in stopped.stdout
    (asked,) = [p for a, p in ecs_cli.cloud.calls if a == "DescribePrice" and p.get("ResourceType") == "disk"]
    assert (asked["DataDisk.1.Category"], asked["DataDisk.1.Size"], asked["PriceUnit"]) == ("cloud_essd", "100", "Hour")
    assert ecs_cli.cloud.instances[next(iter(ecs_cli.cloud.instances))].raw["StoppedMode"] == "StopCharging"
    table = ecs_cli.gp("status")
    (n1,) = [line for line in table.stdout.splitlines() if line.lstrip().startswith("n1 ")]
    assert "$0.02" in n1 and "$1.87" not in n1 and "(compute $0/h, disk $0.0200/h)" in n1  # its $/h: the disk's
    assert "gp3" not in table.stdout  # AWS's disk price is not an Alibaba disk's
    row = next(r for r in json.loads(ecs_cli.gp("status", "--json").stdout) if r["name"] == "n1")
    assert (row["disk_usd_hour"], row["storage_usd_month"]) == (0.02, 14.4)
    assert row["storage_price"] is None and row["storage_unknown"] is None


def test_a_price_ecs_will_not_say_leaves_the_node_without_one(ecs_cli) -> None:
    from tests.alibaba.server import Fault

    ecs_cli.cloud.faults.append(Fault("DescribePrice", "Forbidden.RAM", "User not authorized to operate on the "
                                      "specified resource.", status=403))
    launched = ecs_cli.up("n1")
    assert "could not read the pay-as-you-go price (Alibaba Cloud refused DescribePrice: Forbidden.RAM" in \
        " ".join(launched.output.split())
    (row,) = json.loads(ecs_cli.gp("status", "--json").stdout)
    assert row["price_usd_hour"] is None and row["state"] == "ready"
