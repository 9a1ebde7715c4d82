"""Run rendered gpuprov step scripts locally against the PATH shims in tests/shims (a fake host).

The fake host lives in one temp folder: `sysroot/` (GPUPROV_SYSROOT, where scripts write their
files), `shim-state/` (GPUPROV_SHIM_STATE: installed packages, holds, enabled units, calls.log),
`shim-run/` (GPUPROV_SHIM_RUN: what a reboot clears) and `bin/` (a `pythonX.Y` for the uv shim).
Results are read like the bootstrap runner reads them: the last stdout line
`GPUPROV_RESULT=unchanged|changed|reboot`, exit 0; on `reboot` the host "reboots" (shim-run is
emptied) and the next step runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.plan.render import Bundle, Script

SHIMS = Path(__file__).resolve().parent / "shims"
LOCAL_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class StepRun:
    name: str
    returncode: int
    result: str | None  # unchanged | changed | reboot, or None when the protocol line is missing
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.result is not None

    @property
    def last_stderr_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""


DMI_DIR = "sys/devices/virtual/dmi/id"


def ec2_dmi() -> dict[str, str]:
    """DMI as an EC2 Nitro instance shows it (AWS, "Detect whether a host is an EC2 instance": the
    board_asset_tag is the instance id, the system UUID starts with EC2): facts ask IMDS only then."""
    return {"sys_vendor": "Amazon EC2\n", "board_asset_tag": "i-0af01c0123456789a\n",
            "product_uuid": "ec2e1916-9099-7caf-fd21-012345abcdef\n"}


@dataclass
class ShimHost:
    root: Path
    gpu: str = "A100"
    count: int = 1
    fail: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sysroot = self.root / "sysroot"
        self.state = self.root / "shim-state"
        self.run_dir = self.root / "shim-run"
        self.bin = self.root / "bin"
        self.home = self.root / "home"
        for d in (self.sysroot, self.state, self.run_dir, self.bin, self.home, self.root / "bundle"):
            d.mkdir(parents=True, exist_ok=True)
        py = self.bin / f"python{LOCAL_PYTHON}"
        if not py.exists():
            py.symlink_to(sys.executable)
        if self.extra_env.get("GPUPROV_SHIM_INSTANCE_TYPE"):  # the curl shim plays IMDS: this host is an EC2 instance
            for name, text in ec2_dmi().items():
                (self.sysroot / DMI_DIR / name).parent.mkdir(parents=True, exist_ok=True)
                (self.sysroot / DMI_DIR / name).write_text(text)

    def env(self) -> dict[str, str]:
        env = {
            "PATH": f"{SHIMS / 'bin'}:{self.bin}:{SYSTEM_PATH}",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
            "GPUPROV_SYSROOT": str(self.sysroot),
            "GPUPROV_SHIM_STATE": str(self.state),
            "GPUPROV_SHIM_RUN": str(self.run_dir),
            "GPUPROV_SHIM_GPU": self.gpu,
            "GPUPROV_SHIM_GPU_COUNT": str(self.count),
            "GPUPROV_RETRY_DELAY": "0",
            "GPUPROV_APT_LOCK_TIMEOUT": "5",
            "GPUPROV_APT_LOCK_POLL": "1",
        }
        if self.fail:
            env["GPUPROV_SHIM_FAIL"] = self.fail
        env.update(self.extra_env)
        return env

    def copy(self, root: Path, **changes: object) -> ShimHost:
        """A clone of this host's disk and boot state in `root`, with other settings changed."""
        shutil.copytree(self.root, root, symlinks=True, dirs_exist_ok=True)
        fields = {"gpu": self.gpu, "count": self.count, "fail": self.fail, "extra_env": dict(self.extra_env)}
        fields.update(changes)
        return ShimHost(root, **fields)  # type: ignore[arg-type]

    def reboot(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir()
        with (self.state / "calls.log").open("a") as log:
            log.write("reboot (simulated by shimrun)\n")

    def run_script(self, script: Script, timeout: float = 120) -> StepRun:
        path = self.root / "bundle" / script.filename
        path.write_text(script.text)
        proc = subprocess.run(
            ["bash", str(path)], capture_output=True, text=True, env=self.env(), cwd=self.root, timeout=timeout
        )
        lines = proc.stdout.splitlines()
        result = None
        if proc.returncode == 0 and lines and lines[-1].startswith("GPUPROV_RESULT="):
            result = lines[-1].split("=", 1)[1]
        return StepRun(script.name, proc.returncode, result, proc.stdout, proc.stderr)

    def run_bundle(self, bundle: Bundle) -> list[StepRun]:
        """Every step in plan order; stops at the first failure; reboots when a step asks."""
        runs = []
        for script in bundle.scripts:
            run = self.run_script(script)
            runs.append(run)
            if not run.ok:
                break
            if run.result == "reboot":
                self.reboot()
        return runs

    def calls(self) -> list[str]:
        log = self.state / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def installed(self) -> dict[str, str]:
        text = (self.state / "installed").read_text() if (self.state / "installed").exists() else ""
        return dict(line.split(" ", 1) for line in text.splitlines() if line.strip())

    def held(self) -> set[str]:
        path = self.state / "held"
        return set(path.read_text().split()) if path.exists() else set()


def summary(runs: list[StepRun]) -> str:
    """One line per step for assertion messages."""
    return "\n".join(
        f"{r.name}: rc={r.returncode} result={r.result} {r.last_stderr_line}" for r in runs
    )
