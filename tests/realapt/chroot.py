"""A Debian/Ubuntu chroot with the real apt and dpkg, built once by debootstrap and cached.

The chroot is the machine's own distribution and release (ID and VERSION_CODENAME from
/etc/os-release), fetched from the mirror the machine's own apt configuration names
(/etc/apt/sources.list and sources.list.d/*.list|*.sources), or from GPUPROV_TEST_MIRROR.
No mirror host is written down here.

Cache: /var/cache/gpuprov-tests/chroot-<key>.tar (override with GPUPROV_TEST_CACHE), where <key>
hashes what the chroot is built from (distribution, release, variant, packages, this file's
BUILD_VERSION). Each test unpacks the tarball into its own temp folder, so runs never share state;
one process at a time builds it (a machine-wide lock, tests/machine.py), the others wait and reuse it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.machine import machine_lock

BUILD_VERSION = "1"
VARIANT = "minbase"
INCLUDE: tuple[str, ...] = ()  # minbase has apt, dpkg, bash, coreutils, grep, sed, mawk
CACHE = Path(os.environ.get("GPUPROV_TEST_CACHE", "/var/cache/gpuprov-tests"))


class ChrootUnavailable(Exception):
    """Why the real-apt chroot cannot be built or used here."""


def os_release() -> tuple[str, str]:
    fields: dict[str, str] = {}
    for line in Path("/etc/os-release").read_text().splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            fields[k] = v.strip().strip('"')
    dist, codename = fields.get("ID", ""), fields.get("VERSION_CODENAME", "")
    if dist not in ("debian", "ubuntu") or not codename:
        raise ChrootUnavailable(f"this machine is {dist or 'unknown'} {codename}; the chroot needs Debian or Ubuntu")
    return dist, codename


def _apt_sources() -> list[tuple[str, list[str]]]:
    """(URI, suites) of every enabled `deb` source in this machine's apt configuration."""
    out: list[tuple[str, list[str]]] = []
    etc = Path("/etc/apt")
    lists = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    for path in lists:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            m = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m:
                out.append((m.group(1), [m.group(2)]))
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
            if fields.get("Enabled", "yes").lower() == "no" or "deb" not in fields.get("Types", "").split():
                continue
            for uri in fields.get("URIs", "").split():
                out.append((uri, fields.get("Suites", "").split()))
    return out


def mirror(codename: str) -> str:
    if os.environ.get("GPUPROV_TEST_MIRROR"):
        return os.environ["GPUPROV_TEST_MIRROR"]
    for uri, suites in _apt_sources():
        if codename in suites and uri.startswith(("http://", "https://", "file:")):
            return uri
    raise ChrootUnavailable(f"no apt source for {codename} in /etc/apt (set GPUPROV_TEST_MIRROR)")


def cache_key(dist: str, codename: str) -> str:
    text = "\n".join([BUILD_VERSION, dist, codename, VARIANT, *INCLUDE])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tarball() -> Path:
    """The cached chroot tarball; built (minutes, network) when missing."""
    if os.geteuid() != 0:
        raise ChrootUnavailable("building and entering a chroot needs root")
    dist, codename = os_release()
    path = CACHE / f"chroot-{dist}-{codename}-{cache_key(dist, codename)}.tar"
    if path.exists():
        return path
    with machine_lock("chroot-cache"):  # one debootstrap at a time (xdist workers, other runs); then reuse it
        if not path.exists():
            _build(path, dist, codename)
    return path


def _build(path: Path, dist: str, codename: str) -> None:
    debootstrap = shutil.which("debootstrap")
    if not debootstrap:
        raise ChrootUnavailable("debootstrap is not installed (tools/sysdeps.sh installs it)")
    CACHE.mkdir(parents=True, exist_ok=True)
    build = CACHE / f"build-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    try:
        args = [debootstrap, f"--variant={VARIANT}"]
        if INCLUDE:
            args.append("--include=" + ",".join(INCLUDE))
        proc = subprocess.run([*args, codename, str(build), mirror(codename)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ChrootUnavailable(f"debootstrap failed: {(proc.stdout + proc.stderr)[-2000:]}")
        # what apt would fetch from the mirror is not needed: the tests use a local file: repository
        (build / "etc/apt/sources.list").write_text("")
        shutil.rmtree(build / "var/cache/apt/archives", ignore_errors=True)
        (build / "var/cache/apt/archives/partial").mkdir(parents=True)
        for lists in (build / "var/lib/apt/lists").glob("*_*"):
            lists.unlink()
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with tarfile.open(tmp, "w") as tar:
            tar.add(build, arcname=".")
        tmp.rename(path)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def unpack(dest: Path) -> Path:
    """A fresh copy of the cached chroot in `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-xf", str(tarball()), "-C", str(dest)], check=True)
    return dest


def as_arm64(root: Path) -> None:
    """Make the unpacked chroot an arm64 host as far as apt and dpkg can tell (its binaries stay this machine's):
    every installed package recorded as arm64, apt's architecture arm64 and no other, arm64 one of dpkg's. apt then
    reads only the arm64 (and `all`) entries of a repository's index and resolves each dependency within arm64, as on
    a Grace or Graviton host; dpkg installs the arm64 packages it is given."""
    status = root / "var/lib/dpkg/status"
    status.write_text(re.sub(r"^Architecture: amd64$", "Architecture: arm64", status.read_text(), flags=re.M))
    for info in (root / "var/lib/dpkg/info").glob("*:amd64.*"):  # Multi-Arch: same packages' file lists
        info.rename(info.with_name(info.name.replace(":amd64.", ":arm64.")))
    (root / "etc/apt/apt.conf.d/00gpuprov-arm64").write_text(
        'APT::Architecture "arm64";\nAPT::Architectures { "arm64"; };\n')
    subprocess.run(["chroot", str(root), "dpkg", "--add-architecture", "arm64"], check=True)
