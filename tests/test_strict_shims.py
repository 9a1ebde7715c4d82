"""The apt/dpkg shims are as strict as NVIDIA's repository (tests/shims/data/nvidia-repo.tsv): every
rendered variant of the render matrix (tests/test_templates.py) runs its package steps under them,
so a package name or version NVIDIA does not ship fails a test; a step naming such a package fails
with apt's own words; a held package reads `hold ok installed`; a newer point release published
after the first run leaves the host as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.plan.plan import NodeRequest, make_plan
from gpuprov.plan.render import Bundle, render_steps
from gpuprov.plan.stack import StackPins
from tests.shimrun import ShimHost, summary
from tests.test_templates import BUNDLES

# the rendered steps run under the shims, seconds a test: `make test`, not `make test-fast` (tests/lanes.py)
pytestmark = pytest.mark.slow

APT_STEPS = ("kernel-headers", "nvidia-driver", "fabric-manager", "cuda-toolkit")

# Rendered package names NVIDIA's repository does not have, which the resolver still gets wrong: each
# must fail, and because of that name; when the resolver is fixed the test fails until the entry goes.
RESOLVER_GAPS: dict[str, str] = {}  # none left: the resolver renders only names NVIDIA ships


def _groups() -> dict[tuple[str, ...], str]:
    """One representative render-matrix key per distinct set of package steps (identical scripts run once), of the
    apt family: the dnf family's steps run under a real dnf (tests/test_real_dnf.py). The other apt OSes (Debian,
    Ubuntu 26.04) render the same steps with another repository directory, which the shims' rows do not tell apart:
    one variant each, the one with the most package steps (Fabric Manager, nvlsm); so do the aarch64 plans of each
    OS, on a host whose `uname -m` says aarch64."""
    out: dict[tuple[str, ...], str] = {}
    others: dict[str, tuple[int, str, tuple[str, ...]]] = {}
    for key, bundle in BUNDLES.items():
        stack = (bundle.manifest.get("gpuprov_plan") or {}).get("stack") or {}
        steps = tuple(s.sha256 for s in bundle.scripts if s.name in APT_STEPS)
        if stack.get("family") == "dnf" or not steps:
            continue
        # aarch64 (issue 40): the same steps with NVIDIA's sbsa folder, one variant per OS as for the other OSes
        arm = stack.get("cpu_arch") == "aarch64"
        if stack.get("os") not in (None, "ubuntu-22.04", "ubuntu-24.04") or arm:
            size = sum(len(s.text) for s in bundle.scripts if s.name in APT_STEPS)
            where = f"{stack['os']}/aarch64" if arm else stack["os"]
            if where not in others or size > others[where][0]:
                others[where] = (size, key, steps)
            continue
        if steps not in out:
            out[steps] = key
    for _, key, steps in others.values():
        out[steps] = key
    return out


VARIANTS = sorted(_groups().values())


def _gaps(bundle: Bundle) -> list[str]:
    texts = "\n".join(s.text for s in bundle.scripts if s.name in APT_STEPS)
    return [name for name in RESOLVER_GAPS if f"={name}\n" in texts]


def _run_package_steps(host: ShimHost, bundle: Bundle) -> list:
    return host.run_bundle(Bundle(tuple(s for s in bundle.scripts if s.name in APT_STEPS), bundle.manifest))


@pytest.mark.parametrize("key", VARIANTS)
def test_every_rendered_variant_installs_what_nvidia_ships(tmp_path: Path, key: str) -> None:
    bundle = BUNDLES[key]
    arch = ((bundle.manifest.get("gpuprov_plan") or {}).get("stack") or {}).get("cpu_arch") or "x86_64"
    host = ShimHost(tmp_path, gpu="H100", count=8, extra_env={"GPUPROV_SHIM_NVSWITCH": "1", "GPUPROV_SHIM_ARCH": arch})
    runs = _run_package_steps(host, bundle)
    gaps = _gaps(bundle)
    if gaps:  # a known resolver-side name: it must fail, and because of that name
        failed = runs[-1]
        assert not failed.ok and any(g in failed.stderr for g in gaps), f"{key}: fixed? drop {gaps} from RESOLVER_GAPS"
        pytest.xfail(f"{key}: {failed.last_stderr_line} -- " + "; ".join(RESOLVER_GAPS[g] for g in gaps))
    assert [r.name for r in runs] == [s.name for s in bundle.scripts if s.name in APT_STEPS], summary(runs)
    assert all(r.ok for r in runs), f"{key}:\n{summary(runs)}"
    if "nvidia-driver" in [r.name for r in runs]:  # the keyring came from the plan's architecture folder
        assert (host.state / "nvidia-repo").read_text().strip().endswith("/sbsa" if arch == "aarch64" else "/x86_64")
    again = _run_package_steps(host, bundle)
    assert {r.result for r in again} == {"unchanged"}, f"{key} (rerun):\n{summary(again)}"


def test_the_matrix_covers_both_repositories_and_the_branch_cutoffs() -> None:
    texts = "\n".join(s.text for k in VARIANTS for s in BUNDLES[k].scripts)
    assert "distro=ubuntu2204" in texts and "distro=ubuntu2404" in texts
    assert "fm=nvidia-fabricmanager\n" in texts and "pinning=nvidia-driver-pinning-" in texts


def test_a_step_naming_a_package_nvidia_does_not_ship_fails_clearly(tmp_path: Path) -> None:
    plan = make_plan(NodeRequest(gpu="A10G", pins=StackPins(cuda="12.8")))
    stack = plan.stack.model_copy(update={"cuda_toolkit_package": "cuda-toolkit-12-7"})  # there was no CUDA 12.7
    steps = tuple(s for s in plan.steps if s.name in ("nvidia-driver", "cuda-toolkit"))
    bundle = render_steps(steps, {"plan": plan, "stack": stack, "playbook": plan.playbook, "env": plan.playbook.env}, {})
    host = ShimHost(tmp_path, gpu="A100")
    runs = host.run_bundle(bundle)
    driver = runs[0]  # the driver step asks apt for every package of the plan before it installs any
    assert driver.name == "nvidia-driver" and driver.returncode == 1 and len(runs) == 1
    assert driver.last_stderr_line.endswith(
        "FAILED: the apt repositories for ubuntu-24.04 (NVIDIA's ubuntu2404 repository) have no cuda-toolkit-12-7 "
        "(there: cuda-toolkit-12-5 cuda-toolkit-12-6 cuda-toolkit-12-8 ... cuda-toolkit-13-3 cuda-toolkit-13-4 "
        "cuda-toolkit-13-5); none of the plan's packages was installed"), driver.stderr
    assert set(host.installed()) <= {"cuda-keyring"}  # the repository was set up; no driver, no pinning package
    assert not [c for c in host.calls() if c.startswith("apt-get") and " install " in f" {c} "]


def test_a_toolkit_nvidia_does_not_ship_for_24_04_fails_before_anything_is_installed(tmp_path: Path) -> None:
    """cuda-toolkit-12-4 on a 24.04 host (plan refuses it; a host plan with stale facts would not): NVIDIA's
    ubuntu2404 repository starts at 12.5 (stack.yaml repo_toolkits), so the driver step stops before the driver."""
    plan = make_plan(NodeRequest(gpu="A10G", os="ubuntu-22.04", pins=StackPins(cuda="12.4", torch="2.6",
                                                                            torch_cuda="cu124")))
    stack = plan.stack.model_copy(update={"os": "ubuntu-24.04", "repo": "ubuntu2404"})
    assert stack.cuda_toolkit_package == "cuda-toolkit-12-4"
    steps = tuple(s for s in plan.steps if s.name in ("nvidia-driver", "cuda-toolkit"))
    context = {"plan": plan, "stack": stack, "playbook": plan.playbook, "env": plan.playbook.env}
    host = ShimHost(tmp_path, gpu="A100")
    (driver,) = host.run_bundle(render_steps(steps, context, {}))
    assert driver.returncode == 1 and driver.last_stderr_line.endswith(
        "FAILED: the apt repositories for ubuntu-24.04 (NVIDIA's ubuntu2404 repository) have no cuda-toolkit-12-4 "
        "(there: cuda-toolkit-12-5 cuda-toolkit-12-6 cuda-toolkit-12-8 ... cuda-toolkit-13-3 cuda-toolkit-13-4 "
        "cuda-toolkit-13-5); none of the plan's packages was installed"), driver.stderr
    assert set(host.installed()) <= {"cuda-keyring"}
    # the toolkit step on its own (a host whose driver is already there) refuses the same way, before apt-get install
    (toolkit,) = host.run_bundle(render_steps(tuple(s for s in steps if s.name == "cuda-toolkit"), context, {}))
    assert toolkit.returncode == 1 and "have no cuda-toolkit-12-4 (there: cuda-toolkit-12-5" in toolkit.last_stderr_line
    assert not [c for c in host.calls() if c.startswith("apt-get") and " install " in f" {c} "]


def test_a_version_nvidia_does_not_ship_fails_like_apt(tmp_path: Path) -> None:
    host = ShimHost(tmp_path)
    bundle = make_plan(NodeRequest(gpu="A10G")).bundle()
    assert host.run_script(next(s for s in bundle.scripts if s.name == "nvidia-driver")).result == "reboot"
    import subprocess

    def apt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["apt-get", "-y", "install", *args], capture_output=True, text=True, env=host.env())

    bad = apt("nvidia-fabricmanager=595.1.1-1")
    assert bad.returncode == 100 and bad.stderr.strip() == "E: Version '595.1.1-1' for 'nvidia-fabricmanager' was not found"
    virtual = apt("nvidia-fabricmanager-580=580.95.05-1")
    assert virtual.returncode == 100 and "Version '580.95.05-1' for 'nvidia-fabricmanager-580' was not found" in virtual.stderr
    unknown = apt("nvidia-fabricmanager-595")
    assert unknown.returncode == 100 and unknown.stderr.strip() == "E: Unable to locate package nvidia-fabricmanager-595"


def test_held_packages_read_hold_and_a_newer_point_release_changes_nothing(tmp_path: Path) -> None:
    import subprocess

    bundle = make_plan(NodeRequest(gpu="H100:8")).bundle()
    host = ShimHost(tmp_path, gpu="H100", count=8)
    first = _run_package_steps(host, bundle)
    assert all(r.ok for r in first), summary(first)
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "nvidia-open"], capture_output=True, text=True,
                            env=host.env()).stdout
    assert status == "hold ok installed"
    installed = host.installed()
    branch = installed["nvidia-open"].split(".")[0]
    # NVIDIA publishes a newer point release of the branch
    (host.state / "nvidia-repo.extra.tsv").write_text(
        f"*\tnvidia-open\t{branch}.999.01-0ubuntu1\t-\ttest\n*\tnvidia-fabricmanager\t{branch}.999.01-1\t-\ttest\n")
    held = subprocess.run(["apt-get", "-y", "install", "nvidia-open"], capture_output=True, text=True, env=host.env())
    assert held.returncode == 100 and "E: Held packages were changed" in held.stderr  # what real apt does
    again = _run_package_steps(host, bundle)
    assert {r.result for r in again} == {"unchanged"}, summary(again)
    assert host.installed() == installed


def _lib_script(tmp_path: Path, body: str) -> Path:
    from gpuprov.plan.render import STATE_DIR, environment

    lib = environment().get_template("lib.sh.j2").render(step_name="lock-test", state_dir=STATE_DIR)
    path = tmp_path / "lock-test.sh"
    path.write_text(lib + body)
    return path


@pytest.mark.parametrize("command", [
    "dpkg -i \"$GPUPROV_SYSROOT/cuda-keyring_1.1-1_all.deb\"",
    "apt-mark hold nvidia-open",
    "apt-get -q update",
    "apt-get -q -y install build-essential",
])
def test_each_locking_call_waits_for_the_lock(tmp_path: Path, command: str) -> None:
    import subprocess
    import time

    host = ShimHost(tmp_path / "host")
    (host.sysroot / "cuda-keyring_1.1-1_all.deb").write_text("!<arch>\n")
    (host.state / "lock-until").write_text(str(int(time.time()) + 2))
    script = _lib_script(tmp_path, f"gp_locked {command} >&2\ngp_result changed\n")
    start = time.monotonic()
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=host.env(), timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "GPUPROV_RESULT=changed", proc.stderr
    assert time.monotonic() - start >= 1
    assert ("waiting for the apt/dpkg lock, held by process 4242 (unattended-upgr)" in proc.stderr
            or "waiting for the apt/dpkg lock, locked by another process with pid 4242" in proc.stderr), proc.stderr


def test_a_lock_held_past_the_timeout_fails_naming_the_holder(tmp_path: Path) -> None:
    import time

    bundle = make_plan(NodeRequest(gpu="A10G")).bundle()
    host = ShimHost(tmp_path, extra_env={"GPUPROV_APT_LOCK_TIMEOUT": "2"})
    (host.state / "lock-until").write_text(str(int(time.time()) + 600))
    run = host.run_script(next(s for s in bundle.scripts if s.name == "nvidia-driver"))
    assert run.returncode == 1 and run.result is None
    assert "FAILED: the apt/dpkg lock is still locked by another process with pid 4242 after 2s" in run.last_stderr_line


def test_the_driver_step_waits_for_unattended_upgrades(tmp_path: Path) -> None:
    import time

    bundle = make_plan(NodeRequest(gpu="A10G")).bundle()
    host = ShimHost(tmp_path)
    (host.state / "lock-until").write_text(str(int(time.time()) + 2))
    run = host.run_script(next(s for s in bundle.scripts if s.name == "nvidia-driver"))
    assert run.result == "reboot", run.stderr
    assert "waiting for the apt/dpkg lock" in run.stderr
    assert "nvidia-open" in host.held()


def test_pinning_package_and_driver_in_one_call_would_miss_the_branch(tmp_path: Path) -> None:
    """Like apt (tests/test_real_apt.py): the pin applies from the next apt run, so the driver step
    installs the pinning package and the driver in two calls."""
    import subprocess

    host = ShimHost(tmp_path / "host")
    bundle = make_plan(NodeRequest(gpu="A10G")).bundle()
    assert host.run_script(next(s for s in bundle.scripts if s.name == "nvidia-driver")).result == "reboot"
    assert host.installed()["nvidia-open"].startswith("595.")  # two calls: the branch
    one = ShimHost(tmp_path / "one")
    keyring = tmp_path / "cuda-keyring_1.1-1_all.deb"
    keyring.write_text("!<arch>\n")
    for args in (["dpkg", "-i", str(keyring)], ["apt-get", "update"],
                 ["apt-get", "-y", "install", "nvidia-driver-pinning-595", "nvidia-open"]):
        subprocess.run(args, env=one.env(), check=True, capture_output=True)
    assert not one.installed()["nvidia-open"].startswith("595.")  # one call: the newest branch
