"""The GPU software stack's facts and types: data/stack.yaml read into models (each fact with its source),
what a user may pin (StackPins), and what the resolver produces (Stack, TorchWheel), with the version
arithmetic every rule shares (which driver runs which CUDA, which SASS runs on which GPU).

plan/compat.py reasons over these; plan/pins.py checks pins on their own and against a GPU.

The facts: torch releases with their release dates, NVIDIA's branch lifecycle (`branch_ended`,
`supported_branch_from`: the default branch moves on when its branch ends), the toolkits per OS in NVIDIA's
repository (`repo_toolkits`), the pinning packages seen per branch. The arithmetic: `driver_runs`,
`minor_compat_runs`, `sm_runs`, `wheel_archs`, `min_branch_for`.
"""

from __future__ import annotations

import re
from datetime import date
from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuprov.plan import facts as families
from gpuprov.plan.wheel_lock import WheelLock

# Every OS a GPU stack installs on, as data/os.yaml lists them (plan/oses.py: family, NVIDIA's repository, the
# branch lock); written out here so that importing the resolver reads no file. tests/test_oses.py holds them equal.
SUPPORTED_OS = ("ubuntu-22.04", "ubuntu-24.04", "ubuntu-26.04", "debian-12", "debian-13", "rocky-9", "rhel-9",
                "rocky-10", "rhel-10", "amzn-2023")


# --- facts -------------------------------------------------------------------------------------


class _Fact(BaseModel):
    """A part of data/stack.yaml. Its validator is built when facts() first reads the file, not at import:
    most commands (bootstrap of a `stack: none` playbook, exec, check) never read it."""

    model_config = ConfigDict(defer_build=True)


class _CudaMin(_Fact):
    driver: str
    unverified: str | None = None


class _TorchRelease(_Fact):
    variants: tuple[str, ...]
    pypi_default: str
    python: tuple[str, str]
    released: date | None = None
    unverified: str | None = None


class _WheelArchs(_Fact):
    torch: tuple[str, str]
    variants: tuple[str, ...]
    sm: tuple[str, ...]
    unverified: str | None = None


class _Arch(_Fact):
    kernel_module: Literal["open", "proprietary"]
    open_only: bool = False
    max_driver_branch: int | None = None
    min_driver_branch: int | None = None
    max_cuda: str | None = None
    min_cuda: str | None = None
    min_torch: str | None = None


class _Cutoff(_Fact):
    branch: int
    source: str


class _Pinning(_Fact):
    from_branch: int
    source: str
    unverified: str | None = None
    exact_versions: tuple[str, ...] = ()
    branches: tuple[int, ...] = ()  # branches whose nvidia-driver-pinning-<branch> a source shows


class _Lifecycle(_Fact):
    type: Literal["LTSB", "PB", "NFB"] | None = None
    end_of_life: str | None = None  # "YYYY-MM": the month NVIDIA names
    ended: bool = False  # NVIDIA lists the branch as ended, without a date
    unverified: str | None = None

    def ended_on(self, on: date) -> bool:
        if self.ended:
            return True
        if self.end_of_life is None:
            return False
        year, month = (int(p) for p in self.end_of_life.split("-"))
        return (on.year, on.month) > (year, month)


class _TorchPlan(_Fact):
    release: str
    drops_variants: tuple[str, ...]
    effect: str
    source: str
    unverified: str


class _MinorCompat(_Fact):
    min_driver: str


class _NvswitchGen4(_Fact):
    archs: tuple[str, ...]
    packages: tuple[str, ...]
    kernel_modules_package: dict[Literal["apt", "dnf"], str]  # per package manager (the OS family)
    modules: tuple[str, ...]
    modules_load_file: str
    unverified: str | None = None


class _Persistence(_Fact):
    dropin: str
    unverified: str | None = None


