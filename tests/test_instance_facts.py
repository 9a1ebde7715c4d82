"""Instance types from EC2 itself, against the moto server (moto ships AWS's own DescribeInstanceTypes data):
the catalog built from it agrees with the shipped snapshot for every type gpuprov knows (a difference is printed,
to be fixed in catalog.yaml with its source); `facts refresh` keeps it as the instance-types overlay; `plan --live`
lays it over the catalog (read once a day per region), so a type EC2 has and the catalog lacks is planned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuprov.cloud import instance_facts
from gpuprov.plan import catalog, facts
from tests.aws.cli import gp

DEFAULTS = {"efa": False, "efa_interfaces": None, "network_cards": 1, "efa_cards": 1, "efa_card0": True}


@pytest.fixture
def ec2_rows(aws: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    from gpuprov.cloud.providers.aws import AwsProvider

    for key, value in aws.env().items():
        monkeypatch.setenv(key, value)
    return instance_facts.rows(catalog.load(), AwsProvider("gpuprov-test", poll=0.1).gpu_instance_types("us-east-1"))


def test_ec2s_instance_types_agree_with_the_shipped_catalog(ec2_rows: dict[str, dict[str, Any]]) -> None:
    cat = catalog.load()
    differences, absent = [], []
    for it in cat.instance_types:
        row = ec2_rows.get(it.name)
        if row is None:
            absent.append(it.name)
            continue
        ours = it.model_dump()
        for field in facts.EC2_FIELDS:
            mine = ours[field] if ours[field] is not None or field != "gpu_memory_mib" or it.cpu_only else \
                cat.gpu(it.gpu or "").memory_mib
            if mine != row.get(field, DEFAULTS.get(field)):
                differences.append(f"{it.name}.{field}: catalog.yaml {mine!r}, EC2 {row.get(field)!r}")
        if row.get("gpu") != it.gpu:
            differences.append(f"{it.name}.gpu: catalog.yaml {it.gpu}, EC2's {row.get('gpu')}")
    print("\n".join(["differences (fix catalog.yaml, with the source):", *differences] if differences else
                    ["catalog.yaml agrees with EC2 on every type both know"]))
    assert differences == []
    # what moto's data lacks is said in the snapshot, not silently trusted
    assert absent == ["p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p6e-gb200.36xlarge", "p6e-gb300.36xlarge"]
    assert {it.name for it in cat.instance_types if it.cpu_only} >= {"c7i.large", "m7i.16xlarge", "r7i.8xlarge"}
    note = facts.snapshot_families("catalog.yaml")["instance-types"].unverified or ""
    assert all(name in note for name in absent)


def test_ec2_knows_gpu_types_the_catalog_does_not_and_maps_its_gpu_names(ec2_rows: dict[str, dict[str, Any]]) -> None:
    assert ec2_rows["p4d.24xlarge"]["gpu"] == "A100-40GB" and ec2_rows["p4de.24xlarge"]["gpu"] == "A100-80GB"
    assert ec2_rows["gr6.4xlarge"]["gpu"] == "L4" and ec2_rows["p6-b300.48xlarge"]["gpu"] == "B300"
    assert ec2_rows["g7e.2xlarge"]["gpu"] == "RTX-PRO-6000"
    assert (ec2_rows["g5g.xlarge"]["gpu"], ec2_rows["g5g.xlarge"]["arch"]) == ("T4G", "arm64")  # EC2's "T4g", arm64 only
    assert ec2_rows["g4dn.xlarge"]["arch"] == "x86_64"  # EC2's "RTX PRO Server 6000", the catalog's alias
    g9 = ec2_rows["g9.2xlarge"]  # invented, not in the catalog: EC2's GPU name kept, for plan/gpu_names.py's table
    assert "gpu" not in g9 and g9["ec2_gpu"] == "L40"
    b300 = ec2_rows["p6-b300.48xlarge"]  # its card 0 carries no EFA (DescribeInstanceTypes NetworkCards)
    assert (b300["network_cards"], b300["efa_cards"], b300["efa_card0"]) == (17, 16, False)
    # CPU-only types (no GpuInfo) of the catalog's cpu_families only: what `--cpu` chooses among
    c7i = ec2_rows["c7i.24xlarge"]
    assert (c7i["gpus"], c7i["vcpu"], c7i["ram_gib"], "gpu" in c7i, "ec2_gpu" in c7i) == (0, 96, 192, False, False)
    assert "m5.large" not in ec2_rows and "c7g.large" not in ec2_rows


def test_facts_refresh_keeps_ec2s_instance_types_and_the_regions_offerings(env: dict[str, str], tmp_path: Path) -> None:
    env = {**env, "GPUPROV_FACTS_DIR": str(tmp_path / "facts")}
    run = gp(env, "facts", "refresh", "--only", "instance-types", "--region", "us-east-1")
    assert run.returncode == 0, run.stderr
    assert "instance-types: read from EC2 DescribeInstanceTypes and DescribeInstanceTypeOfferings in us-east-1" in run.stdout
    assert "g9.2xlarge: new (1× L40, EFA no)" in run.stdout and "p3.2xlarge: gone" in run.stdout
    assert "g7e.2xlarge" not in run.stdout  # the snapshot's row is EC2's
    assert "gr6f.4xlarge: new (0.5 of one L4, not planned)" in run.stdout
    overlay = facts.Overlay.model_validate(__import__("yaml").safe_load((tmp_path / "facts/instance-types.yaml").read_text()))
    assert "g4dn.xlarge" in overlay.offerings["us-east-1"]
    shown = json.loads(gp(env, "facts", "--json").stdout)
    assert next(f for f in shown["families"] if f["name"] == "instance-types")["origin"] == "refreshed"
    planned = json.loads(gp(env, "plan", "--gpu", "L40", "--json").stdout)  # offline, on the overlay
    assert planned["instance_type"] == "g9.2xlarge" and planned["stack"]["compute_capability"] == "8.9"


def test_plan_live_reads_ec2s_types_once_a_day(aws: Any, env: dict[str, str], tmp_path: Path) -> None:
    env = {**env, "GPUPROV_FACTS_DIR": str(tmp_path / "facts")}
    offline = json.loads(gp(env, "plan", "--gpu", "L4", "--json").stdout)
    assert "g7e.2xlarge" not in [c["instance_type"] for c in offline["candidates"]]
    before = len(aws.log("DescribeInstanceTypes"))
    live = json.loads(gp(env, "plan", "--gpu", "L4", "--live", "--json").stdout)
    kinds = {c["instance_type"]: c for c in live["candidates"]}
    assert kinds["gr6.4xlarge"]["price_usd_hour"] is None  # no list price known
    assert live["instance_type"] == "g6.xlarge"  # the cheapest priced type still wins
    assert len(aws.log("DescribeInstanceTypes")) > before
    again = len(aws.log("DescribeInstanceTypes"))
    gp(env, "plan", "--gpu", "L4", "--live", "--json")
    assert len(aws.log("DescribeInstanceTypes")) == again  # the day's reading, from the facts folder
    assert (tmp_path / "facts/ec2-us-east-1.yaml").is_file()


def test_bad_input_asks_ec2_nothing_and_a_type_only_ec2_knows_is_planned_live(aws: Any, env: dict[str, str],
                                                                            tmp_path: Path) -> None:
    env = {**env, "GPUPROV_FACTS_DIR": str(tmp_path / "facts")}
    before = len(aws.log("DescribeInstanceTypes"))
    bad = gp(env, "up", "x", "--gpu", "A1000", "--yes")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --gpu: unknown GPU 'A1000'")
    assert len(aws.log("DescribeInstanceTypes")) == before
    offline = gp(env, "plan", "--gpu", "L4", "--instance-type", "g9.2xlarge")
    assert offline.returncode == 2 and "unknown instance type 'g9.2xlarge'" in offline.stderr
    live = json.loads(gp(env, "plan", "--gpu", "L40", "--instance-type", "g9.2xlarge", "--live", "--json").stdout)
    assert live["instance_type"] == "g9.2xlarge"
    assert any("g9.2xlarge: read from EC2 DescribeInstanceTypes" in u for u in live["unverified"])


def test_what_ec2_describes_today_decides_new_gpus_and_retired_types(aws: Any, env: dict[str, str],
                                                                     tmp_path: Path) -> None:
    """The local endpoint describes the invented g9.2xlarge (one L40, a GPU the snapshot lacks) and no longer P3
    (tests/aws/ec2_types.py): EC2's answer decides, the snapshot is the fallback."""
    env = {**env, "GPUPROV_FACTS_DIR": str(tmp_path / "facts")}
    offline = gp(env, "plan", "--gpu", "L40")
    assert offline.returncode == 2 and "unknown GPU 'L40'" in offline.stderr
    live = json.loads(gp(env, "plan", "--gpu", "L40", "--live", "--json").stdout)
    assert (live["gpu"], live["instance_type"], live["stack"]["compute_capability"]) == ("L40", "g9.2xlarge", "8.9")
    assert any("developer.nvidia.com/cuda-gpus" in u for u in live["unverified"])
    b300 = json.loads(gp(env, "plan", "--gpu", "B300", "--live", "--json").stdout)
    assert (b300["instance_type"], b300["stack"]["compute_capability"]) == ("p6-b300.48xlarge", "10.3")
    for args in ((), ("--live",)):  # P3 retired: the snapshot says so, and EC2 does not describe it
        v100 = json.loads(gp(env, "plan", "--gpu", "v100", "--json", *args).stdout)
        assert v100["instance_type"] == "p3dn.24xlarge"
        assert not [c for c in v100["candidates"] if c["instance_type"].startswith("p3.")]
    listed = gp(env, "gpus", "--live", "--region", "us-east-1")
    assert listed.returncode == 0, listed.stderr
    assert "g9.2xlarge: 1× L40, from EC2 (not in the shipped catalog)" in listed.stdout
    assert "p3.2xlarge: gone, never chosen (" in listed.stdout
    assert "g6f.large: 0.125 of one L4, not planned (a fractional GPU" in listed.stdout  # not silently absent
    offered = aws.log("DescribeInstanceTypeOfferings")
    assert offered and not any("p3.2xlarge" in str(e["form"]) for e in offered)  # a retired type is not priced
