"""What runs on an Alibaba Cloud node: the spot watch reads ECS's metadata (tests/alibaba/metadata.py) and feeds the
same hook as on AWS; autostop and the TTL say what ECS's stop from within bills, and ask ECS for economical mode with
the instance's RAM role (the ECS imitation checks the node's signature), powering off saying why without one; the node
downloads through Alibaba's internal mirror unless the user names sources. In-process and under the shims (fast
lane)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuprov.plan.plan import NodeRequest, guard_steps, make_plan
from gpuprov.plan.render import render_steps
from tests.alibaba.metadata import EcsMetadata
from tests.shimrun import ShimHost
from tests.test_alibaba_plan import error_line, gp
from tests.test_guardrails import assert_bash_and_shellcheck_pass


@pytest.fixture(autouse=True)
def _home(gp_home: Path) -> None:
    """gpuprov's home of its own for each test (gp_home)."""


def plan(*args: str, cloud: str = "alibaba") -> dict[str, Any]:
    result = gp("plan", "--cloud", cloud, "--gpu", "A10" if cloud == "alibaba" else "T4", *args, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.fixture
def metadata() -> Iterator[EcsMetadata]:
    meta = EcsMetadata()
    try:
        yield meta
    finally:
        meta.close()


def test_the_spot_watch_reads_ecs_metadata_and_runs_the_hook_once_per_notice(tmp_path: Path, metadata) -> None:
    guards = make_plan(NodeRequest(gpu="A10", cloud="alibaba", region="cn-hangzhou", spot=True,
                                   on_interrupt='echo "$GPUPROV_INTERRUPT_ACTION $GPUPROV_INTERRUPT_TIME" >> HOOK')).guards
    assert guards.interrupt_watch and guards.metadata_url == "http://100.100.100.200"
    (step,) = guard_steps(guards)
    assert "ECS metadata instance/spot/termination-time (set five minutes ahead)" in step.summary
    (script,) = render_steps((step,), {}, {}).scripts
    host = ShimHost(tmp_path, gpu="A10")
    assert host.run_script(script).result == "changed"
    conf = (host.sysroot / "etc/gpuprov/interrupt.conf").read_text()
    assert conf == "CLOUD=alibaba\nMETADATA_URL=http://100.100.100.200\nPOLL_SECONDS=5\nHOOK_TIMEOUT=240\n"
    watch = host.sysroot / "usr/local/lib/gpuprov/interrupt-watch"
    hook = host.sysroot / "etc/gpuprov/on-interrupt"
    runs = tmp_path / "hook-runs"
    hook.write_text(hook.read_text().replace("HOOK", str(runs)))
    log = host.sysroot / "var/log/gpuprov/interrupt.log"

    def once() -> str:
        env = {**os.environ, "GPUPROV_SYSROOT": str(host.sysroot), "GPUPROV_METADATA_URL": metadata.url}
        subprocess.run(["bash", str(watch), "--once"], env=env, check=True, capture_output=True, timeout=30)
        return runs.read_text() if runs.exists() else ""

    assert once() == "" and not log.exists()  # 404: nothing scheduled, nothing logged
    assert metadata.puts == 1 and metadata.gets == [("instance/spot/termination-time", 404)]  # with the token
    metadata.reclaim("2026-12-04T05:02:00Z")
    assert once() == "terminate 2026-12-04T05:02:00Z\n"
    assert "spot interruption notice: action=terminate time=2026-12-04T05:02:00Z" in log.read_text()
    assert once() == "terminate 2026-12-04T05:02:00Z\n"  # the same notice: the hook does not run again
    assert metadata.gets[-1] == ("instance/spot/termination-time", 200)
    (tmp_path / "step.sh").write_text(script.text)
    assert_bash_and_shellcheck_pass([tmp_path / "step.sh", watch])


def test_an_alibaba_plan_takes_the_hook_and_says_what_autostop_and_the_ttl_stop_bills() -> None:
    data = plan("--spot", "--on-interrupt", "echo saved", "--autostop", "30m", "--ttl", "8h")
    assert data["guards"]["interrupt_watch"] and data["guards"]["cloud"] == "alibaba"
    assert data["guards"]["shutdown_action"] == "stop"  # ECS stops an instance powered off from within, spot too
    steps = {s["name"]: s["summary"] for s in data["steps"]}
    assert "ECS metadata instance/spot/termination-time" in steps["spot-interrupt"]
    assert data["guards"]["stop_role"]  # gpuprov launches it with the RAM role its guards' stop asks ECS with
    for name in ("autostop", "ttl"):
        assert "ECS's economical mode: its disk is kept and its compute stops billing (the node asks ECS with its " \
            "RAM role; where ECS refuses, it powers off in ECS's standard mode" in steps[name]
    assert error_line(gp("plan", "--gpu", "A10", "--autostop", "1h", "--autostop-action", "terminate")).startswith(
        "error: --autostop-action: terminate: an ECS instance powered off from within stops")
    assert not {"cloud", "stop_role"} & set(plan(cloud="aws")["guards"])  # an AWS plan's guards as they were


def test_a_node_on_alibaba_downloads_through_its_internal_mirror_unless_sources_are_named(tmp_path: Path) -> None:
    rows = {r["key"]: r for r in plan()["sources"]}
    assert rows["nvidia"]["url"] == "http://mirrors.cloud.aliyuncs.com/nvidia-cuda"
    assert rows["nvidia"]["from"] == "cn-aliyun-vpc (the default on Alibaba Cloud)"
    named = {r["key"]: r for r in plan("--sources", "cn-tuna")["sources"]}  # the user's map replaces it whole
    assert "cn-aliyun-vpc" not in json.dumps(named) and named["nvidia"]["from"] == "default"
    config = tmp_path / "config.toml"
    config.write_text('[sources]\npypi = "https://pypi.example.org/simple"\n')
    from_config = gp("plan", "--gpu", "A10", "--json", env={"GPUPROV_CONFIG": str(config)})
    assert "cn-aliyun-vpc" not in from_config.stdout, from_config.output  # so does the config's
    config.write_text("[sources]\n")  # an empty map is one: the origins
    from_config = gp("plan", "--gpu", "A10", "--json", env={"GPUPROV_CONFIG": str(config)})
    assert all(r["from"] == "default" for r in json.loads(from_config.stdout)["sources"])
    human = gp("plan", "--gpu", "A10")
    assert "cn-aliyun-vpc (the default on Alibaba Cloud)" in human.stdout
    assert all(r["from"] == "default" for r in plan(cloud="aws")["sources"])  # AWS keeps the origins


def test_an_ecs_host_is_told_by_its_dmi_and_its_type_read_from_ecs_metadata(tmp_path: Path) -> None:
    """DMI that says Alibaba Cloud (as hostnamectl shows an ECS instance's) is what sends the facts to ECS's metadata;
    a host whose DMI says neither cloud asks no metadata service at all (test_nvswitch_b200.py's Dell case)."""
    from gpuprov.hosts.detect import FACTS_COMMAND, parse_facts
    from tests.shimrun import DMI_DIR

    host = ShimHost(tmp_path, gpu="A10", extra_env={"GPUPROV_SHIM_ECS_INSTANCE_TYPE": "ecs.gn7i-c8g1.2xlarge"})
    dmi = host.sysroot / DMI_DIR
    dmi.mkdir(parents=True)
    (dmi / "sys_vendor").write_text("Alibaba Cloud\n")
    (dmi / "product_name").write_text("Alibaba Cloud ECS\n")

    def facts() -> tuple[str | None, list[str]]:
        before = len(host.calls())
        out = subprocess.run(["bash", "-c", FACTS_COMMAND], capture_output=True, text=True, env=host.env(), timeout=60)
        return parse_facts(out.stdout).instance_type, [c for c in host.calls()[before:] if c.startswith("curl ")]

    found, curls = facts()
    assert found == "ecs.gn7i-c8g1.2xlarge"
    assert all("100.100.100.200" in c for c in curls) and len(curls) == 2  # the token, then the type
    (dmi / "sys_vendor").write_text("QEMU\n")
    (dmi / "product_name").write_text("Standard PC (Q35 + ICH9, 2009)\n")
    assert facts() == (None, [])


def test_status_says_an_alibaba_nodes_guards_stop_in_economical_mode_with_its_role_else_standard() -> None:
    from gpuprov.state import open_store

    store = open_store()
    with_role = json.dumps({"guards": {"stop_role": True, "cloud": "alibaba"}})
    for name, provider, plan_json in (("ali", "alibaba", None), ("aws1", "aws", None), ("eco", "alibaba", with_role)):
        store.create_node(name, provider, "cn-hangzhou" if provider == "alibaba" else "us-east-1", gpu="T4",
                          gpu_count=1, instance_type="ecs.gn6i-c4g1.xlarge", market="spot", state="ready",
                          address="10.0.0.5", ssh_user="root", autostop_seconds=1800, shutdown_action="stop",
                          plan_json=plan_json)
    rows = {r["name"]: r for r in json.loads(gp("status", "--json").stdout)}
    assert rows["ali"]["autostop_stop_mode"] == "standard" and "autostop_stop_mode" not in rows["aws1"]
    assert rows["eco"]["autostop_stop_mode"] == "economical"  # launched with the RAM role its ecs-stop asks with
    out = " ".join(gp("status").stdout.split())
    assert "30m idle → stop (standard)" in out and "30m idle → stop (economical)" in out
    assert ("ali: its guards' stop is ECS's standard mode: the disk is kept and the compute may go on billing "
            "(`gpuprov stop ali` stops in economical mode; `gpuprov down ali` ends the bill)") in out
    assert "aws1: its guards'" not in out and "eco: its guards'" not in out


def test_a_data_entry_on_oss_is_refused_saying_s3_only_for_now(tmp_path: Path) -> None:
    playbook = tmp_path / "d.yml"
    playbook.write_text("name: d\nstack: none\nenv: null\ndata:\n  - from: /work/ckpt\n    to: oss://ckpt/run1\n"
                        "    when: interrupt\n")
    assert error_line(gp("plan", "--gpu", "T4", "-p", str(playbook))) == (
        f"error: --playbook: {playbook}:6: data.0.to: 'oss://ckpt/run1': gpuprov moves data with S3 only for now "
        "(oss:// is not read); an s3://BUCKET/PREFIX or an absolute path on the node")


def test_sources_origins_by_flag_or_variable_keeps_an_alibaba_node_at_the_origins() -> None:
    for flag, env in ((("--sources", "origins"), None), ((), {"GPUPROV_SOURCES": "origins"})):
        result = gp("plan", "--gpu", "A10", "--json", *flag, env=env)
        assert result.exit_code == 0, result.output
        assert all(r["from"] == "default" for r in json.loads(result.stdout)["sources"])
    assert error_line(gp("plan", "--gpu", "A10", "--sources", "nowhere")) == \
        "error: --sources: 'nowhere' is neither a preset nor a file"


def test_a_bootstrapped_ecs_instance_has_its_watch_read_ecss_notice() -> None:
    """A host whose facts name an ECS type (a machine made in Alibaba's console) gets the watch of ECS's notice for its
    --on-interrupt; an EC2 instance, or a host on no cloud, AWS's as before."""
    from gpuprov.hosts.detect import HostFacts
    from gpuprov.hosts.planner import Planner
    from gpuprov.plan.inventory import Target
    from gpuprov.plan.plan import GuardRequest
    from gpuprov.plan.stack import StackPins

    planner = Planner("T4", "minimal", None, StackPins(), GuardRequest(on_interrupt="echo bye"))

    def cloud(instance_type: str | None) -> str:
        facts = HostFacts(gpus=["T4"], nvswitch=False, os="ubuntu-22.04", source="nvidia-smi",
                          instance_type=instance_type)
        plan = planner(Target(host="10.0.0.9"), facts)
        (watch,) = [s for s in plan.steps if s.name == "spot-interrupt"]
        return dict(watch.extra)["guards"].cloud  # type: ignore[no-any-return]

    assert cloud("ecs.gn6i-c4g1.xlarge") == "alibaba"
    assert cloud("g4dn.xlarge") == "aws" and cloud(None) == "aws"


# --- autostop and the TTL ask ECS for economical mode (the node's ecs-stop) --------------------------------------

SECRET, STS_TOKEN = "role/secret+do-not-log=", "CAIS+role/token~do not log=="  # the signature encodes these


@pytest.fixture
def ecs() -> Iterator[tuple[Any, str]]:
    from tests.alibaba.server import serve

    with serve() as served:
        yield served


def _running_instance(cloud: Any, metadata: EcsMetadata) -> str:
    """One instance launched in the imitation, whose metadata the stand-in answers for."""
    answer, _ = cloud.handle("RunInstances", {"RegionId": "cn-hangzhou", "ZoneId": "cn-hangzhou-h",
                                              "InstanceType": "ecs.gn7i-c8g1.2xlarge",
                                              "ImageId": "ubuntu_22_04_x64_20G_alibase_20250101.vhd",
                                              "VSwitchId": "vsw-cn-hangzhou-h"})  # the zone's default vSwitch
    (iid,) = answer["InstanceIdSets"]["InstanceIdSet"]
    cloud.handle("DescribeInstances", {"RegionId": "cn-hangzhou"})  # Pending -> Running (no boot delay)
    metadata.instance_id = iid
    return iid


def _ttl_node(tmp_path: Path, metadata: EcsMetadata, endpoint: str) -> tuple[ShimHost, Any]:
    (step,) = [s for s in make_plan(NodeRequest(gpu="A10", cloud="alibaba", region="cn-hangzhou", ttl_seconds=3600))
               .bundle().scripts if s.name == "ttl"]
    host = ShimHost(tmp_path, gpu="A10", extra_env={"GPUPROV_NOW": "1000000", "GPUPROV_METADATA_URL": metadata.url,
                                                    "GPUPROV_ECS_ENDPOINT": endpoint})
    assert host.run_script(step).result == "changed"
    assert (host.sysroot / "usr/local/lib/gpuprov/ecs-stop").stat().st_mode & 0o111

    def tick(now: int) -> list[str]:
        env = {**host.env(), "GPUPROV_NOW": str(now), "GPUPROV_BOOT_TIME": "999000"}
        subprocess.run(["bash", str(host.sysroot / "usr/local/lib/gpuprov/ttl-check")], env=env, check=True,
                       timeout=60)
        return [c for c in host.calls() if c.startswith("shutdown")]

    return host, tick


def test_the_ttl_asks_ecs_to_stop_the_instance_in_economical_mode_with_its_ram_role(tmp_path: Path, metadata,
                                                                                     ecs) -> None:
    cloud, endpoint = ecs
    iid = _running_instance(cloud, metadata)
    metadata.attach_role("gpuprov-node-stop", "STS.node1", SECRET, STS_TOKEN)
    cloud.grant_sts("STS.node1", SECRET, STS_TOKEN)
    host, tick = _ttl_node(tmp_path, metadata, endpoint)
    assert tick(1003599) == []
    assert tick(1003600) == []  # ECS took the stop: no power-off from within
    stops = [f for a, f in cloud.calls if a == "StopInstances"]
    assert stops == [{"RegionId": "cn-hangzhou", "InstanceId.1": iid, "StoppedMode": "StopCharging"}]
    assert cloud.signed == [("StopInstances", "STS.node1")]  # the SDK's own RPC signer agreed with the node's
    cloud.handle("DescribeInstances", {"RegionId": "cn-hangzhou"})  # Stopping -> Stopped
    row = cloud.instances[iid].raw
    assert row["Status"] == "Stopped" and row["StoppedMode"] == "StopCharging"
    log = (host.sysroot / "var/log/gpuprov/ttl.log").read_text()
    assert f"ECS stops {iid} in economical mode (StopCharging, with the RAM role gpuprov-node-stop)" in log
    on_disk = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()
                      and "ecs-stop" not in p.name)
    assert SECRET not in on_disk and STS_TOKEN not in on_disk  # the credentials stay in ecs-stop's process


