"""`gpuprov bundle --offline`: download what a plan needs into a folder, on a connected machine, for a host with no
route out (plan/offline.py says what a plan needs and what the folder holds).

- NVIDIA's packages: the repository's signed index is copied whole (apt: InRelease, Release, Release.gpg and the
  Packages file the Release lists; dnf: repomd.xml, its signature where there is one, and every file it lists; the
  `.repo` must say gpgcheck=1, as dnf then checks each package's own signature), each file checked against the
  sha256 the index above it gives. The plan's packages and their dependencies are resolved against that
  index (a dependency NVIDIA's repository does not carry is the OS's: named in the summary, not bundled), and each
  package is downloaded and checked against the index's sha256. On the host, apt or dnf check the index's
  signature against NVIDIA's key, so neither a mirror nor the bundle can change what is installed.
- The wheels: `pip download` with the target's platform and Python (`--platform`, `--python-version`,
  `--only-binary=:all:`), from the map's torch and pypi indexes; pip checks each wheel against the index's sha256.
  Where a wheel lock fits the plan (`facts refresh` made it from the origin index; plan/wheel_lock.py), torch's
  closure is downloaded exactly as locked, `--require-hashes -r LOCK --no-deps` from the map's torch index: a
  mirror that serves a changed wheel (its own index listing the changed file's sha256) is refused naming the wheel
  and the index, and the lock goes into the bundle (wheel-lock.txt, named in the manifest) for the host's pip.
- Miniforge's pinned release, checked against its pinned sha256; uv comes as its own wheel (its installer script
  would download it from GitHub), with the others.
- A uv env's Python: python-build-standalone's CPython build of the plan's Python for the target's CPU, from the
  release data/sources.yaml pins (`python_builds`), as uv names it (`install_only_stripped`), checked against the
  sha256 the release's own SHA256SUMS gives. Read from UV_PYTHON_INSTALL_MIRROR when set (uv's own variable, a
  mirror of the releases), else from GitHub.
"""

from __future__ import annotations

import configparser
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.files import write_atomic
from gpuprov.plan import offline
from gpuprov.plan.offline import Item, Manifest, Need
from gpuprov.plan.plan import Plan
from gpuprov.plan.wheel_lock import WheelLock
from gpuprov.sources.http import SourceUnreachable, save
from gpuprov.sources.wheel_lock import platforms

Say = Callable[[str], None]

# pip's --platform tags a Linux wheel of the architecture may carry (PEP 600 and the older manylinux names)
PLATFORMS = {arch: (f"manylinux_2_28_{arch}", f"manylinux_2_17_{arch}", f"manylinux2014_{arch}", f"linux_{arch}")
             for arch in ("x86_64", "aarch64")}


class Changed(GpuprovError):
    """A downloaded file whose sha256 is not the one its index (or gpuprov's pin) gives: refused, nothing kept."""


