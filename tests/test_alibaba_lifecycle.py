"""A node's life on Alibaba Cloud through the CLI, in the fast lane: the real `gpuprov` against the ECS imitation
(tests/alibaba/server.py) in this process (`ecs_cli`), no SSH (--no-bootstrap --no-wait; tests/test_alibaba_cli.py
walks the same on a real SSH host). Pay-as-you-go and spot with a price limit failing over across zones and types
with ECS's own codes, a stop in economical mode (a spot node too) and what `status` says of it, a start refused
for want of stock, a reclaimed spot node, a lost RunInstances answer found by its ClientToken, and SIGKILL or
SIGTERM of `up` while RunInstances' answer is held: nothing is left untracked."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests import forkcli
from tests.alibaba.cli import EMPTY, leftovers
from tests.alibaba.server import Ecs, Fault

NO_SSH = ("--ssh-cidr", "198.51.100.7/32", "--yes", "--no-bootstrap", "--no-wait")
T4, T4X4 = "ecs.gn6i-c4g1.xlarge", "ecs.gn6i-c24g1.24xlarge"
ZONE_H, ZONE_I = "cn-hangzhou-h", "cn-hangzhou-i"
NO_STOCK = ("The requested resource is sold out in the specified zone; try other types of resources or other "
            "regions and zones.")


def _runs(ecs: Ecs) -> list[tuple[str, str, str, str | None]]:
    """Each RunInstances sent: (type, zone, SpotStrategy, SpotPriceLimit)."""
    return [(p["InstanceType"], p["ZoneId"], p["SpotStrategy"], p.get("SpotPriceLimit"))
            for action, p in ecs.calls if action == "RunInstances"]


def _status(ecs_cli) -> dict[str, dict]:
    shown = ecs_cli.gp("status", "--json")
    assert shown.exit_code == 0, shown.output
    return {n["name"]: n for n in json.loads(shown.stdout)}


def _offer_4x_t4(ecs: Ecs) -> None:
    """The catalog's next T4 type, offered in both zones."""
    ecs.types[T4X4] = ("NVIDIA T4", 4, 16.0, 96, 372)
    for zone in ecs.zones:
        ecs.stock[(zone, T4X4)], ecs.spot_price[(zone, T4X4)] = 10, 2.0


def test_the_registry_says_of_spot_stops_what_each_provider_declares(alibaba):
    from gpuprov.cloud import providers
    from gpuprov.cloud.providers.aws import AwsProvider
    from gpuprov.cloud.providers.capabilities import SPOT_STOP, has

    assert providers.CLOUDS["alibaba"].spot_stops and has(alibaba, SPOT_STOP)
    assert not providers.CLOUDS["aws"].spot_stops and not has(AwsProvider("gpuprov-test"), SPOT_STOP)


def test_pay_as_you_go_and_a_price_limited_spot_node_fail_over_with_ecs_codes_and_resize(ecs_cli):
    ecs = ecs_cli.cloud
    _offer_4x_t4(ecs)
    ecs.faults.append(Fault("RunInstances", code="OperationDenied.NoStock", message=NO_STOCK, status=403, times=2))
    up = ecs_cli.gp("up", "od", "--gpu", "T4", *NO_SSH)
    assert up.exit_code == 0, up.output
    # both zones of the first type refused, each in ECS's words, then the next type of the catalog
    assert up.stdout.count(f"  OperationDenied.NoStock: {NO_STOCK}") == 2
    assert _runs(ecs) == [(T4, ZONE_H, "NoSpot", None), (T4, ZONE_I, "NoSpot", None), (T4X4, ZONE_H, "NoSpot", None)]
    assert f"od is ready: {T4X4} in {ZONE_H} (on-demand)" in up.stdout
    assert {r.raw["InstanceChargeType"] for r in ecs.instances.values()} == {"PostPaid"}

    ecs.spot_price[(ZONE_H, T4)], ecs.spot_price[(ZONE_I, T4)] = 0.9, 0.3
    spot = ecs_cli.gp("up", "sp", "--gpu", "T4", "--spot", "--max-price", "0.5", *NO_SSH)
    assert spot.exit_code == 0, spot.output
    assert "  InvalidSpotPriceLimit.LowerThanPublicPrice: " in spot.stdout  # zone h's price is over the limit
    assert _runs(ecs)[3:] == [(T4, ZONE_H, "SpotWithPriceLimit", "0.5"), (T4, ZONE_I, "SpotWithPriceLimit", "0.5")]
    nodes = _status(ecs_cli)
    assert (nodes["sp"]["cloud"], nodes["sp"]["zone"], nodes["sp"]["market"]) == ("alibaba", ZONE_I, "spot")

    # the pay-as-you-go node resized back to the first type while stopped (ModifyInstanceSpec), on Alibaba's catalog
    assert ecs_cli.gp("stop", "od").exit_code == 0
    resized = ecs_cli.gp("start", "od", "--gpu", "T4", "--no-bootstrap", "--yes")
    assert resized.exit_code == 0, resized.output
    assert [p["InstanceType"] for action, p in ecs.calls if action == "ModifyInstanceSpec"] == [T4]
    assert _status(ecs_cli)["od"]["instance_type"] == T4
    stopped = ecs_cli.gp("stop", "sp")
    assert stopped.exit_code == 0, stopped.output
    spot_resize = ecs_cli.gp("start", "sp", "--instance-type", T4X4, "--no-bootstrap", "--yes")
    assert spot_resize.exit_code == 2 and "whose type ECS cannot change" in spot_resize.stderr
    down = ecs_cli.gp("down", "--all", "--yes")
    assert down.exit_code == 0, down.output
    assert leftovers(ecs) == EMPTY