class StackFacts(_Fact):
    model_config = ConfigDict(frozen=True)

    cuda_min_driver: dict[str, _CudaMin]
    driver_branches: tuple[int, ...]
    default_driver_branch: int
    last_volta_branch: int
    proprietary_removed_in: int
    driver_packages_unversioned_from: _Cutoff
    fabric_manager_unversioned_from: _Cutoff
    driver_pinning: _Pinning
    driver_versions: dict[int, tuple[str, ...]]
    driver_versions_unverified: str | None = None
    driver_lifecycle: dict[int, _Lifecycle]
    repo_toolkits: dict[str, tuple[str, ...]]
    repo_toolkits_unverified: str | None = None
    torch_releases: dict[str, _TorchRelease]
    python_ranges_unverified: str | None = None
    torch_plans: tuple[_TorchPlan, ...]
    minor_version_compat: dict[str, _MinorCompat]
    minor_version_compat_limits: str
    wheel_archs: tuple[_WheelArchs, ...]
    aarch64_wheel_archs: tuple[_WheelArchs, ...] = ()  # the Linux aarch64 wheels: a release/variant without a row has none
    architectures: dict[str, _Arch]
    nvswitch_gen4: _NvswitchGen4
    nvcc_must_match_torch: Literal["major"]
    persistence_mode: _Persistence
    python_default: str
    pytorch_index: str

    def installable_branches(self) -> tuple[int, ...]:
        """Branches gpuprov can install: those with NVIDIA's pinning packages."""
        return tuple(b for b in self.driver_branches if b >= self.driver_pinning.from_branch)

    def branch_ended(self, branch: int, on: date | None = None) -> str | None:
        """'R610 (a New Feature Branch) reached its end of life in YYYY-MM' when NVIDIA has ended the branch."""
        life = self.driver_lifecycle.get(branch)
        if life is None or not life.ended_on(on or families.today()):
            return None
        kind = {"LTSB": "a Long Term Support Branch", "PB": "a Production Branch", "NFB": "a New Feature Branch"}
        what = f" ({kind[life.type]})" if life.type else ""
        when = f" in {life.end_of_life}" if life.end_of_life else ""
        return f"R{branch}{what} reached its end of life{when}: NVIDIA no longer fixes it"

    def fabric_manager_package(self, branch: int) -> str:
        """NVIDIA CUDA repo name of Fabric Manager for a driver branch (no suffix from R580)."""
        return "nvidia-fabricmanager" if branch >= self.fabric_manager_unversioned_from.branch \
            else f"nvidia-fabricmanager-{branch}"


@cache
def facts() -> StackFacts:
    """stack.yaml with the families `gpuprov facts refresh` read again laid over it (plan/facts.py)."""
    return StackFacts.model_validate(families.merged("stack.yaml"))


# --- inputs and outputs ------------------------------------------------------------------------


