"""The rendered driver, fabric-manager, persistence and toolkit steps with the REAL apt and dpkg,
in a debootstrapped chroot of this machine's Debian/Ubuntu release (cached: tests/realapt/chroot.py),
against a local repository shaped like NVIDIA's (tests/realapt/repo.py). Stand-ins only for what a
chroot cannot run: nvidia-smi, modprobe, modinfo, reboot, systemctl, and curl for the keyring.

What a user would notice: a plan whose toolkit the repository does not carry (cuda-toolkit-12-4 on 24.04,
where NVIDIA's repository starts at 12.5) fails in the driver step, after the repository is set up and
before anything else is installed, naming the package and what the repository has; the first run installs
the pinned branch and holds it; a rerun changes nothing and asks for no reboot; a newer point release in
the repository leaves the host as it is; a dpkg lock held by another process is waited for (and a lock
that stays held fails clearly); a package the repository lacks fails before apt-get installs anything,
naming what the repository has. Through a mirror (tests/realapt/mirror.py: the same repository signed, at a second
URL over HTTP): the keyring's key is checked against the pinned fingerprint, the list that names NVIDIA's host is read
from the mirror, and apt installs from it; a mirror whose keyring holds another key is refused, nothing of it
installed.

Needs root (chroot) and, the first time, the distribution's mirror (debootstrap). Without them it
skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuprov.plan import sources
from gpuprov.plan.plan import NodeRequest, make_plan
from gpuprov.plan.render import Script
from gpuprov.plan.stack import StackPins
from tests import indexsite
from tests.realapt import chroot, mirror, repo

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # a debootstrapped chroot: root and system packages

STAND_INS = Path(__file__).resolve().parent / "realapt" / "stand-ins"
BRANCH = "595"
FIRST, NEWER_POINT, NEWER_BRANCH = "595.71.05", "595.91.07", "610.57.04"  # gpu-driver-container versions.mk
STEPS = ("nvidia-driver", "fabric-manager", "persistence", "cuda-toolkit")
LOCKS = ("var/lib/dpkg/lock-frontend", "var/lib/dpkg/lock", "var/lib/apt/lists/lock")


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the real-apt test cannot run here: {why}")
    pytest.skip(f"the real-apt test cannot run here: {why}")


@dataclass
class Run:
    name: str
    rc: int
    result: str | None
    stderr: str
    seconds: float

    @property
    def last(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""


class Chroot:
    def __init__(self, root: Path) -> None:
        self.root = root

    def sh(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["chroot", str(self.root), "/usr/bin/env", "-i", *self._env(), "bash", "-c", command],
                              capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"{command}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def _env(self, **extra: str) -> list[str]:
        env = {"PATH": "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
               "GPUPROV_RETRY_DELAY": "0", "GPUPROV_APT_LOCK_POLL": "1", **extra}
        return [f"{k}={v}" for k, v in env.items()]

    def step(self, script: Script, net: bool = True, **env: str) -> Run:
        """Run a rendered step; `net=False`: in a network namespace of its own (no route at all)."""
        (self.root / "root" / script.filename).write_text(script.text)
        start = time.monotonic()
        proc = subprocess.run([*(() if net else ("unshare", "--net")), "chroot", str(self.root), "/usr/bin/env", "-i",
                               *self._env(**env), "bash", f"/root/{script.filename}"],
                              capture_output=True, text=True, timeout=300)
        lines = proc.stdout.splitlines()
        result = lines[-1].split("=", 1)[1] if proc.returncode == 0 and lines and lines[-1].startswith(
            "GPUPROV_RESULT=") else None
        return Run(script.name, proc.returncode, result, proc.stderr, time.monotonic() - start)

    def reboot(self) -> None:
        (self.root / "run/gpuprov-module-not-loaded").unlink(missing_ok=True)

    def version(self, pkg: str) -> str:
        return self.sh(f"dpkg-query -W -f='${{Version}}' {pkg}").stdout

    def status(self, pkg: str) -> str:
        return self.sh(f"dpkg-query -W -f='${{Status}}' {pkg}").stdout

    def held(self) -> set[str]:
        return set(self.sh("apt-mark showhold").stdout.split())

    def log(self) -> list[str]:
        path = self.root / "var/log/gpuprov-stand-ins.log"
        return path.read_text().splitlines() if path.exists() else []


def _hold_locks(root: Path, seconds: float, release: threading.Event | None = None) -> threading.Thread:
    """Hold dpkg's and apt's locks the way apt does (fcntl write locks), from this process, for `seconds` (or until
    `release` is set)."""
    ready = threading.Event()
    release = release or threading.Event()

    def hold() -> None:
        files = []
        for rel in LOCKS:
            f = (root / rel).open("a")
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            files.append(f)
        ready.set()
        release.wait(seconds)
        for f in files:
            f.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert ready.wait(10)
    return thread


def _scripts(cuda: str = "13.0") -> dict[str, Script]:
    plan = make_plan(NodeRequest(gpu="A100:8", os="ubuntu-24.04", playbook="cuda-dev",
                                 pins=StackPins(driver=BRANCH, cuda=cuda)))
    assert plan.stack.fabric_manager == "required"
    return {s.name: s for s in plan.bundle().scripts}


def _toolkit_24_04_lacks() -> Script:
    """The driver step of a 24.04 plan with cuda-toolkit-12-4, which `plan` refuses (toolkit-not-for-os): made
    from the 22.04 plan, as a plan on stale facts would be."""
    from gpuprov.plan.render import render_steps

    plan = make_plan(NodeRequest(gpu="A100:8", os="ubuntu-22.04", playbook="cuda-dev",
                                 pins=StackPins(driver=BRANCH, cuda="12.4", torch="2.6", torch_cuda="cu124")))
    assert plan.stack is not None
    stack = plan.stack.model_copy(update={"os": "ubuntu-24.04", "repo": "ubuntu2404"})
    steps = tuple(s for s in plan.steps if s.name == "nvidia-driver")
    (script,) = render_steps(steps, {"plan": plan, "stack": stack, "playbook": plan.playbook,
                                     "env": plan.playbook.env}, {}).scripts
    return script


@dataclass
class Story:
    host: Chroot
    first: list[Run]
    second: list[Run]
    newer: list[Run]
    one_call_candidate: str
    upgrade: dict[str, str]
    held_install: subprocess.CompletedProcess[str]
    lock_wait: Run
    cold_seconds: float
    no_toolkit: Run
    no_toolkit_installed: list[str]
    mirrored: Mirrored


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    if os.geteuid() != 0:
        _unavailable("it needs root (chroot)")
    if not shutil.which("dpkg-deb") or not shutil.which("dpkg-scanpackages"):
        _unavailable("dpkg-deb/dpkg-scanpackages are missing (tools/sysdeps.sh installs dpkg-dev)")
    start = time.monotonic()
    try:
        root = chroot.unpack(tmp_path_factory.mktemp("real-apt") / "root")
    except chroot.ChrootUnavailable as e:
        _unavailable(str(e))
    for tool in STAND_INS.iterdir():
        shutil.copy2(tool, root / "usr/local/bin" / tool.name)
    host = Chroot(root)
    # the 24.04 repository's toolkits start at 12.5 (stack.yaml repo_toolkits): 12.4 is not there
    repo.build(root, [repo.keyring(), *repo.driver_release(FIRST), *repo.driver_release(NEWER_BRANCH),
                      repo.toolkit("12.5", "12.5.1-1"), repo.toolkit("13.0", "13.0.2-1")])
    cold = time.monotonic() - start
    steps = _scripts()

    # a plan asking for a toolkit the repository lacks stops before the driver, on a fresh host
    no_toolkit = host.step(_toolkit_24_04_lacks())
    no_toolkit_installed = sorted(host.sh("dpkg-query -W -f='${Package}\\n' 'nvidia-*' 'cuda-*' 2>/dev/null || true",
                                          check=False).stdout.split())
    host.sh("dpkg --purge cuda-keyring")

    # Why the driver step installs the pinning package and the driver in two apt-get calls: in one,
    # the pin is not in effect yet when apt chooses the driver, and it picks the newest branch.
    host.sh(f"dpkg -i {repo.REPO_IN_CHROOT}/cuda-keyring_1.1-1_all.deb && apt-get -q update")
    one_call = host.sh(f"apt-get install -s -y nvidia-driver-pinning-{BRANCH} nvidia-open | "
                       "sed -n 's/^Inst nvidia-open (\\([^ ]*\\).*/\\1/p'").stdout.strip()
    host.sh("dpkg --purge cuda-keyring")

    # The first run, with dpkg's and apt's locks held by another process for its first seconds.
    locker = _hold_locks(root, 4)
    first = []
    for name in STEPS:
        run = host.step(steps[name])
        first.append(run)
        if run.result == "reboot":
            host.reboot()
    locker.join()
    # What the pin does that the hold does not: an upgrade keeps nvidia-open (held) either way,
    # but without the preferences file its `>=` dependencies move to the newer branch.
    (root / "tmp/no-prefs").mkdir(exist_ok=True)
    upgrade = {
        "pinned": host.sh("apt-get -s -q upgrade").stdout,
        "hold only": host.sh("apt-get -s -q -o Dir::Etc::PreferencesParts=/tmp/no-prefs "
                             "-o Dir::Etc::Preferences=/tmp/no-prefs/none upgrade").stdout,
    }
    second = [host.step(steps[name]) for name in STEPS]

    # NVIDIA publishes a newer point release of the branch.
    repo.build(root, [*repo.driver_release(NEWER_POINT)])
    host.sh("apt-get -q update")
    held_install = host.sh("apt-get -q -y install nvidia-open", check=False)
    newer = [host.step(steps[name]) for name in STEPS]

    # The toolkit again, while another process holds the locks for a while.
    host.sh("apt-get -q -y remove cuda-toolkit-13-0")
    locker = _hold_locks(root, 3)
    lock_wait = host.step(steps["cuda-toolkit"])
    locker.join()
    mirrored = _through_a_mirror(host, tmp_path_factory.mktemp("real-apt-mirror"))
    yield Story(host, first, second, newer, one_call, upgrade, held_install, lock_wait, cold, no_toolkit,
                no_toolkit_installed, mirrored)


@dataclass
class Mirrored:
    runs: list[Run]  # the driver and toolkit steps
    listed: str
    toolkit: str  # the version installed from the mirror
    requests: list[str]
    other_key: Run
    other_key_installed: str
    seconds: float


def _through_a_mirror(host: Chroot, where: Path) -> Mirrored:
    """The driver step again on the installed host, its cuda-keyring gone, with `nvidia` at a mirror on this machine
    (a second URL serving the same repository, signed as the origin is); then at a mirror whose keyring holds
    another key. The pinned fingerprint is the test key standing for NVIDIA's."""
    start = time.monotonic()
    nvidia, own = mirror.new_key(where / "nvidia-key", "nvidia"), mirror.new_key(where / "own-key", "mirror")
    mirror.give_gpg(host.root)
    repo_dir = host.root / repo.REPO_IN_CHROOT.lstrip("/")
    mirror.build(where / "site", repo_dir, signed_by=nvidia, keyring_key=nvidia)
    mirror.build(where / "site-own", repo_dir, signed_by=own, keyring_key=own)
    pins = {**sources.pinned_keys(), "nvidia": (nvidia.fingerprint,)}

    def planned(base: str) -> dict[str, Script]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sources, "pinned_keys", lambda: pins)
            plan = make_plan(NodeRequest(gpu="A100:8", os="ubuntu-24.04", playbook="cuda-dev",
                                         pins=StackPins(driver=BRANCH, cuda="13.0"),
                                         sources=sources.Sources(nvidia=f"{base}/nvidia")))
            return {s.name: s for s in plan.bundle().scripts}

    # the toolkit removed, so that apt reads the mirror's index and installs from it
    host.sh("dpkg --purge cuda-keyring && apt-get -q -y remove cuda-toolkit-13-0")
    with indexsite.serve(where / "site") as (base, requests):
        steps = planned(base)
        runs = [host.step(steps["nvidia-driver"]), host.step(steps["cuda-toolkit"])]
    listed = (host.root / "etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list").read_text()
    toolkit = host.version("cuda-toolkit-13-0")
    host.sh("dpkg --purge cuda-keyring")
    with indexsite.serve(where / "site-own") as (base, _):
        other = host.step(planned(base)["nvidia-driver"])
    other_installed = host.sh("dpkg-query -W -f='${Status}' cuda-keyring 2>/dev/null || true", check=False).stdout
    # the host as the other tests expect it: NVIDIA's repository from the chroot's folder
    host.sh(f"dpkg -i {repo.REPO_IN_CHROOT}/cuda-keyring_1.1-1_all.deb && apt-get -q update")
    return Mirrored(runs, listed, toolkit, [path for path, _ in requests], other, other_installed, time.monotonic() - start)


