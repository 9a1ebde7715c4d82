"""The rendered dnf-family steps (templates/el/) with the REAL dnf and rpm (Debian ships both), on an --installroot,
against an imitation of NVIDIA's amzn2023 repository with its module streams and of the distribution's own
(tests/realdnf/repo.py: built with rpmbuild, indexed with createrepo_c). Stand-ins only for what an install root cannot
run: nvidia-smi, lsmod, modprobe, dracut, systemctl, uname, curl and nvidia-ctk (tests/realdnf/stand-ins).

What a user would notice: a plan naming a package NVIDIA's repository does not have fails in the driver step, before
any NVIDIA package is installed, naming it and what the repository has; a fresh run installs the headers of the
running kernel, the planned branch's driver through its module stream (though the repository also has a newer
branch), Fabric Manager at the driver's exact version, version-locked, and the toolkit; a rerun changes nothing (no
rpm transaction). The docker step the same way (Amazon Linux's own `docker`, NVIDIA's container toolkit repository,
the nvidia runtime in daemon.json, the daemon restarted only when that changed it). HGX B200 on Amazon Linux 2023's
6.12 kernel (namespaced kernel6.12-devel, kernel6.12-modules-extra) and on Rocky 10: the running kernel's own devel
package, and its modules-extra installed before ib_umad/mlx5_ib are loaded. Through a mirror (the same repository
at a second URL over HTTP, its `.repo` file naming NVIDIA's host and key): the file read from the mirror, the key
checked against the pinned fingerprint and kept, the toolkit installed from the mirror; a mirror serving another key
is refused.

Needs dnf, rpm, rpmbuild, createrepo_c and modifyrepo_c (tools/sysdeps.sh installs them); without them it skips,
except under CI=true, where it fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuprov.plan import sources
from gpuprov.plan.plan import NodeRequest, make_plan
from gpuprov.plan.render import Bundle, Script, render_steps
from gpuprov.plan.stack import StackPins
from tests import indexsite
from tests.conftest import skip_or_fail
from tests.realapt import mirror
from tests.realdnf import repo

STAND_INS = Path(__file__).parent / "realdnf" / "stand-ins"
STEPS = ("kernel-headers", "nouveau-off", "nvidia-driver", "fabric-manager", "cuda-toolkit", "docker")
TOOLS = ("dnf", "rpm", "rpmbuild", "createrepo_c", "modifyrepo_c")


@dataclass
class Run:
    name: str
    returncode: int
    result: str | None
    stderr: str

    @property
    def last(self) -> str:
        return self.stderr.strip().splitlines()[-1] if self.stderr.strip() else ""


class Host:
    """An install root with the imitation's repositories: the distribution's configured, NVIDIA's added by the step."""

    def __init__(self, where: Path, cuda: Path, distro: Path, ctk: Path, release: str = "2023",
                 kernel: str = repo.KERNEL, arch: str = "") -> None:
        self.root = where / "root"
        self.cuda, self.ctk, self.release, self.kernel, self.arch = cuda, ctk, release, kernel, arch
        (self.root / "etc/yum.repos.d").mkdir(parents=True)
        # the distribution's repositories; CodeReady Builder there, disabled, as on Rocky (EPEL's steps enable it)
        (self.root / "etc/yum.repos.d/amazonlinux.repo").write_text(
            f"[amazonlinux]\nname=amazonlinux\nbaseurl=file://{distro}\nenabled=1\ngpgcheck=0\n\n"
            f"[crb]\nname=crb\nbaseurl=file://{distro}\nenabled=0\ngpgcheck=0\n")
        plugins = self.root / "etc/dnf/plugins"
        plugins.mkdir(parents=True)
        # what python3-dnf-plugin-versionlock lays down (its conf and an empty list); the machine's dnf runs the plugin
        (plugins / "versionlock.conf").write_text(f"[main]\nenabled = 1\nlocklist = {plugins}/versionlock.list\n")
        (plugins / "versionlock.list").write_text("")

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{STAND_INS}:{os.environ['PATH']}", "GPUPROV_SYSROOT": str(self.root),
                "GPUPROV_RETRY_DELAY": "0", "REALDNF_KERNEL": self.kernel, "REALDNF_CUDA_REPO": str(self.cuda),
                "REALDNF_CTK_REPO": str(self.ctk), "REALDNF_CUDA10_REPO": str(self.cuda), "REALDNF_RELEASEVER": self.release,
                # an aarch64 host (uname -m, dnf --forcearch) whose NVIDIA repository is the sbsa folder's
                "REALDNF_ARCH": self.arch, "REALDNF_CUDA_SBSA_REPO": str(self.cuda) if self.arch else ""}

    def run(self, script: Script) -> Run:
        out = subprocess.run(["bash", "-c", script.text], capture_output=True, text=True, env=self.env(), timeout=120)
        lines = [line for line in out.stdout.splitlines() if line.startswith("GPUPROV_RESULT=")]
        return Run(script.name, out.returncode, lines[-1].split("=", 1)[1] if lines else None, out.stderr)

    def run_all(self, scripts: list[Script]) -> list[Run]:
        runs = []
        for s in scripts:
            runs.append(self.run(s))
            if runs[-1].result == "reboot":
                (self.root.parent / "module-loaded").touch()  # what the reboot does: the new module loads
            if runs[-1].returncode != 0:
                break
        return runs

    def installed(self) -> dict[str, str]:
        out = subprocess.run(["rpm", "--root", str(self.root), "-qa", "--qf", "%{NAME} %{VERSION}\n"],
                             capture_output=True, text=True, check=True).stdout
        return dict(line.split() for line in out.splitlines())

    def calls(self) -> list[str]:
        log = self.root.parent / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def transactions(self) -> int:
        out = subprocess.run(["rpm", "--root", str(self.root), "-qa", "--qf", "%{INSTALLTID}\n"],
                             capture_output=True, text=True, check=True).stdout
        return len(set(out.split()))