class StackPins(BaseModel):
    """What the user pinned; None means 'choose for me'."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    driver: str | None = None  # a branch ("580") or an exact version ("580.95.05")
    cuda: str | None = None  # CUDA toolkit to install (nvcc), e.g. "12.8"
    torch: str | None = None  # "2.9" or "2.9.1"
    torch_cuda: str | None = None  # wheel variant, "cu128"
    python: str | None = None  # "3.12"

    @field_validator("driver", mode="before")
    @classmethod
    def _branch_as_written(cls, value: object) -> object:
        """`R580`, as every message writes a branch, is the branch 580."""
        if isinstance(value, str) and re.fullmatch(r"[Rr]\d{3}(\.\d+){0,2}", value.strip()):
            return value.strip()[1:]
        return value

    def without(self, name: str) -> StackPins:
        return self.model_copy(update={name: None})


class TorchWheel(BaseModel):
    model_config = ConfigDict(frozen=True)

    version: str  # as pinned ("2.9.1") or a release family ("2.13")
    variant: str  # cu128
    cuda: str  # 12.8; "" for the CPU wheel (variant cpu, plan/cpu.py)
    index_url: str
    # every wheel it installs pinned by sha256 (plan/wheel_lock.py), when `facts refresh` made a lock that fits;
    # not in the plan's JSON (its label is: `wheels`)
    lock: WheelLock | None = Field(default=None, exclude=True)

    @property
    def requirement(self) -> str:
        """pip requirement: an exact patch when one was pinned, else the newest of the family."""
        return f"torch=={self.version}" if self.version.count(".") >= 2 else f"torch=={self.version}.*"


FabricManager = Literal["required", "auto", "no"]


CpuArch = Literal["x86_64", "aarch64"]  # a host's CPU as `uname -m` says it (EC2 says arm64 for aarch64)


class Stack(BaseModel):
    """One consistent GPU software stack, as the templates install it."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    arch: str
    compute_capability: str
    os: str
    family: Literal["apt", "dnf"] = "apt"  # the OS's package manager (plan/oses.py)
    repo: str = ""  # NVIDIA's repository directory for the OS: ubuntu2404, rhel9, amzn2023
    cpu_arch: CpuArch = "x86_64"  # the host's `uname -m`, which the steps check
    driver_stream: str | None = None  # dnf: the module stream that holds the branch, nvidia-driver:580-open
    driver_versionlock: str | None = None  # dnf without modularity (EL10): `dnf versionlock` of *nvidia*580*
    kept_driver: bool = False  # --keep-driver: the host's installed driver (driver_version) is used as it is
    driver_branch: int
    driver_version: str | None  # exact version when pinned
    kernel_module: Literal["open", "proprietary"]
    driver_pinning_package: str
    driver_package: str
    fabric_manager: FabricManager  # required: NVSwitch instance; auto: install if lspci shows NVSwitch
    fabric_manager_package: str
    nvlsm: bool
    # HGX B200: what Fabric Manager's pre-check needs besides nvlsm (packages, modules loaded at boot)
    fabric_extra_packages: tuple[str, ...] = ()
    fabric_kernel_modules: tuple[str, ...] = ()
    fabric_modules_package: str | None = None
    fabric_modules_load_file: str | None = None
    cuda_toolkit: str | None
    cuda_toolkit_package: str | None
    torch: TorchWheel | None
    python: str
    minor_version_compat: bool = False  # the wheel runs only through CUDA minor-version compatibility
    unverified: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # allowed but worth knowing: a branch NVIDIA has ended

    @property
    def repo_arch(self) -> str:
        """The architecture folder of NVIDIA's repositories (.../repos/ubuntu2404/sbsa/): Arm servers are sbsa's."""
        return "sbsa" if self.cpu_arch == "aarch64" else self.cpu_arch

    @property
    def repo_packages(self) -> tuple[str, ...]:
        """What the driver step asks the host's apt for before it installs anything: every package from NVIDIA's
        repository this stack installs (Fabric Manager only where it is known to be needed)."""
        fabric = (self.fabric_manager_package, *(("nvlsm",) if self.nvlsm else ())) if self.fabric_manager == "required" else ()
        toolkit = (self.cuda_toolkit_package,) if self.cuda_toolkit_package else ()
        pinning = (self.driver_pinning_package,) if self.family == "apt" else ()  # dnf: the module stream holds it
        return (*pinning, self.driver_package, *fabric, *toolkit)

    @property
    def repo_label(self) -> str:
        """'ubuntu-24.04 (NVIDIA's ubuntu2404 repository)': where a missing package was looked for."""
        return f"{self.os} (NVIDIA's {self.repo or self.os.replace('-', '').replace('.', '')} repository)"

    @property
    def driver_lock(self) -> str:
        """How the driver stays on its branch, in words (what `plan` prints)."""
        if self.kept_driver:
            return "the host's own, kept as installed (--keep-driver: no driver, kernel or reboot steps)"
        if self.driver_stream:
            return f"held on its branch by the module stream {self.driver_stream}"
        if self.driver_versionlock:
            return f"held on its branch by dnf versionlock {self.driver_versionlock}"
        return f"pinned with {self.driver_pinning_package}, held"

    @property
    def min_driver(self) -> str | None:
        """The lowest driver that runs this stack's CUDA (wheel and toolkit)."""
        needs = [c for c in (self.torch.cuda if self.torch else None, self.cuda_toolkit) if c]
        if not needs:
            return None
        return max((facts().cuda_min_driver[c].driver for c in needs), key=version_tuple)