def _summary(runs: list[Run]) -> str:
    return "\n".join(f"{r.name}: rc={r.rc} result={r.result} {r.last}" for r in runs)


def test_a_toolkit_the_repository_lacks_stops_the_driver_step_before_anything_is_installed(story: Story) -> None:
    run = story.no_toolkit
    assert run.rc == 1 and run.result is None, run.stderr[-3000:]
    assert run.last.endswith("FAILED: the apt repositories for ubuntu-24.04 (NVIDIA's ubuntu2404 repository) have no "
                             "cuda-toolkit-12-4 (there: cuda-toolkit-12-5 cuda-toolkit-13-0); none of the plan's "
                             "packages was installed"), run.stderr[-3000:]
    assert story.no_toolkit_installed == ["cuda-keyring"]  # the repository set up; no pinning package, no driver


def test_first_run_installs_the_pinned_branch_and_holds_it(story: Story) -> None:
    assert [r.result for r in story.first] == ["reboot", "changed", "changed", "changed"], _summary(story.first)
    host = story.host
    assert host.version("nvidia-open") == f"{FIRST}-0ubuntu1"  # not the newer branch the repo also has
    assert host.version("nvidia-driver-open") == f"{FIRST}-0ubuntu1"  # the pin holds the dependencies too
    assert host.version("nvidia-fabricmanager") == f"{FIRST}-1"  # exactly the driver's version
    assert host.version("cuda-toolkit-13-0") == "13.0.2-1"
    assert {"nvidia-open", f"nvidia-driver-pinning-{BRANCH}", "nvidia-fabricmanager"} <= host.held()
    assert host.status("nvidia-open") == "hold ok installed"  # what gp_pkg_installed must accept
    assert f"Pin: version {BRANCH}.*" in (host.root / repo.PIN_FILE).read_text()
    assert "systemctl enable --now nvidia-fabricmanager" in host.log()