def test_the_ttl_stops_economically_with_the_role_gpuprov_made_and_the_credentials_ecs_gives_it(
        tmp_path: Path, metadata, ecs_cloud, alibaba) -> None:
    """The role the provider makes (RAM's imitation) on an instance launched with it: the credentials ECS's metadata
    hands out for it are allowed StopInstances by its policy, and nothing else."""
    import os

    role = alibaba.create_stop_role()
    answer, _ = ecs_cloud.handle("RunInstances", {"RegionId": "cn-hangzhou", "ZoneId": "cn-hangzhou-h",
                                                  "InstanceType": "ecs.gn7i-c8g1.2xlarge", "RamRoleName": role,
                                                  "ImageId": "ubuntu_22_04_x64_20G_alibase_20250101.vhd",
                                                  "VSwitchId": "vsw-cn-hangzhou-h"})
    (iid,) = answer["InstanceIdSets"]["InstanceIdSet"]
    ecs_cloud.handle("DescribeInstances", {"RegionId": "cn-hangzhou"})
    metadata.instance_id = iid
    named, key, secret, token = ecs_cloud.role_credentials(iid)
    assert named == role and ecs_cloud.sts[key][2] == ("StopInstances",)  # its policy's one action
    metadata.attach_role(role, key, secret, token)
    _host, tick = _ttl_node(tmp_path, metadata, os.environ["GPUPROV_ALIBABA_ENDPOINT"])
    assert tick(1003600) == []  # ECS took the stop: no power-off from within
    assert ecs_cloud.signed == [("StopInstances", key)]
    ecs_cloud.handle("DescribeInstances", {"RegionId": "cn-hangzhou"})
    assert ecs_cloud.instances[iid].raw["StoppedMode"] == "StopCharging"


