"""`gpuprov doctor`: the parser and rules on recorded outputs (tests/fixtures/doctor), the fact
command itself on a shim host (no root needed), and the CLI end to end on the real-sshd test hosts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpuprov.hosts.doctor import diagnose, examine
from gpuprov.hosts.doctor_facts import DoctorFacts, facts_command, parse_facts
from gpuprov.hosts.verify import Check
from gpuprov.plan.plan import make_host_plan
from gpuprov.plan.stack import StackPins
from tests.shimrun import ShimHost, summary
from tests.test_bootstrap_ssh import addrs, bootstrap, gpuprov, reset

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "doctor"


def findings(name: str, **kw: object) -> dict[str, Check]:
    report = examine("gpu1", (FIXTURES / name).read_text(), **kw)  # type: ignore[arg-type]
    return {c.name: c for c in report.findings}


def failed(checks: dict[str, Check]) -> dict[str, str]:
    """name -> severity of every finding that did not pass, in report order."""
    return {n: c.severity for n, c in checks.items() if not c.ok}


# --- parser and rules on recorded outputs -------------------------------------------------------


def test_healthy_host_every_finding_passes_and_is_listed():
    report = examine("gpu1", (FIXTURES / "healthy.txt").read_text())
    assert report.ok and not report.failures
    names = [c.name for c in report.findings]
    assert names == ["os", "gpu on pci bus", "apt lock", "nouveau", "kernel headers", "driver package", "driver hold",
                     "driver pin", "secure boot", "kernel module", "nvidia-smi", "persistence daemon",
                     "persistence mode", "device nodes", "torch vs driver", "disk"]
    assert all(c.ok for c in report.findings), [c for c in report.findings if not c.ok]
    f = report.facts
    assert f.os == "ubuntu-22.04" and f.kernel == "6.8.0-1015-aws"
    assert f.driver_version == "580.95.05" and f.cuda_version == "13.0" and f.loaded_version == "580.95.05"
    assert f.driver_packages == {"nvidia-open": "580.95.05-0ubuntu1"} and "nvidia-open" in f.held
    assert f.secure_boot is False and f.module_signer == "DKMS module signing key"
    assert f.torch is not None and (f.torch.version, f.torch.cuda) == ("2.9.1+cu130", "13.0")
    assert len(f.pci_gpus) == 1 and not f.nvswitches and len(f.dev_nodes) == 6
    assert f.disk[0].mount == "/" and 75 < f.disk[0].avail_gib < 76


def test_fresh_driver_not_rebooted_says_reboot():
    checks = findings("fresh-driver-not-rebooted.txt")
    assert failed(checks) == {"kernel module": "fail", "nvidia-smi": "fail"}
    assert checks["dkms"].ok  # built for the running kernel: only the reboot is missing
    assert "reboot" in (checks["kernel module"].fix or "")
    assert checks["nvidia-smi"].fix == "see `kernel module` above"  # the symptom points at the cause
    assert checks["persistence daemon"].ok  # enabled; it starts with the module


def test_nouveau_loaded_is_the_root_cause():
    checks = findings("nouveau-loaded.txt")
    assert list(failed(checks)) == ["nouveau", "kernel module", "nvidia-smi"]
    fix = checks["nouveau"].fix or ""
    assert "blacklist nouveau" in fix and "update-initramfs -u" in fix and "reboot" in fix
    assert checks["kernel module"].fix == "see `nouveau` above"


def test_version_mismatch_says_reboot_and_hold():
    checks = findings("version-mismatch.txt")
    assert failed(checks) == {"driver hold": "warn", "driver pin": "warn", "nvidia-smi": "fail"}
    smi = checks["nvidia-smi"]
    assert "version mismatch" in smi.detail and "580.82.07" in smi.detail and "580.95.05" in smi.detail
    assert (smi.fix or "").startswith("reboot")
    assert checks["driver hold"].fix == "apt-mark hold nvidia-open"


def test_held_driver_without_the_pinning_package_says_the_hold_is_not_enough():
    # apt-mark hold nvidia-open keeps the meta-package; its dependencies are `>= VERSION` and follow a
    # newer branch unless NVIDIA's pinning preferences are installed (tests/test_real_apt.py shows it)
    checks = findings("held-without-pin.txt")
    assert failed(checks) == {"driver pin": "warn"}
    pin = checks["driver pin"]
    assert "keeps the meta-package only" in pin.detail and ">= 580.95.05" in pin.detail
    assert (pin.fix or "").startswith("apt-get install nvidia-driver-pinning-580 ")


def test_nvswitch_without_fabric_manager():
    checks = findings("nvswitch-no-fabricmanager.txt")
    assert failed(checks) == {"fabric manager": "fail"}
    fm = checks["fabric manager"]
    assert "6 NVSwitch" in fm.detail and "802" in fm.detail and "system not yet initialized" in fm.detail
    # R580: NVIDIA's repo names it without the branch (gpu-driver-container ubuntu24.04/install.sh @ 78fa4ac)
    assert "install nvidia-fabricmanager at exactly 580.95.05" in (fm.fix or "")
    assert "nvidia-fabricmanager-580" not in (fm.fix or "")
    assert "systemctl enable --now nvidia-fabricmanager" in (fm.fix or "")


def test_nvswitch_fabric_manager_version_mismatch():
    checks = findings("nvswitch-fabricmanager-mismatch.txt")
    assert failed(checks) == {"fabric manager": "fail", "fabric manager service": "fail"}
    assert "580.82.07-1 does not match driver 580.95.05" in checks["fabric manager"].detail
    assert "failed" in checks["fabric manager service"].detail


def test_torch_built_for_a_newer_cuda_than_the_driver():
    checks = findings("torch-newer-than-driver.txt")
    assert failed(checks) == {"torch vs driver": "fail"}
    c = checks["torch vs driver"]
    assert "CUDA 13.0" in c.detail and "≤ 12.8" in c.detail
    assert "≥ 580.65.06" in (c.fix or "")  # compat facts: CUDA 13.0 needs 580.65.06 (gpu-stack-facts §2a)
    # the resolver's newest wheel for this L4 on R570: torch 2.14 has cu126/cu130/cu132; cu126 runs on 570
    assert "--torch 2.14 --torch-cuda cu126" in (c.fix or "")


def test_apt_lock_held_warns_and_names_the_holder():
    report = examine("gpu1", (FIXTURES / "apt-lock-held.txt").read_text())
    checks = {c.name: c for c in report.findings}
    assert failed(checks) == {"apt lock": "warn", "driver package": "fail", "disk": "warn"}
    assert "unattended-upgrade" in checks["apt lock"].detail and "wait" in (checks["apt lock"].fix or "")
    assert "gpuprov bootstrap gpu1" in (checks["driver package"].fix or "")
    # with no driver, its symptoms are not listed as more problems
    assert not {"kernel module", "nvidia-smi", "persistence daemon", "device nodes"} & set(checks)
    assert report.facts.smi_rc == 127


def test_secure_boot_blocks_an_unsigned_module():
    checks = findings("secure-boot-unsigned.txt")
    assert list(failed(checks)) == ["secure boot", "kernel module", "nvidia-smi"]
    assert "unsigned" in checks["secure boot"].detail and "mokutil --import" in (checks["secure boot"].fix or "")
    assert checks["kernel module"].fix == "see `secure boot` above"
    assert checks["driver package"].detail.startswith("nvidia-driver-580-server-open")  # Ubuntu's own packages count


def test_b200_infiniband_modules_missing():
    # HGX B200: Fabric Manager's pre-check and nvlsm need ib_umad/mlx5_ib at every boot (stack.yaml
    # `nvswitch_gen4`: aws-parallelcluster-cookbook PR #3022, spectrocloud/CanvOS PR #700, NVIDIA/gpu-operator#2781)
    report = examine("gpu1", (FIXTURES / "b200-infiniband-modules-missing.txt").read_text())
    checks = {c.name: c for c in report.findings}
    assert failed(checks) == {"fabric manager service": "fail", "infiniband modules": "fail"}
    assert report.facts.instance_type == "p6-b200.48xlarge" and not report.facts.nvswitches
    assert len(report.facts.pci_gpus) == 8  # 10de:2901 is the GPU, not an NVSwitch
    assert checks["fabric manager"].ok and "nvidia-fabricmanager 595.91.07-1" in checks["fabric manager"].detail
    ib = checks["infiniband modules"]
    assert "ib_umad, mlx5_ib not loaded" in ib.detail and "In Progress" in ib.detail and "802" in ib.detail
    fix = ib.fix or ""
    assert "linux-modules-extra-6.14.0-1012-aws" in fix and "infiniband-diags" in fix and "modprobe -a ib_umad mlx5_ib" in fix
    assert "/etc/modules-load.d/gpuprov-nvswitch.conf" in fix


def test_persistence_mode_off_though_the_daemon_runs():
    checks = findings("persistence-mode-off.txt")
    assert failed(checks) == {"persistence mode": "warn"}
    assert checks["persistence daemon"].ok  # active and enabled: the packaged unit says --no-persistence-mode
    pm = checks["persistence mode"]
    assert "GPU 0" in pm.detail and "--no-persistence-mode" in pm.detail
    assert pm.fix and "--persistence-mode" in pm.fix and "gpuprov-persistence-mode.conf" in pm.fix


def test_every_fixture_parses_and_every_failure_has_a_fix():
    for path in sorted(FIXTURES.glob("*.txt")):
        report = examine("gpu1", path.read_text())
        assert report.findings, path.name
        assert all(c.fix for c in report.findings if not c.ok), path.name


def test_rules_cover_missing_tools_and_other_oses():
    facts = parse_facts("## os\nfedora-41\nFedora Linux 41 (Server Edition)\n## lspci\n@missing\n## lsmod\n@missing\n"
                        "## dpkg\n@missing\n## nvidia-smi\n@rc 127\n## lock\n@missing\n## end\n")
    checks = {c.name: c for c in diagnose(facts, "h")}
    assert checks["os"].severity == "warn" and "Fedora" in checks["os"].detail
    assert checks["gpu on pci bus"].severity == "warn" and "pciutils" in (checks["gpu on pci bus"].fix or "")
    assert "kernel headers" not in checks and "nouveau" not in checks and "apt lock" not in checks
    assert not checks["driver package"].ok


def test_cut_off_output_is_an_error():
    from gpuprov.hosts.doctor_facts import DoctorError

    with pytest.raises(DoctorError, match="cut off"):
        parse_facts("## os\nubuntu-22.04\n## lsmod\nModule  Size  Used by\n")


@pytest.mark.parametrize(("driver", "package"), [
    ("575.57.08", "nvidia-fabricmanager-575"), ("580.95.05", "nvidia-fabricmanager"), ("590.48.01", "nvidia-fabricmanager"),
])
def test_fabric_manager_fix_names_the_package_of_the_driver_branch(driver, package):
    text = (FIXTURES / "nvswitch-no-fabricmanager.txt").read_text().replace("580.95.05", driver)
    checks = {c.name: c for c in examine("h", text).findings}
    assert f"install {package} at exactly {driver}" in (checks["fabric manager"].fix or "")


def test_low_disk_threshold_is_configurable():
    assert failed(findings("healthy.txt", min_free_gb=100)) == {"disk": "warn"}


# --- the fact command on a shim host (no SSH, no root) ------------------------------------------


def _run_facts(host: ShimHost, env_path: str = "/opt/gpuprov/env") -> DoctorFacts:
    out = subprocess.run(["sh", "-c", facts_command(env_path)], capture_output=True, text=True, env=host.env(),
                         timeout=60, check=True).stdout
    return parse_facts(out, env_path)


def _os_release(host: ShimHost) -> None:
    etc = host.sysroot / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "os-release").write_text('PRETTY_NAME="Ubuntu 22.04.5 LTS"\nID=ubuntu\nVERSION_ID="22.04"\n')


def test_fact_command_on_a_fresh_shim_host(tmp_path: Path):
    host = ShimHost(tmp_path, gpu="T4")
    _os_release(host)
    facts = _run_facts(host)
    assert facts.os == "ubuntu-22.04" and facts.packages == {} and facts.smi_rc == 127
    assert len(facts.pci_gpus) == 1 and facts.modules is not None and "nvidia" not in facts.modules
    assert facts.torch is not None and not facts.torch.found
    checks = {c.name: c for c in diagnose(facts, "h")}
    assert not checks["driver package"].ok and "gpuprov bootstrap h" in (checks["driver package"].fix or "")


def test_fact_command_after_a_bundle_on_an_nvswitch_shim_host(tmp_path: Path):
    bundle = make_host_plan("H100", "minimal", "ubuntu-22.04", StackPins()).bundle()
    host = ShimHost(tmp_path, gpu="H100", count=8)
    _os_release(host)
    runs = host.run_bundle(bundle)
    assert all(r.ok for r in runs), summary(runs)
    facts = _run_facts(host)
    checks = {c.name: c for c in diagnose(facts, "h", min_free_gb=0)}
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    assert len(facts.nvswitches) == 4 and checks["fabric manager"].ok and checks["fabric manager service"].ok
    assert facts.torch is not None and not facts.torch.found  # minimal: no env

    # Fabric Manager one patch behind the driver, its service down: both named, with the 802 symptom
    state = host.state / "installed"
    drv = facts.driver_version
    assert drv
    lines = [f"{n} 1.0.0-1" if n.startswith("nvidia-fabricmanager") else f"{n} {v}"
             for n, v in (line.split(" ", 1) for line in state.read_text().splitlines())]
    state.write_text("\n".join(lines) + "\n")
    (host.state / "enabled" / "nvidia-fabricmanager").unlink(missing_ok=True)
    (host.run_dir / "active" / "nvidia-fabricmanager").unlink(missing_ok=True)
    checks = {c.name: c for c in diagnose(_run_facts(host), "h", min_free_gb=0)}
    assert failed(checks) == {"fabric manager": "fail", "fabric manager service": "fail"}
    assert f"exactly {drv}" in (checks["fabric manager"].fix or "")


# --- end to end on the SSH test hosts -----------------------------------------------------------


def _ubuntu(pool, hosts) -> None:
    """The test hosts run the build machine's OS; give them Ubuntu's os-release in their sysroot."""
    for i in hosts:
        pool.exec_in(i, "mkdir -p /var/lib/gpuprov-shim/root/etc && printf '%s\\n' 'PRETTY_NAME=\"Ubuntu 22.04.5 LTS\"' "
                        "ID=ubuntu 'VERSION_ID=\"22.04\"' > /var/lib/gpuprov-shim/root/etc/os-release", check=True)


def doctor(pool, hosts, *extra: str):
    result = gpuprov("doctor", *addrs(pool, hosts), "-i", str(pool.key_path), "--accept-new-host-key",
                     "--connect-timeout", "3", "--min-free-gb", "0.01", "--json", *extra)
    try:
        return result.returncode, json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"doctor printed no JSON (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")


def by_name(host: dict) -> dict[str, dict]:
    return {c["name"]: c for c in host["findings"]}


def test_doctor_on_ssh_hosts_healthy_fresh_mismatch_and_unreachable(host_pool, gp_home):
    pool = host_pool
    reset(pool, [0, 1, 2, 3])
    _ubuntu(pool, [0, 1, 2, 3])
    code, hosts = bootstrap(pool, [0, 2])
    assert code == 0, hosts

    code, hosts = doctor(pool, [0])
    assert code == 0, hosts
    healthy = by_name(hosts[0])
    assert all(c["ok"] for c in healthy.values()), [c for c in healthy.values() if not c["ok"]]
    assert {"driver package", "kernel module", "nvidia-smi", "persistence daemon", "device nodes",
            "torch vs driver"} <= set(healthy)
    human = gpuprov("doctor", *addrs(pool, [0]), "-i", str(pool.key_path), "--min-free-gb", "0.01")
    assert human.returncode == 0 and "healthy" in human.stdout and "torch vs driver" in human.stdout

    pool.exec_in(2, "echo 'export GPUPROV_SHIM_FAIL=nvml-mismatch' >> /var/lib/gpuprov-shim/env", check=True)
    pool.kill_host(3)
    try:
        code, hosts = doctor(pool, [0, 1, 2, 3])
    finally:
        pool.restart(3)
    assert code == 1
    ok, fresh, mismatch, gone = hosts
    assert ok["ok"] and not fresh["ok"] and not mismatch["ok"]

    driver = by_name(fresh)["driver package"]
    assert not driver["ok"] and "not installed" in driver["detail"]
    assert f"gpuprov bootstrap {addrs(pool, [1])[0]}" in driver["fix"]  # the host as the user typed it
    assert fresh["facts"]["packages"] == {}

    smi = by_name(mismatch)["nvidia-smi"]
    assert not smi["ok"] and "version mismatch" in smi["detail"] and smi["fix"].startswith("reboot")
    assert by_name(mismatch)["kernel module"]["ok"]

    assert gone["unreachable"] and gone["findings"] is None and gone["error"]


# --- doctor --sources ---------------------------------------------------------------------------


def test_sources_judge_reads_curls_line_in_either_order_and_names_the_fastest_working():
    from gpuprov.hosts.doctor_sources import MARK, Probe, judge, nvidia_index

    # NVIDIA's index file of the host's OS and architecture: a dnf repository's repomd, an apt one's InRelease
    assert nvidia_index("rocky-9", "aarch64") == "rhel9/sbsa/repodata/repomd.xml"
    assert nvidia_index("ubuntu-22.04", "x86_64") == "ubuntu2204/x86_64/InRelease"
    assert nvidia_index("gentoo-2", "x86_64") == "ubuntu2404/x86_64/InRelease"

    batch = [Probe("pypi", "configured", "https://pypi.org/simple/pip/"),
             Probe("pypi", "cn-tuna", "https://pypi.tuna.tsinghua.edu.cn/simple/pip/"),
             Probe("pypi", "cn-ustc", "https://mirrors.ustc.edu.cn/pypi/web/simple/pip/"),
             Probe("nvidia", "configured", "https://developer.download.nvidia.com/compute/cuda/repos/x/InRelease")]
    output = "\n".join([f"{MARK} 1 200 0.120", f"{MARK} 0 200 0.480",
                        f"{MARK} 2 curl: (6) Could not resolve host: mirrors.ustc.edu.cn 000 0.002",
                        f"{MARK} 3 404 0.300"])
    report = judge("h", batch, output)
    best = report.fastest("pypi")
    assert best is not None and best.source == "cn-tuna" and best.seconds == 0.12
    ustc = report.timed[2]
    assert not ustc.ok and ustc.problem == "unreachable: (6) Could not resolve host: mirrors.ustc.edu.cn"
    assert report.timed[3].problem == "HTTP 404" and report.fastest("nvidia") is None and not report.ok
    # the table: the fastest marked, the key without a working source in the title
    from rich.console import Console

    from gpuprov.cli.report_hosts import sources_tables
    from gpuprov.hosts.remote import HostOutcome
    from gpuprov.plan.inventory import Target

    console = Console(width=200, record=True)
    for renderable in sources_tables([HostOutcome(Target("h"), report)]):
        console.print(renderable)
    text = console.export_text()
    assert "h: no source works for nvidia" in text
    assert [w for w in next(line for line in text.splitlines() if "cn-tuna" in line).split() if w != "│"][2:4] == [
        "0.120", "fastest"]


def test_doctor_sources_times_each_source_from_the_host_itself(host_pool, gp_home, tmp_path: Path, monkeypatch):
    """The configured sources on a web server the host reaches (the test hosts' bridge), the presets' public hosts
    unreachable from it (no route out): each said as such, the fastest working one named per key."""
    from gpuprov.hosts.doctor_sources import nvidia_index
    from gpuprov.plan.oses import from_os_release
    from tests import indexsite

    pool = host_pool
    site = indexsite.build(tmp_path / "site")
    # NVIDIA's index file for the host's own OS (the build machine's, in the test hosts) and architecture
    said = pool.exec_in(0, '. /etc/os-release; echo "$ID $VERSION_ID $(uname -m)"', check=True).stdout.split()
    index = nvidia_index(from_os_release(said[0], said[1]), said[2])
    (site / "repos" / index).parent.mkdir(parents=True, exist_ok=True)
    (site / "repos" / index).write_text("Origin: imitation\n")
    (site / "whl/filelock").mkdir(parents=True)
    (site / "whl/filelock/index.html").write_text("<html></html>\n")
    with indexsite.serve(site, host=f"{pool.subnet}.1") as (base, requests):
        # the hosts' curl is a shim without network; the site's URLs go to the real one
        pool.exec_in(0, f"echo 'export GPUPROV_SHIM_CURL_PASSTHROUGH={base}' > /var/lib/gpuprov-shim/env", check=True)
        config = tmp_path / "config.toml"
        config.write_text(f'[sources]\nnvidia = "{base}/repos"\ntorch = "{base}/whl"\npypi = "{base}/pypi"\n')
        monkeypatch.setenv("GPUPROV_CONFIG", str(config))
        try:
            code, hosts = doctor(pool, [0], "--sources", "--timeout", "1")
        finally:
            pool.exec_in(0, "rm -f /var/lib/gpuprov-shim/env", check=True)
    assert code == 1, hosts  # no source of uv, miniforge, docker or the toolkit answers from a host with no route out
    rows = {(t["key"], t["source"]): t for t in hosts[0]["sources"]}
    assert rows[("nvidia", "configured")]["ok"] and rows[("nvidia", "configured")]["seconds"] >= 0
    assert rows[("torch", "configured")]["ok"]
    assert rows[("pypi", "configured")]["problem"] == "HTTP 404"  # the site has no pip page
    assert not rows[("pypi", "cn-tuna")]["ok"] and rows[("pypi", "cn-tuna")]["problem"].startswith("unreachable")
    assert hosts[0]["fastest"] == {"nvidia": "configured", "torch": "configured"}
    assert f"/repos/{index}" in [p for p, _ in requests]