def test_first_run_waited_for_the_lock_held_by_another_process(story: Story) -> None:
    driver = story.first[0]
    assert "waiting for the apt/dpkg lock, held by process" in driver.stderr or \
           "waiting for the apt/dpkg lock, locked by another process" in driver.stderr, driver.stderr[-3000:]
    assert driver.seconds >= 3


def test_one_apt_call_would_pick_the_newer_branch(story: Story) -> None:
    # the reason the driver step installs the pinning package and the driver in two calls
    assert story.one_call_candidate.startswith(NEWER_BRANCH), story.one_call_candidate


def test_the_pin_keeps_the_dependencies_in_the_branch_the_hold_does_not(story: Story) -> None:
    # why `gpuprov doctor` warns about a held driver without its pinning package
    assert f"Inst nvidia-driver-open [{FIRST}-0ubuntu1] ({NEWER_BRANCH}-0ubuntu1" in story.upgrade["hold only"]
    assert "Inst nvidia-open" not in story.upgrade["hold only"]  # the hold itself works
    assert "Inst nvidia-driver-open" not in story.upgrade["pinned"], story.upgrade["pinned"]


def test_second_run_changes_nothing_and_asks_for_no_reboot(story: Story) -> None:
    assert [r.result for r in story.second] == ["unchanged"] * 4, _summary(story.second)


