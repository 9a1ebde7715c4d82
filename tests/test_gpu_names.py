"""The pure part of planning with what EC2 says at the time of use (plan/gpu_names.py, Catalog.with_instance_facts):
a type whose GPU the snapshot lacks is planned from the table of NVIDIA GPU names, a GPU the table lacks is
refused by the type's name, and a type EC2 no longer describes (P3) is never chosen. In-process, fast lane;
tests/test_instance_facts.py runs the same through the CLI against the local EC2 endpoint."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from gpuprov.errors import UserInputError
from gpuprov.plan import catalog, gpu_names
from gpuprov.plan import plan as P
from gpuprov.plan.stack import facts

CAT = catalog.load()
WHEN = datetime(2026, 12, 3, tzinfo=timezone.utc)


def ec2_row(ec2_gpu: str, gpus: int = 1, memory: int = 97_887, **net: Any) -> dict[str, Any]:
    """One row as cloud/instance_facts.rows makes it for a GPU the catalog lacks."""
    return {"gpus": gpus, "vcpu": 8, "ram_gib": 64, "gpu_memory_mib": memory, "efa": False, "efa_interfaces": None,
            "network_cards": 1, "efa_cards": 1, "efa_card0": True, "ec2_gpu": ec2_gpu, **net}


def described(**extra: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """EC2's answer for a region: every snapshot type but P3 (retired), plus `extra`."""
    rows = {it.name: {"gpu": it.gpu, "gpus": it.gpus} for it in CAT.instance_types if not it.name.startswith("p3.")}
    return {**rows, **extra}


def test_every_row_names_an_architecture_the_stack_knows_and_agrees_with_the_catalog() -> None:
    archs = facts().architectures
    assert all(n.arch in archs for n in gpu_names.NAMES)
    for gpu in CAT.gpus:
        found = gpu_names.named(gpu.name) or gpu_names.named(gpu.name.split("-")[0])  # A100-40GB: EC2's A100
        assert found is not None, gpu.name
        assert (found.arch, found.compute_capability) == (gpu.arch, gpu.compute_capability), gpu.name


@pytest.mark.parametrize(("spelled", "cc"), [("RTX PRO 6000", "12.0"), ("rtx-pro-6000", "12.0"), ("B300", "10.3"),
                                              ("l4", "8.9"), ("RTX_PRO_4500", "12.0")])
def test_ec2s_names_in_any_spelling(spelled: str, cc: str) -> None:
    found = gpu_names.named(spelled)
    assert found is not None and found.compute_capability == cc and found.source.startswith("developer.nvidia.com")
    # g7e's GPU as AWS's data names it, planned under the name people use
    server = gpu_names.named("RTX PRO Server 6000")
    assert server is not None and server.catalog_name == "RTX-PRO-6000"


def test_a_type_whose_gpu_the_snapshot_lacks_is_planned_from_the_table() -> None:
    # a stand-in: EC2 describing a type with the L40, a GPU of the table the snapshot lacks
    cat = CAT.with_instance_facts(described(**{"p7.4xlarge": ec2_row("L40", memory=46_068)}), WHEN, "us-east-1")
    plan = P.make_plan(P.NodeRequest(gpu="l40"), cat)
    assert plan.instance is not None and plan.instance.name == "p7.4xlarge"
    assert plan.gpu is not None and (plan.gpu.name, plan.gpu.arch, plan.gpu.sm) == ("L40", "ada", "sm_89")
    assert plan.gpu.memory_mib == 46_068  # EC2's GpuInfo figure
    assert "p7.4xlarge" in (plan.gpu.unverified or "") and "cuda-gpus" in (plan.gpu.unverified or "")
    assert plan.instance.price_usd_hour is None and plan.instance.nvswitch is None
    assert P.make_plan(P.NodeRequest(gpu="RTX PRO 4500")).instance.name == "g7.2xlarge"  # type: ignore[union-attr]


def test_a_gpu_the_table_lacks_is_refused_naming_the_type_the_gpu_and_refresh() -> None:
    cat = CAT.with_instance_facts(described(**{"p9.48xlarge": ec2_row("X900", 8)}), WHEN, "us-east-1")
    assert cat.unplannable == {"p9.48xlarge": "X900"}
    for request in (P.NodeRequest(gpu="X900"), P.NodeRequest(gpu="H100", instance_type="p9.48xlarge")):
        with pytest.raises(UserInputError) as refused:
            P.make_plan(request, cat)
        assert "p9.48xlarge" in refused.value.problem and "'X900'" in refused.value.problem
        assert "gpuprov facts refresh" in refused.value.problem


