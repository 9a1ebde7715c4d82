"""Wheel locks: every wheel of torch's dependency closure, pinned by exact version and sha256 as the origin index
(the PyTorch wheel index) lists them, for one torch requirement, CUDA variant, Python and CPU. Pure: reading them.

`gpuprov facts refresh` makes them (sources/wheel_lock.py, with pip's installation report) and keeps them in the
facts folder's `wheel-locks.yaml`. A plan whose torch wheel one matches carries it (`TorchWheel.lock`): the torch
step writes it as a requirements file and installs with `--require-hashes` from whichever index the sources map
names, so a mirror that serves a changed wheel is refused, naming the wheel and the index. Where none matches, the
plan says the wheels are not pinned by hash and installs as before.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuprov.errors import UserInputError
from gpuprov.paths import facts_dir

FILE = "wheel-locks.yaml"
NOT_PINNED = "not pinned by hash (run `gpuprov facts refresh`)"

# a project name and version as a requirements file may carry them (PEP 508 names, PEP 440 versions with a
# local label): nothing a shell or pip would read as more than a name
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=200)]
Version = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$", max_length=100)]


class LockedWheel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Name
    version: Version
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    url: str  # where the origin index listed it (a record of where the hash came from; the node asks its own index)


class WheelLock(BaseModel):
    """One lock: what it was made for, where and when it was read, and its wheels."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requirement: str  # as the plan writes it: torch==2.15.*
    variant: str  # cu132
    python: str  # 3.12
    arch: str  # x86_64 | aarch64 (`uname -m`)
    index: str  # the origin index the hashes came from
    read: datetime
    source: str  # how it was read (pip's installation report, pip's version)
    wheels: tuple[LockedWheel, ...]
    unverified: str | None = None

    @property
    def torch_version(self) -> str:
        return next((w.version for w in self.wheels if w.name.lower() == "torch"), "")

    @property
    def short(self) -> str:
        """Which lock, for what, read when (what the rendered step says: no host)."""
        return (f"{FILE}: torch {self.torch_version}, Python {self.python}, {self.arch}, {len(self.wheels)} wheels, "
                f"read {self.read.date().isoformat()}")

    @property
    def label(self) -> str:
        """What `plan` shows: which lock, for what, read when and from where."""
        return f"{self.short} from {self.index}"

    def requirements(self) -> str:
        """The lock as a pip/uv requirements file in hash-checking mode (one line per wheel)."""
        return "".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n"
                       for w in sorted(self.wheels, key=lambda w: w.name.lower()))

    def fits(self, version: str, variant: str, python: str, arch: str) -> bool:
        """Does the lock install torch `version` (a release family, 2.15, or an exact 2.15.0) of `variant`?"""
        public, _, label = self.torch_version.partition("+")
        family_or_exact = public == version or (version.count(".") < 2 and public.startswith(version + "."))
        return (family_or_exact and label == variant and self.variant == variant and self.python == python
                and self.arch == arch)


class LockFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    locks: tuple[WheelLock, ...] = ()


def path() -> Path:
    return facts_dir() / FILE


def locks() -> tuple[WheelLock, ...]:
    """The locks in the facts folder (none when `facts refresh` made none); a file that does not read is bad input
    naming it. Read once per version of the file."""
    where = path()
    try:
        stamp = where.stat().st_mtime_ns
    except OSError:
        return ()
    return _read(where, stamp)


@cache
def _read(where: Path, stamp: int) -> tuple[WheelLock, ...]:
    hint = "run `gpuprov facts refresh --only wheels` again, or delete the file"
    try:
        data: Any = yaml.safe_load(where.read_text())
        return LockFile.model_validate(data or {}).locks
    except (OSError, yaml.YAMLError) as exc:
        raise UserInputError(str(where), f"cannot read it: {exc}", hint) from None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UserInputError(f"{where}: {'.'.join(str(p) for p in err['loc'])}", err["msg"], hint) from None


def lock_for(version: str, variant: str, python: str, arch: str) -> WheelLock | None:
    """The newest lock that installs this torch wheel, or None."""
    fitting = [lock for lock in locks() if lock.fits(version, variant, python, arch)]
    return max(fitting, key=lambda lock: lock.read) if fitting else None
