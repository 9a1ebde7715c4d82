"""Wheel locks made from the origin index (plan/wheel_lock.py reads them): pip resolves torch's dependency closure
for the node's Python and platform, without installing anything (`pip install --dry-run --report`), and its
installation report carries each wheel's version, URL and the sha256 the index lists for it.

pip is run `--isolated` with PIP_CONFIG_FILE set to the null device (no pip.conf, user's or global, no PIP_*
variables: a configured mirror, extra index or constraint would put its own files in the lock) against the origin
index alone, GPUPROV_PYTORCH_INDEX_URL's when set (a test's stand-in). pip evaluates the wheels' environment
markers on this machine, not on the node: a lock is made only on Linux, and one for another CPU than this
machine's says so.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuprov.errors import GpuprovError
from gpuprov.plan.wheel_lock import LockedWheel, WheelLock

# the Python a lock is made for when nothing else is asked: the plans' default (plan/plan.py)
PYTHON = "3.12"
ARCHS = ("x86_64", "aarch64")
# the manylinux tags a node's glibc (2.34 and newer on every supported OS) takes, newest first, and the legacy ones
GLIBC_MINORS = range(34, 16, -1)
TIMEOUT = 600


def platforms(arch: str) -> list[str]:
    return [f"manylinux_2_{m}_{arch}" for m in GLIBC_MINORS] + [f"manylinux2014_{arch}"]


def command(index: str, requirement: str, python: str, arch: str, report: Path) -> list[str]:
    """pip's dry run that writes the installation report of `requirement` for CPython `python` on `arch` (pip
    takes another platform's tags only for a --target, which a dry run never writes)."""
    plats = [arg for p in platforms(arch) for arg in ("--platform", p)]
    return [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "--no-input", "install",
            "--dry-run", "--ignore-installed", "--quiet", "--no-cache-dir", "--report", str(report),
            "--target", str(report.parent / "target"),
            "--only-binary=:all:", *plats, "--python-version", python, "--implementation", "cp",
            "--index-url", index, requirement]


def from_report(report: dict[str, Any], index: str) -> tuple[LockedWheel, ...]:
    """The wheels of pip's installation report, each with the sha256 the index listed (none listed: not lockable)."""
    wheels = []
    for item in report.get("install") or []:
        meta, info = item["metadata"], item["download_info"]
        archive = info.get("archive_info") or {}
        legacy = str(archive.get("hash") or "")  # an older pip's one "sha256=<hex>"
        sha = (archive.get("hashes") or {}).get("sha256") or (legacy[7:] if legacy.startswith("sha256=") else None)
        if not sha:
            raise GpuprovError(f"{index}: lists no sha256 for {meta['name']} {meta['version']} ({info['url']})")
        wheels.append(LockedWheel(name=meta["name"], version=meta["version"], sha256=sha, url=info["url"]))
    if not any(w.name.lower() == "torch" for w in wheels):
        raise GpuprovError(f"{index}: pip's report has no torch wheel")
    return tuple(wheels)


def make(index: str, requirement: str, variant: str, python: str, arch: str, now: datetime) -> WheelLock:
    """One lock read from `index` (the variant's simple index), or GpuprovError saying why not."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-lock-") as tmp:
        report = Path(tmp) / "report.json"
        try:
            run = subprocess.run(command(index, requirement, python, arch, report), capture_output=True, text=True,
                                 timeout=TIMEOUT, check=False, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GpuprovError(f"{index}: pip did not answer: {exc}") from None
        if run.returncode != 0 or not report.is_file():
            said = [line.strip() for line in (run.stderr or run.stdout).splitlines()
                    if line.strip().startswith("ERROR:") and "ResolutionImpossible" not in line]
            raise GpuprovError(f"{index}: pip could not resolve {requirement} for Python {python} on {arch}: "
                            + (said[0].removeprefix("ERROR: ") if said else f"exit {run.returncode}"))
        data = json.loads(report.read_text())
    pip_version = data.get("pip_version", "?")
    here = platform.machine()
    return WheelLock(requirement=requirement, variant=variant, python=python, arch=arch, index=index, read=now,
                     source=f"pip {pip_version}'s installation report (install --dry-run) against {index}",
                     wheels=from_report(data, index),
                     unverified=None if here == arch else
                     f"the wheels' environment markers were evaluated on {here}, not on {arch}")


def wanted(releases: dict[str, Any]) -> list[tuple[str, str]]:
    """(requirement, variant) of the newest torch release family, each of its variants: what plans choose today."""
    newest = max(releases, key=lambda r: tuple(int(p) for p in r.split(".")))
    return [(f"torch=={newest}.*", variant) for variant in releases[newest]["variants"]]


def make_all(base: str, wants: Iterable[tuple[str, str]], pythons: Sequence[str], now: datetime,
             archs: Sequence[str] = ARCHS) -> tuple[list[WheelLock], list[str]]:
    """Each wanted lock, for each Python and CPU (pip runs side by side): the locks made, and why each other was
    not. On anything but Linux nothing is made: pip would read the markers of this OS."""
    if sys.platform != "linux":
        return [], [f"no lock made: pip evaluates the wheels' markers on this machine ({sys.platform}), not on a "
                    "Linux node: run `gpuprov facts refresh --only wheels` on Linux"]
    jobs = [(f"{base}/{variant}", req, variant, py, arch) for req, variant in wants for py in pythons for arch in archs]

    def one(job: tuple[str, str, str, str, str]) -> WheelLock | str:
        try:
            return make(*job, now=now)
        except GpuprovError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(one, jobs))
    return [d for d in done if isinstance(d, WheelLock)], [d for d in done if isinstance(d, str)]
