"""Every systemd unit and timer gpuprov renders passes `systemd-analyze verify`, the check systemd itself applies
when it loads them (unknown keys, bad timer values, Type= against ExecStart=, missing executables).

The plan (guards, persistence, jupyter) runs under the shims into a sysroot; the units it wrote are copied into a
verify root with the sysroot prefix taken out again (on a real node GPUPROV_SYSROOT is empty), next to the
machine's own systemd units (targets they refer to) and the executables the steps installed. Only executables
that are not gpuprov's to install have stand-ins (STAND_INS). Warnings count as failures: systemd only logs
most mistakes ("Unknown key ..., ignoring") and goes on without the setting.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuprov.plan.plan import NodeRequest, make_plan
from gpuprov.plan.stack import StackPins
from tests.conftest import skip_or_fail
from tests.shimrun import LOCAL_PYTHON, ShimHost, summary

SYSTEM_UNITS = Path("/usr/lib/systemd/system")
# Executables the units name that gpuprov does not install: the env's jupyter (the shims put theirs on PATH),
# NVIDIA's daemon (the driver's package) and the base system's rm (in the packaged persistenced unit).
STAND_INS = ("/opt/gpuprov/env/bin/jupyter", "/usr/bin/nvidia-persistenced", "/bin/rm")
# nvidia-persistenced.service as NVIDIA's package ships it (the drop-in gpuprov writes is verified on top of it).
PACKAGED_PERSISTENCED = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
StopWhenUnneeded=true
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
"""
EXPECTED = {"gpuprov-autostop.service", "gpuprov-autostop.timer", "gpuprov-ttl.service", "gpuprov-ttl.timer",
            "gpuprov-interrupt.service", "gpuprov-jupyter.service", "nvidia-persistenced.service"}


def _systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.geteuid() == 0:  # tools/sysdeps.sh installs systemd as root: missing here is a broken setup
            pytest.fail("systemd-analyze is missing (tools/sysdeps.sh installs the systemd package)")
        skip_or_fail("needs systemd-analyze (the systemd package; tools/sysdeps.sh installs it as root)")
    assert tool
    return tool


@pytest.fixture(scope="module")
def verify_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """A root with the units a full plan renders (every guard, persistence, jupyter) and what they run."""
    tmp = tmp_path_factory.mktemp("units")
    request = NodeRequest(gpu="T4", spot=True, playbook="jupyter", pins=StackPins(python=LOCAL_PYTHON),
                          autostop_seconds=1800, ttl_seconds=7200, on_interrupt="echo checkpoint")
    host = ShimHost(tmp / "host", gpu="T4")
    runs = host.run_bundle(make_plan(request).bundle())
    assert all(r.ok for r in runs), summary(runs)

    root = tmp / "root"
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    (root / "usr/lib/systemd/system/nvidia-persistenced.service").write_text(PACKAGED_PERSISTENCED)
    units: set[str] = set()
    rendered = host.sysroot / "etc/systemd/system"
    for path in sorted(p for p in rendered.rglob("*") if p.is_file()):
        rel = path.relative_to(rendered)
        text = path.read_text().replace(str(host.sysroot), "")  # what the step writes where GPUPROV_SYSROOT is ""
        (root / "etc/systemd/system" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "etc/systemd/system" / rel).write_text(text)
        name = rel.parts[0].removesuffix(".d") if len(rel.parts) > 1 else rel.name
        units.add(name)
        for command in re.findall(r"^Exec\w*=[-@:+!]*(\S+)", text, re.M):
            installed = host.sysroot / command.lstrip("/")
            if installed.is_file():
                (root / command.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(installed, root / command.lstrip("/"))
    for command in STAND_INS:
        stand_in = root / command.lstrip("/")
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        stand_in.write_text("#!/bin/sh\n")
        stand_in.chmod(0o755)
    return root, units


@pytest.mark.slow  # a whole plan run under the shims (verify_root)
def test_the_plan_renders_every_unit_and_timer(verify_root: tuple[Path, set[str]]) -> None:
    _, units = verify_root
    assert units == EXPECTED  # a new unit joins the list below by being rendered; a lost one fails here


@pytest.mark.heavy  # systemd-analyze (the systemd package)
def test_systemd_accepts_every_rendered_unit_and_timer(verify_root: tuple[Path, set[str]]) -> None:
    tool = _systemd_analyze()
    root, units = verify_root
    result = subprocess.run([tool, "verify", f"--root={root}", *sorted(units)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "SYSTEMD_LOG_COLOR": "0"})
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
