"""HGX B200 (p6-b200) end to end on shim hosts: lspci shows B200 GPUs (10de:2901, class 0302) and no NVIDIA
NVSwitch; the instance type (IMDSv2) says NVSwitch; the fabric-manager step installs nvidia-fabricmanager
(no branch suffix from R580), nvlsm, infiniband-diags and linux-modules-extra-$(uname -r), loads ib_umad and
mlx5_ib, lists them in /etc/modules-load.d, and the service starts; doctor checks the modules. Also
persistence mode really on (a drop-in with --persistence-mode), as nvidia-smi reports it.

Facts and sources: src/gpuprov/data/stack.yaml (`nvswitch_gen4`, `fabric_manager_unversioned_from`,
`persistence_mode`). The shims refuse what the real tools refuse: modprobe ib_umad fails without the
modules-extra package; nvidia-fabricmanager fails to start on B200 without nvlsm and ib_umad; nvidia-smi
reports persistence mode Disabled while nvidia-persistenced runs with the packaged --no-persistence-mode.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuprov.hosts.detect import FACTS_COMMAND, parse_facts
from gpuprov.hosts.doctor import diagnose
from gpuprov.hosts.doctor_facts import facts_command
from gpuprov.hosts.doctor_facts import parse_facts as doctor_facts
from gpuprov.plan.plan import make_host_plan
from gpuprov.plan.stack import StackPins
from tests import hgxb200
from tests.shimrun import DMI_DIR, ShimHost, summary

B200_ENV = {"GPUPROV_SHIM_INSTANCE_TYPE": "p6-b200.48xlarge"}
# the rendered steps run under the shims, seconds a test: `make test`, not `make test-fast` (tests/lanes.py)
pytestmark = pytest.mark.slow

KERNEL = os.uname().release  # what `uname -r` says in the shim host (the shims run on this machine)


def _sh(host: ShimHost, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=host.env(), timeout=60)


def _ubuntu(host: ShimHost) -> None:
    etc = host.sysroot / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "os-release").write_text('PRETTY_NAME="Ubuntu 24.04.3 LTS"\nID=ubuntu\nVERSION_ID="24.04"\n')


@pytest.fixture(scope="module")
def b200(tmp_path_factory: pytest.TempPathFactory):
    """A p6-b200 shim host: detected from its own facts, planned, bootstrapped (minimal playbook), twice."""
    host = ShimHost(tmp_path_factory.mktemp("b200"), gpu="B200", count=8, extra_env=dict(B200_ENV))
    _ubuntu(host)
    facts = parse_facts(_sh(host, FACTS_COMMAND).stdout)
    plan = make_host_plan(facts.gpu, "minimal", "ubuntu-24.04", StackPins(), nvswitch=True if facts.nvswitch else None)
    bundle = plan.bundle()
    first = host.run_bundle(bundle)
    calls_first = host.calls()
    second = host.run_bundle(bundle)
    return host, facts, plan, first, calls_first, second, host.calls()[len(calls_first):]


@pytest.mark.parametrize("dmi", [{"sys_vendor": "Dell Inc.\n", "product_uuid": "4c4c4544-0042-3510-8052-b4c04f4e3332\n"},
                                 {}], ids=["dell", "no-dmi"])
def test_facts_ask_imds_only_where_dmi_says_ec2(tmp_path: Path, dmi: dict[str, str]) -> None:
    """Off EC2 the facts never run curl, though IMDS would answer here: a network that drops packets to
    169.254.169.254 would make every facts read wait out curl's timeouts."""
    host = ShimHost(tmp_path, gpu="B200", count=8, extra_env=dict(B200_ENV))
    _ubuntu(host)
    on_ec2 = parse_facts(_sh(host, FACTS_COMMAND).stdout)
    assert on_ec2.instance_type == "p6-b200.48xlarge" and [c for c in host.calls() if c.startswith("curl ")]
    shutil.rmtree(host.sysroot / DMI_DIR)
    for name, text in dmi.items():
        (host.sysroot / DMI_DIR).mkdir(parents=True, exist_ok=True)
        (host.sysroot / DMI_DIR / name).write_text(text)
    before = len(host.calls())
    elsewhere = parse_facts(_sh(host, FACTS_COMMAND).stdout)
    assert elsewhere.instance_type is None and elsewhere.gpus == ["B200"] * 8
    assert not [c for c in host.calls()[before:] if c.startswith("curl ")]