def test_without_a_ram_role_or_when_ecs_refuses_the_ttl_powers_the_os_off_and_says_why(tmp_path: Path, metadata,
                                                                                      ecs) -> None:
    cloud, endpoint = ecs
    iid = _running_instance(cloud, metadata)
    host, tick = _ttl_node(tmp_path, metadata, endpoint)
    assert tick(1003600) == ["shutdown -h now gpuprov ttl: the 3600s deadline has passed"]
    log = (host.sysroot / "var/log/gpuprov/ttl.log").read_text()
    assert ("no stop in economical mode: the instance has no RAM role (ECS's metadata lists none); powering the OS "
            "off instead (ECS's standard mode)") in log
    assert not [a for a, _ in cloud.calls if a == "StopInstances"]
    # a role whose credentials ECS does not take (or whose policy does not allow the stop): ECS's refusal, then the
    # power-off
    metadata.attach_role("gpuprov-node-stop", "STS.node1", SECRET, STS_TOKEN)
    cloud.grant_sts("STS.node1", SECRET, STS_TOKEN, actions=())
    assert len(tick(1003700)) == 2
    assert ("ECS refused StopInstances: HTTP 403 Forbidden.RAM: User not authorized to operate on the specified "
            "resource, or this API doesn't support RAM.; powering the OS off instead") in \
        (host.sysroot / "var/log/gpuprov/ttl.log").read_text()
    cloud.grant_sts("STS.node1", "another-secret", STS_TOKEN)
    assert len(tick(1003800)) == 3
    assert "SignatureDoesNotMatch" in (host.sysroot / "var/log/gpuprov/ttl.log").read_text()
    host.extra_env["GPUPROV_ECS_ENDPOINT"] = "http://127.0.0.1:9"  # ECS not reached at all
    assert len(tick(1003900)) == 4
    assert "ECS did not answer StopInstances (http://127.0.0.1:9: [Errno 111] Connection refused); powering the OS " \
        "off instead" in (host.sysroot / "var/log/gpuprov/ttl.log").read_text()
    assert cloud.instances[iid].raw["Status"] == "Running" and cloud.signed == []