def test_a_quota_or_a_balance_refusal_stops_up_in_alibaba_clouds_words_leaving_nothing(ecs_cli):
    ecs = ecs_cli.cloud
    ecs.vcpu_quota["PostPaid"] = 1
    quota = ecs_cli.gp("up", "q", "--gpu", "T4", *NO_SSH)
    assert quota.exit_code != 0 and "Traceback" not in quota.output
    assert "error: QuotaExceed.ElasticQuota: The number of vCPUs assigned" in quota.stderr
    assert f"Alibaba Cloud counts its quotas in vCPUs: {T4} needs 4" in quota.stderr
    assert "fix: ask for a higher vCPU quota of the instance family in Quota Center" in quota.stderr
    assert "AWS" not in quota.output and "aws " not in quota.output
    ecs.vcpu_quota["PostPaid"], ecs.balance_ok = 1000, False
    broke = ecs_cli.gp("up", "b", "--gpu", "T4", *NO_SSH)
    assert broke.exit_code != 0 and "Alibaba Cloud refused the launch: InvalidAccountStatus.NotEnoughBalance: " in \
        broke.stderr and "top it up in the Billing console" in broke.stderr
    assert [p["ZoneId"] for a, p in ecs.calls if a == "RunInstances"] == [ZONE_H, ZONE_H]  # each stopped at once
    assert leftovers(ecs) == EMPTY and _status(ecs_cli) == {}


def test_a_spot_node_stops_in_economical_mode_and_starts_again(ecs_cli):
    ecs = ecs_cli.cloud
    assert ecs_cli.gp("up", "sp", "--gpu", "T4", "--spot", *NO_SSH).exit_code == 0
    (row,) = ecs.instances.values()
    first = row.raw["PublicIpAddress"]["IpAddress"][0]
    stopped = ecs_cli.gp("stop", "sp")
    assert stopped.exit_code == 0, stopped.output  # ECS stops a preemptible instance as a pay-as-you-go one
    (sent,) = [p for action, p in ecs.calls if action == "StopInstances"]
    assert sent["StoppedMode"] == "StopCharging" and row.raw["Status"] == "Stopped"
    assert "sp: stopped; its compute is not billed, its 100 GB disk is: $0.0100/h ($7.20/month)" in stopped.stdout
    node = _status(ecs_cli)["sp"]
    assert (node["cloud"], node["state"], node["can_stop"]) == ("alibaba", "stopped", True)
    assert node["storage_price"] is None and node["disk_usd_hour"] == 0.01 and node["storage_unknown"] is None
    table = ecs_cli.gp("status").stdout
    assert "stopped (compute $0/h, disk $0.0100/h)" in table
    assert "on Alibaba Cloud is billed, its compute is not: its $/h is the disk's" in " ".join(table.split())
    assert "aws.amazon.com" not in table and "EC2" not in table and "gp3" not in table

    ecs.stock[(ZONE_I if row.raw["ZoneId"] == ZONE_I else ZONE_H, T4)] = 0  # economical mode gave its compute back
    refused = ecs_cli.gp("start", "sp", "--no-bootstrap")
    assert refused.exit_code == 1, refused.output
    assert "Alibaba Cloud refused to start sp: OperationDenied.NoStock: " in refused.stderr
    assert "sp stays stopped" in refused.stderr and _status(ecs_cli)["sp"]["state"] == "stopped"
    ecs.stock[(row.raw["ZoneId"], T4)] = 1
    started = ecs_cli.gp("start", "sp", "--no-bootstrap")
    assert started.exit_code == 0, started.output
    node = _status(ecs_cli)["sp"]
    assert node["state"] == "ready" and node["address"] == row.raw["PublicIpAddress"]["IpAddress"][0] != first
    assert ecs_cli.gp("down", "sp", "--yes").exit_code == 0
    assert leftovers(ecs) == EMPTY


