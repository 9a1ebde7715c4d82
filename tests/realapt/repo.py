"""A local apt repository that imitates NVIDIA's CUDA repository for Ubuntu, for the real-apt test.

Names, version shapes, dependency shapes and the pinning preferences file follow NVIDIA's
repository (sources: the @source rows of tests/shims/data/nvidia-repo.tsv: dsx-6049 and cupy-10295
for `nvidia-open: Depends: nvidia-driver-open (>= V)`, pin-595 for the preferences file, gdc-fm-1
for Fabric Manager's `V-1`, gdc-pr451 for its `Provides`); the packages are empty dpkg-deb builds.
It is a flat `file:` repository inside the chroot (`deb [trusted=yes] file:/srv/nvidia-repo ./`),
installed the way NVIDIA's is: by the cuda-keyring .deb, which the driver step downloads (the
chroot's `curl` stand-in copies it from the repository folder).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO_IN_CHROOT = "/srv/nvidia-repo"


@dataclass(frozen=True)
class Deb:
    name: str
    version: str
    depends: str = ""
    provides: str = ""
    arch: str = "amd64"
    files: dict[str, str] = field(default_factory=dict)
    postinst: str = ""


PIN_FILE = "etc/apt/preferences.d/nvidia-driver-pin"  # the file NVIDIA's pinning packages ship (data: pin-595)


def pinning_preferences(branch: str) -> str:
    """NVIDIA's pinning preferences: driver packages at the branch's versions (priority 1000), above
    any newer branch (500). NVIDIA's stanzas name source packages (`Package: cuda-drivers*
    src:nvidia-open:any`, `Pin: version 595.71.05-*`); these stand-ins are each their own source,
    so one glob over source names covers them."""
    return (f"Package: src:*nvidia*:any src:cuda-drivers:any src:cuda-compat:any\n"
            f"Pin: version {branch}.*\nPin-Priority: 1000\n")


def driver_release(version: str, *, fm: bool = True) -> list[Deb]:
    """One driver release, shaped like NVIDIA's (from R590 names without a branch): the meta
    package depends on the driver at >= its version (not = : only the pin keeps the branch)."""
    branch = version.split(".")[0]
    deb_version = f"{version}-0ubuntu1"
    debs = [
        Deb("nvidia-open", deb_version, depends=f"nvidia-driver-open (>= {version}), nvidia-kernel-open (>= {version})"),
        Deb("nvidia-driver-open", deb_version, depends=f"libnvidia-compute (>= {version})"),
        # the kernel module: a fresh one loads only after a reboot (the nvidia-smi stand-in reads this)
        Deb("nvidia-kernel-open", deb_version, postinst="mkdir -p /run && touch /run/gpuprov-module-not-loaded\n"),
        Deb("libnvidia-compute", deb_version),
        Deb(f"nvidia-driver-pinning-{branch}", deb_version, arch="all",
            files={PIN_FILE: pinning_preferences(branch)}),
    ]
    if fm:
        debs.append(Deb("nvidia-fabricmanager", f"{version}-1", provides=f"nvidia-fabricmanager-{branch}"))
    return debs


def keyring() -> Deb:
    return Deb("cuda-keyring", "1.1-1", arch="all", files={
        "etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list": f"deb [trusted=yes] file:{REPO_IN_CHROOT} ./\n"})


def toolkit(minor: str, version: str) -> Deb:
    return Deb(f"cuda-toolkit-{minor.replace('.', '-')}", version)


def build(chroot: Path, debs: list[Deb]) -> None:
    """Write each .deb into the chroot's repository folder (skips those there) and rebuild the index."""
    repo = chroot / REPO_IN_CHROOT.lstrip("/")
    repo.mkdir(parents=True, exist_ok=True)
    work = repo.parent / "nvidia-repo-src"
    for deb in debs:
        out = repo / f"{deb.name}_{deb.version}_{deb.arch}.deb"
        if out.exists():
            continue
        root = work / f"{deb.name}_{deb.version}"
        (root / "DEBIAN").mkdir(parents=True, exist_ok=True)
        control = [f"Package: {deb.name}", f"Version: {deb.version}", f"Architecture: {deb.arch}",
                   "Maintainer: gpuprov tests <tests@invalid>", "Section: multiverse/devel", "Priority: optional"]
        if deb.depends:
            control.append(f"Depends: {deb.depends}")
        if deb.provides:
            control.append(f"Provides: {deb.provides}")
        control.append(f"Description: stand-in for NVIDIA's {deb.name}")
        (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
        if deb.postinst:
            post = root / "DEBIAN/postinst"
            post.write_text("#!/bin/sh\nset -e\n" + deb.postinst)
            post.chmod(0o755)
        for path, text in deb.files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(out)],
                       check=True, capture_output=True)
    index = subprocess.run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo, check=True,
                           capture_output=True, text=True).stdout
    (repo / "Packages").write_text(index)