def test_a_newer_point_release_leaves_the_host_as_it_is(story: Story) -> None:
    # what a plain `apt-get install` of the held driver does now (the shims copy it)
    assert story.held_install.returncode == 100
    assert "E: Held packages were changed and -y was used without --allow-change-held-packages." in \
           story.held_install.stderr
    assert [r.result for r in story.newer] == ["unchanged"] * 4, _summary(story.newer)
    host = story.host
    assert host.version("nvidia-open") == f"{FIRST}-0ubuntu1"
    assert host.version("nvidia-fabricmanager") == f"{FIRST}-1"
    assert not [line for line in host.log() if line.startswith("reboot")]


def test_a_held_lock_is_waited_for(story: Story) -> None:
    run = story.lock_wait
    assert run.result == "changed", run.stderr[-3000:]
    assert "waiting for the apt/dpkg lock" in run.stderr and run.seconds >= 2.5


def test_a_lock_that_stays_held_fails_clearly(story: Story) -> None:
    host = story.host
    host.sh("apt-get -q -y remove cuda-toolkit-13-0")
    done = threading.Event()
    locker = _hold_locks(host.root, 30, done)  # held past the step's 2 s, then let go as soon as the step gave up
    run = host.step(_scripts()["cuda-toolkit"], GPUPROV_APT_LOCK_TIMEOUT="2")
    done.set()
    locker.join()
    assert run.rc == 1 and run.result is None
    assert "FAILED: the apt/dpkg lock is still held by process" in run.last and "after 2s" in run.last, run.stderr