def test_a_reclaimed_spot_node_is_interrupted_after_a_refresh_and_down_leaves_nothing(ecs_cli, monkeypatch):
    monkeypatch.setenv("GPUPROV_TEST_SETTLE_SECONDS", "0.5")  # past it, an instance ECS does not list is gone
    ecs = ecs_cli.cloud
    assert ecs_cli.gp("up", "sp", "--gpu", "T4", "--spot", *NO_SSH).exit_code == 0
    (iid,) = ecs.instances
    ecs.reclaim(iid)  # released (SpotInterruptionBehavior Terminate): ECS no longer lists it
    time.sleep(0.6)
    assert ecs_cli.gp("status", "--refresh").exit_code == 0
    node = _status(ecs_cli)["sp"]
    assert (node["state"], node["interrupted"]) == ("interrupted", True)
    assert ecs_cli.gp("down", "sp", "--yes").exit_code == 0
    assert leftovers(ecs) == EMPTY and _status(ecs_cli) == {}


def test_a_lost_run_instances_answer_is_found_by_its_client_token(ecs_cli):
    ecs = ecs_cli.cloud
    ecs.faults.append(Fault("RunInstances", lose=True))
    up = ecs_cli.gp("up", "lost", "--gpu", "T4", *NO_SSH)
    assert up.exit_code == 0, up.output
    (row,) = ecs.instances.values()  # one instance: looked for by its token's tag before asking again
    token = row.tags["gpuprov:token"]
    assert [a for a, _ in ecs.calls if a == "RunInstances"] == ["RunInstances"]
    assert any(a == "DescribeInstances" and p.get("Tag.1.Value") == token for a, p in ecs.calls)
    assert _status(ecs_cli)["lost"]["state"] == "ready"
    assert ecs_cli.gp("down", "lost", "--yes").exit_code == 0
    assert leftovers(ecs) == EMPTY


def _held_up(ecs: Ecs, gp_home, name: str) -> subprocess.Popen[str]:
    """`gpuprov up NAME` as its own process, once ECS has made its instance and holds RunInstances' answer."""
    import os

    from tests.aws.cli import CLI_SETTINGS

    env = {**os.environ, "GPUPROV_HOME": str(gp_home), "GPUPROV_CLOUD": "alibaba", **CLI_SETTINGS}
    ecs.faults.append(Fault("RunInstances", hold=True))
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "up", name, "--gpu", "T4", "--spot", *NO_SSH], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ecs.held:
        if proc.poll() is not None:
            pytest.fail(f"`up` ended before RunInstances: {proc.communicate()}")
        assert time.monotonic() < deadline, "RunInstances was never held"
        time.sleep(0.02)
    return proc


@pytest.mark.parametrize(("sig", "cleanup"), [(signal.SIGKILL, "down"), (signal.SIGKILL, "gc"), (signal.SIGTERM, "")],
                         ids=["SIGKILL-down", "SIGKILL-gc", "SIGTERM"])
def test_up_killed_at_run_instances_leaves_nothing_untracked(ecs_cli, gp_home, sig, cleanup):
    ecs = ecs_cli.cloud
    proc = _held_up(ecs, gp_home, "kill")
    assert len(ecs.instances) == 1  # made, its answer not yet given
    proc.send_signal(sig)
    ecs.release()
    out, err = proc.communicate(timeout=120)
    if sig == signal.SIGTERM:  # ends like Ctrl-C: what it made is taken back by the one gate
        assert proc.returncode == 143, out + err
        assert "interrupted by SIGTERM: kill was taken back: nothing of it is left" in err.strip().splitlines()[-1]
    else:  # the record made before RunInstances (with its ClientToken) finds the instance
        assert proc.returncode == -signal.SIGKILL
        assert _status(ecs_cli)["kill"]["cloud"] == "alibaba"
        cleaned = ecs_cli.gp(*(("down", "kill", "--yes") if cleanup == "down" else ("gc", "--yes")))
        assert cleaned.exit_code == 0, cleaned.output
    assert leftovers(ecs) == EMPTY and "kill" not in _status(ecs_cli)