@dataclass
class Result:
    manifest: Manifest
    from_os: list[str] = field(default_factory=list)  # what the OS provides: NVIDIA's packages' other dependencies,
    # and the running kernel's headers, which their step installs with the OS's own package manager


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as held:
        while chunk := held.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _download(url: str, dest: Path, want: str | None = None, previous: Path | None = None) -> tuple[str, int]:
    """`url` into `dest` (written whole or not at all); its sha256 and size. `want`: the sha256 it must have;
    `previous`: where an earlier bundle kept it, used instead when it has that sha256 (a rerun downloads only what
    changed)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if want is not None and previous is not None and previous.is_file() and _sha256(previous) == want.lower():
        if previous != dest:
            shutil.copy2(previous, dest)
        return want.lower(), dest.stat().st_size
    tmp = dest.with_name(dest.name + ".part")
    try:
        with tmp.open("wb") as out:
            sha, size = save(url, out)
    except SourceUnreachable:
        tmp.unlink(missing_ok=True)
        raise
    except OSError as exc:  # the part file itself could not be made: said with the URL, as a failed fetch is
        tmp.unlink(missing_ok=True)
        raise SourceUnreachable(url, str(exc) or type(exc).__name__) from None
    if want is not None and sha != want.lower():
        tmp.unlink(missing_ok=True)
        raise Changed(f"{url}: sha256 {sha}, but its index says {want.lower()}: the source serves a changed file; "
                      "nothing of it was kept")
    tmp.replace(dest)
    return sha, size


def _optional(url: str, dest: Path) -> tuple[str, int] | None:
    try:
        return _download(url, dest)
    except SourceUnreachable as exc:
        if exc.status == 404:
            return None
        raise


# ---- NVIDIA's signing key: the one thing a repository's index cannot vouch for, checked here against the pins

def fingerprints(key: bytes) -> list[str]:
    """The primary keys' fingerprints of an OpenPGP key file, as gpg reads them (the steps' gp_pinned_key)."""
    if shutil.which("gpg") is None:
        raise GpuprovError("gpg is needed here to check NVIDIA's signing key before it goes into a bundle; install "
                           "it (gnupg)")
    with tempfile.TemporaryDirectory() as home:
        path = Path(home) / "key"
        path.write_bytes(key)
        shown = subprocess.run(["gpg", "--homedir", home, "--batch", "--show-keys", "--with-colons", str(path)],
                               capture_output=True, text=True, check=False)
    out, primary = [], False
    for line in shown.stdout.splitlines():
        fields = line.split(":")
        if fields[0] == "fpr" and primary:
            out.append(fields[9].upper())
        primary = fields[0] == "pub"
    return out


def check_key(key: bytes, source: str, pinned: tuple[str, ...]) -> None:
    got = fingerprints(key)
    if not got:
        raise Changed(f"{source} served no signing key gpg can read: refused (NVIDIA's are {' '.join(pinned)})")
    for fpr in got:
        if fpr not in pinned:
            raise Changed(f"{source} served the signing key {fpr}, not NVIDIA's ({' '.join(pinned)}): refused, "
                          "nothing was bundled")


def keyring_keys(deb: Path) -> list[bytes]:
    """The key files a keyring .deb installs under usr/share/keyrings (an ar archive holding data.tar.*)."""
    import io
    import tarfile

    blob = deb.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise Changed(f"{deb.name} is not a .deb")
    pos, keys = 8, []
    while pos + 60 <= len(blob):
        name, size = blob[pos:pos + 16].decode().strip().rstrip("/"), int(blob[pos + 48:pos + 58].decode().strip())
        body = blob[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)
        if name.startswith("data.tar"):
            try:
                with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                    for member in tar.getmembers():
                        if member.isfile() and re.fullmatch(r"(\./)?usr/share/keyrings/[^/]+\.gpg", member.name):
                            keys.append(tar.extractfile(member).read())  # type: ignore[union-attr]
            except tarfile.TarError as exc:
                raise Changed(f"{deb.name}: cannot read its {name}: {exc}") from None
    return keys


# ---- apt: a flat repository (NVIDIA's: `deb … {base}/{repo}/{arch}/ /`)

@dataclass(frozen=True)
class Deb:
    name: str
    version: str
    filename: str
    sha256: str
    depends: tuple[tuple[str, ...], ...]  # each dependency's alternatives, by name
    provides: tuple[str, ...]


def _fields(block: str) -> dict[str, str]:
    out: dict[str, str] = {}
    key = ""
    for line in block.splitlines():
        if line[:1] in (" ", "\t") and key:
            out[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            out[key.strip()] = value.strip()
    return out


def _names(relation: str) -> tuple[tuple[str, ...], ...]:
    """`a (>= 1) | b, c:any` -> (('a', 'b'), ('c',))."""
    return tuple(tuple(re.split(r"[\s(:]", alt.strip(), maxsplit=1)[0] for alt in dep.split("|") if alt.strip())
                 for dep in relation.split(",") if dep.strip())


def parse_debs(text: str) -> list[Deb]:
    out = []
    for block in re.split(r"\n[ \t]*\n", text):
        f = _fields(block)
        if "Package" in f and "Filename" in f and "SHA256" in f:
            depends = _names(", ".join(x for x in (f.get("Pre-Depends", ""), f.get("Depends", "")) if x))
            provides = tuple(p[0] for p in _names(f.get("Provides", "")))
            out.append(Deb(f["Package"], f.get("Version", ""), f["Filename"], f["SHA256"], depends, provides))
    return out


def release_sums(text: str) -> dict[str, tuple[str, int]]:
    """The SHA256 section of a Release (or InRelease) file: path -> (sha256, size)."""
    out: dict[str, tuple[str, int]] = {}
    section = ""
    for line in text.splitlines():
        if line and line[0] not in " \t":
            section = line.split(":", 1)[0]
        elif section == "SHA256" and len(parts := line.split()) == 3:
            out[parts[2]] = (parts[0].lower(), int(parts[1]))
    return out


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def _pick(candidates: list[Deb], branch: int | None) -> Deb:
    """The newest candidate, within the driver's branch where the package has versions of it (the pinning package
    keeps apt there, so the bundle carries what apt will choose)."""
    if branch is not None:
        of_branch = [d for d in candidates if d.version.split(":")[-1].startswith(f"{branch}.")]
        candidates = of_branch or candidates
    return max(candidates, key=lambda d: _version_key(d.version))


def resolve_debs(debs: list[Deb], wanted: Iterable[str], branch: int | None) -> tuple[list[Deb], list[str], list[str]]:
    """The packages `wanted` needs from this index, dependencies included; the names it lacks of `wanted`; the
    dependencies it does not carry (the OS's)."""
    by_name: dict[str, list[Deb]] = {}
    for d in debs:
        for name in (d.name, *d.provides):
            by_name.setdefault(name, []).append(d)
    chosen: dict[str, Deb] = {}
    lacking: list[str] = []
    from_os: set[str] = set()
    queue = list(wanted)
    first = set(queue)
    while queue:
        name = queue.pop(0)
        if name not in by_name:
            (lacking if name in first else []).append(name)
            continue
        deb = _pick(by_name[name], branch)
        if deb.name in chosen:
            continue
        chosen[deb.name] = deb
        for alternatives in deb.depends:
            here = next((a for a in alternatives if a in by_name), None)
            if here is None:
                from_os.add(" | ".join(alternatives))
            elif here not in chosen:
                queue.append(here)
    return list(chosen.values()), lacking, sorted(from_os)


def _apt(base: str, folder: Path, kept: Path, rel: str, wanted: list[str], branch: int | None,
         pinned: tuple[str, ...], say: Say, items: list[Item]) -> list[str]:
    signed = [name for name in ("InRelease", "Release.gpg") if _optional(f"{base}/{name}", folder / name)]
    release = _optional(f"{base}/Release", folder / "Release")
    if not signed:
        raise Changed(f"{base}: no InRelease or Release.gpg: the repository's index is not signed, so apt on the "
                      "host could not check it; nothing was bundled")
    # the signed text, as apt on the host reads it: InRelease where there is one
    text = (folder / ("InRelease" if "InRelease" in signed or not release else "Release")).read_text(errors="replace")
    sums = release_sums(text)
    packages_path = next((p for p in ("Packages.gz", "Packages", "./Packages.gz", "./Packages") if p in sums), None)
    if packages_path is None:
        raise Changed(f"{base}: its Release lists no Packages file with a sha256")
    name = packages_path.removeprefix("./")
    sha, size = _download(f"{base}/{name}", folder / name, sums[packages_path][0])
    for index in (*signed, *(("Release",) if release else ()), name):
        items.append(Item(kind="index", name=index, path=f"{rel}/{index}", source=f"{base}/{index}",
                          sha256=_sha256(folder / index),
                          size=(folder / index).stat().st_size))
    body = (folder / name).read_bytes()
    debs = parse_debs((gzip.decompress(body) if name.endswith(".gz") else body).decode("utf-8", "replace"))
    chosen, lacking, from_os = resolve_debs(debs, wanted, branch)
    if lacking:
        raise UserInputError("--gpu", f"NVIDIA's repository at {base} has no {', '.join(lacking)}, which the plan "
                             "installs; nothing was bundled", "pick a driver or toolkit that repository carries")
    keys: list[bytes] = []
    for deb in chosen:
        path = deb.filename.removeprefix("./")
        say(f"  {deb.name} {deb.version}")
        sha, size = _download(f"{base}/{path}", folder / path, deb.sha256, kept / path)
        if deb.name == "cuda-keyring":  # the key apt will check the index against must be NVIDIA's own
            keys = keyring_keys(folder / path)
            if not keys:
                raise Changed(f"{base}/{path} holds no key under usr/share/keyrings: refused, nothing was bundled")
            for key in keys:
                check_key(key, f"{base}/{path}", pinned)
        items.append(Item(kind="package", name=deb.name, version=deb.version, path=f"{rel}/{path}", sha256=sha,
                          size=size, source=f"{base}/{path}"))
    if keys:  # the index's signature now, as apt will check it on the host: a forged one is refused here
        _verify_index(folder, "InRelease" if "InRelease" in signed else "Release.gpg", keys, base)
    return from_os


def _verify_index(folder: Path, signature: str, keys: list[bytes], base: str) -> None:
    """gpgv of the copied index (InRelease, or Release.gpg over Release) against the keyring's checked keys."""
    if shutil.which("gpgv") is None:
        raise GpuprovError("gpgv is needed here to check NVIDIA's signed index before it goes into a bundle; install "
                           "it (gnupg)")
    with tempfile.TemporaryDirectory() as home:
        keyring = Path(home) / "keyring.gpg"
        keyring.write_bytes(b"".join(keys))
        files = [folder / "InRelease"] if signature == "InRelease" else [folder / "Release.gpg", folder / "Release"]
        done = subprocess.run(["gpgv", "--homedir", home, "--keyring", str(keyring), *map(str, files)],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Changed(f"{base}/{signature}: not signed by the cuda-keyring's key (NVIDIA's): refused, nothing was "
                      f"bundled ({(done.stderr.strip().splitlines() or ['gpgv failed'])[-1]})")


# ---- dnf: repodata/repomd.xml and the files it lists

_NS = {"repo": "http://linux.duke.edu/metadata/repo", "common": "http://linux.duke.edu/metadata/common",
       "rpm": "http://linux.duke.edu/metadata/rpm"}


def _dnf(base: str, folder: Path, kept: Path, rel: str, repo: str, wanted: list[str], branch: int | None,
         pinned: tuple[str, ...], say: Say, items: list[Item]) -> list[str]:
    def keep(name: str, sha: str, size: int, kind: offline.Kind = "index", version: str = "") -> None:
        items.append(Item(kind=kind, name=name.rsplit("/", 1)[-1], version=version, path=f"{rel}/{name}",
                          sha256=sha, size=size, source=f"{base}/{name}"))

    keep("repodata/repomd.xml", *_download(f"{base}/repodata/repomd.xml", folder / "repodata/repomd.xml"))
    # dnf checks each package's own signature against the .repo's gpgkey (gpgcheck=1): that is what keeps a bundle
    # from changing what is installed; the index's signature, where the repository publishes one, comes too
    if signature := _optional(f"{base}/repodata/repomd.xml.asc", folder / "repodata/repomd.xml.asc"):
        keep("repodata/repomd.xml.asc", *signature)
    repo_file = f"cuda-{repo}.repo"
    keep(repo_file, *_download(f"{base}/{repo_file}", folder / repo_file))
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string((folder / repo_file).read_text())
    unchecked = [s for s in parser.sections() if parser[s].get("gpgcheck", "0").strip() != "1"
                 or not parser[s].get("gpgkey", "").strip()]
    if unchecked:
        raise Changed(f"{base}/{repo_file}: {', '.join(unchecked)} has no gpgcheck=1 with a gpgkey, so dnf would "
                      "install its packages unchecked: refused, nothing was bundled")
    for section in parser.sections():
        for key_url in parser[section].get("gpgkey", "").split():
            key_name = key_url.rsplit("/", 1)[-1]
            keep(key_name, *_download(f"{base}/{key_name}", folder / key_name))
            check_key((folder / key_name).read_bytes(), f"{base}/{key_name}", pinned)
    root = ET.parse(folder / "repodata/repomd.xml").getroot()
    primary: Path | None = None
    for data in root.findall("repo:data", _NS):
        href = data.find("repo:location", _NS).get("href", "")  # type: ignore[union-attr]
        want = data.findtext("repo:checksum", "", _NS)
        keep(href, *_download(f"{base}/{href}", folder / href, want or None))
        if data.get("type") == "primary":
            primary = folder / href
    if primary is None:
        raise Changed(f"{base}: repomd.xml lists no primary metadata")
    body = primary.read_bytes()
    tree = ET.fromstring(gzip.decompress(body) if primary.name.endswith(".gz") else body)
    debs = []
    for pkg in tree.findall("common:package", _NS):
        ver = pkg.find("common:version", _NS)
        version = f"{ver.get('ver')}-{ver.get('rel')}" if ver is not None else ""
        fmt = pkg.find("common:format", _NS)
        requires = tuple((e.get("name", ""),) for e in (fmt.findall("rpm:requires/rpm:entry", _NS) if fmt is not None else ()))
        provides = tuple(e.get("name", "") for e in (fmt.findall("rpm:provides/rpm:entry", _NS) if fmt is not None else ()))
        location = pkg.find("common:location", _NS)
        debs.append(Deb(pkg.findtext("common:name", "", _NS), version,
                        location.get("href", "") if location is not None else "",
                        pkg.findtext("common:checksum", "", _NS), requires, provides))
    chosen, lacking, from_os = resolve_debs(debs, wanted, branch)
    if lacking:
        raise UserInputError("--gpu", f"NVIDIA's repository at {base} has no {', '.join(lacking)}, which the plan "
                             "installs; nothing was bundled", "pick a driver or toolkit that repository carries")
    for rpm in chosen:
        say(f"  {rpm.name} {rpm.version}")
        keep(rpm.filename, *_download(f"{base}/{rpm.filename}", folder / rpm.filename, rpm.sha256,
                                      kept / rpm.filename), kind="package",
             version=rpm.version)
        items[-1] = items[-1].model_copy(update={"name": rpm.name})
    return from_os


# ---- wheels and installers

# what pip is told from outside that would change which wheels a bundle holds: the sources map decides that
PIP_CHOICES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONSTRAINT",
               "PIP_REQUIREMENT", "PIP_ONLY_BINARY", "PIP_NO_BINARY", "PIP_PRE", "PIP_PLATFORM", "PIP_PYTHON_VERSION")


def _pip_env() -> dict[str, str]:
    """This process's environment for pip, less what chooses wheels (PIP_CHOICES, and the configuration files,
    which can set the same); how it reaches an index (a proxy, PIP_CERT, timeouts) stays."""
    env = {k: v for k, v in os.environ.items() if k not in PIP_CHOICES}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all
    return env


def _pip(argv: list[str], plan: Plan) -> subprocess.CompletedProcess[str]:
    for host in plan.sources.plain_http_hosts:
        argv = [*argv, "--trusted-host", host]
    return subprocess.run(argv, capture_output=True, text=True, check=False, env=_pip_env())


def _pip_download(python: str, dest: Path, platforms: Iterable[str]) -> list[str]:
    """`pip download` of binary wheels for CPython `python` on these platforms into `dest`, this process's pip."""
    return [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "--dest", str(dest),
            "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
            *(a for tag in platforms for a in ("--platform", tag))]


def _pip_failed(done: subprocess.CompletedProcess[str], indexes: list[str]) -> GpuprovError:
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return GpuprovError(f"pip download ({' '.join(indexes)}) failed: {last}")


# pip's table of wheels whose bytes are not the hash asked: "    NAME==VERSION from URL:" under its heading
_NOT_THE_HASH = re.compile(r"^ *(\S+==\S+) from .*:$", re.MULTILINE)


def _locked(plan: Plan, lock: WheelLock, stage: Path, say: Say) -> None:
    """Exactly the lock's wheels (torch's closure), in pip's hash-checking mode, from the map's torch index as the
    torch step installs them: a wheel whose sha256 is not the lock's (the origin's) is refused naming it and the
    index."""
    assert plan.stack is not None and plan.stack.torch is not None
    index = plan.stack.torch.index_url  # already on the map's torch source (plan.with_sources)
    requirements = stage / offline.LOCK_FILE
    requirements.write_text(lock.requirements())
    say(f"wheels pinned by {lock.short}, from {index}")
    done = _pip([*_pip_download(lock.python, stage, platforms(lock.arch)), "--no-deps", "--require-hashes",
                 "-r", str(requirements), "--index-url", index], plan)
    requirements.unlink()
    if done.returncode != 0:
        said = done.stderr + done.stdout
        if "DO NOT MATCH THE HASHES" in said:
            wheel = (m.group(1) if (m := _NOT_THE_HASH.search(said)) else "a wheel")
            raise Changed(f"{index} served {wheel} with a sha256 other than the lock's ({lock.short}, the "
                          "origin's): refused, no wheel was kept")
        raise _pip_failed(done, ["--index-url", index])


def _wheels(plan: Plan, specs: list[Need], out: Path, say: Say, items: list[Item]) -> WheelLock | None:
    """The wheels into wheels/, replaced whole once every one is in (a refusal leaves the earlier ones as they
    were): where a lock fits the plan (plan.stack.torch.lock), torch's closure exactly as locked (_locked), then
    one `pip download` of the rest with the locked versions as constraints; else one `pip download` of every
    wheel, so the torch the other packages depend on is the plan's build: the PyTorch index first (its local
    versions, +cu132, rank above PyPI's), PyPI for the rest. The lock the wheels were pinned by, or None."""
    python = offline.served(plan).python or "3.12"
    wheel = plan.stack.torch if plan.stack else plan.cpu_torch
    has_torch = wheel is not None and any(n.name == "torch" for n in specs)
    lock = plan.stack.torch.lock if has_torch and plan.stack is not None and plan.stack.torch is not None else None
    torch_index = plan.sources.rebase(wheel.index_url) if wheel is not None and has_torch else None
    indexes = ["--index-url", torch_index, "--extra-index-url", plan.sources.pypi] if torch_index else \
        ["--index-url", plan.sources.pypi]
    dest = out / "wheels"
    say(f"wheels for Python {python} on {plan.arch}: {' '.join(n.spec for n in specs)}")
    with tempfile.TemporaryDirectory(dir=out, prefix=".wheels-") as work:
        stage = Path(work)
        previous = {p.name: p for p in dest.glob("*.whl")} if dest.is_dir() else {}
        for name, path in previous.items():  # pip takes a file already in --dest as downloaded (locked: if it
            try:                            # has the lock's sha256), so a rerun downloads only what changed
                os.link(path, stage / name)
            except OSError:
                shutil.copy2(path, stage / name)
        saved: set[str] = set()
        if lock is not None:
            _locked(plan, lock, stage, say)
            saved = {_wheel_file(stage, w.name, w.version) for w in lock.wheels}
            specs = [n for n in specs if n.name != "torch"]
        if specs:
            argv = _pip_download(python, stage, PLATFORMS[plan.arch]) + indexes + [n.spec for n in specs]
            if lock is not None:  # the rest takes the locked wheels, not the index's newest of them
                constraints = stage / "locked-constraints.txt"
                constraints.write_text("".join(f"{w.name}=={w.version}\n" for w in lock.wheels))
                argv += ["-c", str(constraints), "--find-links", str(stage)]
            done = _pip(argv, plan)
            if done.returncode != 0:
                raise _pip_failed(done, indexes)
            took = _saved(done.stdout, stage)
            if not took:  # a pip that says it otherwise: better no bundle than one without its wheels
                raise GpuprovError(f"pip download ({' '.join(indexes)}) named no wheel it saved: {done.stdout[-300:]}")
            saved |= took
        for path in stage.iterdir():  # what this plan does not take: an earlier bundle's, the constraints
            if path.name not in saved:
                path.unlink()
        stage.chmod(0o755)
        if dest.exists():
            shutil.rmtree(dest)
        stage.rename(dest)
        stage.mkdir()  # for TemporaryDirectory's own clean-up
    for wheel_path in sorted(dest.glob("*.whl")):
        name, version = wheel_path.name.split("-")[:2]
        items.append(Item(kind="wheel", name=offline.normal(name), version=version, path=f"wheels/{wheel_path.name}",
                          sha256=_sha256(wheel_path), size=wheel_path.stat().st_size,
                          source=torch_index if torch_index and "+" in version else plan.sources.pypi))
    return lock


def _wheel_file(stage: Path, name: str, version: str) -> str:
    """The file pip saved for a locked wheel (a wheel's file name spells its project with underscores)."""
    project = re.sub(r"[-_.]+", "_", name).lower()
    for path in stage.glob("*.whl"):
        got, have = path.name.split("-")[:2]
        if re.sub(r"[-_.]+", "_", got).lower() == project and have == version:
            return path.name
    raise GpuprovError(f"pip download left no wheel of {name}=={version}, which the lock pins")


def _saved(stdout: str, stage: Path) -> set[str]:
    """The files pip says it took: "Saved PATH" or "File was already downloaded PATH"."""
    return {Path(m.group(1)).name for m in re.finditer(r"^\s*(?:Saved|File was already downloaded) (.+\.whl)$",
                                                       stdout, re.MULTILINE) if (stage / Path(m.group(1)).name).is_file()}


def _miniforge(plan: Plan, out: Path, say: Say, items: list[Item]) -> None:
    pin = plan.sources.installers["miniforge"]
    name = f"Miniforge3-{pin.version}-Linux-{plan.arch}.sh"
    url = f"{plan.sources.miniforge}/{pin.version}/{name}"
    say(f"Miniforge {pin.version} ({url})")
    dest = out / "installers" / pin.version / name
    sha, size = _download(url, dest, pin.sha256[plan.arch], dest)
    items.append(Item(kind="installer", name="miniforge", version=pin.version,
                      path=f"installers/{pin.version}/{name}", sha256=sha, size=size, source=url))


PYTHON_BUILDS = "https://github.com/astral-sh/python-build-standalone/releases/download"


def _python(plan: Plan, python: str, out: Path, say: Say, items: list[Item]) -> None:
    """The CPython build uv installs for `python` on the target's CPU, into python/{release}/ as the release names it
    (uv reads a mirror's folder by the release's own paths)."""
    from gpuprov.resources import load_data

    release = str(load_data("sources.yaml")["python_builds"]["release"])
    base = (os.environ.get("UV_PYTHON_INSTALL_MIRROR") or PYTHON_BUILDS).rstrip("/")
    sums_url = f"{base}/{release}/SHA256SUMS"
    folder = out / "python" / release
    _download(sums_url, folder / "SHA256SUMS")
    pattern = re.compile(rf"cpython-{re.escape(python)}\.(\d+)\+{release}-{plan.arch}-unknown-linux-gnu-"
                         r"install_only_stripped\.tar\.gz")
    builds = {}
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        sha, _, name = line.strip().partition("  ")
        if (match := pattern.fullmatch(name.lstrip("*"))) and re.fullmatch(r"[0-9a-f]{64}", sha):
            builds[int(match.group(1))] = (name.lstrip("*"), sha)
    (folder / "SHA256SUMS").unlink()
    if not builds:
        raise GpuprovError(f"{sums_url} lists no CPython {python} build for {plan.arch} Linux: the plan's Python "
                           "cannot be bundled (plan with a --python that release has)")
    name, sha = builds[max(builds)]
    url = f"{base}/{release}/{name.replace('+', '%2B')}"
    say(f"Python {python}: {name} ({base}/{release})")
    got, size = _download(url, folder / name, sha, folder / name)
    items.append(Item(kind="python", name="cpython", version=name.split("-")[1].split("+")[0],
                      path=f"python/{release}/{name}", sha256=got, size=size, source=url))


def make(plan: Plan, out: Path, say: Say) -> Result:
    """Download everything `plan` needs into `out` and write its manifest there; the manifest and what NVIDIA's
    repository left to the OS."""
    unbundled = offline.unbundled(plan)
    if unbundled:  # refused now, not when the bundle reaches a host that cannot use it
        raise UserInputError("bundle --offline", f"{'; '.join(unbundled)}; nothing was downloaded")
    out.mkdir(parents=True, exist_ok=True)
    # the folder is no bundle until this run's manifest is written: a refusal or a cut leaves none to install from
    (out / offline.MANIFEST).unlink(missing_ok=True)
    needs = offline.needs(plan)
    served = offline.served(plan)
    items: list[Item] = []
    from_os: list[str] = []
    packages = [n.spec for n in needs if n.kind == "package"]
    stack = plan.stack
    if packages and stack is not None and served.repo:
        base = f"{plan.sources.nvidia}/{stack.repo}/{stack.repo_arch}"
        say(f"NVIDIA's {stack.repo}/{stack.repo_arch} repository ({base}): {' '.join(packages)} and their dependencies")
        branch = stack.driver_branch
        pinned = plan.sources.keys["nvidia"]
        with tempfile.TemporaryDirectory(dir=out) as work:  # a failed download leaves the folder as it was
            staged: list[Item] = []
            target = out / served.repo
            if stack.family == "apt":
                from_os = _apt(base, Path(work), target, served.repo, packages, branch, pinned, say, staged)
            else:
                from_os = _dnf(base, Path(work), target, served.repo, stack.repo, packages, branch, pinned, say,
                               staged)
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            Path(work).chmod(0o755)  # a temporary folder is its owner's only; apt reads the copy as its own user
            Path(work).rename(target)
            Path(work).mkdir()  # for TemporaryDirectory's own clean-up
            items += staged
    if any(need.kind == "installer" for need in needs):
        _miniforge(plan, out, say, items)
    wheels = [n for n in needs if n.kind == "wheel"]
    lock = _wheels(plan, wheels, out, say, items) if wheels else None
    if lock is not None:  # the lock beside the wheels, as the torch step reads it on the host
        write_atomic(out / offline.LOCK_FILE, lock.requirements(), 0o644)
        items.append(Item(kind="lock", name="wheels", version=lock.torch_version, path=offline.LOCK_FILE,
                          sha256=_sha256(out / offline.LOCK_FILE), size=(out / offline.LOCK_FILE).stat().st_size,
                          source=lock.index))
    else:
        (out / offline.LOCK_FILE).unlink(missing_ok=True)
    env = plan.playbook.env
    if env is not None and env.manager == "uv" and served.python and any(s.name == "python-env" for s in plan.steps):
        _python(plan, served.python, out, say, items)  # for a host without the plan's Python
    if stack is not None and any(s.name == "kernel-headers" for s in plan.steps):  # a host without them cannot
        # build the driver, and no bundle holds a kernel's: said now, on the machine that still has a network
        headers = "kernel-devel and kernel-headers" if stack.family == "dnf" else "linux-headers"
        from_os = [*from_os, f"{headers} for the host's running kernel (step kernel-headers)"]
    manifest = Manifest(plan=served, items=tuple(items), lock=lock)
    write_atomic(out / offline.MANIFEST, manifest.model_dump_json(indent=2) + "\n", 0o644)
    return Result(manifest, from_os)
