"""Run the rendered scripts on a fake host (tests/shims on PATH, a temp sysroot) in plan order,
the way the bootstrap runner will: order of apt/dpkg calls, reboot after a fresh driver install,
Fabric Manager at the driver's exact version, a second run that changes nothing, and verify
failing with a clear reason when the driver or the torch build is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.plan.plan import NodeRequest, make_host_plan, make_plan
from gpuprov.plan.stack import StackPins
from tests.shimrun import LOCAL_PYTHON, ShimHost, StepRun, summary

# the rendered steps run under the shims, seconds a test: `make test`, not `make test-fast` (tests/lanes.py)
pytestmark = pytest.mark.slow

PINS = StackPins(python=LOCAL_PYTHON)  # the uv shim builds envs from the Pythons this machine has


def _index(calls: list[str], prefix: str) -> int:
    hits = [i for i, c in enumerate(calls) if c.startswith(prefix)]
    assert hits, f"no call starting with {prefix!r}"
    return hits[0]


def _installs(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("apt-get ") and " install " in f"{c} "]


def _probe(run: StepRun) -> dict:
    body = run.stdout.split("GPUPROV_PROBE_BEGIN\n", 1)[1].split("\nGPUPROV_PROBE_END", 1)[0]
    return json.loads(body)


@pytest.fixture(scope="module")
def cuda_dev(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ShimHost, list[StepRun], list[str], list[StepRun], list[str]]:
    """A100 on p4d (Fabric Manager required) with the cuda-dev playbook: first run, then a second."""
    bundle = make_plan(NodeRequest(gpu="A100", playbook="cuda-dev", pins=PINS)).bundle()
    host = ShimHost(tmp_path_factory.mktemp("cuda-dev"), gpu="A100", count=2)
    first = host.run_bundle(bundle)
    calls_first = host.calls()
    second = host.run_bundle(bundle)
    calls_second = host.calls()[len(calls_first):]
    return host, first, calls_first, second, calls_second


def test_first_run_succeeds_in_plan_order(cuda_dev) -> None:
    _, first, *_ = cuda_dev
    assert all(r.ok for r in first), summary(first)
    assert [r.name for r in first] == ["kernel-headers", "nouveau-off", "nvidia-driver", "fabric-manager",
                                       "persistence", "cuda-toolkit", "python-env", "pytorch", "packages",
                                       "nvcc-on-path", "verify"]
    results = {r.name: r.result for r in first}
    assert results["nvidia-driver"] == "reboot"
    assert all(v == "changed" for k, v in results.items() if k not in ("nvidia-driver", "verify")), summary(first)
    assert results["verify"] == "unchanged"


def test_apt_order_keyring_headers_pinning_driver(cuda_dev) -> None:
    _, _, calls, *_ = cuda_dev
    headers = _index(calls, "apt-get -o Dpkg::Options::=--force-confdef "
                            "-o Dpkg::Options::=--force-confold -q -y install linux-headers-")
    keyring = _index(calls, "dpkg -i ")
    assert "cuda-keyring_1.1-1_all.deb" in calls[keyring]
    pinning = next(i for i, c in enumerate(calls) if c in _installs(calls) and "nvidia-driver-pinning-" in c)
    driver = next(i for i, c in enumerate(calls) if c in _installs(calls) and c.endswith(" nvidia-open"))
    update_after_keyring = next(i for i, c in enumerate(calls) if i > keyring and c.endswith(" update"))
    assert headers < driver and keyring < pinning and pinning < driver
    assert keyring < update_after_keyring < pinning  # the repo's lists are fetched before its packages
    reboot = calls.index("reboot (simulated by shimrun)")
    assert driver < reboot < _index(calls, "nvidia-smi")


def test_fabric_manager_matches_the_driver_exactly_and_all_are_held(cuda_dev) -> None:
    host, _, calls, *_ = cuda_dev
    installed = host.installed()
    driver_version = installed["nvidia-open"].split("-")[0]
    assert installed["nvidia-fabricmanager"].split("-")[0] == driver_version
    # the repo also offers a newer patch (see the apt-cache shim); the exact match was chosen
    assert any(c.endswith(f"nvidia-fabricmanager={driver_version}-1") for c in _installs(calls))
    assert {"nvidia-open", "nvidia-fabricmanager"} <= host.held()
    assert any(h.startswith("nvidia-driver-pinning-") for h in host.held())
    assert "systemctl enable --now nvidia-fabricmanager" in calls
    assert "systemctl enable --now nvidia-persistenced" in calls


def test_files_written_into_the_sysroot(cuda_dev) -> None:
    host, *_ = cuda_dev
    profile = host.sysroot / "etc/profile.d/gpuprov-cuda.sh"
    assert "export PATH=/usr/local/cuda/bin:$PATH" in profile.read_text()
    assert oct(profile.stat().st_mode & 0o7777) == "0o644"
    assert "blacklist nouveau" in (host.sysroot / "etc/modprobe.d/blacklist-nouveau.conf").read_text()
    assert (host.sysroot / "usr/local/bin/uv").exists()  # installed from the (stand-in) uv release archive
    assert (host.sysroot / "opt/gpuprov/env/bin/python").exists()


def test_verify_passes_and_the_probe_json_parses(cuda_dev) -> None:
    _, first, *_ = cuda_dev
    probe = _probe(first[-1])
    assert probe["probe_version"] == 1
    assert probe["nvidia_smi"]["found"] and probe["nvidia_smi"]["returncode"] == 0
    assert "CUDA Version" in probe["nvidia_smi"]["summary"]
    rows = probe["nvidia_smi"]["query_csv"].splitlines()
    assert len(rows) == 2 and rows[0].split(", ")[1] == "NVIDIA A100-SXM4-40GB"
    t = probe["torch"]
    assert t["is_available"] and t["device_count"] == 2 and t["cuda"] == "13.2" and t["version"].endswith("+cu132")
    assert t["nccl"] == "2.27.5" and "sm_80" in t["arch_list"]
    assert [d["matmul_ok"] for d in t["devices"]] == [True, True]
    assert t["devices"][0]["capability"] == [8, 0] and t["devices"][0]["memory_mib"] == 40960


def test_second_run_changes_nothing(cuda_dev) -> None:
    _, _, _, second, calls_second = cuda_dev
    assert all(r.ok for r in second), summary(second)
    assert {r.result for r in second} == {"unchanged"}, summary(second)
    assert _installs(calls_second) == []
    assert not [c for c in calls_second if c.startswith(("dpkg -i", "apt-mark hold", "systemctl enable", "uv venv",
                                                         "uv pip install", "curl", "update-initramfs"))]


@pytest.mark.parametrize(
    ("fail", "reason"),
    [
        ("nvml-mismatch", "Failed to initialize NVML: Driver/library version mismatch"),
        ("torch-newer-cuda", "torch.cuda.is_available() is False"),
        ("no-driver", "couldn't communicate with the NVIDIA driver"),
        ("bad-matmul", "the matmul check failed on GPU 0"),
    ],
)
def test_verify_fails_with_a_clear_reason(cuda_dev, tmp_path: Path, fail: str, reason: str) -> None:
    host, *_ = cuda_dev
    broken = host.copy(tmp_path / "host", fail=fail)
    verify = make_plan(NodeRequest(gpu="A100", playbook="cuda-dev", pins=PINS)).bundle().scripts[-1]
    run = broken.run_script(verify)
    assert run.returncode == 1 and run.result is None
    assert reason in run.last_stderr_line, run.stderr
    assert "FAILED" in run.last_stderr_line and "Traceback" not in run.stderr


def test_driver_installed_but_not_rebooted_fails_verify_until_reboot(tmp_path: Path) -> None:
    bundle = make_plan(NodeRequest(gpu="T4", playbook="minimal", pins=StackPins())).bundle()
    host = ShimHost(tmp_path, gpu="T4")
    steps = {s.name: s for s in bundle.scripts}
    for name in ("kernel-headers", "nouveau-off"):
        assert host.run_script(steps[name]).ok
    assert host.run_script(steps["nvidia-driver"]).result == "reboot"
    run = host.run_script(steps["verify"])  # no reboot yet: the module is not loaded
    assert run.returncode == 1 and "couldn't communicate with the NVIDIA driver" in run.last_stderr_line
    host.reboot()
    assert host.run_script(steps["nvidia-driver"]).result == "unchanged"
    assert host.run_script(steps["persistence"]).result == "changed"
    run = host.run_script(steps["verify"])
    assert run.result == "unchanged", run.stderr
    assert _probe(run)["torch"] is None  # minimal: no env, probe ran with python3


@pytest.mark.parametrize(("nvswitch", "expect_fm"), [("1", True), ("0", False)])
def test_fabric_manager_auto_follows_lspci(tmp_path: Path, nvswitch: str, expect_fm: bool) -> None:
    bundle = make_host_plan("H100", "minimal", "ubuntu-22.04", StackPins()).bundle()
    assert "fabric-manager" in [s.name for s in bundle.scripts]
    host = ShimHost(tmp_path, gpu="H100", count=8, extra_env={"GPUPROV_SHIM_NVSWITCH": nvswitch})
    runs = host.run_bundle(bundle)
    assert all(r.ok for r in runs), summary(runs)
    fm = next(r for r in runs if r.name == "fabric-manager")
    if expect_fm:
        assert fm.result == "changed"
        assert host.installed()["nvidia-fabricmanager"].split("-")[0] == host.installed()["nvidia-open"].split("-")[0]
    else:
        assert fm.result == "unchanged" and "no NVSwitch" in fm.stderr
        assert "nvidia-fabricmanager" not in host.installed()
    assert {r.result for r in host.run_bundle(bundle)} == {"unchanged"}


def test_shims_are_executable_bash_and_shellcheck_clean() -> None:
    import os
    import shutil
    import subprocess
    import sys

    from tests.shimrun import SHIMS

    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck
    others = {"reboot", "shutdown"}  # written by the SSH-host harness
    shims = [p for p in sorted((SHIMS / "bin").iterdir()) if p.name not in others] + [
        SHIMS / "libexec" / "uv", SHIMS / "libexec" / "efa_installer.sh"]
    for p in shims:
        assert os.access(p, os.X_OK) and p.read_text().startswith("#!/usr/bin/env bash\n"), p
    proc = subprocess.run([shellcheck, "-x", "-S", "warning", *map(str, shims), str(SHIMS / "lib" / "common.sh")],
                          capture_output=True, text=True, cwd=SHIMS / "bin")
    assert proc.returncode == 0, proc.stdout[:3000]


def test_a_probe_that_crashes_fails_verify_in_one_line(cuda_dev, tmp_path: Path) -> None:
    """verify's one Python process (probe and judge together): an interpreter that dies fails the step with one
    FAILED line naming it and its exit status, after its own words; a probe that raises says what it raised."""
    host, *_ = cuda_dev
    verify = make_plan(NodeRequest(gpu="A100", playbook="cuda-dev", pins=PINS)).bundle().scripts[-1]
    broken = host.copy(tmp_path / "dead")
    python = broken.sysroot / "opt/gpuprov/env/bin/python"
    python.unlink()
    python.write_text("#!/bin/sh\necho 'Fatal Python error: init_fs_encoding' >&2\nexit 3\n")
    python.chmod(0o755)
    run = broken.run_script(verify)
    assert run.returncode == 1 and run.result is None and "GPUPROV_PROBE_BEGIN" not in run.stdout
    assert "FAILED: the probe crashed" in run.last_stderr_line and "exited 3" in run.last_stderr_line, run.stderr
    assert "Fatal Python error: init_fs_encoding" in run.stderr
    raising = host.copy(tmp_path / "raising")
    python = raising.sysroot / "opt/gpuprov/env/bin/python"
    real = python.resolve()
    python.unlink()
    # the real interpreter running verify's program ($2) with json.dumps broken: the probe raises past its guards
    python.write_text(f"#!/bin/sh\nshift\nexec {real} -c 'import json, sys; json.dumps = None; exec(sys.argv.pop(1))' "
                      '"$@"\n')
    python.chmod(0o755)
    run = raising.run_script(verify)
    assert run.returncode == 1 and "FAILED: the probe crashed: TypeError" in run.last_stderr_line, run.stderr


def test_a_playbook_command_runs_in_its_own_subshell_under_the_steps_strict_mode(tmp_path: Path) -> None:
    """A user step's `run` (a subshell of the step script now, `bash -euo pipefail -c` before): its first failing
    command, a failing pipeline or an unset variable fails the step with that status; `exit 0` ends the command,
    not the step; its variables and cd leave the step's own state alone."""
    playbook = tmp_path / "semantics.yml"
    commands = {
        "exit-early": "exit 0; echo never",
        "first-failure": "false; echo never",
        "status": "exit 3",
        "pipeline": "false | true; echo never",
        "unset": "echo \"$NOT_SET_ANYWHERE\"",
        "own-state": "GP_CHANGED=0; GP_STEP=other; cd /; echo here=\"$PWD\"",
    }
    playbook.write_text("name: semantics\nstack: none\nenv: null\nsteps:\n" + "".join(
        f"  - name: {name}\n    run: {json.dumps(run)}\n" for name, run in commands.items()))
    host = ShimHost(tmp_path / "host", gpu="T4")
    runs = {s.name: host.run_script(s) for s in make_host_plan(None, str(playbook), "ubuntu-24.04",
                                                               StackPins()).bundle().scripts}
    assert (runs["exit-early"].returncode, runs["exit-early"].result) == (0, "changed")
    assert "never" not in runs["exit-early"].stderr + runs["first-failure"].stderr + runs["pipeline"].stderr
    assert (runs["first-failure"].returncode, runs["first-failure"].result) == (1, None)
    assert (runs["status"].returncode, runs["pipeline"].returncode, runs["unset"].returncode) == (3, 1, 1)
    assert "NOT_SET_ANYWHERE: unbound variable" in runs["unset"].stderr
    own = runs["own-state"]
    assert own.result == "changed" and "here=/\n" in own.stderr and "[gpuprov own-state] changed: step done" in own.stderr