def test_b200_facts_gpus_by_class_and_nvswitch_from_the_instance_type(b200) -> None:
    _, facts, plan, *_ = b200
    assert facts.gpus == ["B200"] * 8 and facts.source == "lspci" and facts.pci_gpu_count == 8
    assert facts.instance_type == "p6-b200.48xlarge" and facts.nvswitch
    assert plan.stack and plan.stack.fabric_manager == "required" and plan.stack.nvlsm


def test_b200_fabric_manager_installs_the_infiniband_stack_and_starts(b200) -> None:
    host, _, _, first, calls, *_ = b200
    assert all(r.ok for r in first), summary(first)
    fm = next(r for r in first if r.name == "fabric-manager")
    assert fm.result == "changed"
    installed = host.installed()
    # R595 (the default branch): NVIDIA's repo package has no branch suffix from R580 on
    assert "nvidia-fabricmanager" in installed and not any(n.startswith("nvidia-fabricmanager-") for n in installed)
    assert installed["nvidia-fabricmanager"].split("-")[0] == installed["nvidia-open"].split("-")[0]
    assert {"nvlsm", "infiniband-diags", f"linux-modules-extra-{KERNEL}"} <= set(installed)
    assert {"nvidia-fabricmanager", "nvlsm"} <= host.held()
    assert "modprobe ib_umad" in calls and "modprobe mlx5_ib" in calls
    conf = (host.sysroot / "etc/modules-load.d/gpuprov-nvswitch.conf").read_text().split()
    assert "ib_umad" in conf and "mlx5_ib" in conf
    assert "active" in _sh(host, "systemctl is-active nvidia-fabricmanager").stdout
    assert next(r for r in first if r.name == "verify").result == "unchanged"


def test_b200_second_run_changes_nothing(b200) -> None:
    *_, second, calls_second = b200
    assert all(r.ok for r in second), summary(second)
    assert {r.result for r in second} == {"unchanged"}, summary(second)
    assert not [c for c in calls_second if c.startswith(("modprobe", "apt-mark hold", "systemctl enable"))]


def test_b200_modules_come_back_after_a_reboot_and_doctor_says_so(b200, tmp_path: Path) -> None:
    host, *_ = b200
    rebooted = host.copy(tmp_path / "h")
    rebooted.reboot()  # modules unload; /etc/modules-load.d loads them again at boot
    lsmod = _sh(rebooted, "lsmod").stdout
    assert "ib_umad" in lsmod and "mlx5_ib" in lsmod
    facts = doctor_facts(_sh(rebooted, facts_command()).stdout)
    checks = {c.name: c for c in diagnose(facts, "h", min_free_gb=0)}
    assert facts.instance_type == "p6-b200.48xlarge" and not facts.nvswitches  # B200: no NVIDIA NVSwitch device
    assert checks["infiniband modules"].ok and checks["fabric manager"].ok, checks
    assert checks["persistence mode"].ok


def test_b200_doctor_names_missing_infiniband_modules(b200, tmp_path: Path) -> None:
    host, *_ = b200
    broken = host.copy(tmp_path / "h")
    (broken.sysroot / "etc/modules-load.d/gpuprov-nvswitch.conf").unlink()
    broken.reboot()  # nothing loads ib_umad / mlx5_ib any more
    facts = doctor_facts(_sh(broken, facts_command()).stdout)
    checks = {c.name: c for c in diagnose(facts, "h", min_free_gb=0)}
    ib = checks["infiniband modules"]
    assert not ib.ok and ib.severity == "fail"
    assert "ib_umad" in ib.detail and "mlx5_ib" in ib.detail and "802" in ib.detail
    assert ib.fix and f"linux-modules-extra-{facts.kernel}" in ib.fix and "/etc/modules-load.d/" in ib.fix


def test_shims_refuse_what_the_real_tools_refuse_on_b200(tmp_path: Path) -> None:
    host = ShimHost(tmp_path, gpu="B200", count=8, extra_env=dict(B200_ENV))
    no_pkg = _sh(host, "modprobe ib_umad")
    assert no_pkg.returncode == 1 and "Module ib_umad not found" in no_pkg.stderr
    # a B200 host with the driver and Fabric Manager but no ib_umad: the service fails its pre-check
    state = host.state / "installed"
    state.write_text("nvidia-driver-pinning-595 595-1\nnvidia-open 595.91.07-0ubuntu1\nnvidia-fabricmanager 595.91.07-1\n"
                     "nvlsm 1.0-1\n")
    start = _sh(host, "systemctl enable --now nvidia-fabricmanager")
    assert start.returncode == 1 and "failed" in start.stderr


