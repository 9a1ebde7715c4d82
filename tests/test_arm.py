"""Arm GPU hosts (issue 40): the host's architecture and CPU in its facts, the Arm types of the catalog with EC2's
architecture, `plan`/`render --arch` and the steps that take NVIDIA's sbsa repositories from the plan."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from gpuprov.cli import main
from gpuprov.hosts.detect import CPU, cpu_name, gpu_from_name, parse_facts
from gpuprov.plan import catalog

if TYPE_CHECKING:
    from gpuprov.cluster import Cluster

SHIMS = Path(__file__).parent / "shims"

# /proc/cpuinfo's first processor on each kind of host, as the arm64 kernel prints it (cpu part as cputype.h has it)
GRACE_CPUINFO = ("processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n"
                 "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\n"
                 "CPU revision\t: 0\n\nprocessor\t: 1\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n")
GRAVITON2_CPUINFO = "processor\t: 0\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0c\n"
X86_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz\n"


def _cpu_section(tmp_path: Path, gpu: str, cpuinfo: str, soc: str | None = None) -> str:
    """The facts' `## cpu` section as a host of the shims prints it: `uname -m` from the uname shim, the rest from
    the sysroot."""
    root = tmp_path / gpu
    (root / "proc").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text(cpuinfo)
    if soc is not None:
        (root / "sys/devices/soc0").mkdir(parents=True)
        (root / "sys/devices/soc0/soc_id").write_text(soc + "\n")
    env = {**os.environ, "PATH": f"{SHIMS / 'bin'}:{os.environ['PATH']}", "GPUPROV_SYSROOT": str(root),
           "GPUPROV_SHIM_GPU": gpu, "GPUPROV_SHIM_STATE": str(tmp_path / "state"), "GPUPROV_SHIM_RUN": str(tmp_path / "run")}
    return subprocess.run(["bash", "-c", CPU], env=env, capture_output=True, text=True, check=True).stdout


def test_a_gh200_host_is_aarch64_with_grace_and_a_t4g_host_graviton2_on_ec2(tmp_path: Path) -> None:
    gh200 = _cpu_section(tmp_path, "GH200", GRACE_CPUINFO, soc="jep106:036b:0241")
    facts = parse_facts(f"## nvidia-smi\nNVIDIA GH200 480GB\n## lspci\n## os\nubuntu-24.04\n{gh200}## end\n")
    assert (facts.arch, facts.cpu, facts.gpus) == ("aarch64", "Grace", ["GH200"])
    t4g = _cpu_section(tmp_path, "T4G", GRAVITON2_CPUINFO)
    facts = parse_facts(f"## nvidia-smi\nNVIDIA T4G\n## lspci\n## os\nubuntu-24.04\n## instance-type\ng5g.xlarge\n"
                        f"{t4g}## end\n")
    assert (facts.arch, facts.cpu, facts.gpus) == ("aarch64", "Graviton2", ["T4G"])
    x86 = _cpu_section(tmp_path, "T4", X86_CPUINFO)  # the machine's own `uname -m`: these tests run on x86_64 hosts
    assert cpu_name(x86.splitlines()[1:], on_ec2=True) == ("x86_64", "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz")


@pytest.mark.parametrize(("lines", "on_ec2", "found"), [
    (["aarch64", "part 0xd4f"], True, ("aarch64", "Graviton4")),  # Neoverse V2 on EC2, no NVIDIA SoC id
    (["aarch64", "part 0xd4f"], False, ("aarch64", "Neoverse-V2")),  # the same core elsewhere: not said to be Grace
    (["aarch64", "implementer 0x41", "part 0xd4f", "soc jep106:036b:0241"], False, ("aarch64", "Grace")),
    (["aarch64", "part 0xabc"], False, ("aarch64", "Arm part 0xabc")),
    (["unknown"], False, (None, None)), ([], False, (None, None)),
])
def test_the_cpu_is_named_by_its_core_and_maker(lines: list[str], on_ec2: bool, found: tuple[str | None, str | None]) -> None:
    assert cpu_name(lines, on_ec2) == found


def test_the_arm_gpus_are_named_apart_from_their_x86_kin() -> None:
    assert [gpu_from_name(n) for n in ("NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA GB300", "NVIDIA T4G", "Tesla T4",
                                       "NVIDIA H200", "NVIDIA B200")] == \
        ["GH200", "GB200", "GB300", "T4G", "T4", "H200", "B200"]
    # lspci without the driver: the shims' T4G line names it though the catalog has no PCI id for it
    facts = parse_facts("## nvidia-smi\n## lspci\n10:1c.0 3D controller [0302]: NVIDIA Corporation TU104GL [T4G] "
                        "[10de:1eb4] (rev a1)\n## os\nubuntu-22.04\n## end\n")
    assert facts.gpus == ["T4G"] and facts.arch is None  # facts without the cpu section: not known


def test_the_catalog_has_the_arm_types_with_ec2s_architecture_and_the_ultraservers() -> None:
    cat = catalog.load()
    arm = {it.name: it for it in cat.instance_types if it.arch == "arm64"}
    assert sorted(arm) == ["g5g.16xlarge", "g5g.2xlarge", "g5g.4xlarge", "g5g.8xlarge", "g5g.metal", "g5g.xlarge",
                           "p6e-gb200.36xlarge", "p6e-gb300.36xlarge"]
    assert {arm[n].gpus for n in arm if n.startswith("g5g")} == {1, 2}
    assert (arm["p6e-gb200.36xlarge"].gpus, arm["p6e-gb200.36xlarge"].ultraserver) == (4, "u-p6e-gb200x72")
    assert arm["p6e-gb300.36xlarge"].ultraserver == "u-p6e-gb300x72" and arm["p6e-gb300.36xlarge"].price_usd_hour is None
    assert all(it.arch == "x86_64" for it in cat.instance_types if it.name not in arm)
    assert {g.name: g.cpu_arch for g in cat.gpus if g.cpu_arch} == dict.fromkeys(["T4G", "GH200", "GB200", "GB300"], "aarch64")


def _plan(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(main, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_plan_takes_the_arch_of_the_type_or_the_gpu_and_refuses_one_that_cannot_be() -> None:
    t4g = _plan("--gpu", "T4G", "-p", "minimal")  # no torch: none is built for aarch64 with sm_75 (below)
    assert (t4g["instance_type"], t4g["arch"]) == ("g5g.xlarge", "aarch64")
    assert t4g["stack"]["cpu_arch"] == "aarch64"  # type: ignore[index]
    assert _plan("--gpu", "T4")["arch"] == "x86_64"
    gh200 = _plan("--gpu", "GH200")  # no AWS type: a plan for a host of one's own, on the GPU's only CPU
    assert (gh200["instance_type"], gh200["arch"]) == (None, "aarch64")
    for args, words in ((["--gpu", "H100", "--arch", "aarch64"], "every instance type with H100 is x86_64, not aarch64"),
                        (["--gpu", "GH200", "--arch", "x86_64"], "GH200 comes only with aarch64 hosts, not x86_64"),
                        (["--gpu", "T4G", "-p", "minimal", "--arch", "x86_64"], "T4G comes only with aarch64 hosts")):
        result = CliRunner().invoke(main, ["plan", *args])
        assert result.exit_code == 2 and f"error: --arch: {words}" in result.output, result.output


def test_a_gb200_is_planned_as_an_ultraserver_bought_through_capacity_blocks_and_up_refuses_it_without_one(
        tmp_path: Path) -> None:
    shown = CliRunner().invoke(main, ["plan", "--gpu", "GB200:4"], env={"COLUMNS": "400"}).output
    assert "p6e-gb200.36xlarge is sold only as part of the UltraServer u-p6e-gb200x72, through Capacity Blocks" in shown
    assert "aws ec2 describe-capacity-block-offerings --region us-east-1 --ultraserver-type u-p6e-gb200x72" in shown
    assert _plan("--gpu", "GB200:4")["ultraserver"] == "u-p6e-gb200x72"
    env = {"GPUPROV_HOME": str(tmp_path / "home")}
    up = CliRunner().invoke(main, ["up", "--gpu", "GB300:4", "--dry-run"], env=env)
    assert up.exit_code == 2 and "error: --capacity-block: p6e-gb300.36xlarge is sold only as part of the UltraServer " \
        "u-p6e-gb300x72" in up.output and "purchase-capacity-block" in up.output
    up = CliRunner().invoke(main, ["up", "--gpu", "GH200", "--dry-run"], env=env)
    assert up.exit_code == 2 and "error: --gpu: no AWS instance type carries GH200" in up.output


@pytest.mark.parametrize(("os_name", "script", "url"), [
    ("ubuntu-24.04", "03-nvidia-driver.sh", "repo_arch=sbsa"),
    ("ubuntu-22.04", "03-nvidia-driver.sh", "repo_arch=sbsa"),
    ("rhel-9", "03-nvidia-driver.sh", "repo_arch=sbsa"),
    ("amzn-2023", "03-nvidia-driver.sh", "repo_arch=sbsa"),
])
def test_render_arch_aarch64_takes_nvidias_sbsa_repository_from_the_plan(tmp_path: Path, os_name: str, script: str,
                                                                         url: str) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["render", "--gpu", "GH200", "--os", os_name, "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = next(out.glob("*-nvidia-driver.sh")).read_text()
    assert url in text and "x86_64" not in text.replace("uname -m", "")
    assert '[ "$(uname -m)" = aarch64 ] || gp_die' in text
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["gpuprov_plan"]["arch"] == "aarch64"
    x86 = tmp_path / "x86"
    assert CliRunner().invoke(main, ["render", "--gpu", "T4", "--os", os_name, "-o", str(x86)]).exit_code == 0
    assert "repo_arch=x86_64" in next(x86.glob("*-nvidia-driver.sh")).read_text()


def test_a_driver_step_planned_for_aarch64_stops_on_an_x86_64_host(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert CliRunner().invoke(main, ["render", "--gpu", "GH200", "-o", str(out)]).exit_code == 0
    script = next(out.glob("*-nvidia-driver.sh"))
    env = {**os.environ, "PATH": f"{SHIMS / 'bin'}:{os.environ['PATH']}", "GPUPROV_SHIM_GPU": "T4",
           "GPUPROV_SHIM_STATE": str(tmp_path / "state"), "GPUPROV_SHIM_RUN": str(tmp_path / "run"),
           "GPUPROV_SYSROOT": str(tmp_path / "root"), "GP_ROOT": str(tmp_path / "root")}
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert run.returncode != 0
    assert "this plan is for aarch64 hosts and this one is x86_64: plan it with --arch x86_64" in run.stdout + run.stderr


@pytest.mark.parametrize(("args", "field", "problem", "hint"), [
    # PyTorch's aarch64 CUDA wheels start at sm_80: g5g's T4G gets none, and no pin changes that
    (["--gpu", "T4G"], "--gpu", "torch 2.15+cu132 Linux aarch64 wheels carry code for sm_80, sm_90, sm_100, sm_110, "
     "sm_120, not T4G's sm_75", "no Linux aarch64 torch wheel carries sm_75: a playbook without torch (-p minimal)"),
    (["--gpu", "GH200", "--torch", "2.5"], "--torch", "torch 2.5+cu124 has no Linux aarch64 wheel",
     "this works instead: --torch 2.15 (torch 2.15+cu132"),
    (["--gpu", "GB200:4", "--torch-cuda", "cu126"], "--torch-cuda",
     "torch 2.14+cu126 Linux aarch64 wheels carry code for sm_80, sm_90, not GB200's sm_100",
     "this works instead: --torch-cuda cu132 (torch 2.15+cu132"),
])
def test_the_resolver_refuses_a_torch_without_an_aarch64_wheel_and_names_one_that_has(
        args: list[str], field: str, problem: str, hint: str) -> None:
    result = CliRunner().invoke(main, ["plan", *args], env={"COLUMNS": "400"})
    assert result.exit_code == 2 and f"error: {field}: {problem}" in result.output and hint in result.output, \
        result.output


def test_an_aarch64_plan_takes_its_wheel_from_the_aarch64_rows_and_says_they_are_unverified() -> None:
    gh200 = _plan("--gpu", "GH200", "--torch", "2.6")
    torch = gh200["stack"]["torch"]  # type: ignore[index]
    assert (torch["version"], torch["variant"]) == ("2.6", "cu126")  # 2.6's only aarch64 CUDA wheel
    assert any("PyTorch index's aarch64 file listings" in note for note in gh200["unverified"])  # type: ignore[union-attr]
    x86 = _plan("--gpu", "H100", "--torch", "2.6")["stack"]["torch"]  # type: ignore[index]
    assert x86["variant"] == "cu124"  # 2.6's PyPI default on x86_64, which has no aarch64 wheel


# --- AWS: the arm64 image of the OS for an Arm type, and an image of the other architecture refused -----------------

NO_SSH = ("--ssh-cidr", "198.51.100.7/32", "--yes", "--no-bootstrap", "--no-wait")


def _instance(cloud, node: str) -> dict:  # type: ignore[no-untyped-def]
    (inst,) = [i for r in cloud.ec2().describe_instances(
        Filters=[{"Name": "tag:gpuprov:node", "Values": [node]}])["Reservations"] for i in r["Instances"]]
    return inst  # type: ignore[no-any-return]


@pytest.mark.parametrize(("os_name", "image"), [("ubuntu-24.04", "ubuntu"), ("amzn-2023", "amzn-2023")])
def test_up_gpu_t4g_launches_g5g_with_the_arm64_image_of_the_os(fake_cloud, os_name: str, image: str) -> None:  # type: ignore[no-untyped-def]
    from tests.aws.fixture import os_ami, ubuntu_ami

    result = fake_cloud.gp("up", "arm", "--gpu", "T4G", "-p", "minimal", "--os", os_name, *NO_SSH)
    assert result.exit_code == 0, result.output
    inst = _instance(fake_cloud, "arm")
    wanted = ubuntu_ami("24.04", "arm64") if image == "ubuntu" else os_ami(image, "arm64")
    assert (inst["InstanceType"], inst["ImageId"]) == ("g5g.xlarge", wanted)
    assert fake_cloud.ec2().describe_images(ImageIds=[wanted])["Images"][0]["Architecture"] == "arm64"


def test_an_image_of_the_other_architecture_is_refused_before_anything_is_made(fake_cloud) -> None:  # type: ignore[no-untyped-def]
    from tests.aws.cli import EMPTY
    from tests.aws.fixture import ubuntu_ami

    x86, arm = ubuntu_ami("24.04", "amd64"), ubuntu_ami("24.04", "arm64")
    for args, words in (
            (["--gpu", "T4G", "-p", "minimal", "--image", x86], f"{x86} is an x86_64 image and g5g.xlarge runs arm64"),
            (["--gpu", "T4", "--image", arm], f"{arm} is an arm64 image and g4dn.xlarge runs x86_64")):
        result = fake_cloud.gp("up", "wrong", *args, *NO_SSH)
        assert result.exit_code == 2, result.output
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert f"error: --image: {words}" in line, result.stderr
    assert fake_cloud.leftovers() == EMPTY


def test_a_kept_driver_on_an_aarch64_host_gets_an_aarch64_wheel() -> None:
    from gpuprov.errors import GpuprovError
    from gpuprov.plan import compat
    from gpuprov.plan.stack import StackPins

    gh200 = catalog.load().gpu("GH200")
    wheel = compat.choose_torch_for_driver(gh200, "570.195.03", StackPins(torch="2.6"), "aarch64")
    assert wheel.variant == "cu126"  # x86_64's choice on R570 is 2.6's PyPI default cu124, which has no aarch64 wheel
    assert compat.choose_torch_for_driver(gh200, "570.195.03", StackPins(torch="2.6")).variant == "cu124"
    with pytest.raises(GpuprovError):
        compat.choose_torch_for_driver(gh200, "570.195.03", StackPins(torch="2.5"), "aarch64")


def _trays(n: int, **member: str) -> Cluster:
    from gpuprov.cluster import Cluster, ClusterHost

    return Cluster(name="nvl72", master_addr="10.0.0.10", master_port=29500, members=[
        ClusterHost(host=f"tray{k}", address=f"10.0.0.{10 + k}", gpus=4, **member) for k in range(n)])  # type: ignore[arg-type]


def _wire(tmp_path: Path, c: Cluster, rank: int = 0) -> subprocess.CompletedProcess[str]:
    """The cluster wiring step on a tray of the shims (apt, nvidia-smi, systemctl), its driver R595 installed."""
    from gpuprov.cluster import render

    state = tmp_path / "state"
    if not state.exists():
        state.mkdir()
        (state / "installed").write_text("cuda-keyring 1.1-1\nnvidia-open 595.58.03-0ubuntu1\n")
        (state / "nvidia-repo").write_text("ubuntu2404/sbsa\n")
    script = tmp_path / "wire.sh"
    script.write_text(render(c, rank))
    return subprocess.run(["bash", str(script)], env=_tray_env(tmp_path), capture_output=True, text=True)


def _tray_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{SHIMS / 'bin'}:{os.environ['PATH']}", "GPUPROV_SYSROOT": str(tmp_path / "root"),
            "GPUPROV_SHIM_GPU": "GH200", "GPUPROV_SHIM_STATE": str(tmp_path / "state"),
            "GPUPROV_SHIM_RUN": str(tmp_path / "run"), "GPUPROV_SHIM_ARCH": "aarch64", "GPUPROV_RETRY_DELAY": "0",
            **extra}


def _imex_query(tmp_path: Path) -> str:
    from gpuprov.cluster.check import IMEX_QUERY

    return subprocess.run(["bash", "-c", IMEX_QUERY], env=_tray_env(tmp_path), capture_output=True, text=True).stdout


def _result(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def test_the_trays_of_an_nvl72_get_imex_at_the_drivers_version_with_every_nodes_address(tmp_path: Path) -> None:
    """`up --nodes` of p6e-gb200 (or `bootstrap --cluster` of GB200 hosts): the wiring step installs nvidia-imex at the
    loaded driver's exact version from NVIDIA's repository, holds it, writes the node list, and (re)starts the service;
    a rerun changes nothing and restarts nothing; a node more restarts it with the longer list."""
    trays = _trays(2, instance_type="p6e-gb200.36xlarge")
    assert trays.imex and _trays(2, gpu="GB300").imex and not _trays(2, instance_type="p5.48xlarge").imex
    assert _result(_wire(tmp_path, trays)) == "GPUPROV_RESULT=changed"
    nodes = tmp_path / "root/etc/nvidia-imex/nodes_config.cfg"
    assert nodes.read_text() == "10.0.0.10\n10.0.0.11\n"
    state = tmp_path / "state"
    assert "nvidia-imex 595.58.03-1" in (state / "installed").read_text().splitlines()
    assert "nvidia-imex" in (state / "held").read_text().split()
    calls = (state / "calls.log").read_text().splitlines()
    assert "systemctl restart nvidia-imex" in calls
    assert _result(_wire(tmp_path, trays)) == "GPUPROV_RESULT=unchanged"
    assert (state / "calls.log").read_text().splitlines().count("systemctl restart nvidia-imex") == 1
    assert _result(_wire(tmp_path, _trays(3, instance_type="p6e-gb200.36xlarge"))) == "GPUPROV_RESULT=changed"
    assert nodes.read_text() == "10.0.0.10\n10.0.0.11\n10.0.0.12\n"
    assert (state / "calls.log").read_text().splitlines().count("systemctl restart nvidia-imex") == 2
    assert _imex_query(tmp_path) == "READY\n"  # what `check --cluster` asks each node (the shim: unit up, a list)


def test_check_cluster_names_each_tray_whose_imex_is_not_ready() -> None:
    from gpuprov.cluster.check import judge_imex

    trays = _trays(3, instance_type="p6e-gb200.36xlarge")
    (ok,) = judge_imex(trays, ["READY"] * 3)
    assert ok.ok and ok.detail == "IMEX READY on all 3 nodes (nvidia-imex-ctl -q)"
    bad = judge_imex(trays, ["READY", "WAITING_FOR_PEERS", "nvidia-imex-ctl: command not found"])
    assert [(c.name, c.ok) for c in bad] == [("nvl72:1 IMEX", False), ("nvl72:2 IMEX", False)]
    assert bad[0].detail == "nvl72:1 IMEX daemon: WAITING_FOR_PEERS"
    assert bad[1].detail.endswith("(not a state `nvidia-imex-ctl -q` reports)")
    assert bad[0].fix and "nodes_config.cfg must list the same addresses" in bad[0].fix


def test_imex_without_a_loaded_driver_fails_naming_it_and_other_clusters_get_no_imex(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state/installed").write_text("")
    proc = _wire(tmp_path, _trays(2, gpu="GB200"))
    assert proc.returncode == 1 and "IMEX needs the NVIDIA driver loaded" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "root/etc/nvidia-imex").exists()
    assert "command not found" in subprocess.run(["bash", "-c", "nvidia-imex-ctl -q"], env=_tray_env(tmp_path),
                                                 capture_output=True, text=True).stderr  # no package, no app
    other = tmp_path / "p5"
    other.mkdir()
    assert _result(_wire(other, _trays(2, instance_type="p5.48xlarge"))) == "GPUPROV_RESULT=changed"
    assert (other / "root/etc/gpuprov/hostfile").exists() and not (other / "root/etc/nvidia-imex").exists()


def test_the_imex_wiring_is_shellcheck_clean(tmp_path: Path) -> None:
    import shutil
    import sys

    from gpuprov.cluster import render

    checker = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert checker
    path = tmp_path / "wire.sh"
    path.write_text(render(_trays(2, gpu="GB200"), 1))
    proc = subprocess.run([checker, "-S", "warning", "-f", "gcc", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("columns", ["80", "200"])
def test_the_gpus_table_says_each_types_cpu_architecture_at_80_columns_too(columns: str) -> None:
    result = CliRunner().invoke(main, ["gpus"], env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= int(columns) and any("┃ CPU " in line for line in lines)
    for it in catalog.load().instance_types:
        if not it.cpu_only:
            (row,) = [line for line in lines if f" {it.name} " in line]
            assert f"│ {'aarch64' if it.arch == 'arm64' else 'x86_64'} " in row, row
    (gh200,) = [line for line in lines if "│ GH200 " in line]
    assert "none on AWS" in gh200 and "│ aarch64 " in gh200  # Grace: the GPU's own CPU
