"""CPU-only nodes (plan/cpu.py), in the fast lane: `plan --cpu N --memory GIB` chooses the cheapest CPU-only type and
plans no GPU steps, torch's CPU wheel and the check on the CPU; the refusals of requests that mix GPU and CPU-only;
`up --cpu 4 --memory 8` on the in-process fake cloud (moto's DescribeInstanceTypes has no GpuInfo for c7i), then
`status`, `stop`/`start` and `down` as for any node. The rendered steps are in tests/test_templates.py's matrix
(bash -n and shellcheck)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuprov.plan.cpu import GPU_STEPS_SKIPPED
from gpuprov.plan.plan import NodeRequest, make_plan
from gpuprov.plan.stack import StackPins
from tests.shimrun import ShimHost
from tests.test_cloud_fast import NO_SSH, instances, one_error_line, status

GPU_STEPS = {"kernel-headers", "nouveau-off", "nvidia-driver", "fabric-manager", "persistence", "cuda-toolkit", "verify"}


def gp(*args: str) -> Any:
    from gpuprov.cli import main
    from gpuprov.settings import reset

    reset()
    return CliRunner().invoke(main, [*args, "--region", "us-east-1"], prog_name="gpuprov", env={"COLUMNS": "200"})


def test_plan_chooses_the_cheapest_cpu_type_that_fits_and_says_the_gpu_steps_are_skipped(gp_home: Any) -> None:
    shown = gp("plan", "--cpu", "4", "--memory", "8")
    assert shown.exit_code == 0, shown.output
    assert "CPU-only, no GPU on c7i.xlarge (4 vCPU, 8 GiB)" in shown.stdout
    assert "no GPU stack (c7i.xlarge is a CPU-only type): skipped kernel-headers" in shown.stdout
    assert "CPU wheel from " in shown.stdout and "/whl/cpu\n" in shown.stdout
    planned = json.loads(gp("plan", "--cpu", "4", "--memory", "8", "--ttl", "2h", "--autostop", "30m",
                            "--budget", "5", "--json").stdout)
    assert (planned["gpu"], planned["instance_type"], planned["stack"]) == (None, "c7i.xlarge", None)
    prices = [c["price_usd_hour"] for c in planned["candidates"]]
    assert prices == sorted(prices) and planned["candidates"][1]["instance_type"] == "m7i.xlarge"  # the failover's
    steps = [s["name"] for s in planned["steps"]]
    assert steps == ["autostop", "ttl", "python-env", "pytorch", "verify-cpu"] and not GPU_STEPS & set(steps)
    torch = planned["cpu_only"]["torch"]
    assert torch["variant"] == "cpu" and torch["index_url"].endswith("/whl/cpu")
    assert planned["cpu_only"]["skipped"] == list(GPU_STEPS_SKIPPED)
    assert planned["guards"]["budget_usd"] == 5 and planned["guards"]["ttl_seconds"] == 7200  # $5 lasts past 2h
    # more memory per vCPU: the memory-optimised family is then the cheapest that fits
    assert make_plan(NodeRequest(cpu=2, memory_gib=16)).instance.name == "r7i.large"  # type: ignore[union-attr]
    named = make_plan(NodeRequest(instance_type="c7i.8xlarge", pins=StackPins(torch="2.9")))
    assert named.cpu_only and named.candidates == (named.instance,) and named.cpu_torch
    assert named.cpu_torch.requirement == "torch==2.9.*" and named.steps[-1].name == "verify-cpu"


@pytest.mark.parametrize(("args", "needle"), [
    (("--gpu", "A100", "--cpu", "4"), "error: --cpu: --gpu A100 with --cpu"),
    (("--cpu", "4", "--instance-type", "g5.xlarge"), "error: --cpu: g5.xlarge carries 1× A10G"),
    (("--gpu", "T4", "--instance-type", "c7i.large"), "error: --instance-type: c7i.large is a CPU-only type"),
    (("--instance-type", "c7i.huge"), "error: --instance-type: unknown instance type 'c7i.huge'"),
    (("--cpu", "4", "--count", "2"), "error: --count: --count 2 counts GPUs"),
    (("--cpu", "4", "--driver", "580"), "error: --driver: c7i.xlarge is a CPU-only type"),
    (("--cpu", "4", "--docker"), "error: --docker: c7i.xlarge is a CPU-only type"),
    (("--cpu", "4", "--metrics", "textfile"), "error: --metrics: c7i.xlarge is a CPU-only type"),
    (("--cpu", "4", "-p", "cuda-dev"), "cuda-dev.yml:"),
    (("--cpu", "512"), "error: --cpu: no CPU-only type gpuprov knows has 512 vCPUs"),
    (("--cpu", "0"), "error: --cpu: 0 is not in the range 1 to 896"),
    ((), "error: --gpu: required (or --cpu/--memory for a CPU-only node, or --instance-type)"),
])
def test_bad_combinations_are_one_error_line(gp_home: Any, args: tuple[str, ...], needle: str) -> None:
    one_error_line(gp("plan", *args), needle)


def test_a_gpu_from_the_environment_gives_way_to_cpu_on_the_command_line(gp_home: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROV_GPU", "A100")
    planned = json.loads(gp("plan", "--instance-type", "c7i.large", "--json").stdout)
    assert (planned["gpu"], planned["instance_type"]) == (None, "c7i.large")
    assert json.loads(gp("plan", "--json").stdout)["gpu"] == "A100-40GB"


def test_up_a_cpu_node_then_status_stop_start_and_down_as_any_node(fake_cloud: Any) -> None:
    up = fake_cloud.gp("up", "prep", "--cpu", "4", "--memory", "8", *NO_SSH)
    assert up.exit_code == 0, up.output
    (inst,) = instances(fake_cloud, "prep")
    assert inst["InstanceType"] == "c7i.xlarge" and inst["State"]["Name"] == "running"
    (node,) = status(fake_cloud)
    assert (node["state"], node["instance_type"], node["gpu"], node["price_usd_hour"]) == (
        "ready", "c7i.xlarge", None, pytest.approx(0.1785))
    from gpuprov.cloud.stopstart import node_plan
    from gpuprov.state import open_store

    again = node_plan(open_store().node("prep"))  # what `start` bootstraps it with again: the same CPU wheel
    assert again.cpu_only and again.instance and again.instance.name == "c7i.xlarge"
    assert again.cpu_torch == make_plan(NodeRequest(cpu=4, memory_gib=8)).cpu_torch
    assert fake_cloud.gp("stop", "prep").exit_code == 0
    assert instances(fake_cloud, "prep")[0]["State"]["Name"] == "stopped"
    one_error_line(fake_cloud.gp("start", "prep", "--instance-type", "g5.xlarge", "--no-bootstrap"),
                   "error: --instance-type: prep was launched as a CPU-only node and g5.xlarge is a GPU type")
    started = fake_cloud.gp("start", "prep", "--no-bootstrap")
    assert started.exit_code == 0, started.output
    assert instances(fake_cloud, "prep")[0]["State"]["Name"] == "running"
    down = fake_cloud.gp("down", "prep", "--yes")
    assert down.exit_code == 0, down.output
    assert status(fake_cloud) == [] and fake_cloud.leftovers()["instances"] == []
    # the live read (DescribeInstanceTypes, no GpuInfo for c7i) knows the CPU-only sizes the snapshot lacks
    big = fake_cloud.gp("up", "big", "--cpu", "96", *NO_SSH)  # 96 vCPUs: c7i.24xlarge, not in the snapshot
    assert big.exit_code == 0, big.output
    assert instances(fake_cloud, "big")[0]["InstanceType"] == "c7i.24xlarge"
    assert fake_cloud.gp("down", "big", "--yes").exit_code == 0
    one_error_line(fake_cloud.gp("up", "crowd", "--cpu", "4", "--nodes", "2", *NO_SSH), "error: --nodes: c7i.xlarge is a "
                   "CPU-only type")
    assert instances(fake_cloud, "crowd") == []


def test_autostop_on_a_cpu_node_judges_the_cpus_load(tmp_path: Path) -> None:
    """No GPU answers nvidia-smi there: a job busy on the CPUs with nobody logged in keeps the node up."""
    plan = make_plan(NodeRequest(cpu=4, memory_gib=8, autostop_seconds=1800))
    assert "idle: the 1-minute load under 10% of the CPUs (no GPU) and no SSH session" in plan.steps[0].summary
    (step,) = [s for s in plan.bundle().scripts if s.name == "autostop"]
    host = ShimHost(tmp_path, extra_env={"GPUPROV_NOW": "1000000"})  # no driver installed: nvidia-smi fails
    assert host.run_script(step).result == "changed"
    check = host.sysroot / "usr/local/lib/gpuprov/autostop-check"
    (host.sysroot / "proc").mkdir()
    cpus = len(os.sched_getaffinity(0))  # what nproc counts

    def tick(now: int, load: float) -> list[str]:
        (host.sysroot / "proc/loadavg").write_text(f"{load:.2f} 0.50 0.40 1/100 999\n")
        subprocess.run(["bash", str(check)], env={**host.env(), "GPUPROV_NOW": str(now)}, check=True, timeout=10)
        return [c for c in host.calls() if c.startswith("shutdown")]

    t = 1_000_000
    assert tick(t, 0.2 * cpus) == [] and tick(t + 2000, 0.2 * cpus) == []  # 20% of the CPUs: busy
    assert tick(t + 3000, 0.0) == [] and tick(t + 4799, 0.0) == []
    assert tick(t + 4800, 0.0) == ["shutdown -h now gpuprov autostop: idle for 1800s"]


def test_up_bootstraps_a_cpu_node_on_an_ssh_host_and_check_judges_it_without_a_gpu(aws, env, aws_hosts, gp_home):
    """The heavy lane's one CPU-only bootstrap: the test host's shims install no driver, so nvidia-smi fails there,
    as on a c7i; the steps are the guards, the env, the CPU wheel and its check."""
    from tests.aws.cli import gp as gp_sub
    from tests.aws.cli import launch_site, nothing_left, up_args

    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)
    result = gp_sub(env, *up_args("prep", "--cpu", "4", "--memory", "8", "--subnet", subnet, "--connect", "private",
                                  "--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11", "--ttl", "8h"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "prep is ready" in result.stdout
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert inst["InstanceType"] == "c7i.xlarge"
    sysroot = "/var/lib/gpuprov-shim/root"
    assert pool.exec_in(0, f"test -s {sysroot}/var/lib/gpuprov/ttl-deadline").returncode == 0
    installed = pool.exec_in(0, "cat /var/lib/gpuprov-shim/installed 2>/dev/null || true").stdout
    assert "nvidia" not in installed  # no driver, toolkit or Fabric Manager package
    checked = gp_sub(env, "check", "prep", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    checks = {c["name"]: c for c in json.loads(checked.stdout)[0]["report"]["checks"]}
    assert list(checks) == ["gpu", "torch"] and all(c["ok"] for c in checks.values())
    assert "no CUDA (the CPU wheel)" in checks["torch"]["detail"] and "+cpu" in checks["torch"]["detail"]
    assert gp_sub(env, "down", "prep", "--yes").returncode == 0
    nothing_left(aws)