def test_autostop_asks_ecs_for_economical_mode_too_and_an_aws_node_gets_no_ecs_stop(tmp_path: Path, metadata,
                                                                                   ecs) -> None:
    from gpuprov.plan.plan import autostop_script, ttl_script

    cloud, endpoint = ecs
    iid = _running_instance(cloud, metadata)
    metadata.attach_role("gpuprov-node-stop", "STS.node1", SECRET, STS_TOKEN)
    cloud.grant_sts("STS.node1", SECRET, STS_TOKEN)
    script = autostop_script(60, shutdown_action="stop", cloud="alibaba")
    host = ShimHost(tmp_path / "ali", gpu="A10", extra_env={"GPUPROV_METADATA_URL": metadata.url,
                                                            "GPUPROV_ECS_ENDPOINT": endpoint})
    assert host.run_script(script).result == "changed"
    conf = host.sysroot / "etc/gpuprov/autostop.conf"
    conf.write_text(conf.read_text().replace("SSH_PORT=22", "SSH_PORT=9"))  # no sshd here: nothing on port 9
    check = str(host.sysroot / "usr/local/lib/gpuprov/autostop-check")
    for now in (1000000, 1000060):
        subprocess.run(["bash", check], env={**host.env(), "GPUPROV_NOW": str(now)}, check=True, timeout=60)
    assert [c for c in host.calls() if c.startswith("shutdown")] == []
    assert cloud.instances[iid].raw["StoppedMode"] == "StopCharging" and cloud.signed == [("StopInstances",
                                                                                           "STS.node1")]
    assert "in economical mode" in (host.sysroot / "var/log/gpuprov/autostop.log").read_text()
    stopper = host.sysroot / "usr/local/lib/gpuprov/ecs-stop"
    aws = ShimHost(tmp_path / "aws", gpu="T4")
    for step in (autostop_script(60, shutdown_action="stop"), ttl_script(3600, "stop")):
        assert aws.run_script(step).result == "changed"
    assert not (aws.sysroot / "usr/local/lib/gpuprov/ecs-stop").exists()
    assert subprocess.run(["python3", "-m", "py_compile", str(stopper)]).returncode == 0
    (tmp_path / "step.sh").write_text(script.text)
    (tmp_path / "ttl.sh").write_text(ttl_script(3600, "stop", cloud="alibaba").text)
    assert_bash_and_shellcheck_pass([tmp_path / "step.sh", tmp_path / "ttl.sh"])  # the checks: test_guardrails
