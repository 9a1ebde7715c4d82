"""Issue 25, at the plan's level: the OS table (data/os.yaml), how a host's os-release and package manager name its
OS, what each OS family's steps do (apt: Ubuntu and Debian; dnf: Rocky, RHEL, Amazon Linux), `stack: none` on any
Linux, and a host that keeps its own driver (--keep-driver, `driver: keep`). The rendered scripts of every OS are
shellchecked by tests/test_templates.py's matrix (SUPPORTED_OS); the dnf steps run under a real dnf in
tests/test_real_dnf.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.errors import StackConflict, UserInputError
from gpuprov.hosts.detect import parse_facts
from gpuprov.hosts.planner import Planner
from gpuprov.plan import oses
from gpuprov.plan.inventory import Target
from gpuprov.plan.monitoring import Monitoring
from gpuprov.plan.plan import NodeRequest, make_host_plan, make_plan
from gpuprov.plan.stack import SUPPORTED_OS, StackPins

DRIVER_STEPS = {"kernel-headers", "nouveau-off", "nvidia-driver", "fabric-manager", "persistence", "cuda-toolkit"}


def test_the_resolver_names_are_the_tables():
    assert oses.names() == SUPPORTED_OS
    assert {"debian-12", "debian-13", "rocky-9", "rhel-9", "amzn-2023", "ubuntu-26.04"} <= set(SUPPORTED_OS)


def _facts(os_line: str, like: str = "", pm: str = "", driver: str = "") -> str:
    return (f"## nvidia-smi\nNVIDIA A10G\n## lspci\n## os\n{os_line}\nlike {like}\n## package-manager\n{pm}\n"
            f"## driver\n{driver}\n## end\n")


@pytest.mark.parametrize(("os_line", "like", "pm", "name"), [
    ("rocky-9.4", "rhel centos fedora", "dnf", "rocky-9"),
    ("rhel-9.6", "fedora", "dnf", "rhel-9"),
    ("amzn-2023", "fedora", "dnf", "amzn-2023"),
    ("debian-12", "", "apt-get", "debian-12"),
    ("debian-13", "", "apt-get", "debian-13"),
    ("ubuntu-26.04", "debian", "apt-get", "ubuntu-26.04"),
    ("ubuntu-24.04", "debian", "apt-get", "ubuntu-24.04"),
])
def test_os_release_and_package_manager_name_the_os(os_line, like, pm, name):
    facts = parse_facts(_facts(os_line, like, pm))
    assert facts.os == name and facts.package_manager == pm and facts.os_like == like.split()
    assert oses.family(name) == ("dnf" if pm == "dnf" else "apt")


def test_the_installed_driver_is_read_from_nvidia_smi_or_the_module():
    assert parse_facts(_facts("ubuntu-24.04", driver="550.54.14")).driver_version == "550.54.14"
    module = "nvrm NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)"
    assert parse_facts(_facts("ubuntu-24.04", driver=module)).driver_version == "580.95.05"
    assert parse_facts(_facts("ubuntu-24.04")).driver_version is None


def _text(plan) -> dict[str, str]:
    return {s.name: s.text for s in plan.bundle().scripts}


@pytest.mark.parametrize("os_name", ["rocky-9", "rhel-9", "amzn-2023"])
def test_dnf_family_steps(os_name):
    plan = make_plan(NodeRequest(gpu="H100:8", os=os_name))
    repo = oses.info(os_name).repo
    assert plan.stack and plan.stack.family == "dnf" and plan.stack.driver_stream == "nvidia-driver:595-open"
    assert "nvidia-driver-pinning-595" not in plan.stack.repo_packages  # the module stream holds the branch
    text = _text(plan)
    driver = text["nvidia-driver"]
    assert "/compute/cuda/repos/${repo}/${repo_arch}/cuda-${repo}.repo" in driver and f"repo={repo}" in driver
    assert 'dnf -y -q module enable "$stream"' in driver and "stream=nvidia-driver:595-open" in driver
    own = driver.split("# NVIDIA driver from NVIDIA's CUDA repository for", 1)[1]  # the step, after the libraries
    assert "apt-get" not in own and "dpkg" not in own
    # the running kernel's devel package by the name dnf has for it (kernel6.12-devel on Amazon Linux's 6.12 kernel)
    assert 'devel="$(gp_dnf_kernel_package devel)"' in text["kernel-headers"]
    assert "dracut --force" in text["nouveau-off"] and "update-initramfs" not in text["nouveau-off"]
    assert '"${fm}-${drv}"' in text["fabric-manager"] and "versionlock add" in text["fabric-manager"]
    # EPEL (for DKMS) and CodeReady Builder where the OS needs them; none on Amazon Linux (dkms is Amazon's own)
    assert ("epel" in driver) == (os_name != "amzn-2023")
    assert ("dnf config-manager --set-enabled crb" in driver) == (os_name == "rocky-9")
    assert "setenforce" not in "".join(text.values()) and "SELINUX=" not in "".join(text.values())


def test_fabric_manager_before_r580_on_dnf_has_its_older_name():
    plan = make_plan(NodeRequest(gpu="H100:8", os="rocky-9", pins=StackPins(driver="570")))
    assert plan.stack and plan.stack.fabric_manager_package == "nvidia-fabric-manager"
    apt = make_plan(NodeRequest(gpu="H100:8", os="debian-12", pins=StackPins(driver="570")))
    assert apt.stack and apt.stack.fabric_manager_package == "nvidia-fabricmanager-570"


@pytest.mark.parametrize(("os_name", "repo"), [("debian-12", "debian12"), ("debian-13", "debian13"),
                                               ("ubuntu-26.04", "ubuntu2604")])
def test_apt_family_steps_use_the_oses_repository(os_name, repo):
    plan = make_plan(NodeRequest(gpu="L4", os=os_name))
    text = _text(plan)
    assert f"distro={repo}" in text["nvidia-driver"] and "cuda-keyring_1.1-1_all.deb" in text["nvidia-driver"]
    assert "update-initramfs -u" in text["nouveau-off"] and "linux-headers-${kernel}" in text["kernel-headers"]
    assert plan.stack and plan.stack.repo_label == f"{os_name} (NVIDIA's {repo} repository)"


def test_os_unverified_notes_reach_the_plan():
    plan = make_plan(NodeRequest(gpu="L4", os="ubuntu-26.04"))
    assert any(u.startswith("ubuntu-26.04: ") and "ubuntu2604" in u for u in plan.unverified)


def test_unknown_os_and_dnf_exact_releases_and_dnf_metrics_are_refused():
    with pytest.raises(UserInputError) as exc:
        make_plan(NodeRequest(gpu="L4", os="centos-7"))
    assert exc.value.field == "--os" and "rocky-9" in exc.value.hint
    with pytest.raises(StackConflict) as conflict:
        make_plan(NodeRequest(gpu="L4", os="rocky-9", pins=StackPins(driver="580.126.09")))
    assert conflict.value.rule == "dnf-exact-driver" and "--driver 580" in conflict.value.hint
    with pytest.raises(UserInputError) as metrics:
        make_plan(NodeRequest(gpu="L4", os="amzn-2023", monitoring=Monitoring(metrics="textfile")))
    assert metrics.value.field == "--metrics"


def _cpu_playbook(tmp_path: Path) -> str:
    path = tmp_path / "cpu.yml"
    path.write_text("name: cpu\nstack: none\nenv: {packages: [rich]}\n")
    return str(path)


def test_stack_none_runs_on_any_linux_and_a_gpu_stack_only_on_the_table(tmp_path):
    facts = parse_facts("## nvidia-smi\n## lspci\n## os\narch-20261101\nlike \n## package-manager\npacman\n## end\n")
    target = Target(host="box")
    plan = Planner(None, _cpu_playbook(tmp_path), None, StackPins())(target, facts)
    assert plan.stack is None and [s.name for s in plan.steps] == ["python-env", "packages"]
    with pytest.raises(UserInputError) as exc:
        Planner("A10G", "pytorch", None, StackPins())(target, facts)
    assert exc.value.field == "--os" and "arch-20261101" in exc.value.problem


# --- a host whose driver is not gpuprov's ------------------------------------------------------------------


def test_kept_r550_gets_the_newest_wheel_that_runs_on_it_and_no_driver_step():
    plan = make_host_plan("A10G", "pytorch", "ubuntu-24.04", StackPins(), kept_driver="550.54.14")
    assert plan.stack and plan.stack.kept_driver and plan.stack.driver_version == "550.54.14"
    assert not DRIVER_STEPS & {s.name for s in plan.steps}
    # torch 2.15 has only CUDA 13 wheels (≥ 580); 2.14's cu126 needs 560.28.03 natively, runs on R550 through
    # CUDA minor-version compatibility (CUDA 12.x on ≥ 525)
    assert plan.stack.torch and (plan.stack.torch.version, plan.stack.torch.variant) == ("2.14", "cu126")
    assert plan.stack.minor_version_compat
    assert any("minor-version compatibility" in r and "550.54.14" in r for r in plan.stack.reasons)
    # a newer kept driver runs the newest release natively
    newer = make_host_plan("A10G", "pytorch", "ubuntu-24.04", StackPins(), kept_driver="595.71.05")
    assert newer.stack and newer.stack.torch and newer.stack.torch.version == "2.15"
    assert not newer.stack.minor_version_compat


def test_kept_driver_too_old_is_refused_with_the_upgrade():
    # R470 still runs torch 2.7's cu118 wheel (CUDA 11.x on ≥ 450.80.02, minor-version compatibility) ...
    old = make_host_plan("T4", "pytorch", "ubuntu-22.04", StackPins(), kept_driver="470.256.02")
    assert old.stack and old.stack.torch and (old.stack.torch.version, old.stack.torch.variant) == ("2.7", "cu118")
    # ... R418 runs none: the refusal names the oldest driver a wheel for the GPU runs on
    with pytest.raises(StackConflict) as exc:
        make_host_plan("T4", "pytorch", "ubuntu-22.04", StackPins(), kept_driver="418.226.00")
    assert exc.value.field == "--keep-driver" and "418.226.00" in exc.value.problem
    assert "upgrade the host's driver to R450 (≥ 450.80.02)" in exc.value.hint
    with pytest.raises(StackConflict) as b200:  # the GPU's own floor first: Blackwell needs R570
        make_host_plan("B200", "pytorch", "ubuntu-24.04", StackPins(), kept_driver="550.54.14")
    assert b200.value.field == "--keep-driver" and b200.value.rule == "gpu-min-driver-branch"


def test_kept_driver_refuses_driver_and_toolkit_pins_and_launches(tmp_path):
    with pytest.raises(UserInputError) as pin:
        make_host_plan("A10G", "pytorch", "ubuntu-24.04", StackPins(driver="580"), kept_driver="550.54.14")
    assert pin.value.field == "--driver"
    with pytest.raises(UserInputError) as toolkit:
        make_host_plan("A10G", "cuda-dev", "ubuntu-24.04", StackPins(), kept_driver="550.54.14")
    assert toolkit.value.field == "--keep-driver"
    book = tmp_path / "keep.yml"
    book.write_text("name: keep\ndriver: keep\n")
    with pytest.raises(UserInputError) as launch:
        make_plan(NodeRequest(gpu="A10G", playbook=str(book)))
    assert launch.value.field == f"{book}:2: driver"


def test_keep_driver_from_the_playbook_and_a_host_without_a_driver(tmp_path):
    book = tmp_path / "keep.yml"
    book.write_text("name: keep\ndriver: keep\n")
    target = Target(host="box")
    planner = Planner(None, str(book), None, StackPins())
    plan = planner(target, parse_facts(_facts("debian-12", pm="apt-get", driver="550.54.14")))
    assert plan.stack and plan.stack.kept_driver and not DRIVER_STEPS & {s.name for s in plan.steps}
    with pytest.raises(UserInputError) as exc:
        planner(target, parse_facts(_facts("debian-12", pm="apt-get")))
    assert exc.value.field == "--keep-driver" and "no NVIDIA driver" in exc.value.problem