# --- small helpers -----------------------------------------------------------------------------


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def release_family(torch_version: str) -> str:
    return ".".join(torch_version.split(".")[:2])


def variant_cuda(variant: str) -> str:
    """cu128 -> 12.8, cu130 -> 13.0, cu118 -> 11.8."""
    digits = variant[2:]
    return f"{digits[:-1]}.{digits[-1]}"


def sm_runs(wheel_sms: tuple[str, ...], cc: str) -> bool:
    """SASS for X.y runs on X.z when z >= y (same major only)."""
    major, minor = version_tuple(cc)
    return any(m == major and n <= minor for m, n in (version_tuple(s) for s in wheel_sms))


def driver_satisfies(branch: int, exact: str | None, minimum: str) -> bool:
    if exact:
        return version_tuple(exact) >= version_tuple(minimum)
    # a branch's current release is newer than the GA minimum of any CUDA minor that names it
    return branch >= version_tuple(minimum)[0]


def supported_branch_from(branch: int) -> int:
    """`branch`, or, once NVIDIA has ended it, the oldest installable branch after it that is still supported
    (a long-term or production branch before a new feature branch)."""
    f = facts()
    if not f.branch_ended(branch):
        return branch
    later = [b for b in f.installable_branches() if b > branch and not f.branch_ended(b)]
    lasting = [b for b in later if (life := f.driver_lifecycle.get(b)) and life.type in ("LTSB", "PB")]
    return min(lasting or later, default=branch)


def min_branch_for(minimum: str) -> int:
    """The oldest branch gpuprov can install that satisfies a minimum driver version, passing over branches NVIDIA
    has ended while a newer one serves."""
    f = facts()
    need = version_tuple(minimum)[0]
    fits = [b for b in f.installable_branches() if b >= need]
    return min((b for b in fits if not f.branch_ended(b)), default=min(fits))


def split_driver(driver: str) -> tuple[int, str | None]:
    """'580' -> (580, None); '580.95.05' -> (580, '580.95.05')."""
    return int(driver.split(".")[0]), (driver if "." in driver else None)


def minor_compat_runs(cuda: str, driver: str) -> bool:
    """CUDA minor-version compatibility: code built with CUDA X.y runs (limited feature set, no PTX JIT of
    newer code) on a driver of at least the X family minimum (stack.yaml `minor_version_compat`)."""
    family = facts().minor_version_compat.get(cuda.split(".")[0])
    if family is None:
        return False
    branch, exact = split_driver(driver)
    return driver_satisfies(branch, exact, family.min_driver)


def driver_runs(cuda: str, driver: str) -> tuple[bool, bool]:
    """(runs, needs_minor_compat) for code built with CUDA `cuda` ("12.6") on `driver` (branch or version)."""
    minimum = facts().cuda_min_driver.get(cuda)
    branch, exact = split_driver(driver)
    if minimum is not None and driver_satisfies(branch, exact, minimum.driver):
        return True, False
    return (True, True) if minor_compat_runs(cuda, driver) else (False, False)


def wheel_archs(release: str, variant: str, cpu_arch: str = "x86_64") -> _WheelArchs | None:
    """The SASS a torch wheel carries; None: not known, or (aarch64) no such wheel."""
    for row in facts().aarch64_wheel_archs if cpu_arch == "aarch64" else facts().wheel_archs:
        lo, hi = (version_tuple(v) for v in row.torch)
        if lo <= version_tuple(release) <= hi and variant in row.variants:
            return row
    return None