def test_b200_without_instance_type_is_not_taken_for_an_nvswitch_host(tmp_path: Path) -> None:
    # ConnectX-7 functions on the bus but no VPD that says SW_MNG: NICs, not NVSwitch management functions
    host = ShimHost(tmp_path, gpu="B200", count=8)
    facts = parse_facts(_sh(host, FACTS_COMMAND).stdout)
    assert facts.gpus == ["B200"] * 8 and not facts.nvswitch and facts.instance_type is None
    assert "15b3:1021" in _sh(host, "lspci -nn").stdout


# --- a recorded HGX B200 off EC2: NVSwitch from what NVIDIA's own tools read (tests/fixtures/hgx-b200) ------------

def _recorded_b200(root: Path) -> ShimHost:
    host = ShimHost(root, gpu="B200", count=8)  # no instance type: a machine gpuprov did not launch
    _ubuntu(host)
    hgxb200.install(host.sysroot)
    return host


def test_a_recorded_hgx_b200_is_an_nvswitch_host_by_its_bridge_functions_vpd(tmp_path: Path) -> None:
    facts = parse_facts(_sh(_recorded_b200(tmp_path), FACTS_COMMAND).stdout)
    assert facts.gpus == ["B200"] * 8 and facts.instance_type is None
    assert facts.nvswitch  # found though no NVIDIA id names an NVSwitch and no instance type says so
    # the four management functions of the recording, by their IB device and PCI function; never the eight NICs
    assert {s for s in facts.nvswitch_seen if s.startswith("ib ")} == {f"ib mlx5_{n}" for n in (8, 9, 10, 11)}
    assert {s for s in facts.nvswitch_seen if s.startswith("pci ")} == {f"pci 0000:e{n}:00.0" for n in range(4)}


def test_bootstrap_of_a_recorded_hgx_b200_installs_fabric_manager_and_nvlsm(tmp_path: Path) -> None:
    host = _recorded_b200(tmp_path)
    facts = parse_facts(_sh(host, FACTS_COMMAND).stdout)
    plan = make_host_plan(facts.gpu, "minimal", "ubuntu-24.04", StackPins(), nvswitch=True if facts.nvswitch else None)
    assert plan.stack and plan.stack.fabric_manager == "required" and plan.stack.nvlsm
    runs = host.run_bundle(plan.bundle())
    assert all(r.ok for r in runs), summary(runs)
    assert next(r for r in runs if r.name == "fabric-manager").result == "changed"
    assert {"nvidia-fabricmanager", "nvlsm", "infiniband-diags"} <= set(host.installed())
    assert "active" in _sh(host, "systemctl is-active nvidia-fabricmanager").stdout


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded-b200", "cx7-nics-only"])
def test_the_fabric_manager_step_on_a_host_of_unknown_nvswitch_reads_the_vpd_itself(tmp_path: Path, recorded: bool) -> None:
    """A host plan made before its facts (nvswitch None: Fabric Manager "auto"): the step decides on the host."""
    host = _recorded_b200(tmp_path) if recorded else ShimHost(tmp_path, gpu="B200", count=8)
    plan = make_host_plan("B200:8", "minimal", "ubuntu-24.04", StackPins(), nvswitch=None)
    assert plan.stack and plan.stack.fabric_manager == "auto"
    runs = host.run_bundle(plan.bundle())
    assert all(r.ok for r in runs), summary(runs)
    fm = next(r for r in runs if r.name == "fabric-manager")
    if recorded:
        assert fm.result == "changed" and "found NVSwitch management functions (VPD SW_MNG" in fm.stderr
        assert {"nvidia-fabricmanager", "nvlsm"} <= set(host.installed())
    else:
        assert fm.result == "unchanged" and "no NVSwitch on this host" in fm.stderr
        assert "nvidia-fabricmanager" not in host.installed()


# --- persistence mode really on ------------------------------------------------------------------------