def _plan_scripts(toolkit_package: str | None = None) -> list[Script]:
    plan = make_plan(NodeRequest(gpu="H100:8", os="amzn-2023", playbook="cuda-dev", docker=True,
                                 pins=StackPins(cuda="13.0", torch_cuda="cu130")))
    assert plan.stack and plan.stack.driver_stream == "nvidia-driver:595-open" and plan.stack.fabric_manager == "required"
    stack = plan.stack if toolkit_package is None else plan.stack.model_copy(
        update={"cuda_toolkit_package": toolkit_package})
    steps = tuple(s for s in plan.steps if s.name in STEPS)
    bundle: Bundle = render_steps(steps, {"plan": plan, "stack": stack, "playbook": plan.playbook,
                                          "env": plan.playbook.env}, {})
    return list(bundle.scripts)


@dataclass
class Story:
    refused: list[Run]
    refused_installed: dict[str, str]
    first: list[Run]
    installed: dict[str, str]
    transactions: int
    locks: str
    second: list[Run]
    installed_after: dict[str, str]
    transactions_after: int
    daemon_json: str  # /etc/docker/daemon.json after the first run
    restarts: tuple[int, int]  # `systemctl restart docker` calls after the first run, after the second
    mirrored: Mirrored


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[Path, Path, Path, Path]]:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        skip_or_fail(f"the real-dnf test needs {', '.join(missing)} (tools/sysdeps.sh installs them)")
    where = tmp_path_factory.mktemp("realdnf")
    return where, repo.build(where / "repos")


