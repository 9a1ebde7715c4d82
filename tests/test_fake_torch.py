"""The fake torch can fail the way the real one does: its arch list is the resolver's own data per release and
variant (tests/shims/data/wheel-archs.tsv, generated from stack.yaml), and a GPU outside it fails its first kernel
with "no kernel image is available"; `check`'s judgement then names the wheel that fits, not a GPU reset."""

from __future__ import annotations

import json
import subprocess

import pytest

from gpuprov.hosts.bootstrap import expectation
from gpuprov.hosts.verify import extract_probe, judge, parse_probe
from gpuprov.plan import compat, stack
from gpuprov.plan.plan import make_host_plan
from gpuprov.plan.stack import StackPins
from tests.shimdata import WHEEL_ARCHS, wheel_archs_tsv
from tests.shimrun import LOCAL_PYTHON, SHIMS, ShimHost, summary

PINS = StackPins(python=LOCAL_PYTHON)
# uv builds an env and installs the fake torch, seconds a test: `make test`, not `make test-fast` (tests/lanes.py)
pytestmark = pytest.mark.slow

UV = str(SHIMS / "libexec" / "uv")
WHEELS = [(r, v) for r, info in stack.facts().torch_releases.items() for v in info.variants]


def test_the_shims_copy_of_the_wheel_archs_is_the_resolvers() -> None:
    assert WHEEL_ARCHS.read_text() == wheel_archs_tsv(), "stale: run `python -m tests.shimdata`"


@pytest.fixture(scope="module")
def env_python(tmp_path_factory: pytest.TempPathFactory) -> tuple[ShimHost, str]:
    host = ShimHost(tmp_path_factory.mktemp("fake-torch"), gpu="T4")
    (host.state / "installed").write_text("nvidia-open 595.91.07-0ubuntu1\n")  # a loaded driver: CUDA is available
    env = host.root / "env"
    subprocess.run([UV, "venv", "--python", LOCAL_PYTHON, str(env)],
                   env=host.env(), check=True, capture_output=True)
    return host, str(env / "bin" / "python")


def _install(host: ShimHost, python: str, release: str, variant: str) -> None:
    index = f"{stack.facts().pytorch_index}/{variant}"
    subprocess.run([UV, "pip", "install", "--python", python, f"torch=={release}.*", "--index-url", index],
                   env=host.env(), check=True, capture_output=True)


@pytest.mark.parametrize(("release", "variant"), WHEELS, ids=[f"{r}+{v}" for r, v in WHEELS])
def test_the_arch_list_is_the_resolvers_for_each_release_and_variant(env_python, release, variant) -> None:
    host, python = env_python
    _install(host, python, release, variant)
    out = subprocess.run([python, "-c", "import json, torch; print(json.dumps([torch.__version__, "
                          "torch.cuda.get_arch_list()]))"], env=host.env(), capture_output=True, text=True, check=True)
    version, archs = json.loads(out.stdout)
    data = stack.wheel_archs(release, variant)
    assert version == f"{release}.0+{variant}"
    assert archs == (["sm_" + s.replace(".", "") for s in data.sm] if data else [])


def _verify(host: ShimHost, plan) -> dict:
    (step,) = [s for s in plan.bundle().scripts if s.kind == "verify"]
    run = host.run_script(step)
    report = parse_probe("b200", extract_probe(run.stdout))
    return judge(report, expectation(plan, 1)).model_dump(mode="json")


def test_a_gpu_outside_the_wheels_arch_list_fails_the_matmul_and_check_names_the_wheel(tmp_path) -> None:
    plan = make_host_plan("B200", "pytorch", "ubuntu-24.04", PINS, nvswitch=False)
    host = ShimHost(tmp_path / "host", gpu="B200")
    runs = host.run_bundle(plan.bundle())
    assert all(r.ok for r in runs), summary(runs)  # the planned wheel (cu132) carries sm_100
    planned = plan.stack.torch.variant
    assert planned in compat.variants_with_sass("2.14", "10.0")

    # someone installs the cu126 build of the same release, which stops at sm_90
    python = str(host.sysroot / "opt/gpuprov/env/bin/python")
    _install(host, python, "2.14", "cu126")
    report = _verify(host, plan)
    (matmul,) = [c for c in report["checks"] if c["name"] == "matmul gpu0"]
    assert not matmul["ok"] and "no kernel image is available" in matmul["detail"]
    assert f"--torch-cuda {stack.facts().torch_releases['2.14'].pypi_default}" in matmul["fix"]
    assert "sm_100" in matmul["fix"] and "reset" not in matmul["fix"]
    assert report["torch"]["is_available"] is True  # CUDA itself initialises; only kernels fail


@pytest.fixture(scope="module")
def t4(tmp_path_factory: pytest.TempPathFactory):
    plan = make_host_plan("T4", "pytorch", "ubuntu-24.04", PINS, nvswitch=False)
    host = ShimHost(tmp_path_factory.mktemp("t4"), gpu="T4")
    runs = host.run_bundle(plan.bundle())
    assert all(r.ok for r in runs), summary(runs)
    return plan, host


@pytest.mark.parametrize(("setting", "shown"), [("22105", "2.21.5"), ("2.19.3", "2.19.3"), ("21803", "2.18.3")])
def test_the_nccl_version_is_read_from_what_torch_returns(t4, setting, shown) -> None:
    plan, host = t4
    host.extra_env["GPUPROV_SHIM_NCCL"] = setting  # an int (older builds) or a tuple (torch 2.x)
    try:
        report = _verify(host, plan)
    finally:
        del host.extra_env["GPUPROV_SHIM_NCCL"]
    assert report["torch"]["nccl"] == shown
    assert f"NCCL {shown}" in next(c["detail"] for c in report["checks"] if c["name"] == "torch")


def test_a_gpu_inside_the_arch_list_runs_the_same_wheel(t4) -> None:
    plan, host = t4
    _install(host, str(host.sysroot / "opt/gpuprov/env/bin/python"), "2.14", "cu126")  # sm_75 is in its list
    report = _verify(host, plan)
    assert [c["name"] for c in report["checks"] if not c["ok"] and c["severity"] == "fail"] == ["torch build"]
