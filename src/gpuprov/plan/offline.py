"""An offline bundle: what a plan downloads, gathered beforehand on a connected machine (`gpuprov bundle --offline`)
so that a host with no route out installs from it (`bootstrap HOST --offline DIR`). Pure: what a plan needs, the
manifest's model, and the check of one against the other.

A bundle is a folder:

    manifest.json                 this model: the plan it serves, and each file with its sha256 and where it came from
    nvidia/{repo}/{arch}/         NVIDIA's repository as the plan reads it: the signed index (InRelease or
                                  Release + Release.gpg, Packages) copied whole, and the packages the plan installs
                                  with their dependencies (dnf: repodata/ and the rpms)
    wheels/                       the wheels for the target's Python and platform (pip download)
    wheel-lock.txt                where a wheel lock fits the plan (plan/wheel_lock.py): torch's closure pinned by
                                  version and sha256 as the origin index lists them, as a requirements file
    installers/                   the pinned Miniforge release (uv comes as its wheel)
    python/{release}/             the plan's CPython from python-build-standalone (a uv env), as the release names it,
                                  for a host without that Python: uv installs it from there (UV_PYTHON_INSTALL_MIRROR)

On the host the folder is OFFLINE_DIR, and the plan's sources map points `nvidia` at it (`file://`): the driver step
installs NVIDIA's cuda-keyring from it, and apt or dnf read the repository there as they read NVIDIA's own, checking
the copied signed index against NVIDIA's signing key. So a bundle, like a mirror, cannot change what is installed: a
package whose bytes differ from the signed index's sha256 is refused by apt or dnf on the host. Python's installs run
with `--no-index --find-links` on wheels/ (PIP_NO_INDEX, UV_NO_INDEX), so nothing is fetched from an index. Where
the bundle was made with a wheel lock, `bundle` downloaded exactly the locked wheels in pip's hash-checking mode, the
manifest names the lock (which, read from where and when), and the torch step installs them with `--require-hashes
-r wheel-lock.txt`: a wheel changed in the bundle after it was made is refused by pip on the host, as a mirror's is.

`check` refuses a plan that needs what the bundle lacks, naming each missing item, before anything is pushed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuprov.errors import UserInputError
from gpuprov.plan.sources import Effective
from gpuprov.plan.wheel_lock import WheelLock

if TYPE_CHECKING:
    from gpuprov.plan.plan import Plan

MANIFEST = "manifest.json"
FORMAT = 1
OFFLINE_DIR = "/var/lib/gpuprov/offline"  # where bootstrap --offline puts the bundle on a host
LOCK_FILE = "wheel-lock.txt"  # the wheel lock's requirements file, in the bundle's folder

Kind = Literal["package", "index", "wheel", "installer", "python", "lock"]


class Item(BaseModel):
    """One file of the bundle."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Kind
    name: str  # a package's or wheel's project name, an index's file name, an installer's key (uv, miniforge), cpython
    version: str = ""
    path: str  # relative to the bundle's folder
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = 0
    source: str  # the URL it was downloaded from


class Served(BaseModel):
    """The plan a bundle was made for: what `check` compares a host's plan with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    os: str
    arch: str
    gpu: str | None
    playbook: str
    python: str | None
    family: Literal["apt", "dnf"] | None
    repo: str | None  # nvidia/{repo}/{arch}: NVIDIA's repository folder inside the bundle; None: no GPU stack
    summary: dict[str, object] = {}


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: int = FORMAT
    plan: Served
    items: tuple[Item, ...] = ()
    lock: WheelLock | None = None  # the lock the wheels were downloaded by (its file: LOCK_FILE); None: not pinned

    def names(self, kind: Kind) -> set[str]:
        return {normal(i.name) if kind == "wheel" else i.name for i in self.items if i.kind == kind}


@dataclass(frozen=True)
class Need:
    """One thing a plan downloads: a package from NVIDIA's repository, a wheel (a requirement), an installer."""

    kind: Kind
    name: str  # a package name, a project name, an installer's key
    spec: str  # what gets downloaded: the package name, the pip requirement, the installer's key
    step: str  # the step that downloads it


def normal(project: str) -> str:
    """A project's name as PEP 503 compares them (`Jupyter_Lab` is `jupyter-lab`)."""
    import re

    return re.sub(r"[-_.]+", "-", project).lower()