@pytest.fixture(scope="module")
def story(repos: tuple[Path, tuple[Path, Path, Path, Path]]) -> Story:
    where, (cuda, distro, ctk, _) = repos
    refusing = Host(where / "refused", cuda, distro, ctk)
    refused = refusing.run_all(_plan_scripts("cuda-toolkit-12-7"))  # there was no CUDA 12.7
    host = Host(where / "host", cuda, distro, ctk)
    scripts = _plan_scripts()
    first = host.run_all(scripts)
    installed, transactions = host.installed(), host.transactions()
    locks = (host.root / "etc/dnf/plugins/versionlock.list").read_text() if (
        host.root / "etc/dnf/plugins/versionlock.list").exists() else ""
    daemon_json = (host.root / "etc/docker/daemon.json").read_text()
    restarts = host.calls().count("systemctl restart docker")
    second = host.run_all(scripts)
    after = host.installed(), host.transactions()
    return Story(refused, refusing.installed(), first, installed, transactions, locks, second, *after,
                 daemon_json, (restarts, host.calls().count("systemctl restart docker")),
                 _through_a_mirror(host, cuda, where / "mirror"))


@dataclass
class Mirrored:
    runs: list[Run]  # the driver and toolkit steps
    repo_file: str
    kept_key: bool
    requests: list[str]
    toolkit: str | None  # the version installed from the mirror
    other_key: Run


def _through_a_mirror(host: Host, cuda: Path, where: Path) -> Mirrored:
    """The driver and toolkit steps again on the installed host, NVIDIA's repository file and the toolkit gone, with
    `nvidia` at a mirror on this machine serving the same repository, its `.repo` file as NVIDIA's names its own host
    and key; then at a mirror that serves another key. A test key stands for NVIDIA's pinned one. The imitation's
    packages are unsigned (gpgcheck=0 in its file), so dnf's own signature check is test_real_apt's part (apt's
    InRelease); here the key check and where dnf reads from."""
    origin = "https://developer.download.nvidia.com/compute/cuda/repos/amzn2023/x86_64"
    keys = {name: mirror.new_key(where / f"{name}-key", name) for name in ("nvidia", "own")}
    for name in keys:
        site = where / f"site-{name}" / "nvidia/amzn2023/x86_64"
        site.parent.mkdir(parents=True)
        site.symlink_to(cuda, target_is_directory=True)
    pins = {**sources.pinned_keys(), "nvidia": (keys["nvidia"].fingerprint,)}

    def planned(base: str) -> dict[str, Script]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sources, "pinned_keys", lambda: pins)
            plan = make_plan(NodeRequest(gpu="H100:8", os="amzn-2023", playbook="cuda-dev",
                                         pins=StackPins(cuda="13.0", torch_cuda="cu130"),
                                         sources=sources.Sources(nvidia=f"{base}/nvidia")))
            return {s.name: s for s in plan.bundle().scripts}

    def serve(name: str) -> Any:
        # NVIDIA's repository file and key at the mirror (the imitation's folder is shared, so written per run)
        (cuda / "cuda-amzn2023.repo").write_text(
            f"[cuda-amzn2023-x86_64]\nname=cuda-amzn2023-x86_64\nbaseurl={origin}\nenabled=1\ngpgcheck=0\n"
            f"gpgkey={origin}/D42D0685.pub\n")
        (cuda / "D42D0685.pub").write_bytes(keys[name].export())
        return indexsite.serve(where / f"site-{name}")

    start = time.monotonic()
    repo_file = host.root / "etc/yum.repos.d/cuda-amzn2023.repo"
    repo_file.unlink()
    subprocess.run(["rpm", "--root", str(host.root), "-e", "cuda-toolkit-13-0"], check=True, capture_output=True)
    with serve("nvidia") as (base, requests):
        steps = planned(base)
        runs = host.run_all([steps["nvidia-driver"], steps["cuda-toolkit"]])
    text = repo_file.read_text()
    kept = (host.root / "etc/pki/rpm-gpg/gpuprov-D42D0685.pub").exists()
    repo_file.unlink()
    with serve("own") as (base, _):
        other = host.run(planned(base)["nvidia-driver"])
    for name in ("cuda-amzn2023.repo", "D42D0685.pub"):
        (cuda / name).unlink()
    print(f"\nreal-dnf through the mirrors: {time.monotonic() - start:.1f}s")
    return Mirrored(runs, text, kept, [path for path, _ in requests], host.installed().get("cuda-toolkit-13-0"), other)


