"""tools/check_facts.py on recorded index excerpts (tests/fixtures/facts, provenance in its README):
it names each difference between the indexes and stack.yaml / tests/shims/data/nvidia-repo.tsv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "tests" / "fixtures" / "facts"
TOOL = ROOT / "tools" / "check_facts.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60)


def test_prints_every_difference_from_the_recorded_indexes() -> None:
    proc = run("--torch-index", str(FACTS / "torch-index.html"),
               "--nvidia-index", f"ubuntu2404/x86_64={FACTS / 'nvidia-ubuntu2404-x86_64-Packages'}")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert "torch 2.16: on the index (cu130, cu132; Python 3.12-3.12), not in stack.yaml" in lines
    assert not [line for line in lines if line.startswith(("torch 2.12", "torch 2.13", "torch 2.14", "torch 2.15"))]
    assert "ubuntu2404/x86_64: nvidia-open: in the index, not in nvidia-repo.tsv: 610.68.01-0ubuntu1" in lines
    assert ("ubuntu2404/x86_64: R615 is in stack.yaml driver_branches, the index has no nvidia-driver-pinning-615"
            in lines)
    # the data's rows the excerpt lacks are listed too (a stale fact, or a trimmed index)
    assert "ubuntu2404/x86_64: nvidia-open 595.58.03-0ubuntu1: in nvidia-repo.tsv, not in the index" not in lines
    assert "ubuntu2404/x86_64: nvidia-open 580.95.05-0ubuntu1: in nvidia-repo.tsv, not in the index" in lines
    assert not [line for line in lines if "nvidia-fabricmanager-580" in line]  # virtual on both sides
    assert not [line for line in lines if "aarch64" in line]


def test_an_unreadable_index_is_exit_2() -> None:
    proc = run("--torch-index", str(FACTS / "missing.html"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr


def test_no_index_host_is_written_in_the_tool() -> None:
    import re

    assert not re.search(r"https?://\w", TOOL.read_text())  # URLs come from arguments and the data files