def _project(requirement: str) -> str:
    import re

    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return normal(match.group(1)) if match else normal(requirement)


def needs(plan: Plan) -> tuple[Need, ...]:
    """What the plan's steps download, in step order: NVIDIA's packages (their dependencies are the bundle's to
    resolve), the wheels, the installers."""
    out: list[Need] = []
    names = {s.name for s in plan.steps}
    stack = plan.stack
    if stack is not None and not stack.kept_driver and "nvidia-driver" in names:
        if stack.family == "apt":
            out.append(Need("package", "cuda-keyring", "cuda-keyring", "nvidia-driver"))
        out += [Need("package", p, p, "nvidia-driver") for p in stack.repo_packages
                if p not in (stack.cuda_toolkit_package, stack.fabric_manager_package)]
    if stack is not None and "fabric-manager" in names:
        out.append(Need("package", stack.fabric_manager_package, stack.fabric_manager_package, "fabric-manager"))
    if stack is not None and "cuda-toolkit" in names and stack.cuda_toolkit_package:
        out.append(Need("package", stack.cuda_toolkit_package, stack.cuda_toolkit_package, "cuda-toolkit"))
    env = plan.playbook.env
    if "python-env" in names and env is not None:  # uv comes as its wheel (its installer script downloads it)
        out.append(Need("wheel", "uv", "uv", "python-env") if env.manager == "uv" else
                   Need("installer", "miniforge", "miniforge", "python-env"))
    torch = stack.torch if stack is not None else plan.cpu_torch
    if "pytorch" in names and torch is not None:
        out.append(Need("wheel", "torch", torch.requirement, "pytorch"))
    if "packages" in names and env is not None:
        out += [Need("wheel", _project(r), r, "packages") for r in env.packages]
    if "jupyter" in names:
        out.append(Need("wheel", "jupyterlab", "jupyterlab", "jupyter"))
    return tuple(out)


def served(plan: Plan) -> Served:
    stack = plan.stack
    python = stack.python if stack else next((str(dict(s.extra).get("python")) for s in plan.steps
                                              if s.name == "python-env" and dict(s.extra).get("python")), None)
    return Served(os=plan.request.os, arch=plan.arch, gpu=plan.gpu.name if plan.gpu else None,
                  playbook=plan.playbook.name, python=python, family=stack.family if stack else None,
                  repo=f"nvidia/{stack.repo}/{stack.repo_arch}" if stack and stack.repo else None,
                  summary={k: v for k, v in plan.summary().items() if k in ("gpu", "os", "arch", "playbook", "stack")})


