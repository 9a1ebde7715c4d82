"""Under CI=true a test whose environment is missing (root, network namespaces, rsync) fails; elsewhere it skips."""

from __future__ import annotations

import pytest

from tests.conftest import skip_or_fail


def test_a_missing_environment_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run in CI"):
        skip_or_fail("the SSH test hosts need root")


def test_a_missing_environment_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        skip_or_fail("the SSH test hosts need root")


def test_under_xdist_workers_fail_instead_of_skipping_under_ci(tmp_path) -> None:
    """`make test` runs in xdist workers: CI=true reaches each of them, and a missing environment still fails."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    seen = tmp_path / "workers"
    (tmp_path / "test_needs_root.py").write_text(
        "import os\nimport pytest\nfrom tests.conftest import skip_or_fail\n\n"
        "@pytest.mark.parametrize('n', range(4))\n"
        "def test_needs_root(n):\n"
        f"    with open({str(seen)!r}, 'a') as f:\n"
        "        f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        "    skip_or_fail('the SSH test hosts need root')\n")
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                           str(tmp_path / "test_needs_root.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "4 failed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout
    assert "must run in CI, not skip" in proc.stdout, proc.stdout
    assert set(seen.read_text().split()) == {"gw0", "gw1"}  # both workers ran (and failed) such a test
