"""An imitation of NVIDIA's amzn2023 CUDA repository and of the distribution's own, as RPM repositories for the real
dnf (tests/test_real_dnf.py): built with rpmbuild from generated spec files (no payload, no scriptlets), indexed with
createrepo_c, NVIDIA's with module metadata (modifyrepo_c --mdtype=modules).

Shapes as NVIDIA publishes them (read 2026-12-01): the driver's packages carry epoch 3 ("kmod-nvidia-open-dkms-3:575.51-1
.fc41", NVIDIA's version-locking page); each branch is a module stream `nvidia-driver:<branch>-open` whose default
profile installs nvidia-open (Driver Installation Guide, Table 5); nvidia-open needs the driver's packages at its own
version and kmod-nvidia-open-dkms needs dkms, which on Amazon Linux comes from the distribution (AWS's ECS AMI script
installs kmod-nvidia-open-dkms, nvidia-driver and nvidia-driver-cuda at one version); Fabric Manager is
nvidia-fabricmanager-<version> outside the stream (NVIDIA's driver container installs it after enabling the stream);
toolkits are cuda-toolkit-X-Y. The release tag `1.amzn2023` and the dependency lists beyond those named are the
imitation's (unverified: NVIDIA's amzn2023 repodata was not read).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

KERNEL = "6.1.115-126.197.amzn2023.x86_64"  # uname -r of an Amazon Linux 2023 kernel
# uname -r of Amazon Linux 2023's 6.12 kernel, whose packages are namespaced: kernel6.12-devel-<this>,
# kernel6.12-modules-extra-<this> (AWS's install commands; the version the imitation's)
KERNEL612 = "6.12.58-82.121.amzn2023.x86_64"
BRANCHES = {"580": "580.126.09", "595": "595.71.05", "610": "610.57.04"}  # each branch's release in the imitation
TOOLKITS = ("12.8", "12.9", "13.0")


@dataclass(frozen=True)
class Rpm:
    name: str
    version: str
    release: str = "1.amzn2023"
    epoch: int | None = None
    arch: str = "x86_64"
    requires: tuple[str, ...] = ()

    @property
    def nevra(self) -> str:
        return f"{self.name}-{self.epoch}:{self.version}-{self.release}.{self.arch}" if self.epoch else \
            f"{self.name}-{self.version}-{self.release}.{self.arch}"

    def spec(self) -> str:
        lines = [f"Name: {self.name}", f"Version: {self.version}", f"Release: {self.release}", "Summary: imitation",
                 "License: imitation"]
        if self.arch != "aarch64":  # an aarch64 package is built with --target (rpmbuild has no BuildArch for it here)
            lines.append(f"BuildArch: {self.arch}")
        if self.epoch:
            lines.append(f"Epoch: {self.epoch}")
        lines += [f"Requires: {r}" for r in self.requires]
        return "\n".join(lines) + "\n%description\nimitation\n%files\n"


def nvidia_rpms() -> tuple[list[Rpm], dict[str, list[Rpm]]]:
    """(every package of NVIDIA's imitation repository, the modular ones per stream)."""
    streams = driver_streams(BRANCHES)
    plain: list[Rpm] = []
    for v in BRANCHES.values():
        plain.append(Rpm("nvidia-fabricmanager", v))
    plain.append(Rpm("nvlsm", "2025.06.6"))  # NVSwitch gen 4 (HGX B200): from NVIDIA's repository (version the imitation's)
    plain += [Rpm(f"cuda-toolkit-{t.replace('.', '-')}", f"{t}.0") for t in TOOLKITS]
    return plain + [r for rpms in streams.values() for r in rpms], streams


def driver_streams(branches: dict[str, str], arch: str = "x86_64") -> dict[str, list[Rpm]]:
    """Each branch's module stream `nvidia-driver:<branch>-open` and its packages, of one architecture."""
    streams: dict[str, list[Rpm]] = {}
    for branch, v in branches.items():
        at = f"3:{v}"
        streams[f"{branch}-open"] = [
            Rpm("nvidia-open", v, epoch=3, arch=arch, requires=(
                f"nvidia-driver = {at}", f"nvidia-driver-cuda = {at}", f"kmod-nvidia-open-dkms = {at}")),
            Rpm("kmod-nvidia-open-dkms", v, epoch=3, arch=arch, requires=("dkms",)),
            Rpm("nvidia-driver", v, epoch=3, arch=arch), Rpm("nvidia-driver-cuda", v, epoch=3, arch=arch),
        ]
    return streams


def distro_rpms() -> list[Rpm]:
    """The distribution's own packages the steps need (Amazon Linux's repositories)."""
    version, release = KERNEL.rsplit(".", 1)[0].split("-", 1)
    v612, r612 = KERNEL612.rsplit(".", 1)[0].split("-", 1)
    return [Rpm("kernel-devel", version, release=release), Rpm("kernel-headers", version, release=release),
            Rpm("kernel-modules-extra", version, release=release),
            # the 6.12 kernel's namespaced packages: no kernel-devel-6.12.* for `kernel-devel-$(uname -r)` to match
            Rpm("kernel6.12-devel", v612, release=r612), Rpm("kernel6.12-modules-extra", v612, release=r612),
            Rpm("infiniband-diags", "48.0"),
            Rpm("dkms", "3.0.13", arch="noarch"), Rpm("python3-dnf-plugin-versionlock", "4.3.1", arch="noarch"),
            # Amazon Linux's own Docker engine (data/docker.yaml [al2023]; versions the imitation's)
            Rpm("docker", "25.0.8", requires=("containerd", "runc")), Rpm("containerd", "1.7.27"), Rpm("runc", "1.2.6"),
            # what an EL10 host's driver step takes from its own repositories and EPEL (Rocky's extras carry
            # epel-release; versions the imitation's)
            Rpm("dnf-plugins-core", "4.7.0", arch="noarch"), Rpm("epel-release", "10", arch="noarch")]


CTK = "1.18.0"


def ctk_rpms() -> list[Rpm]:
    """NVIDIA's container toolkit repository (nvidia.github.io/libnvidia-container/stable/rpm): the four packages of
    NVIDIA's install guide, the toolkit needing the others at its version (dependency shape the imitation's)."""
    return [Rpm("nvidia-container-toolkit", CTK, release="1",
                requires=(f"nvidia-container-toolkit-base = {CTK}-1", f"libnvidia-container-tools >= {CTK}-1")),
            Rpm("nvidia-container-toolkit-base", CTK, release="1"),
            Rpm("libnvidia-container-tools", CTK, release="1", requires=(f"libnvidia-container1 >= {CTK}-1",)),
            Rpm("libnvidia-container1", CTK, release="1")]


def modules_yaml(streams: dict[str, list[Rpm]], arch: str = "x86_64") -> str:
    docs = []
    for stream, rpms in streams.items():
        artifacts = "".join(f"    - {r.nevra}\n" for r in rpms)
        docs.append(f"""---
document: modulemd
version: 2
data:
  name: nvidia-driver
  stream: "{stream}"
  version: 20261101000000
  context: "00000000"
  arch: {arch}
  summary: Nvidia driver for {stream} branch (imitation)
  description: imitation
  license:
    module: [MIT]
  profiles:
    default:
      rpms: [nvidia-open]
  artifacts:
    rpms:
{artifacts}...
""")
    return "".join(docs)


def _build(rpms: list[Rpm], top: Path, out: Path, target: str = "") -> None:
    (top / "SPECS").mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    specs = []
    for r in rpms:
        spec = top / "SPECS" / f"{r.name}-{r.version}.spec"
        spec.write_text(r.spec())
        specs.append(str(spec))
    subprocess.run(["rpmbuild", "--quiet", "-bb", *(["--target", target] if target else []),
                    "--define", f"_topdir {top}", "--define", f"_rpmdir {out}",
                    "--define", "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm", *specs],
                   check=True, capture_output=True)


def build(where: Path) -> tuple[Path, Path, Path, Path]:
    """(NVIDIA's imitation amzn2023 CUDA repository, the distribution's, NVIDIA's container toolkit's, NVIDIA's rhel10
    one), indexed, under `where`."""
    nvidia, streams = nvidia_rpms()
    cuda, distro, ctk = where / "cuda-amzn2023", where / "amazonlinux", where / "libnvidia-container"
    _build(nvidia, where / "build-cuda", cuda)
    _build(distro_rpms(), where / "build-distro", distro)
    _build(ctk_rpms(), where / "build-ctk", ctk)
    for repo in (cuda, distro, ctk):
        subprocess.run(["createrepo_c", "-q", str(repo)], check=True)
    (where / "modules.yaml").write_text(modules_yaml(streams))
    subprocess.run(["modifyrepo_c", "--mdtype=modules", str(where / "modules.yaml"), str(cuda / "repodata")],
                   check=True, capture_output=True)
    # NVIDIA's rhel10 repository: the same packages without module metadata (EL10 has no modularity; NVIDIA's guide
    # holds the branch with dnf versionlock there)
    cuda10 = where / "cuda-rhel10"
    cuda10.mkdir()
    for rpm in cuda.glob("**/*.rpm"):
        (cuda10 / rpm.name).hardlink_to(rpm)
    subprocess.run(["createrepo_c", "-q", str(cuda10)], check=True)
    return cuda, distro, ctk, cuda10


def build_sbsa(where: Path) -> Path:
    """NVIDIA's amzn2023/sbsa repository, imitated: the R595 and R610 streams and one toolkit as aarch64 packages (built
    with `rpmbuild --target aarch64`), with their module metadata. dnf reads it on an x86_64 machine only under
    --forcearch=aarch64 (the dnf stand-in's REALDNF_ARCH), which makes it resolve as an aarch64 host would."""
    streams = driver_streams({b: BRANCHES[b] for b in ("595", "610")}, arch="aarch64")
    rpms = [r for s in streams.values() for r in s] + [Rpm("cuda-toolkit-13-0", "13.0.0", arch="aarch64")]
    repo = where / "cuda-amzn2023-sbsa"
    _build(rpms, where / "build-sbsa", repo, target="aarch64")
    subprocess.run(["createrepo_c", "-q", str(repo)], check=True)
    (where / "modules-sbsa.yaml").write_text(modules_yaml(streams, arch="aarch64"))
    subprocess.run(["modifyrepo_c", "--mdtype=modules", str(where / "modules-sbsa.yaml"), str(repo / "repodata")],
                   check=True, capture_output=True)
    return repo