@pytest.mark.heavy  # dnf, rpm and createrepo_c (system packages)
def test_a_package_nvidia_does_not_ship_is_refused_before_anything_is_installed(story: Story) -> None:
    driver = story.refused[-1]
    assert driver.name == "nvidia-driver" and driver.returncode == 1, story.refused
    assert "FAILED: the dnf repositories for amzn-2023 (NVIDIA's amzn2023 repository) have no cuda-toolkit-12-7 " \
           "(there: cuda-toolkit-12-8 cuda-toolkit-12-9 cuda-toolkit-13-0); none of the plan's packages was " \
           "installed" in driver.last
    assert not [p for p in story.refused_installed if p.startswith(("nvidia", "kmod-nvidia", "cuda"))]


@pytest.mark.heavy  # dnf, rpm and createrepo_c (system packages)
def test_a_fresh_install_takes_the_planned_branch_through_its_module_stream(story: Story) -> None:
    assert [(r.name, r.returncode, r.result) for r in story.first] == [
        ("kernel-headers", 0, "changed"), ("nouveau-off", 0, "changed"), ("nvidia-driver", 0, "reboot"),
        ("fabric-manager", 0, "changed"), ("cuda-toolkit", 0, "changed"), ("docker", 0, "changed")], \
        [r.stderr for r in story.first]
    version, _ = repo.KERNEL.rsplit(".", 1)[0].split("-", 1)
    assert story.installed["kernel-devel"] == version and story.installed["kernel-headers"] == version
    # the repository also has R610 (stream 610-open): the stream holds the driver on R595
    assert story.installed["nvidia-open"] == repo.BRANCHES["595"] == story.installed["kmod-nvidia-open-dkms"]
    assert story.installed["dkms"] == "3.0.13"  # from the distribution's repository, no EPEL on Amazon Linux
    assert story.installed["nvidia-fabricmanager"] == repo.BRANCHES["595"]  # the driver's exact version
    assert f"nvidia-fabricmanager-0:{repo.BRANCHES['595']}-" in story.locks
    assert story.installed["cuda-toolkit-13-0"] == "13.0.0"
    assert "nvidia-open" in story.first[2].last and "stream nvidia-driver:595-open" in story.first[2].last
    # Docker: Amazon Linux's own engine, NVIDIA's toolkit from its dnf repository, the runtime in daemon.json, the
    # daemon restarted once for it (and not again by the rerun: test_a_rerun_changes_nothing)
    assert story.installed["docker"] == "25.0.8" and "docker-ce" not in story.installed
    assert story.installed["nvidia-container-toolkit"] == repo.CTK == story.installed["libnvidia-container1"]
    assert json.loads(story.daemon_json)["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert story.restarts[0] == 1


@pytest.mark.heavy  # dnf, rpm and createrepo_c (system packages)
def test_a_rerun_changes_nothing(story: Story) -> None:
    assert [(r.name, r.result) for r in story.second] == [(n, "unchanged") for n in STEPS], \
        [r.stderr for r in story.second]
    assert story.installed_after == story.installed and story.transactions_after == story.transactions
    assert story.restarts == (1, 1)


EL10_STEPS = ("kernel-headers", "nouveau-off", "nvidia-driver", "fabric-manager")


@pytest.mark.heavy  # dnf, rpm and createrepo_c (system packages)
def test_el10_holds_the_branch_with_versionlock_before_the_install(repos) -> None:
    """Rocky 10 (no modularity): NVIDIA's Table 5 for EL10, `dnf versionlock *nvidia*595*` then `dnf install
    nvidia-open`, against the same packages without module metadata (NVIDIA's rhel10 repository): EPEL enabled through
    CodeReady Builder first (DKMS), R595 installed though R610 is there, Fabric Manager at its version; a rerun changes
    nothing."""
    where, (_, distro, ctk, cuda10) = repos
    plan = make_plan(NodeRequest(gpu="H100:8", os="rocky-10"))
    assert plan.stack and plan.stack.driver_versionlock == "*nvidia*595*" and plan.stack.driver_stream is None
    scripts = list(render_steps(tuple(s for s in plan.steps if s.name in EL10_STEPS),
                                {"plan": plan, "stack": plan.stack, "playbook": plan.playbook, "env": plan.playbook.env},
                                {}).scripts)
    host = Host(where / "el10", cuda10, distro, ctk, release="10")
    first = host.run_all(scripts)
    assert [(r.name, r.returncode, r.result) for r in first] == [
        ("kernel-headers", 0, "changed"), ("nouveau-off", 0, "changed"), ("nvidia-driver", 0, "reboot"),
        ("fabric-manager", 0, "changed")], [r.stderr for r in first]
    installed = host.installed()
    assert installed["nvidia-open"] == repo.BRANCHES["595"] == installed["nvidia-fabricmanager"]
    assert "epel-release" in installed and "dkms" in installed
    locks = (host.root / "etc/dnf/plugins/versionlock.list").read_text()
    assert f"nvidia-open-3:{repo.BRANCHES['595']}-" in locks and repo.BRANCHES["610"] not in locks
    again = host.run_all(scripts)
    assert [(r.name, r.result) for r in again] == [(n, "unchanged") for n in EL10_STEPS], [r.stderr for r in again]
    assert host.installed() == installed


B200_STEPS = ("kernel-headers", "nouveau-off", "nvidia-driver", "fabric-manager")


@pytest.mark.heavy  # dnf, rpm and createrepo_c (system packages)
@pytest.mark.parametrize(("os_name", "kernel", "devel", "extra"), [
    # Amazon Linux 2023's 6.12 kernel: namespaced packages, no kernel-devel-$(uname -r) to match
    ("amzn-2023", repo.KERNEL612, "kernel6.12-devel", "kernel6.12-modules-extra"),
    # EL (and Amazon Linux's 6.1 kernel): the plain names
    ("rocky-10", repo.KERNEL, "kernel-devel", "kernel-modules-extra")])
def test_b200_takes_the_running_kernels_devel_and_modules_extra_packages(repos, os_name: str, kernel: str, devel: str,
                                                                         extra: str) -> None:
    """HGX B200 on a dnf host: the headers step installs the devel package dnf has for the running kernel (on Amazon
    Linux's 6.12 kernel kernel6.12-devel, as `kernel-devel-$(uname -r)` answers "No match" there), and the fabric step
    installs the running kernel's modules-extra package (which holds ib_umad and mlx5_ib: the modprobe stand-in
    loads them only once it is installed) before loading them, with nvlsm and infiniband-diags; a rerun changes
    nothing."""
    where, (cuda, distro, ctk, cuda10) = repos
    plan = make_plan(NodeRequest(gpu="B200:8", os=os_name))
    assert plan.stack and plan.stack.nvlsm and plan.stack.fabric_modules_package == "kernel-modules-extra-$(uname -r)"
    scripts = list(render_steps(tuple(s for s in plan.steps if s.name in B200_STEPS),
                                {"plan": plan, "stack": plan.stack, "playbook": plan.playbook, "env": plan.playbook.env},
                                {}).scripts)
    host = Host(where / f"b200-{os_name}", cuda if os_name == "amzn-2023" else cuda10, distro, ctk,
                release="2023" if os_name == "amzn-2023" else "10", kernel=kernel)
    first = host.run_all(scripts)
    assert [(r.name, r.returncode, r.result) for r in first] == [
        ("kernel-headers", 0, "changed"), ("nouveau-off", 0, "changed"), ("nvidia-driver", 0, "reboot"),
        ("fabric-manager", 0, "changed")], [r.stderr for r in first]
    installed = host.installed()
    version = kernel.split("-", 1)[0]
    assert installed[devel] == version and installed[extra] == version
    assert {p for p in installed if p.endswith(("-devel", "-modules-extra"))} == {devel, extra}  # not the 6.1 kernel's
    assert {"nvlsm", "infiniband-diags"} <= set(installed)
    calls = host.calls()
    installs = [i for i, c in enumerate(calls) if c.startswith("dnf") and " install " in c and extra in c]
    assert installs and installs[0] < calls.index("modprobe ib_umad") < calls.index("modprobe mlx5_ib"), calls
    conf = (host.root / "etc/modules-load.d/gpuprov-nvswitch.conf").read_text()
    assert "ib_umad" in conf and "mlx5_ib" in conf
    again = host.run_all(scripts)
    assert [(r.name, r.result) for r in again] == [(n, "unchanged") for n in B200_STEPS], [r.stderr for r in again]
    assert host.installed() == installed


ARM_STEPS = ("nvidia-driver", "cuda-toolkit")


@pytest.mark.heavy  # dnf, rpm and createrepo_c (system packages)
def test_an_aarch64_host_takes_the_branch_from_the_sbsa_repository(repos) -> None:
    """GB200 trays on Amazon Linux 2023 (aarch64): the driver step adds NVIDIA's amzn2023/sbsa repository (not the
    x86_64 one), and dnf, resolving as an aarch64 host (--forcearch), installs the aarch64 packages of the R595 stream
    though R610's are there too, and the toolkit; a rerun changes nothing."""
    where, (_, distro, ctk, _) = repos
    sbsa = repo.build_sbsa(where / "repos")
    plan = make_plan(NodeRequest(gpu="GB200:4", os="amzn-2023", playbook="minimal", arch="aarch64",
                                 pins=StackPins(cuda="13.0")))
    assert plan.stack and plan.stack.repo_arch == "sbsa" and plan.stack.driver_stream == "nvidia-driver:595-open"
    scripts = list(render_steps(tuple(s for s in plan.steps if s.name in ARM_STEPS),
                                {"plan": plan, "stack": plan.stack, "playbook": plan.playbook, "env": plan.playbook.env},
                                {}).scripts)
    assert [s.name for s in scripts] == list(ARM_STEPS)
    host = Host(where / "gb200", sbsa, distro, ctk, arch="aarch64")
    first = host.run_all(scripts)
    assert [(r.name, r.returncode, r.result) for r in first] == [
        ("nvidia-driver", 0, "reboot"), ("cuda-toolkit", 0, "changed")], [r.stderr for r in first]
    assert "[cuda-amzn2023-sbsa]" in (host.root / "etc/yum.repos.d/cuda-amzn2023.repo").read_text()
    out = subprocess.run(["rpm", "--root", str(host.root), "-qa", "--qf", "%{NAME} %{ARCH} %{VERSION}\n"],
                         capture_output=True, text=True, check=True).stdout
    installed = {name: f"{arch} {version}" for name, arch, version in (line.split() for line in out.splitlines())}
    for name in ("nvidia-open", "kmod-nvidia-open-dkms", "nvidia-driver", "nvidia-driver-cuda"):
        assert installed[name] == f"aarch64 {repo.BRANCHES['595']}", installed
    assert installed["cuda-toolkit-13-0"] == "aarch64 13.0.0" and installed["dkms"] == "noarch 3.0.13"
    again = host.run_all(scripts)
    assert [(r.name, r.result) for r in again] == [(n, "unchanged") for n in ARM_STEPS], [r.stderr for r in again]


def test_stand_ins_are_bash_and_shellcheck_clean() -> None:
    checker = shutil.which("shellcheck")
    assert checker, "shellcheck is not installed"
    files = sorted(str(p) for p in STAND_INS.iterdir())
    out = subprocess.run([checker, "-S", "warning", *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


@pytest.mark.heavy  # dnf, rpm and createrepo_c (system packages)
def test_through_a_mirror_dnf_reads_the_mirror_with_the_origins_key_checked(story: Story) -> None:
    """NVIDIA's repository file from the mirror, read from the mirror (it names NVIDIA's host); the key it names
    fetched from the mirror, checked against the pinned fingerprint and kept, the file naming that copy; the toolkit
    installed from the mirror."""
    m = story.mirrored
    assert [(r.name, r.result) for r in m.runs] == [("nvidia-driver", "changed"), ("cuda-toolkit", "changed")], \
        [r.stderr for r in m.runs]
    assert "baseurl=http://127.0.0.1:" in m.repo_file and "/nvidia/amzn2023/x86_64\n" in m.repo_file
    assert "gpgkey=file:///etc/pki/rpm-gpg/gpuprov-D42D0685.pub\n" in m.repo_file and m.kept_key
    assert "developer.download.nvidia.com" not in m.repo_file
    assert "/nvidia/amzn2023/x86_64/D42D0685.pub" in m.requests
    assert "/nvidia/amzn2023/x86_64/repodata/repomd.xml" in m.requests
    assert any(p.endswith(".rpm") and "cuda-toolkit-13-0" in p for p in m.requests), m.requests
    assert m.toolkit == "13.0.0"


@pytest.mark.heavy  # dnf, rpm and createrepo_c (system packages)
def test_a_mirror_serving_another_signing_key_is_refused(story: Story) -> None:
    run = story.mirrored.other_key
    assert run.returncode == 1 and run.result is None
    assert "NVIDIA's CUDA repository (http://127.0.0.1:" in run.last and "served the signing key " in run.last, run.stderr
    assert "not the origin's" in run.last and "refused, nothing from it is installed" in run.last


@pytest.mark.heavy  # dnf, rpm, rpmsign and createrepo_c (system packages)
def test_an_offline_bundle_of_signed_packages_installs_with_gpgcheck_under_the_real_dnf(
        repos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVIDIA's dnf repositories sign each package (rpmsign; the `.repo` says gpgcheck=1 and names the key) and not
    repomd.xml: the imitation's packages signed so with a throwaway key pinned as NVIDIA's, `bundle --offline` made of
    it over HTTP, and the driver step run from the bundle's folder with no route: the real dnf imports the key the
    `.repo` names from the bundle and checks every package's signature against it; a package the bundle holds
    unsigned is refused by dnf, and nothing of the driver is installed."""
    from click.testing import CliRunner

    from gpuprov.cli import main
    from gpuprov.plan import offline
    from gpuprov.plan.plan import make_host_plan

    if shutil.which("rpmsign") is None:
        skip_or_fail("the signed offline bundle needs rpmsign (tools/sysdeps.sh installs rpm)")
    where, (cuda, distro, ctk, _) = repos
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    subprocess.run(["gpg", "--homedir", str(home), "--batch", "--passphrase", "", "--quick-gen-key",
                    "nvidia-test <nvidia@invalid>", "rsa2048", "sign", "never"], check=True, capture_output=True)
    fpr = next(line.split(":")[9] for line in subprocess.run(
        ["gpg", "--homedir", str(home), "--with-colons", "--list-keys"], check=True, capture_output=True,
        text=True).stdout.splitlines() if line.startswith("fpr:"))
    site = tmp_path / "site" / "nvidia" / "amzn2023" / "x86_64"
    site.mkdir(parents=True)
    rpms = [shutil.copy(r, site / r.name) for r in cuda.glob("**/*.rpm")]
    subprocess.run(["rpmsign", "--addsign", "--define", f"__gpg {shutil.which('gpg')}", "--define", f"_gpg_path {home}",
                    "--define", f"_gpg_name {fpr}", *map(str, rpms)], check=True, capture_output=True,
                   stdin=subprocess.DEVNULL)
    subprocess.run(["createrepo_c", "-q", str(site)], check=True)
    subprocess.run(["modifyrepo_c", "--mdtype=modules", str(where / "repos" / "modules.yaml"), str(site / "repodata")],
                   check=True, capture_output=True)
    origin = "https://developer.download.nvidia.com/compute/cuda/repos/amzn2023/x86_64"
    (site / "cuda-amzn2023.repo").write_text(f"[cuda-amzn2023-x86_64]\nname=cuda-amzn2023-x86_64\nbaseurl={origin}\n"
                                             f"enabled=1\ngpgcheck=1\ngpgkey={origin}/D42D0685.pub\n")
    (site / "D42D0685.pub").write_bytes(subprocess.run(["gpg", "--homedir", str(home), "--export", "--armor", fpr],
                                                       check=True, capture_output=True).stdout)
    pins = {**sources.pinned_keys(), "nvidia": (fpr,)}  # the throwaway key stands for NVIDIA's pinned one
    monkeypatch.setattr(sources, "pinned_keys", lambda: pins)
    with indexsite.serve(tmp_path / "site") as (base, _):
        (tmp_path / "sources.yml").write_text(f"nvidia: {base}/nvidia\n")
        made = CliRunner().invoke(main, ["bundle", "--offline", "--gpu", "H100:8", "--os", "amzn-2023", "-p", "minimal",
                                         "--sources", str(tmp_path / "sources.yml"), "-o", str(tmp_path / "bundle")])
    assert made.exit_code == 0, made.output
    plan = make_host_plan("H100:8", "minimal", "amzn-2023", StackPins())
    offline.check(plan, offline.load(tmp_path / "bundle"), "--offline")
    steps = {s.name: s for s in dataclasses.replace(
        plan, sources=offline.offline_sources(plan.sources, str(tmp_path / "bundle"))).bundle().scripts}

    host = Host(tmp_path / "host", cuda, distro, ctk)
    runs = host.run_all([steps["kernel-headers"], steps["nvidia-driver"]])
    assert [(r.name, r.returncode, r.result) for r in runs] == [("kernel-headers", 0, "changed"),
                                                                ("nvidia-driver", 0, "reboot")], runs[-1].stderr[-3000:]
    assert host.installed()["nvidia-open"] == repo.BRANCHES["595"]
    listed = (host.root / "etc/yum.repos.d/cuda-amzn2023.repo").read_text()
    assert f"baseurl=file://{tmp_path}/bundle/nvidia/amzn2023/x86_64" in listed and "gpgcheck=1" in listed
    keys = subprocess.run(["rpm", "--root", str(host.root), "-q", "gpg-pubkey"], capture_output=True, text=True).stdout
    assert f"gpg-pubkey-{fpr[-8:].lower()}" in keys  # the bundle's key, imported by dnf to check the packages

    # the same bundle with the driver's package unsigned (its sha256 in the repodata made again, as whoever made the
    # bundle could): dnf refuses it, and installs nothing of the driver
    unsigned = tmp_path / "bundle" / "nvidia" / "amzn2023" / "x86_64"
    for r in cuda.glob("**/nvidia-open-*.rpm"):
        shutil.copy(r, unsigned / r.name)
    subprocess.run(["createrepo_c", "-q", "--update", str(unsigned)], check=True)
    subprocess.run(["modifyrepo_c", "--mdtype=modules", str(where / "repos" / "modules.yaml"),
                    str(unsigned / "repodata")], check=True, capture_output=True)
    other = Host(tmp_path / "other", cuda, distro, ctk)  # with the bundle's .repo file, as the step lays it down
    (other.root / "etc/yum.repos.d/cuda-amzn2023.repo").write_text(listed)
    assert plan.stack is not None
    refused = subprocess.run(["bash", "-c", f"dnf -y -q module enable {plan.stack.driver_stream} && "
                              "dnf -y -q install nvidia-open"], capture_output=True, text=True, env=other.env())
    assert refused.returncode != 0 and "nvidia-open" not in other.installed(), other.installed()
    assert "Package nvidia-open-595.71.05-1.amzn2023.x86_64.rpm is not signed" in refused.stderr, refused.stderr[-3000:]
