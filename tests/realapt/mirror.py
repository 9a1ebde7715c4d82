"""A mirror of the imitation NVIDIA repository for the real-apt test, signed as NVIDIA's is, served over HTTP by
tests/indexsite.py at NVIDIA's layout ({base}/ubuntu2404/x86_64/: InRelease, Packages, the .debs and the
cuda-keyring .deb).

The keyring .deb is shaped like NVIDIA's: its list names NVIDIA's own host with `signed-by` its keyring, which holds
the key the repository's InRelease is signed with. A test key stands for NVIDIA's (`signing_key`); a second one
stands for a mirror's own (`other_key`). The chroot gets the machine's own gpg (same distribution and release) for
the driver step's fingerprint check: a debootstrapped minbase has gpgv but no gpg, and copying the binary and the
libraries it lacks costs milliseconds where installing gnupg would need the distribution's mirror.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = "ubuntu2404/x86_64"
KEYRING = "usr/share/keyrings/cuda-archive-keyring.gpg"
ORIGIN = "https://developer.download.nvidia.com/compute/cuda/repos"


@dataclass(frozen=True)
class Key:
    home: Path
    fingerprint: str

    def export(self) -> bytes:
        return subprocess.run(["gpg", "--homedir", str(self.home), "--export"], check=True,
                              capture_output=True).stdout


def new_key(home: Path, name: str) -> Key:
    """An ed25519 signing key in its own GnuPG home (quick to make)."""
    home.mkdir(mode=0o700, parents=True)
    subprocess.run(["gpg", "--homedir", str(home), "--batch", "--passphrase", "", "--quick-gen-key",
                    f"{name} <{name}@invalid>", "ed25519", "sign", "never"], check=True, capture_output=True)
    listed = subprocess.run(["gpg", "--homedir", str(home), "--with-colons", "--list-keys"], check=True,
                            capture_output=True, text=True).stdout
    return Key(home, next(line.split(":")[9] for line in listed.splitlines() if line.startswith("fpr:")))


def build(site: Path, chroot_repo: Path, signed_by: Key, keyring_key: Key) -> None:
    """site/nvidia/REPO: the chroot repository's packages, an InRelease signed by `signed_by`, and a cuda-keyring
    .deb whose keyring holds `keyring_key` (the same key for a faithful mirror)."""
    where = site / "nvidia" / REPO
    where.mkdir(parents=True)
    work = site.parent / f"{site.name}-keyring"
    (work / "DEBIAN").mkdir(parents=True)
    (work / "DEBIAN/control").write_text("Package: cuda-keyring\nVersion: 1.1-1\nArchitecture: all\n"
                                         "Maintainer: gpuprov tests <tests@invalid>\n"
                                         "Description: stand-in for NVIDIA's cuda-keyring\n")
    (work / KEYRING).parent.mkdir(parents=True)
    (work / KEYRING).write_bytes(keyring_key.export())
    listed = work / "etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list"
    listed.parent.mkdir(parents=True)
    listed.write_text(f"deb [signed-by=/{KEYRING}] {ORIGIN}/{REPO}/ /\n")
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(work),
                    str(where / "cuda-keyring_1.1-1_all.deb")], check=True, capture_output=True)
    for deb in chroot_repo.glob("*.deb"):
        if not deb.name.startswith("cuda-keyring_"):
            (where / deb.name).hardlink_to(deb)
    index = subprocess.run(["dpkg-scanpackages", "--multiversion", "."], cwd=where, check=True,
                           capture_output=True, text=True).stdout
    (where / "Packages").write_text(index)
    (where / "Release").write_text("Origin: NVIDIA (imitation)\nLabel: NVIDIA CUDA\nArchitectures: amd64 all\n"
                                   "Date: Thu, 03 Dec 2026 00:00:00 UTC\n" + _hashes(where, "Packages"))
    subprocess.run(["gpg", "--homedir", str(signed_by.home), "--batch", "--yes", "--clearsign", "-o",
                    str(where / "InRelease"), str(where / "Release")], check=True, capture_output=True)


def _hashes(where: Path, *names: str) -> str:
    rows = {"MD5Sum": hashlib.md5, "SHA256": hashlib.sha256}
    out = []
    for field, algo in rows.items():
        out.append(f"{field}:")
        for name in names:
            data = (where / name).read_bytes()
            out.append(f" {algo(data).hexdigest()} {len(data)} {name}")
    return "\n".join(out) + "\n"


def give_gpg(chroot: Path) -> None:
    """The machine's gpg in the chroot, with the shared libraries the chroot lacks."""
    gpg = Path(shutil.which("gpg") or "/usr/bin/gpg").resolve()
    shutil.copy2(gpg, chroot / "usr/bin/gpg")
    for line in subprocess.run(["ldd", str(gpg)], check=True, capture_output=True, text=True).stdout.splitlines():
        parts = line.split("=>")
        if len(parts) != 2 or not parts[1].strip().startswith("/"):
            continue
        lib = Path(parts[1].split()[0])
        inside = chroot / str(lib).lstrip("/")
        if not inside.exists():
            inside.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib.resolve(), inside)
