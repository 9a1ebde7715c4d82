"""Under CI=true a test whose environment is missing (root, network namespaces, rsync) fails; elsewhere it skips.
In the fast lane (`pytest --fast`, tests/lanes.py) it fails too, and so does a test that starts what that lane has not."""

from __future__ import annotations

import pytest

from tests import lanes
from tests.conftest import skip_or_fail


def test_a_missing_environment_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(lanes.ENV, raising=False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run in CI"):
        skip_or_fail("the SSH test hosts need root")


def test_a_missing_environment_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(lanes.ENV, raising=False)
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
    env.pop(lanes.ENV, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                           str(tmp_path / "test_needs_root.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "4 failed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout
    assert "must run in CI, not skip" in proc.stdout, proc.stdout
    assert set(seen.read_text().split()) == {"gw0", "gw1"}  # both workers ran (and failed) such a test


def test_the_fast_lane_leaves_heavy_tests_out_and_fails_one_that_reaches_for_what_it_has_not(tmp_path) -> None:
    """`make test-fast`: a test asking for the moto server's fixture (through another fixture too) or marked
    `heavy` is deselected; one left in that starts sshd or the moto server, or calls skip_or_fail, fails naming
    it (a machine without them would otherwise skip it quietly); a plain one passes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "test_lane.py").write_text(
        "import subprocess, sys\nimport pytest\nfrom tests.conftest import skip_or_fail\n\n"
        "@pytest.fixture\ndef url(aws):\n    return aws\n\n"
        "def test_moto(aws):\n    pass\n\n"
        "def test_moto_through_a_fixture(url):\n    pass\n\n"
        "@pytest.mark.heavy\ndef test_marked():\n    pass\n\n"
        "def test_sshd():\n    subprocess.run(['/usr/sbin/sshd', '-t'])\n\n"
        "def test_moto_server():\n    subprocess.Popen([sys.executable, '-m', 'moto.server', '-p', '1'])\n\n"
        "def test_no_root():\n    skip_or_fail('the SSH test hosts need root')\n\n"
        "def test_plain():\n    assert subprocess.run(['true']).returncode == 0\n")
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop(lanes.ENV, None)
    env.pop("CI", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "--fast", str(tmp_path / "test_lane.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "3 failed, 1 passed, 3 deselected" in out, out
    assert "reached for sshd (/usr/sbin/sshd -t)" in out and "reached for the moto server" in out, out
    assert "reached for the SSH test hosts need root" in out, out