def load(folder: Path, where: str = "--offline") -> Manifest:
    """The bundle's manifest; a folder that is not a bundle is refused naming `where`."""
    path = folder / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserInputError(where, f"{folder}: no {MANIFEST} there, so not a bundle",
                             "make one with `gpuprov bundle --offline … -o DIR` on a connected machine") from None
    except (OSError, ValueError) as exc:
        raise UserInputError(where, f"{path}: cannot read it: {exc}") from None
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserInputError(where, f"{path}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
    if manifest.format != FORMAT:
        raise UserInputError(where, f"{path}: format {manifest.format}; this gpuprov reads format {FORMAT}",
                             "make the bundle again with this gpuprov")
    return manifest


def mismatch(plan: Plan, manifest: Manifest) -> str | None:
    """How the bundle's hosts differ from the plan's (OS, CPU), in words; None when they are the same."""
    want, have = served(plan), manifest.plan
    if (want.os, want.arch) == (have.os, have.arch):
        return None
    return f"the bundle is for {have.os} {have.arch} hosts, the plan for {want.os} {want.arch}"


# steps whose downloads no bundle holds yet: a plan with one of them is refused offline rather than failing there
NOT_BUNDLED = {
    "docker": "Docker's and NVIDIA's container toolkit repositories are not bundled yet (drop --docker)",
    "metrics": "the exporters' packages are not bundled yet (drop --metrics)",
    "data-fetch": "it reads S3, which a host with no network cannot reach",
    "data-save": "it writes to S3, which a host with no network cannot reach",
}


def unbundled(plan: Plan) -> list[str]:
    """The plan's steps whose downloads no bundle holds, each naming the step, why and what to do."""
    out = [f"step {s.name}: {NOT_BUNDLED[s.name]}" for s in plan.steps if s.name in NOT_BUNDLED]
    env = plan.playbook.env
    if env is not None and env.manager == "conda" and any(s.name == "python-env" for s in plan.steps):
        where = (plan.playbook.where("env", "manager") or plan.playbook.where("env")
                 or f"playbook {plan.playbook.name}: env")
        out.append(f"step python-env: a conda env's `conda create` reads conda-forge's channel, which no bundle "
                   f"holds yet (set `manager: uv` in {where})")
    return out


def missing(plan: Plan, manifest: Manifest) -> list[str]:
    """What `plan` needs that the bundle lacks, each naming the item and the step; empty: it serves the plan."""
    out = unbundled(plan)
    for need in needs(plan):
        have = manifest.names(need.kind)
        if (normal(need.name) if need.kind == "wheel" else need.name) not in have:
            out.append(f"{need.kind} {need.spec} (step {need.step})")
    out += _unlocked(plan, manifest)
    repo = served(plan).repo
    indexed = any(i.kind == "index" and i.path.startswith(f"{repo}/") for i in manifest.items)
    if repo and any(n.kind == "package" for n in needs(plan)) and not indexed:
        out.append(f"NVIDIA's signed repository index {repo}/ (step nvidia-driver)")
    return out


def _unlocked(plan: Plan, manifest: Manifest) -> list[str]:
    """Where the bundle's wheels are pinned by a lock: a lock that installs another torch than the plan's, and each
    locked wheel the bundle lacks or holds with another sha256 than its lock's (a bundle changed after it was made)."""
    lock, torch = manifest.lock, plan.stack.torch if plan.stack is not None else None
    if lock is None or torch is None or not any(s.name == "pytorch" for s in plan.steps):
        return []
    python = plan.stack.python if plan.stack is not None else ""
    if not lock.fits(torch.version, torch.variant, python, plan.arch):
        return [f"wheels locked for torch {torch.requirement} {torch.variant}, Python {python}, {plan.arch} "
                f"(the bundle's lock is {lock.short}) (step pytorch)"]
    held = {(normal(i.name), i.version): i.sha256 for i in manifest.items if i.kind == "wheel"}
    out = [f"wheel {w.name}=={w.version} with its lock's sha256 (step pytorch)" for w in lock.wheels
           if held.get((normal(w.name), w.version)) != w.sha256]
    if not any(i.kind == "lock" and i.path == LOCK_FILE for i in manifest.items):
        out.append(f"the wheel lock {LOCK_FILE} (step pytorch)")
    return out


def check(plan: Plan, manifest: Manifest, where: str) -> None:
    """Refuse `plan` when the bundle is for other hosts or lacks anything it needs, naming each missing item;
    nothing is pushed."""
    fix = ("make the bundle for this plan (`gpuprov bundle --offline` with the same --gpu, --os, --arch, -p and "
           "pins)")
    if other := mismatch(plan, manifest):
        raise UserInputError(where, f"{other}; nothing was pushed", fix)
    if gone := missing(plan, manifest):
        raise UserInputError(where, f"the bundle lacks what the plan needs: {'; '.join(gone)}; nothing was pushed",
                             fix)


def offline_sources(effective: Effective, folder: str = OFFLINE_DIR) -> Effective:
    """The map a host with the bundle at `folder` reads: NVIDIA's repository and Miniforge from the bundle's copy
    (`file://`), and no Python index at all (`offline`: the steps install from wheels/, uv included)."""
    urls = {**effective.urls, "nvidia": f"file://{folder}/nvidia", "miniforge": f"file://{folder}/installers"}
    origins = {**effective.origins, **dict.fromkeys(("nvidia", "miniforge"), "--offline")}
    return replace(effective, urls=urls, origins=origins, offline=folder)


def for_bundle(plan: Plan, manifest: Manifest, folder: str = OFFLINE_DIR) -> Plan:
    """The plan a host with the bundle at `folder` runs: its map on the bundle (offline_sources), and torch's
    wheels pinned by the bundle's own lock, or by none where the bundle was made without one (the lock this
    machine's facts hold may be another: the bundle holds the wheels its lock names)."""
    stack = plan.stack
    if stack is not None and stack.torch is not None:
        stack = stack.model_copy(update={"torch": stack.torch.model_copy(update={"lock": manifest.lock})})
    return replace(plan, sources=offline_sources(plan.sources, folder), stack=stack)