def test_a_package_the_repository_lacks_fails_before_apt_installs_it(story: Story) -> None:
    # the toolkit step on its own (the driver already in): apt-cache policy says cuda-toolkit-12-8 has no candidate
    run = story.host.step(_scripts(cuda="12.8")["cuda-toolkit"])
    assert run.rc == 1 and run.result is None
    assert run.last.endswith("have no cuda-toolkit-12-8 (there: cuda-toolkit-12-5 cuda-toolkit-13-0); none of the "
                             "plan's packages was installed"), run.stderr[-2000:]
    assert "apt-get install" not in run.stderr


def test_through_a_mirror_the_driver_step_reads_the_mirror_and_checks_its_key(story: Story) -> None:
    """The keyring from the mirror, its key the pinned one; its list (which names NVIDIA's host) read from the mirror;
    apt checks the mirror's InRelease against that key and installs the toolkit from there."""
    assert [r.result for r in story.mirrored.runs] == ["changed", "changed"], _summary(story.mirrored.runs)
    run = story.mirrored.runs[1]
    assert story.mirrored.listed.startswith("deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                                            "http://127.0.0.1:") and "/nvidia/ubuntu2404/x86_64/ /" in story.mirrored.listed
    assert "/nvidia/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb" in story.mirrored.requests
    assert "/nvidia/ubuntu2404/x86_64/InRelease" in story.mirrored.requests, run.stderr  # apt read the mirror, signed
    assert "/nvidia/ubuntu2404/x86_64/./cuda-toolkit-13-0_13.0.2-1_amd64.deb" in story.mirrored.requests
    assert story.mirrored.toolkit == "13.0.2-1"
    assert "developer.download.nvidia.com" not in "".join(story.mirrored.requests)


def test_a_mirror_serving_another_signing_key_is_refused(story: Story) -> None:
    run = story.mirrored.other_key
    assert run.rc == 1 and run.result is None
    assert "/nvidia/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb served the signing key " in run.last, run.stderr[-2000:]
    assert "not the origin's" in run.last and "refused, nothing from it is installed" in run.last
    assert "install ok installed" not in story.mirrored.other_key_installed  # nothing of it installed


@pytest.fixture
def overlay(story: Story, tmp_path: Path) -> Iterator[Chroot]:
    """The story's chroot, copied on write (overlayfs): a test that changes it leaves the story's as it was."""
    for name in ("upper", "work", "merged"):
        (tmp_path / name).mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={story.host.root},upperdir={tmp_path}/upper,"
                    f"workdir={tmp_path}/work", str(tmp_path / "merged")], check=True, capture_output=True)
    try:
        yield Chroot(tmp_path / "merged")
    finally:
        subprocess.run(["umount", str(tmp_path / "merged")], check=False)