def test_enabling_the_packaged_unit_leaves_persistence_mode_off(tmp_path: Path) -> None:
    host = ShimHost(tmp_path, gpu="T4")
    host.state.joinpath("installed").write_text("nvidia-driver-pinning-595 595-1\nnvidia-open 595.91.07-0ubuntu1\n")
    assert _sh(host, "systemctl enable --now nvidia-persistenced").returncode == 0
    modes = _sh(host, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").stdout
    assert modes.strip() == "Disabled"  # the packaged unit runs nvidia-persistenced --no-persistence-mode


def test_persistence_step_turns_it_on_and_verify_reads_it(tmp_path: Path) -> None:
    plan = make_host_plan("T4", "minimal", "ubuntu-24.04", StackPins())
    host = ShimHost(tmp_path, gpu="T4")
    runs = host.run_bundle(plan.bundle())
    assert all(r.ok for r in runs), summary(runs)
    pm = next(r for r in runs if r.name == "persistence")
    assert pm.result == "changed"
    dropin = (host.sysroot / "etc/systemd/system/nvidia-persistenced.service.d/gpuprov-persistence-mode.conf")
    text = dropin.read_text()
    assert "ExecStart=\n" in text and "--persistence-mode" in text and "--no-persistence-mode" not in text
    assert _sh(host, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").stdout.strip() == "Enabled"
    verify = next(r for r in runs if r.name == "verify")
    probe = json.loads(verify.stdout.split("GPUPROV_PROBE_BEGIN\n", 1)[1].split("\nGPUPROV_PROBE_END", 1)[0])
    assert ", Enabled, " in probe["nvidia_smi"]["query_csv"]
    # the drop-in gone (e.g. removed by hand): verify and doctor report persistence mode off
    dropin.unlink()
    facts = doctor_facts(_sh(host, facts_command()).stdout)
    checks = {c.name: c for c in diagnose(facts, "h", min_free_gb=0)}
    assert checks["persistence daemon"].ok  # the daemon runs …
    off = checks["persistence mode"]  # … but without persistence mode
    assert not off.ok and off.severity == "warn" and "--no-persistence-mode" in off.detail
    assert off.fix and "--persistence-mode" in off.fix
    assert {r.result for r in host.run_bundle(plan.bundle())} >= {"changed"}  # a rerun restores the drop-in
    assert dropin.exists()


# --- end to end on a real-sshd test host ----------------------------------------------------------------


def test_b200_bootstrap_and_doctor_over_ssh(host_pool, gp_home) -> None:
    from tests.test_bootstrap_ssh import bootstrap, by_step, calls, reset
    from tests.test_doctor import _ubuntu, by_name, doctor

    pool = host_pool
    reset(pool, [4], GPUPROV_SHIM_GPU="B200", GPUPROV_SHIM_GPU_COUNT="8", **B200_ENV)
    _ubuntu(pool, [4])
    code, hosts = bootstrap(pool, [4], "-p", "minimal")  # no --gpu: the host's lspci names the B200s
    assert code == 0, hosts
    steps = by_step(hosts[0])
    assert steps["fabric-manager"] == "changed" and steps["verify"] == "unchanged"
    log = calls(pool, 4)
    assert "modprobe ib_umad" in log and "modprobe mlx5_ib" in log
    assert any(c.endswith(" nvlsm") or " nvlsm " in c for c in log if c.startswith("apt-get") and " install" in c)
    code, found = doctor(pool, [4])
    assert code == 0, found
    checks = by_name(found[0])
    assert checks["infiniband modules"]["ok"] and checks["fabric manager"]["ok"]
    assert checks["persistence mode"]["ok"]


def test_recorded_hgx_b200_bootstrap_over_ssh_installs_fabric_manager_and_nvlsm(host_pool, gp_home) -> None:
    """`gpuprov bootstrap` of an HGX B200 that is no EC2 instance: its NVSwitches show up as ConnectX-7 functions
    whose VPD says SW_MNG (the recording), so Fabric Manager, nvlsm and the InfiniBand modules go in."""
    from tests.test_bootstrap_ssh import bootstrap, by_step, calls, reset
    from tests.test_doctor import _ubuntu

    pool = host_pool
    reset(pool, [5], GPUPROV_SHIM_GPU="B200", GPUPROV_SHIM_GPU_COUNT="8")
    _ubuntu(pool, [5])
    pool.exec_in(5, f"GPUPROV_SYSROOT=/var/lib/gpuprov-shim/root; {hgxb200.install_command()}", check=True)
    code, hosts = bootstrap(pool, [5], "-p", "minimal")
    assert code == 0, hosts
    steps = by_step(hosts[0])
    assert steps["fabric-manager"] == "changed" and steps["verify"] == "unchanged"
    log = calls(pool, 5)
    installs = [c for c in log if c.startswith("apt-get") and " install" in c]
    assert any(" nvlsm" in c for c in installs) and any("nvidia-fabricmanager=" in c for c in installs)
    assert "modprobe ib_umad" in log
