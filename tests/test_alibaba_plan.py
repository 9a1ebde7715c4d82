"""`plan` and `render` with `--cloud alibaba`: offline, on Alibaba Cloud's catalog (data/catalog-alibaba.yaml through
plan/catalog_alibaba.py), through the CLI in-process. The smallest ECS type with the GPUs is chosen, the stack is
planned as on AWS, no price figure is shown (DescribePrice is not read) and an estimate is refused naming why, the
region is Alibaba's, and nothing in the plan names AWS's things."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.alibaba.inprocess_cli import error_line

# what only AWS has, which an Alibaba plan must not show
AWS_WORDS = re.compile(r"\bEC2\b|\bAMIs?\b|\bami-|Capacity Block|\bEFA\b|\bL-[0-9A-F]{8}\b|\bAWS\b|us-east-1")


def gp(*args: str, env: dict[str, str] | None = None) -> Any:
    """`gpuprov ARGS` in this process with GPUPROV_CLOUD=alibaba (--cloud alibaba, as its variable)."""
    from click.testing import CliRunner

    from gpuprov.cli import main
    from gpuprov.settings import reset

    reset()
    return CliRunner().invoke(main, list(args), prog_name="gpuprov",
                              env={"COLUMNS": "200", "GPUPROV_CLOUD": "alibaba", **(env or {})})


@pytest.fixture(autouse=True)
def _home(gp_home: Path) -> None:
    """gpuprov's home of its own for each test (gp_home)."""


def plan(*args: str) -> Any:
    result = gp("plan", *args)
    assert result.exit_code == 0, result.output
    return result


def test_the_smallest_type_with_the_gpus_in_an_alibaba_region_with_no_price() -> None:
    result = plan("--gpu", "A10", "--cloud", "alibaba")
    head = result.stdout.splitlines()[0]
    assert head == "Plan: 1× A10 on ecs.gn7i-c8g1.2xlarge (1 GPU, 8 vCPU, 30 GiB) · on-demand · cn-hangzhou"
    assert "price: not known (gpuprov does not read Alibaba Cloud's DescribePrice yet)" in result.stdout
    assert "$" not in result.stdout
    assert "region cn-hangzhou (from Alibaba Cloud's default)" in result.stderr
    assert not AWS_WORDS.search(result.stdout), AWS_WORDS.search(result.stdout)
    # two GPUs: the smallest type with at least two (gn7i's four), on spot, in the region asked
    data = json.loads(plan("--gpu", "a10:2", "--spot", "--region", "cn-shanghai", "--json").stdout)
    assert (data["instance_type"], data["count"], data["market"], data["region"]) == \
        ("ecs.gn7i-c32g1.32xlarge", 2, "spot", "cn-shanghai")


def test_json_names_the_cloud_and_the_stack_and_no_aws_thing() -> None:
    data = json.loads(plan("--gpu", "A100:8", "--spot", "--os", "ubuntu-22.04", "--json").stdout)
    assert data["cloud"] == "alibaba"
    assert data["instance_type"] == "ecs.gn7-c13g1.26xlarge"  # the 40 GB A100 (A100-80GB: gn7e's)
    assert data["gpu"] == "A100-40GB" and data["os"] == "ubuntu-22.04"
    assert data["price_usd_hour_on_demand"] is None
    assert data["price_unknown"] == "gpuprov does not read Alibaba Cloud's DescribePrice yet"
    assert [c["price_usd_hour"] for c in data["candidates"]] == [None]
    assert data["stack"]["driver_branch"] and data["stack"]["torch"]["cuda"]
    steps = [s["name"] for s in data["steps"]]
    # the spot watch first: it reads ECS's notice (tests/test_alibaba_node.py)
    assert steps[:4] == ["spot-interrupt", "kernel-headers", "nouveau-off", "nvidia-driver"] and "pytorch" in steps
    assert data["guards"]["interrupt_watch"] and data["guards"]["cloud"] == "alibaba"
    assert not AWS_WORDS.search(json.dumps({k: v for k, v in data.items() if k != "guards"}))


def test_what_an_alibaba_plan_cannot_have_is_one_line_each() -> None:
    line = error_line(gp("plan", "--gpu", "H100"))
    assert line == "error: --gpu: unknown GPU 'H100'"
    hint = gp("plan", "--gpu", "H100").stderr
    assert "Known GPUs: T4, V100, V100-32GB, A10, A100-40GB, A100-80GB, L20." in hint
    assert error_line(gp("plan", "--gpu", "A10:8")) == "error: --gpu: no instance type carries 8× A10"
    why = "no Alibaba Cloud price is known: gpuprov does not read Alibaba Cloud's DescribePrice yet, so nothing " \
          "can be estimated"
    assert error_line(gp("plan", "--gpu", "A10", "--budget", "20")) == f"error: --budget: {why}"
    assert error_line(gp("plan", "--gpu", "A10", "--hours", "3")) == f"error: --hours: {why}"
    assert error_line(gp("plan", "--gpu", "A10", "--region", "us-east-1")) == \
        "error: --region: unknown Alibaba Cloud region 'us-east-1'"
    assert error_line(gp("plan", "--gpu", "A10", "--os", "rocky-9")) == \
        "error: --os: Alibaba Cloud's public images gpuprov finds give no rocky-9"
    assert error_line(gp("plan", "--cpu", "4")) == "error: --cpu: gpuprov knows no CPU-only Alibaba Cloud type"


def test_a_cluster_plan_on_alibaba_says_its_deployment_set_and_tcp() -> None:
    shown = gp("plan", "--gpu", "A10", "--nodes", "2")
    assert shown.exit_code == 0, shown.output
    assert "deployment set: strategy LowLatency" in shown.stdout and "no eRDMA" in shown.stdout
    assert "ECS creates no spot instance in a deployment set" in shown.stdout
    cluster = json.loads(gp("plan", "--gpu", "A10", "--nodes", "2", "--json").stdout)["cluster"]
    assert (cluster["deployment_set"], cluster["spot_placement"], cluster["transport"]) == ("LowLatency", False, "tcp")


def test_render_writes_the_scripts_of_the_alibaba_plan(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    result = gp("render", "--gpu", "T4", "-o", str(out))
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    plan_data = manifest["gpuprov_plan"]
    assert (plan_data["cloud"], plan_data["instance_type"], plan_data["region"]) == \
        ("alibaba", "ecs.gn6i-c4g1.xlarge", "cn-hangzhou")
    scripts = sorted(p.name for p in out.glob("*.sh"))
    assert scripts and any("nvidia-driver" in name for name in scripts)
    assert result.stdout.startswith(f"wrote {len(scripts)} scripts and manifest.json")


def test_gpus_lists_the_same_rows_by_either_name() -> None:
    """`gpus --cloud alibaba` reads the data the plan does: A100 is both memories as Alibaba names it, A100-80GB the
    plan's name of one; a GPU Alibaba lacks is refused naming those it has."""
    def types(*names: str) -> list[str]:
        result = gp("gpus", *names, "--json")
        assert result.exit_code == 0, result.output
        return [t["instance_type"] for t in json.loads(result.stdout)["instance_types"]]

    assert types("a100") == ["ecs.gn7-c12g1.3xlarge", "ecs.gn7-c13g1.26xlarge", "ecs.gn7e-c16g1.4xlarge",
                             "ecs.gn7e-c16g1.32xlarge"]
    assert types("A100-80GB") == ["ecs.gn7e-c16g1.4xlarge", "ecs.gn7e-c16g1.32xlarge"]
    assert len(types()) == 14
    assert error_line(gp("gpus", "h100")) == "error: GPU: unknown GPU 'h100'"
