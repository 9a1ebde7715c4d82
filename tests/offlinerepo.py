"""An imitation of NVIDIA's flat apt repository as `bundle --offline` reads it, signed as NVIDIA's is: a signing key
of the test's own (real gpg, ed25519), the cuda-keyring .deb that installs it with the list NVIDIA's keyring lays
down (`deb [signed-by=…] {origin}/ubuntu2404/x86_64/ /`), a Packages index, a Release listing its sha256, and
InRelease, the Release clear-signed. Served over HTTP in the test's own process (`served`).

The tests that read it pin the test key as NVIDIA's (`pinned_keys` in plan/sources.py), as a mirror's key would
have to be.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpuprov.plan.sources import DEFAULTS

REPO = "ubuntu2404/x86_64"
KEYRING_PATH = "usr/share/keyrings/cuda-archive-keyring.gpg"
KEYRING_LIST = f"deb [signed-by=/{KEYRING_PATH}] {DEFAULTS.nvidia}/{REPO}/ /\n"


@dataclass(frozen=True)
class Signer:
    home: Path
    fingerprint: str
    public: bytes  # the key, binary, as a keyring file holds it

    @classmethod
    def make(cls, home: Path) -> Signer:
        gpg = shutil.which("gpg")
        assert gpg, "gpg is not installed"
        home.mkdir(mode=0o700, parents=True)
        run = partial(subprocess.run, env={"GNUPGHOME": str(home), "PATH": "/usr/bin:/bin"}, check=True,
                      capture_output=True)
        run([gpg, "--batch", "--passphrase", "", "--quick-gen-key", "repo <r@repo.test>", "ed25519", "sign", "never"])
        listed = run([gpg, "--with-colons", "--list-keys"], text=True).stdout
        fingerprint = next(line.split(":")[9] for line in listed.splitlines() if line.startswith("fpr:"))
        return cls(home, fingerprint, run([gpg, "--export"]).stdout)

    def clearsign(self, text: str) -> str:
        return subprocess.run(["gpg", "--batch", "--clearsign", "--digest-algo", "SHA256"], input=text, text=True,
                              env={"GNUPGHOME": str(self.home), "PATH": "/usr/bin:/bin"}, check=True,
                              capture_output=True).stdout


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    """A .deb's outer archive (ar), as dpkg-deb writes it."""
    out = io.BytesIO()
    out.write(b"!<arch>\n")
    for name, body in members:
        out.write(f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(body):<10}`\n".encode())
        out.write(body + (b"\n" if len(body) % 2 else b""))
    return out.getvalue()


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def keyring_deb(key: bytes) -> bytes:
    """NVIDIA's cuda-keyring 1.1-1 in shape: the key, and the list naming the origin's repository with it."""
    control = "Package: cuda-keyring\nVersion: 1.1-1\nArchitecture: all\nMaintainer: test\nDescription: test\n"
    return _ar([("debian-binary", b"2.0\n"), ("control.tar.gz", _tar({"control": control.encode()})),
                ("data.tar.gz", _tar({KEYRING_PATH: key,
                                      "etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list": KEYRING_LIST.encode()}))])


@dataclass(frozen=True)
class Deb:
    name: str
    version: str
    body: bytes
    depends: str = ""
    arch: str = "amd64"
    provides: str = ""

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version}_{self.arch}.deb"


def write(folder: Path, debs: list[Deb], signer: Signer | None, *, served_as: dict[str, bytes] | None = None) -> None:
    """The repository in `folder`: each .deb (its bytes in `served_as` instead, when named there: a changed file),
    Packages.gz, Release and, with a signer, InRelease. Without one, the index is unsigned."""
    folder.mkdir(parents=True, exist_ok=True)
    stanzas = []
    for deb in debs:
        (folder / deb.filename).write_bytes((served_as or {}).get(deb.name, deb.body))
        stanzas.append(f"Package: {deb.name}\nVersion: {deb.version}\nArchitecture: {deb.arch}\n"
                       + (f"Depends: {deb.depends}\n" if deb.depends else "")
                       + (f"Provides: {deb.provides}\n" if deb.provides else "")
                       + f"Filename: ./{deb.filename}\nSize: {len(deb.body)}\n"
                       f"SHA256: {hashlib.sha256(deb.body).hexdigest()}\n")
    text = "\n".join(stanzas).encode()
    packages = gzip.compress(text, mtime=0)
    (folder / "Packages.gz").write_bytes(packages)
    # as NVIDIA's: the plain index listed too (apt looks for its name), served compressed only
    release = (f"Origin: NVIDIA\nLabel: NVIDIA CUDA\nArchitecture: amd64\n"
               "Date: Thu, 03 Dec 2026 00:00:00 UTC\n"
               f"SHA256:\n {hashlib.sha256(text).hexdigest()} {len(text)} Packages\n"
               f" {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages.gz\n")
    (folder / "Release").write_text(release)
    if signer is not None:
        (folder / "InRelease").write_text(signer.clearsign(release))


REQUESTS: list[str] = []  # every path the served sites were asked for, in order (tests clear it)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        REQUESTS.append(self.path)
        super().do_GET()


@contextlib.contextmanager
def served(root: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """`root` over HTTP on `host`, from a thread of this process; the base URL."""
    server = ThreadingHTTPServer((host, 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def wheel(name: str, version: str, tag: str = "cp312-cp312-manylinux_2_28_x86_64", requires: tuple[str, ...] = (),
          scripts: dict[str, str] | None = None) -> tuple[str, bytes]:
    """A wheel pip can read (metadata only: nothing in it runs, but `scripts`, laid as the wheel's
    NAME-VERSION.data/scripts/, as uv's wheel carries its binary): its file name and bytes."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "", **{f"{name}-{version}.data/scripts/{script}": text
                                           for script, text in (scripts or {}).items()},
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n"}
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return f"{name}-{version}-{tag}.whl", buf.getvalue()


def simple_index(root: Path, wheels: dict[str, list[tuple[str, bytes]]]) -> None:
    """A PEP 503 simple index in `root`: one page per project, each file with its sha256 (as pip checks it)."""
    root.mkdir(parents=True, exist_ok=True)
    for project, files in wheels.items():
        (root / project).mkdir(exist_ok=True)
        links = []
        for filename, body in files:
            (root / project / filename).write_bytes(body)
            links.append(f'<a href="{filename}#sha256={hashlib.sha256(body).hexdigest()}">{filename}</a>')
        (root / project / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")


def write_dnf(folder: Path, repo: str, rpms: list[tuple[str, str, tuple[str, ...], bytes]], signer: Signer) -> None:
    """An imitation of NVIDIA's dnf repository in `folder`, as createrepo_c lays it out: repodata/repomd.xml (with
    its detached signature) listing primary.xml.gz by sha256, each package's sha256 and requires in primary, the
    `.repo` file naming the signing key at the origin, and the key. `rpms`: (name, version-release, requires, bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    packages = []
    for name, evr, requires, body in rpms:
        ver, rel = evr.rsplit("-", 1)
        filename = f"{name}-{evr}.x86_64.rpm"
        (folder / filename).write_bytes(body)
        entries = "".join(f'<rpm:entry name="{r}"/>' for r in requires)
        packages.append(
            f'<package type="rpm"><name>{name}</name><arch>x86_64</arch><version epoch="3" ver="{ver}" rel="{rel}"/>'
            f'<checksum type="sha256" pkgid="YES">{hashlib.sha256(body).hexdigest()}</checksum>'
            f'<location href="{filename}"/><format><rpm:provides><rpm:entry name="{name}"/></rpm:provides>'
            f"<rpm:requires>{entries}</rpm:requires></format></package>")
    primary = gzip.compress(('<?xml version="1.0" encoding="UTF-8"?>\n<metadata xmlns="http://linux.duke.edu/metadata/'
                             'common" xmlns:rpm="http://linux.duke.edu/metadata/rpm" '
                             f'packages="{len(packages)}">{"".join(packages)}</metadata>\n').encode(), mtime=0)
    (folder / "repodata").mkdir(exist_ok=True)
    name = f"repodata/{hashlib.sha256(primary).hexdigest()}-primary.xml.gz"
    (folder / name).write_bytes(primary)
    repomd = ('<?xml version="1.0" encoding="UTF-8"?>\n<repomd xmlns="http://linux.duke.edu/metadata/repo">'
              f'<data type="primary"><checksum type="sha256">{hashlib.sha256(primary).hexdigest()}</checksum>'
              f'<location href="{name}"/></data></repomd>\n')
    (folder / "repodata/repomd.xml").write_text(repomd)
    (folder / "repodata/repomd.xml.asc").write_text(subprocess.run(
        ["gpg", "--batch", "--armor", "--detach-sign"], input=repomd, text=True, check=True, capture_output=True,
        env={"GNUPGHOME": str(signer.home), "PATH": "/usr/bin:/bin"}).stdout)
    base = f"{DEFAULTS.nvidia}/{repo}/x86_64"
    (folder / f"cuda-{repo}.repo").write_text(f"[cuda-{repo}-x86_64]\nname=cuda-{repo}-x86_64\nbaseurl={base}\n"
                                              f"enabled=1\ngpgcheck=1\ngpgkey={base}/D42D0685.pub\n")
    (folder / "D42D0685.pub").write_bytes(signer.public)


def python_release(root: Path, python: str, arch: str = "x86_64", body: bytes = b"cpython build",
                   served_as: bytes | None = None) -> tuple[str, str]:
    """A python-build-standalone release folder under `root` (data/sources.yaml's release): its SHA256SUMS, as the
    release publishes it, listing an older and a newer patch of `python` for `arch` (the newer one is the build),
    another CPU's and an `install_only` (unstripped) one; the newer build served with `served_as` when given. The
    build's file name and sha256."""
    from gpuprov.resources import load_data

    release = str(load_data("sources.yaml")["python_builds"]["release"])
    folder = root / release
    folder.mkdir(parents=True, exist_ok=True)
    names = {f"cpython-{python}.3+{release}-{arch}-unknown-linux-gnu-install_only_stripped.tar.gz": b"older",
             f"cpython-{python}.14+{release}-{arch}-unknown-linux-gnu-install_only_stripped.tar.gz": body,
             f"cpython-{python}.14+{release}-{arch}-unknown-linux-gnu-install_only.tar.gz": b"unstripped",
             f"cpython-{python}.14+{release}-riscv64-unknown-linux-gnu-install_only_stripped.tar.gz": b"riscv"}
    for name, data in names.items():
        (folder / name).write_bytes(data)
    (folder / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in names.items()))
    build = f"cpython-{python}.14+{release}-{arch}-unknown-linux-gnu-install_only_stripped.tar.gz"
    if served_as is not None:
        (folder / build).write_bytes(served_as)
    return build, hashlib.sha256(body).hexdigest()
