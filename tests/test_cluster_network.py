"""The cluster network per instance type (placement group, EFA interfaces, transport) as the catalog's facts say,
and the `efa` step under the shims (AWS's installer served by the curl shim, which knows only published versions)."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from gpuprov.cloud import cluster_network as cluster
from gpuprov.cloud.providers import aws_efa
from gpuprov.cloud.providers.base import Nic
from gpuprov.plan import catalog
from gpuprov.plan.plan import NodeRequest, make_plan
from tests.shimrun import ShimHost

CAT = catalog.load()


def test_interfaces_follow_aws_layout_for_one_and_many_cards():
    assert cluster.efa_interfaces((0,)) == (Nic(0, 0, "efa"),)
    four = cluster.efa_interfaces((0, 1, 2, 3))
    assert four[:2] == (Nic(0, 0, "interface"), Nic(0, 1, "efa-only"))  # never an EFA-only primary
    assert [(n.card, n.device) for n in four[2:]] == [(1, 0), (2, 0), (3, 0)]
    assert {n.card for n in cluster.efa_interfaces(tuple(range(32)))} == set(range(32))
    # p6-b300 (EC2 DescribeInstanceTypes): card 0 is ENA only, cards 1-16 carry EFA: no EFA interface on card 0
    b300 = cluster.efa_interfaces(tuple(range(1, 17)))
    assert b300[0] == Nic(0, 0, "interface") and Nic(0, 1, "efa-only") not in b300
    assert [n.card for n in b300[1:]] == list(range(1, 17))


@pytest.mark.parametrize("it", [it for it in CAT.instance_types if it.efa], ids=lambda it: it.name)
def test_every_efa_type_gets_one_efa_interface_per_efa_card(it):
    layout = cluster.network_for(it)
    assert layout.transport == "efa" and layout.placement_group
    assert len({n.card for n in layout.interfaces if n.kind != "interface"}) == it.efa_cards  # card 0 may be ENA only
    assert layout.elastic_ip == (it.efa_cards > 1)
    assert layout.device_rdma == it.efa_rdma


def test_efa_on_the_g_types_the_list_missed_and_rdma_only_on_the_p_types_from_p4d():
    # EC2 DescribeInstanceTypes (moto 5.2.5's copy): EfaSupported on g4dn/g5/g6/g6e from 8xlarge, and p5.4xlarge
    efa = {it.name for it in CAT.instance_types if it.efa}
    assert {"g4dn.8xlarge", "g5.48xlarge", "g6.12xlarge", "g6e.48xlarge", "p5.4xlarge"} <= efa
    assert not {"g4dn.xlarge", "g5.4xlarge", "g6e.4xlarge"} & efa
    # GPUDirect RDMA over EFA (aws-ofi-nccl platform-aws.cpp gdr_required): p4d and later P types only
    assert {it.name for it in CAT.instance_types if it.efa_rdma} == {
        "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge"}


def _efa_env(instance_type: str) -> str:
    it = CAT.instance_type(instance_type)
    plan = make_plan(NodeRequest(gpu=f"{it.gpu}:{it.gpus}", instance_type=instance_type))
    plan = cluster.with_efa_step(plan, cluster.network_for(it))
    (script,) = [s for s in plan.bundle().scripts if s.name == "efa"]
    return script.text


def test_device_rdma_is_set_only_where_the_efa_device_does_rdma_read():
    assert "FI_EFA_USE_DEVICE_RDMA=1" in _efa_env("p5.48xlarge")
    g5 = _efa_env("g5.48xlarge")
    assert "FI_PROVIDER=efa" in g5 and "FI_EFA_USE_DEVICE_RDMA" not in g5
    assert "FI_EFA_USE_DEVICE_RDMA" not in _efa_env("p3dn.24xlarge")
    assert any("without RDMA read" in line for line in cluster.describe(cluster.network_for(CAT.instance_type(
        "g6e.48xlarge")), 2))


def test_types_without_efa_use_tcp_and_the_plan_says_so():
    layout = cluster.network_for(CAT.instance_type("g5.4xlarge"))
    assert layout.transport == "tcp" and layout.interfaces == () and not layout.elastic_ip
    assert any("network: TCP" in line for line in cluster.describe(layout, 2))
    plan = make_plan(NodeRequest(gpu="A10G", instance_type="g5.4xlarge"))
    assert cluster.with_efa_step(plan, layout) == plan


def test_the_efa_step_goes_before_verify():
    plan = make_plan(NodeRequest(gpu="H100:8"))
    names = [s.name for s in cluster.with_efa_step(plan, cluster.network_for(CAT.instance_type("p5.48xlarge"))).steps]
    assert names.index("efa") == names.index("verify") - 1


def _efa_script(installer: aws_efa.EfaInstaller | None = None):
    plan = make_plan(NodeRequest(gpu="H100:8"))
    plan = cluster.with_efa_step(plan, cluster.network_for(CAT.instance_type("p5.48xlarge")))
    if installer is not None:
        steps = tuple(dataclasses.replace(s, extra=(("efa", installer),)) if s.name == "efa" else s for s in plan.steps)
        plan = dataclasses.replace(plan, steps=steps)
    (script,) = [s for s in plan.bundle().scripts if s.name == "efa"]
    return script


@pytest.mark.heavy  # root: the EFA installer refuses anyone else, and so does its shim
def test_efa_step_installs_once_and_writes_the_nccl_environment(tmp_path):
    host = ShimHost(tmp_path, gpu="H100", count=8)
    first = host.run_script(_efa_script())
    assert first.result == "changed", first.stderr
    assert host.installed()["aws-efa-installer"] == cluster.EFA_INSTALLER.version
    assert any(c.startswith("efa_installer.sh -y") for c in host.calls())
    env = (host.sysroot / "etc/gpuprov/efa.env").read_text()
    assert "FI_PROVIDER=efa" in env and "/opt/amazon/ofi-nccl/lib" in env
    assert (host.sysroot / "opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so").exists()
    again = host.run_script(_efa_script())
    assert again.result == "unchanged", again.stderr
    assert sum(c.startswith("efa_installer.sh") for c in host.calls()) == 1


def test_an_installer_version_aws_never_published_fails_naming_the_download(tmp_path):
    host = ShimHost(tmp_path, gpu="H100", count=8)
    bogus = dataclasses.replace(cluster.EFA_INSTALLER, version="1.99.0",
                                url="https://efa-installer.amazonaws.com/aws-efa-installer-1.99.0.tar.gz")
    run = host.run_script(_efa_script(bogus))
    assert run.returncode != 0 and "could not download" in run.last_stderr_line and "1.99.0" in run.last_stderr_line
    assert not (host.sysroot / "etc/gpuprov/efa.env").exists()


def test_the_efa_step_is_shellcheck_clean(tmp_path):
    from tests.test_templates import SHELLCHECK

    assert SHELLCHECK
    path = tmp_path / "efa.sh"
    path.write_text(_efa_script().text)
    proc = subprocess.run([SHELLCHECK, "-S", "warning", "-f", "gcc", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
