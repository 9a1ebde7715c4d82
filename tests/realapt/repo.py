"""A local apt repository that imitates NVIDIA's CUDA repository for Ubuntu, for the real-apt test.

Names, version shapes, dependency shapes and the pinning preferences file follow NVIDIA's
repository (sources: the @source rows of tests/shims/data/nvidia-repo.tsv: dsx-6049 and cupy-10295
for `nvidia-open: Depends: nvidia-driver-open (>= V)`, pin-595 for the preferences file, gdc-fm-1
for Fabric Manager's `V-1`, gdc-pr451 for its `Provides`); the packages are empty dpkg-deb builds.
It is a flat `file:` repository inside the chroot (`deb [trusted=yes] file:/srv/nvidia-repo ./`),
installed the way NVIDIA's is: by the cuda-keyring .deb, which the driver step downloads (the
chroot's `curl` stand-in copies it from the repository folder). The sbsa imitation (arm64 packages) lies
where NVIDIA's does relative to its x86 folder, `…/ubuntu2404/sbsa/`, with its own keyring and index.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO_IN_CHROOT = "/srv/nvidia-repo"
# NVIDIA's layout, for the repositories of one architecture folder: <this>/ubuntu2404/sbsa/ as …/repos/ubuntu2404/sbsa/
# (the curl stand-in serves a keyring URL's folder from here when the folder exists)
REPOS_IN_CHROOT = "/srv/nvidia-repos"


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


def driver_release(version: str, *, fm: bool = True, arch: str = "amd64") -> list[Deb]:
    """One driver release, shaped like NVIDIA's (from R590 names without a branch): the meta
    package depends on the driver at >= its version (not = : only the pin keeps the branch).
    `arch` is the Debian architecture of the binary packages (arm64 in the sbsa repository)."""
    branch = version.split(".")[0]
    deb_version = f"{version}-0ubuntu1"
    debs = [
        Deb("nvidia-open", deb_version, arch=arch,
            depends=f"nvidia-driver-open (>= {version}), nvidia-kernel-open (>= {version})"),
        Deb("nvidia-driver-open", deb_version, depends=f"libnvidia-compute (>= {version})", arch=arch),
        # the kernel module: a fresh one loads only after a reboot (the nvidia-smi stand-in reads this)
        Deb("nvidia-kernel-open", deb_version, arch=arch,
            postinst="mkdir -p /run && touch /run/gpuprov-module-not-loaded\n"),
        Deb("libnvidia-compute", deb_version, arch=arch),
        Deb(f"nvidia-driver-pinning-{branch}", deb_version, arch="all",
            files={PIN_FILE: pinning_preferences(branch)}),
    ]
    if fm:
        debs.append(Deb("nvidia-fabricmanager", f"{version}-1", provides=f"nvidia-fabricmanager-{branch}", arch=arch))
    return debs


def keyring(folder: str = "") -> Deb:
    """NVIDIA's cuda-keyring: its list names the repository folder it came from (`ubuntu2404/sbsa`: the
    keyring of NVIDIA's sbsa folder lists `…/ubuntu2404/sbsa/ /`); "" is the flat x86 imitation."""
    where = f"{REPOS_IN_CHROOT}/{folder}" if folder else REPO_IN_CHROOT
    name = f"cuda-{folder.replace('/', '-')}.list" if folder else "cuda-ubuntu2404-x86_64.list"
    return Deb("cuda-keyring", "1.1-1", arch="all", files={
        f"etc/apt/sources.list.d/{name}": f"deb [trusted=yes] file:{where} ./\n"})


def toolkit(minor: str, version: str, arch: str = "amd64") -> Deb:
    return Deb(f"cuda-toolkit-{minor.replace('.', '-')}", version, arch=arch)


def build(chroot: Path, debs: list[Deb], folder: str = "") -> None:
    """Write each .deb into the chroot's repository folder (skips those there) and rebuild the index;
    `folder` is a subfolder laid out like NVIDIA's (`ubuntu2404/sbsa`), "" the flat x86 imitation."""
    repo = chroot / (f"{REPOS_IN_CHROOT}/{folder}" if folder else REPO_IN_CHROOT).lstrip("/")
    repo.mkdir(parents=True, exist_ok=True)
    work = chroot / "srv/nvidia-repo-src" / folder
    for deb in debs:
        out = repo / f"{deb.name}_{deb.version}_{deb.arch}.deb"
        if out.exists():
            continue
        root = work / f"{deb.name}_{deb.version}_{deb.arch}"
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
