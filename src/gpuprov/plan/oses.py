"""The host operating systems gpuprov installs a GPU stack on (data/os.yaml): each name's package family (apt or
dnf), NVIDIA's repository directory for it and how the driver branch is held, and how a host's /etc/os-release
names it. Pure: the facts are data with their sources; this module only looks them up."""

from __future__ import annotations

from functools import cache
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

from gpuprov.errors import UserInputError
from gpuprov.resources import data_file

Family = Literal["apt", "dnf"]


class OsInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    family: Family
    repo: str  # NVIDIA's CUDA repository directory: ubuntu2404, rhel9, amzn2023
    os_release: tuple[str, str]  # (ID, VERSION_ID as gpuprov names it)
    # dnf: how the branch is held (NVIDIA's module streams on EL9 and AL2023; apt uses the pinning packages)
    lock: Literal["pinning", "module"] = "pinning"
    epel: str | None = None  # dnf: "epel-release" (a package of the OS's own repositories) or the release RPM's URL
    # dnf: the shell command that enables CodeReady Builder (EPEL's dependencies); rendered as it is: data, no user's
    crb: str | None = None
    source: str = ""
    unverified: str | None = None


class _Table(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    oses: dict[str, OsInfo]
    version_major: tuple[str, ...]


@cache
def table() -> _Table:
    return _Table.model_validate(yaml.safe_load(data_file("os.yaml").read_text()))


def names() -> tuple[str, ...]:
    """Every OS name `--os` accepts, as `gpuprov` writes them."""
    return tuple(table().oses)


def info(name: str) -> OsInfo:
    try:
        return table().oses[name]
    except KeyError:
        raise UserInputError("--os", f"unsupported OS {name!r}", f"choose one of: {', '.join(names())}") from None


def family(name: str) -> Family:
    """apt or dnf: which package manager the stack's steps use on this OS."""
    return info(name).family


def from_os_release(os_id: str, version_id: str) -> str:
    """`rocky` + `9.4` -> `rocky-9`; `ubuntu` + `24.04` -> `ubuntu-24.04`; an unknown ID keeps its full version."""
    version = version_id.split(".")[0] if os_id in table().version_major else version_id
    return f"{os_id}-{version}"