def test_p3_is_retired_in_the_snapshot_and_never_chosen() -> None:
    assert {it.name for it in CAT.instance_types if it.retired} == {"p3.2xlarge", "p3.8xlarge", "p3.16xlarge"}
    assert all("2026-12-03" in (it.retired or "") for it in CAT.instance_types if it.name.startswith("p3."))
    plan = P.make_plan(P.NodeRequest(gpu="v100"))
    assert plan.instance is not None and plan.instance.name == "p3dn.24xlarge"
    assert all(not c.name.startswith("p3.") for c in plan.candidates)
    with pytest.raises(UserInputError) as refused:
        P.make_plan(P.NodeRequest(gpu="V100", instance_type="p3.2xlarge"))
    assert refused.value.field == "--instance-type" and "retired" in refused.value.problem
    assert "p3dn.24xlarge" in (refused.value.hint or "")
    assert CAT.instance_type("p3.2xlarge").gpus == 1  # a node already on it is still described by its row


def test_what_ec2_describes_decides_retired_both_ways() -> None:
    gone = CAT.with_instance_facts(described(), WHEN, "us-east-1")
    assert "did not describe it" not in (gone.instance_type("p3.2xlarge").retired or "")  # the snapshot's own reason
    no_g4 = {k: v for k, v in described().items() if not k.startswith("g4dn.")}
    cat = CAT.with_instance_facts(no_g4, WHEN, "eu-west-9")
    assert cat.instance_type("g4dn.xlarge").retired == "EC2 DescribeInstanceTypes in eu-west-9 did not describe it on 2026-12-03"
    with pytest.raises(UserInputError):
        P.make_plan(P.NodeRequest(gpu="T4"), cat)
    back = CAT.with_instance_facts({**described(), "p3.2xlarge": {"gpu": "V100", "gpus": 1}}, WHEN, "us-east-1")
    assert back.instance_type("p3.2xlarge").retired is None  # EC2 describes it again: it may be chosen
    # no region named (an answer of unknown reach) or nothing read: nothing is retired by absence
    assert not CAT.with_instance_facts(no_g4, WHEN, "").instance_type("g4dn.xlarge").retired


def test_the_efa_cards_are_the_ones_ec2_lists_never_a_count_from_card_0_or_1() -> None:
    from gpuprov.cloud.cluster_network import network_for

    b300 = ec2_row("B300", 8, 275_040, efa=True, efa_interfaces=16, network_cards=17, efa_cards=16, efa_card0=False,
                   efa_card_list=list(range(1, 17)))
    odd = ec2_row("RTX PRO 6000", 8, efa=True, efa_interfaces=2, network_cards=4, efa_cards=2, efa_card0=False,
                  efa_card_list=[1, 3])
    cat = CAT.with_instance_facts(described(**{"p6-b300.48xlarge": b300, "g7e.48xlarge": odd}), WHEN, "us-east-1")
    plan = P.make_plan(P.NodeRequest(gpu="B300", count=8), cat)
    assert plan.instance is not None and plan.instance.name == "p6-b300.48xlarge" and plan.gpu is not None
    assert plan.gpu.sm == "sm_103"
    layout = network_for(plan.instance)
    assert [(n.card, n.device, n.kind) for n in layout.interfaces][:2] == [(0, 0, "interface"), (1, 0, "efa-only")]
    assert len(layout.interfaces) == 17  # card 0 ENA only: no EFA interface on it
    assert network_for(cat.instance_type("g7e.48xlarge")).interfaces[1:] == tuple(
        n for n in network_for(cat.instance_type("g7e.48xlarge")).interfaces if n.card in (1, 3))
    assert [n.card for n in network_for(cat.instance_type("g7e.48xlarge")).interfaces] == [0, 1, 3]


def test_a_new_type_that_runs_only_arm64_is_planned_for_aarch64_hosts() -> None:
    arm = ec2_row("L40", cpu_archs=["arm64"], arch="arm64")
    cat = CAT.with_instance_facts(described(**{"gr7g.xlarge": arm}), WHEN, "us-east-1")
    it = cat.instance_type("gr7g.xlarge")
    assert (it.gpu, it.arch, it.host_arch) == ("L40", "arm64", "aarch64") and not cat.unplannable
    plan = P.make_plan(P.NodeRequest(gpu="L40"), cat)
    assert plan.instance is not None and plan.instance.name == "gr7g.xlarge" and plan.arch == "aarch64"
    t4g = gpu_names.named("T4g")  # g5g's GPU as EC2 names it
    assert t4g is not None and (t4g.catalog_name, t4g.compute_capability) == ("T4G", "7.5")


def test_a_fraction_of_one_gpu_is_named_and_never_planned() -> None:
    g6f = {**ec2_row("L4", 0, 2861), "gpu_fraction": 0.125}
    cat = CAT.with_instance_facts(described(**{"g6f.large": g6f}), WHEN, "us-east-1")
    assert cat.fractional == {"g6f.large": "0.125 of one L4"} and "g6f.large" not in {i.name for i in cat.instance_types}
    with pytest.raises(UserInputError) as refused:
        P.make_plan(P.NodeRequest(gpu="L4", instance_type="g6f.large"), cat)
    assert "vGPU (GRID) driver" in refused.value.problem