def test_an_offline_bundle_installs_the_driver_on_a_host_with_no_network_and_apt_still_checks_it(
        overlay: Chroot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bundle --offline against a signed imitation of NVIDIA's repository (the story's packages), then the plan's
    driver step in a network namespace of its own (no route at all), from the bundle's copy on the host: the pinned
    branch is installed and held, Fabric Manager at the driver's version is apt's candidate there, and apt checks
    the copied signed index against the keyring's key, so a package changed in the bundle is refused."""
    import dataclasses

    from click.testing import CliRunner

    from gpuprov.cli import main
    from gpuprov.plan import offline, sources
    from gpuprov.plan.plan import make_host_plan
    from tests import offlinerepo

    host = overlay
    host.sh("dpkg --purge nvidia-open nvidia-driver-open nvidia-kernel-open libnvidia-compute nvidia-fabricmanager "
            f"nvidia-driver-pinning-{BRANCH} cuda-keyring && rm -f /run/gpuprov-module-not-loaded")
    signer = offlinerepo.Signer.make(tmp_path / "gnupg")
    keys = {**sources.pinned_keys(), "nvidia": (*sources.pinned_keys()["nvidia"], signer.fingerprint)}
    monkeypatch.setattr(sources, "pinned_keys", lambda: keys)
    built = host.root / repo.REPO_IN_CHROOT.lstrip("/")
    debs = [offlinerepo.Deb("cuda-keyring", "1.1-1", offlinerepo.keyring_deb(signer.public), arch="all")] + [
        offlinerepo.Deb(d.name, d.version, (built / f"{d.name}_{d.version}_{d.arch}.deb").read_bytes(),
                        depends=d.depends, arch=d.arch, provides=d.provides)
        for d in [*repo.driver_release(FIRST), *repo.driver_release(NEWER_BRANCH)]]
    offlinerepo.write(tmp_path / "site" / "repos" / offlinerepo.REPO, debs, signer)
    with offlinerepo.served(tmp_path / "site") as base:
        (tmp_path / "sources.yml").write_text(f"nvidia: {base}/repos\n")
        made = CliRunner().invoke(main, ["bundle", "--offline", "--gpu", "A100:8", "--os", "ubuntu-24.04", "-p",
                                         "minimal", "--driver", BRANCH, "--sources", str(tmp_path / "sources.yml"),
                                         "-o", str(tmp_path / "bundle")])
    assert made.exit_code == 0, made.output
    on_host = host.root / offline.OFFLINE_DIR.lstrip("/")
    shutil.copytree(tmp_path / "bundle", on_host)
    plan = make_host_plan("A100:8", "minimal", "ubuntu-24.04", StackPins(driver=BRANCH))
    offline.check(plan, offline.load(tmp_path / "bundle"), "--offline")
    driver = next(s for s in dataclasses.replace(plan, sources=offline.offline_sources(plan.sources)).bundle().scripts
                  if s.name == "nvidia-driver")

    run = host.step(driver, net=False)
    assert run.result == "reboot", run.stderr[-3000:]
    assert host.version("nvidia-open") == f"{FIRST}-0ubuntu1"  # the branch's, not the newer one the index lists
    assert {"nvidia-open", f"nvidia-driver-pinning-{BRANCH}"} <= host.held()
    listed = (host.root / "etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list").read_text()
    assert f"file://{offline.OFFLINE_DIR}/nvidia/{offlinerepo.REPO}/" in listed and "signed-by=" in listed
    assert f"Candidate: {FIRST}-1" in host.sh("apt-cache policy nvidia-fabricmanager").stdout

    library = on_host / "nvidia" / offlinerepo.REPO / f"libnvidia-compute_{FIRST}-0ubuntu1_amd64.deb"
    library.write_bytes(library.read_bytes() + b"changed")
    changed = host.sh("unshare --net apt-get -q -y install --reinstall libnvidia-compute", check=False)
    assert changed.returncode != 0 and "Hash Sum mismatch" in changed.stdout + changed.stderr, changed


@dataclass
class ArmStory:
    host: Chroot
    other_cpu: Run
    first: list[Run]
    second: list[Run]
    fetched: list[str]
    installed: dict[str, str]
    lists: list[str]
    seconds: float


SBSA = "ubuntu2404/sbsa"


