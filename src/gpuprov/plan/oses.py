"""The host operating systems gpuprov installs a GPU stack on (data/os.yaml): each name's package family (apt or
dnf), NVIDIA's repository directory for it and how the driver branch is held, and how a host's /etc/os-release
names it. Pure: the facts are data with their sources; this module only looks them up.

The table: Ubuntu 22.04/24.04/26.04, Debian 12/13, Rocky/RHEL 9 and 10, Amazon Linux 2023. The branch is held with
apt's pinning packages, or on dnf with the module stream (on EL10 `dnf versionlock *nvidia*<branch>*`); each OS also
says where `up --os` finds its EC2 image and its login user (`aws`), and where DKMS needs EPEL and the CodeReady
Builder command. `from_os_release` names a host's OS from ID and VERSION_ID (EL and Debian by major).
`stack.SUPPORTED_OS` is the same list written out, so no file is read at import; tests/test_oses.py holds them equal.
The planner refuses an OS outside the table only for a GPU stack: a `stack: none` playbook or a kept driver installs
no system package and plans on any Linux.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict

from gpuprov.errors import UserInputError
from gpuprov.resources import load_data

PackageFamily = Literal["apt", "dnf"]


class AwsImage(BaseModel):
    """Where `up --os` finds the OS's image on EC2 (data/os.yaml `aws`): Canonical's SSM parameters (Ubuntu), another
    public SSM parameter, or its publisher's account and name pattern (DescribeImages, newest first)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    user: str  # the image's login user
    canonical: bool = False
    ssm: str | None = None
    owner: str | None = None
    name: str | None = None
    source: str = ""
    unverified: str | None = None


class OsInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    family: PackageFamily
    repo: str  # NVIDIA's CUDA repository directory: ubuntu2404, rhel9, amzn2023
    os_release: tuple[str, str]  # (ID, VERSION_ID as gpuprov names it)
    # how the branch is held: apt's pinning packages; dnf: NVIDIA's module streams (EL9, AL2023), or `dnf versionlock`
    # where the OS has no modularity (EL10)
    lock: Literal["pinning", "module", "versionlock"] = "pinning"
    epel: str | None = None  # dnf: "epel-release" (a package of the OS's own repositories) or the release RPM's URL
    # dnf: the shell command that enables CodeReady Builder (EPEL's dependencies); rendered as it is: data, no user's
    crb: str | None = None
    aws: AwsImage | None = None
    source: str = ""
    unverified: str | None = None


class _Table(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    oses: dict[str, OsInfo]
    version_major: tuple[str, ...]


@cache
def table() -> _Table:
    return _Table.model_validate(load_data("os.yaml"))


def names() -> tuple[str, ...]:
    """Every OS name `--os` accepts, as `gpuprov` writes them."""
    return tuple(table().oses)


def info(name: str) -> OsInfo:
    try:
        return table().oses[name]
    except KeyError:
        raise UserInputError("--os", f"unsupported OS {name!r}", f"choose one of: {', '.join(names())}") from None


def login_user(name: str) -> str:
    """The login user of the OS's EC2 image ("ubuntu" where gpuprov knows none)."""
    image = table().oses[name].aws if name in table().oses else None
    return image.user if image else "ubuntu"


def family(name: str) -> PackageFamily:
    """apt or dnf: which package manager the stack's steps use on this OS."""
    return info(name).family


def from_os_release(os_id: str, version_id: str) -> str:
    """`rocky` + `9.4` -> `rocky-9`; `ubuntu` + `24.04` -> `ubuntu-24.04`; an unknown ID keeps its full version."""
    version = version_id.split(".")[0] if os_id in table().version_major else version_id
    return f"{os_id}-{version}"


def ssm_for_arch(parameter: str, arch: str) -> str:
    """An OS's public SSM parameter (data/os.yaml `aws.ssm`, the x86_64 image's) for `arch`: its publishers name the
    arm64 image's parameter with the architecture in the same place (Amazon Linux's al2023-ami-kernel-default-arm64,
    Debian's release/12/latest/arm64)."""
    if arch != "arm64":
        return parameter
    for x86 in ("-x86_64", "/amd64"):
        if parameter.endswith(x86):
            return parameter.removesuffix(x86) + x86[0] + "arm64"
    raise UserInputError("--os", f"the public image parameter {parameter} names no architecture to swap for arm64",
                         "pass --image ami-... of an arm64 image of that OS")
