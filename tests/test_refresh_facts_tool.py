"""tools/refresh_facts.py: the shipped snapshot regenerated from the sources with the code `gpuprov facts refresh`
runs, against the local stand-in of the sources (tests/indexsite.py), on a copy of src/gpuprov/data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from gpuprov.plan.catalog import Catalog
from gpuprov.plan.stack import StackFacts
from tests import indexsite

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "refresh_facts.py"


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_tool_rewrites_the_rows_that_changed_and_prints_the_diff(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(ROOT / "src" / "gpuprov" / "data", data)
    site = indexsite.build(tmp_path / "site", newer=True)
    with indexsite.serve(site) as (base, _):
        env = {**os.environ, **indexsite.env(base)}
        first = run(env, "--only", "torch", "--only", "drivers", "--data", str(data))
        again = run(env, "--only", "torch", "--only", "drivers", "--data", str(data), "--check")
    assert first.returncode == 0, first.stderr
    diff = first.stdout.splitlines()
    assert "+++ b/data/stack.yaml" in diff
    assert '+  "2.16": {variants: [cu130, cu132], pypi_default: cu132, python: ["3.11", "3.15"], released: "2026-12-22"}' in diff
    text = (data / "stack.yaml").read_text()
    assert "# torch 2.15: PyPI, first upload 2026-10-28T15:16:25Z" in text  # a row's comment stays above it
    stack = StackFacts.model_validate(yaml.safe_load(text))  # what gpuprov reads still reads
    assert stack.torch_releases["2.16"].pypi_default == "cu132"
    assert any(row.torch == ("2.16", "2.16") and row.unverified for row in stack.wheel_archs)
    families = yaml.safe_load(text)["families"]
    assert families["torch"]["source"].startswith(f"{base}/pypi/torch/json")
    Catalog.model_validate({k: v for k, v in yaml.safe_load((data / "catalog.yaml").read_text()).items() if k != "families"})
    assert again.returncode == 0 and "the snapshot agrees with the sources read" in again.stdout, again.stdout[-2000:]


def test_the_tool_with_a_source_gone_writes_nothing_of_it_and_exits_2(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(ROOT / "src" / "gpuprov" / "data", data)
    before = (data / "stack.yaml").read_text()
    env = {**os.environ, **indexsite.env("http://127.0.0.1:9")}  # nothing listens on the discard port
    proc = run(env, "--only", "torch", "--data", str(data))
    assert proc.returncode == 2 and "torch: not read: http://127.0.0.1:9/pypi/torch/json" in proc.stderr
    assert (data / "stack.yaml").read_text() == before