@pytest.fixture(scope="module")
def arm(story: Story) -> ArmStory:
    """The same chroot, after the x86 story, made a fresh aarch64 host (a GH200 box on Ubuntu 24.04): the x86 story's
    NVIDIA packages purged, apt and dpkg made arm64, and an imitation of NVIDIA's ubuntu2404/sbsa repository with arm64
    packages beside the x86 one (the newer branch there too)."""
    start = time.monotonic()
    host = story.host
    host.sh("held=\"$(apt-mark showhold)\"; [ -z \"$held\" ] || apt-mark unhold $held >/dev/null; "
            "dpkg --purge $(dpkg-query -W -f='${Package}\\n' 'nvidia-*' 'libnvidia-*' 'cuda-*') >/dev/null; "
            "rm -rf /etc/systemd/system/nvidia-persistenced.service.d /run/gpuprov-module-not-loaded")
    chroot.as_arm64(host.root)
    repo.build(host.root, [repo.keyring(SBSA), *repo.driver_release(FIRST, arch="arm64"),
                           *repo.driver_release(NEWER_BRANCH, arch="arm64"), repo.toolkit("13.0", "13.0.2-1", "arm64")],
               folder=SBSA)
    plan = make_plan(NodeRequest(gpu="GH200:1", os="ubuntu-24.04", playbook="cuda-dev", arch="aarch64",
                                 pins=StackPins(driver=BRANCH, cuda="13.0")))
    assert plan.stack and plan.stack.repo_arch == "sbsa"
    steps = {s.name: s for s in plan.bundle().scripts}
    logged = len(host.log())
    other_cpu = host.step(steps["nvidia-driver"])  # uname -m says x86_64: the plan is not for this host
    first = []
    for name in STEPS:
        run = host.step(steps[name], GPUPROV_TEST_MACHINE="aarch64")
        first.append(run)
        if run.result == "reboot":
            host.reboot()
    listed = host.sh("dpkg-query -W -f='${db:Status-Status} ${Package} ${Architecture} ${Version}\\n' "
                     "'nvidia-*' 'libnvidia-*' 'cuda-*'").stdout.split("\n")
    installed = {f[1]: f"{f[2]} {f[3]}" for f in (line.split() for line in listed) if f and f[0] == "installed"}
    second = [host.step(steps[name], GPUPROV_TEST_MACHINE="aarch64") for name in STEPS]
    return ArmStory(host, other_cpu, first, second, [line for line in host.log()[logged:] if line.startswith("curl")],
                    installed, sorted(p.name for p in (host.root / "etc/apt/sources.list.d").iterdir()),
                    time.monotonic() - start)


def test_an_aarch64_plan_stops_on_an_x86_64_host_before_anything(arm: ArmStory) -> None:
    run = arm.other_cpu
    assert run.rc == 1 and run.last.endswith(
        "FAILED: this plan is for aarch64 hosts and this one is x86_64: plan it with --arch x86_64"), run.stderr[-2000:]


def test_an_aarch64_host_takes_the_pinned_branch_from_the_sbsa_repository(arm: ArmStory) -> None:
    assert [r.result for r in arm.first] == ["reboot", "unchanged", "changed", "changed"], _summary(arm.first)
    assert arm.fetched == [f"curl https://developer.download.nvidia.com/compute/cuda/repos/{SBSA}/"
                           "cuda-keyring_1.1-1_all.deb"]
    assert arm.lists == ["cuda-ubuntu2404-sbsa.list"]
    # arm64 packages, resolved within arm64, at the pinned branch though the sbsa repository has a newer one
    assert arm.installed["nvidia-open"] == f"arm64 {FIRST}-0ubuntu1"
    assert arm.installed["nvidia-driver-open"] == arm.installed["libnvidia-compute"] == f"arm64 {FIRST}-0ubuntu1"
    assert arm.installed["cuda-toolkit-13-0"] == "arm64 13.0.2-1"
    assert arm.installed[f"nvidia-driver-pinning-{BRANCH}"] == f"all {FIRST}-0ubuntu1"
    assert "nvidia-fabricmanager" not in arm.installed  # one GH200: no NVSwitch, no Fabric Manager
    assert {"nvidia-open", f"nvidia-driver-pinning-{BRANCH}"} <= arm.host.held()


def test_an_aarch64_rerun_changes_nothing(arm: ArmStory) -> None:
    assert [r.result for r in arm.second] == ["unchanged"] * 4, _summary(arm.second)


def test_report_times(story: Story) -> None:
    print(f"\nreal-apt chroot ready in {story.cold_seconds:.1f}s; first run "
          f"{sum(r.seconds for r in story.first):.1f}s, second {sum(r.seconds for r in story.second):.1f}s; "
          f"through the mirrors {story.mirrored.seconds:.1f}s")


def test_stand_ins_are_bash_and_shellcheck_clean() -> None:
    import sys

    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck
    tools = sorted(STAND_INS.iterdir())
    assert {t.name for t in tools} == {"curl", "modinfo", "modprobe", "nvidia-smi", "reboot", "systemctl", "uname"}
    for tool in tools:
        assert os.access(tool, os.X_OK) and tool.read_text().startswith("#!/usr/bin/env bash\n"), tool
    proc = subprocess.run([shellcheck, "-S", "warning", *map(str, tools)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[:3000]
