"""The facts as data: the shipped families each say where they came from; what the plan reasons with agrees with
the imitation NVIDIA repository the shims answer from; NVIDIA's lifecycle moves the default branch and warns on
an ended one; an overlay laid over the snapshot replaces what it read and keeps the rest."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, timezone
from pathlib import Path

import pytest
import yaml

from gpuprov.plan import catalog, compat, facts
from gpuprov.plan import stack as st
from gpuprov.sources import refresh
from tests import indexsite

READ = {"torch": date(2026, 12, 3), "cuda": date(2026, 12, 3), "drivers": date(2026, 12, 1),
        "driver-lifecycle": date(2026, 12, 1), "instance-types": date(2026, 12, 3)}


def test_every_family_records_its_source_and_read_date() -> None:
    for family in facts.FAMILIES:
        record = facts.snapshot_families(family.file)[family.name]
        assert record.source and record.read == READ[family.name], family.name
        assert all(key in facts.snapshot(family.file) for key in family.keys if not key.endswith("_unverified"))


def test_a_gpus_memory_is_what_ec2_says_for_its_instance_types() -> None:
    """`gpus` shows EC2's GpuInfo MemoryInfo SizeInMiB (T4 16,384 MiB on g4dn), not nvidia-smi's usable figure
    (15,360), wherever its instance types all give one (p3's V100 rows do not: p3dn carries the 32 GB V100)."""
    cat = catalog.load()
    for gpu in cat.gpus:
        given = {it.gpu_memory_mib for it in cat.instance_types_for(gpu)}
        if given and None not in given:  # GH200: no AWS type carries it
            assert given == {gpu.memory_mib}, gpu.name
    assert cat.gpu("T4").memory_mib == 16384
    assert cat.prices_as_of.startswith("2026-07-20 (AWS Pricing API)")


def test_the_toolkits_per_os_are_the_imitation_repositorys() -> None:
    """stack.yaml's repo_toolkits (what `plan` refuses by) and nvidia-repo.tsv (what the host's apt answers in the
    tests) say the same per OS, so a plan the resolver allows installs under the strict shims."""
    shim: dict[str, set[str]] = defaultdict(set)
    for stanza in indexsite.packages_index("ubuntu2204/x86_64").split("\n\n"):
        if stanza.startswith("Package: cuda-toolkit-"):
            shim["ubuntu-22.04"].add(stanza.split("\n")[0].removeprefix("Package: cuda-toolkit-").replace("-", "."))
    for stanza in indexsite.packages_index("ubuntu2404/x86_64").split("\n\n"):
        if stanza.startswith("Package: cuda-toolkit-"):
            shim["ubuntu-24.04"].add(stanza.split("\n")[0].removeprefix("Package: cuda-toolkit-").replace("-", "."))
    assert {os: set(kits) for os, kits in st.facts().repo_toolkits.items()} == shim
    assert set(st.facts().repo_toolkits["ubuntu-22.04"]) <= set(st.facts().cuda_min_driver)


def test_ended_branches_and_the_default_that_moves_on(monkeypatch: pytest.MonkeyPatch) -> None:
    f = st.facts()
    on = date(2026, 12, 1)
    assert f.branch_ended(610, on) and f.branch_ended(570, on) and f.branch_ended(575, on)
    assert not f.branch_ended(595, on) and not f.branch_ended(580, on) and not f.branch_ended(620, on)
    assert not f.branch_ended(595, date(2027, 3, 31)) and f.branch_ended(595, date(2027, 4, 1))  # "March 2027"
    gpu = catalog.load().gpu("H100")
    monkeypatch.setenv("GPUPROV_TEST_TODAY", "2027-04-01")  # R595, the default (a production branch), has ended
    assert st.supported_branch_from(595) == 620  # the next long-term/production branch, not the NFB 615
    stack = compat.resolve(gpu)
    assert stack.driver_branch == 620 and not stack.warnings
    pinned = compat.resolve(gpu, pins=st.StackPins(driver="595"))
    assert pinned.driver_branch == 595 and pinned.warnings == (
        "driver R595 (a Production Branch) reached its end of life in 2027-03: NVIDIA no longer fixes it; "
        "--driver 620 is supported",)


def test_an_overlay_replaces_what_it_read_and_keeps_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROV_FACTS_DIR", str(tmp_path))
    rows = {"p5.48xlarge": {"gpus": 8, "vcpu": 192, "ram_gib": 2048, "gpu_memory_mib": 81920, "efa": True,
                            "efa_interfaces": 32, "network_cards": 32, "efa_cards": 31, "efa_card0": False,
                            "gpu": "H100"},
            "g9.xlarge": {"gpus": 1, "vcpu": 4, "ram_gib": 16, "gpu_memory_mib": 81920, "efa": False, "gpu": "H100"}}
    when = datetime(2027, 1, 5, tzinfo=timezone.utc)
    overlay = facts.Overlay(family="instance-types", read=when, sources=("EC2 (a test)",), values={"instance_types": rows})
    refresh.write([refresh.Result("instance-types", overlay)])
    try:
        cat = catalog.load()
        p5 = cat.instance_type("p5.48xlarge")
        assert (p5.efa_cards, p5.efa_card0, p5.efa_card_indexes()[:2]) == (31, False, (1, 2))  # EC2's, field by field
        assert p5.price_usd_hour == 55.04 and p5.nvswitch and p5.efa_rdma  # gpuprov's own, kept
        new = cat.instance_type("g9.xlarge")
        assert new.price_usd_hour is None and new.nvswitch is None and "2027-01-05" in (new.unverified or "")
        state = next(s for s in facts.states() if s.family.name == "instance-types")
        assert state.origin == "refreshed" and state.read == date(2027, 1, 5)
        assert (tmp_path / "instance-types.yaml").read_text().startswith("# written by `gpuprov facts refresh`")
        assert yaml.safe_load((tmp_path / "instance-types.yaml").read_text())["family"] == "instance-types"
    finally:
        refresh.forget()


def test_the_2026_families_have_their_sizes_and_the_prices_a_source_gives() -> None:
    """g7e's sizes as EC2 states them (GPUs, EFA from 8xlarge, network cards) with us-east-1 prices read in public
    copies of AWS's, p6-b300's us-west-2 price said to be that, gr6 unpriced; `plan` picks g7e offline."""
    from gpuprov.plan.plan import NodeRequest, make_plan

    cat = catalog.load()
    g7e = {it.name: it for it in cat.instance_types_for(cat.gpu("RTX PRO 6000"))}
    assert {n: (it.gpus, it.efa, it.network_cards) for n, it in g7e.items()} == {
        "g7e.2xlarge": (1, False, 1), "g7e.4xlarge": (1, False, 1), "g7e.8xlarge": (1, True, 1),
        "g7e.12xlarge": (2, True, 1), "g7e.24xlarge": (4, True, 2), "g7e.48xlarge": (8, True, 4)}
    assert g7e["g7e.2xlarge"].price_usd_hour == 3.3631 and "public code" in (g7e["g7e.2xlarge"].unverified or "")
    b300 = cat.instance_type("p6-b300.48xlarge")
    assert b300.price_usd_hour == 142.416 and "us-west-2" in (b300.unverified or "")
    assert cat.instance_type("gr6.4xlarge").price_usd_hour is None  # no public source gave one
    assert "2026-12-03" in cat.prices_as_of
    plan = make_plan(NodeRequest(gpu="RTX PRO 6000"))
    assert plan.instance is not None and plan.instance.name == "g7e.2xlarge"
