"""A built wheel carries the templates and playbooks: an installed gpuprov renders from any folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_renders_from_another_folder(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    str(ROOT), "-w", str(wheels)], check=True, capture_output=True)
    site = tmp_path / "site"
    wheel = next(wheels.glob("gpuprov-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    assert (site / "gpuprov" / "templates" / "lib.sh.j2").is_file()
    assert (site / "gpuprov" / "playbooks" / "pytorch.yml").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import gpuprov, sys; from gpuprov.cli import main; print(gpuprov.__file__, file=sys.stderr); main()"
    result = subprocess.run([sys.executable, "-c", code, "render", "--gpu", "H100", "-o", "out"],
                            cwd=elsewhere, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert str(site) in result.stderr  # the installed copy ran, not the checkout
    manifest = json.loads((elsewhere / "out" / "manifest.json").read_text())
    assert manifest["steps"][-1]["name"] == "verify"
