"""The stack resolver: GPU x OS x driver x CUDA x torch -> one consistent stack, or a reason why not.

Rules come from data/stack.yaml (facts, with sources); this module only reasons over them:
- a torch wheel runs on a GPU when it carries SASS for the GPU's compute capability, or for an
  earlier minor of the same major (sm_86 code runs on sm_89);
- the driver must be at least the minimum NVIDIA lists for the wheel's (and toolkit's) CUDA, or,
  for a wheel, the minimum of its CUDA major family (minor-version compatibility: a fallback with a
  limited feature set, used only when no wheel of that release runs natively);
- only branches with NVIDIA's pinning packages (R570+) are installed; an exact version must be known;
- a CUDA toolkit (nvcc) must share the torch wheel's CUDA major (PyTorch's extension builder);
- Volta stays on R580 with the proprietary module; Blackwell needs the open module and R570+;
- NVSwitch systems need Fabric Manager at exactly the driver's version, named without the branch
  from R580 (and NVLSM + the InfiniBand modules on Blackwell).
When pins conflict, the StackConflict carries the rule's id (`rule`), and the error names what would
work instead, found by re-solving with each pin relaxed in turn.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from itertools import groupby
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

from gpuprov.errors import StackConflict, UserInputError
from gpuprov.plan.catalog import Gpu
from gpuprov.resources import data_file

SUPPORTED_OS = ("ubuntu-22.04", "ubuntu-24.04")


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
    kernel_modules_package: str
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
    driver_versions_unverified: str
    torch_releases: dict[str, _TorchRelease]
    python_ranges_unverified: str
    torch_plans: tuple[_TorchPlan, ...]
    minor_version_compat: dict[str, _MinorCompat]
    minor_version_compat_limits: str
    wheel_archs: tuple[_WheelArchs, ...]
    architectures: dict[str, _Arch]
    nvswitch_gen4: _NvswitchGen4
    nvcc_must_match_torch: Literal["major"]
    persistence_mode: _Persistence
    python_default: str
    pytorch_index: str

    def installable_branches(self) -> tuple[int, ...]:
        """Branches gpuprov can install: those with NVIDIA's pinning packages."""
        return tuple(b for b in self.driver_branches if b >= self.driver_pinning.from_branch)

    def fabric_manager_package(self, branch: int) -> str:
        """NVIDIA CUDA repo name of Fabric Manager for a driver branch (no suffix from R580)."""
        return "nvidia-fabricmanager" if branch >= self.fabric_manager_unversioned_from.branch \
            else f"nvidia-fabricmanager-{branch}"


@cache
def facts() -> StackFacts:
    with data_file("stack.yaml").open() as f:
        return StackFacts.model_validate(yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


# --- inputs and outputs ------------------------------------------------------------------------


class StackPins(BaseModel):
    """What the user pinned; None means 'choose for me'."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    driver: str | None = None  # a branch ("580") or an exact version ("580.95.05")
    cuda: str | None = None  # CUDA toolkit to install (nvcc), e.g. "12.8"
    torch: str | None = None  # "2.9" or "2.9.1"
    torch_cuda: str | None = None  # wheel variant, "cu128"
    python: str | None = None  # "3.12"

    def without(self, name: str) -> StackPins:
        return self.model_copy(update={name: None})


class TorchWheel(BaseModel):
    model_config = ConfigDict(frozen=True)

    version: str  # as pinned ("2.9.1") or a release family ("2.13")
    variant: str  # cu128
    cuda: str  # 12.8
    index_url: str

    @property
    def requirement(self) -> str:
        """pip requirement: an exact patch when one was pinned, else the newest of the family."""
        return f"torch=={self.version}" if self.version.count(".") >= 2 else f"torch=={self.version}.*"


FabricManager = Literal["required", "auto", "no"]


class Stack(BaseModel):
    """One consistent GPU software stack, as the templates install it."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    arch: str
    compute_capability: str
    os: str
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

    @property
    def min_driver(self) -> str | None:
        """The lowest driver that runs this stack's CUDA (wheel and toolkit)."""
        needs = [c for c in (self.torch.cuda if self.torch else None, self.cuda_toolkit) if c]
        if not needs:
            return None
        return max((facts().cuda_min_driver[c].driver for c in needs), key=_version_tuple)


# --- small helpers -----------------------------------------------------------------------------


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _family(torch_version: str) -> str:
    return ".".join(torch_version.split(".")[:2])


def variant_cuda(variant: str) -> str:
    """cu128 -> 12.8, cu130 -> 13.0, cu118 -> 11.8."""
    digits = variant[2:]
    return f"{digits[:-1]}.{digits[-1]}"


def _sm_runs(wheel_sms: tuple[str, ...], cc: str) -> bool:
    """SASS for X.y runs on X.z when z >= y (same major only)."""
    major, minor = _version_tuple(cc)
    return any(m == major and n <= minor for m, n in (_version_tuple(s) for s in wheel_sms))


def _driver_satisfies(branch: int, exact: str | None, minimum: str) -> bool:
    if exact:
        return _version_tuple(exact) >= _version_tuple(minimum)
    # a branch's current release is newer than the GA minimum of any CUDA minor that names it
    return branch >= _version_tuple(minimum)[0]


def _min_branch_for(minimum: str) -> int:
    """The oldest branch gpuprov can install that satisfies a minimum driver version."""
    need = _version_tuple(minimum)[0]
    return min(b for b in facts().installable_branches() if b >= need)


def _split_driver(driver: str) -> tuple[int, str | None]:
    """'580' -> (580, None); '580.95.05' -> (580, '580.95.05')."""
    return int(driver.split(".")[0]), (driver if "." in driver else None)


def minor_compat_runs(cuda: str, driver: str) -> bool:
    """CUDA minor-version compatibility: code built with CUDA X.y runs (limited feature set, no PTX JIT of
    newer code) on a driver of at least the X family minimum (stack.yaml `minor_version_compat`)."""
    family = facts().minor_version_compat.get(cuda.split(".")[0])
    if family is None:
        return False
    branch, exact = _split_driver(driver)
    return _driver_satisfies(branch, exact, family.min_driver)


def driver_runs(cuda: str, driver: str) -> tuple[bool, bool]:
    """(runs, needs_minor_compat) for code built with CUDA `cuda` ("12.6") on `driver` (branch or version)."""
    minimum = facts().cuda_min_driver.get(cuda)
    branch, exact = _split_driver(driver)
    if minimum is not None and _driver_satisfies(branch, exact, minimum.driver):
        return True, False
    return (True, True) if minor_compat_runs(cuda, driver) else (False, False)


# --- validation of single pins -----------------------------------------------------------------


def check_pins(pins: StackPins) -> None:
    """Reject malformed or unknown pins, and drivers gpuprov cannot install (before any GPU is known)."""
    _check_pin_syntax(pins)
    _check_driver_installable(pins)


def _check_pin_syntax(pins: StackPins) -> None:
    """Malformed or unknown pins."""
    if not (pins.driver is None and pins.cuda is None and pins.torch is None and pins.torch_cuda is None):
        _check_known_pins(pins)  # stack.yaml is read only when a pin needs a look-up (most runs pin nothing)
    if pins.python is not None and not re.fullmatch(r"3\.\d+", pins.python):
        raise UserInputError("--python", f"{pins.python!r} is not a Python version", "e.g. 3.12")


def _check_known_pins(pins: StackPins) -> None:
    """Pins of a driver branch, CUDA toolkit, torch release or wheel variant that stack.yaml does not know."""
    f = facts()
    if pins.driver is not None:
        if not re.fullmatch(r"\d{3}(\.\d+){0,2}", pins.driver):
            raise UserInputError("--driver", f"{pins.driver!r} is not a driver branch or version", "e.g. 580 or 580.95.05")
        branch = int(pins.driver.split(".")[0])
        if branch not in f.driver_branches:
            raise UserInputError(
                "--driver", f"unknown driver branch {branch}",
                f"known branches: {', '.join(map(str, f.installable_branches()))}",
            )
    if pins.cuda is not None and pins.cuda not in f.cuda_min_driver:
        raise UserInputError(
            "--cuda", f"unknown CUDA toolkit {pins.cuda!r}", f"known: {', '.join(f.cuda_min_driver)}"
        )
    if pins.torch is not None and (
        not re.fullmatch(r"\d+\.\d+(\.\d+)?", pins.torch) or _family(pins.torch) not in f.torch_releases
    ):
        raise UserInputError(
            "--torch", f"unknown torch release {pins.torch!r}",
            f"known: {', '.join(f.torch_releases)} (optionally with a patch, e.g. 2.9.1)",
        )
    if pins.torch_cuda is not None:
        known = sorted({v for r in f.torch_releases.values() for v in r.variants})
        if pins.torch_cuda not in known:
            raise UserInputError("--torch-cuda", f"unknown wheel variant {pins.torch_cuda!r}", f"known: {', '.join(known)}")


def _check_driver_installable(pins: StackPins) -> None:
    """A driver pin gpuprov can hold apt at: a branch with NVIDIA's pinning package, a release it knows of."""
    if pins.driver is None:
        return
    f = facts()
    branch = int(pins.driver.split(".")[0])
    if branch < f.driver_pinning.from_branch:
        raise StackConflict(
            "--driver",
            f"R{branch} cannot be installed from NVIDIA's repository: it has no nvidia-driver-pinning-{branch} "
            f"package (pinning packages exist from R{f.driver_pinning.from_branch} on), so apt could not hold "
            "the driver on that branch",
            f"use --driver {f.driver_pinning.from_branch} or newer (known: "
            f"{', '.join(map(str, f.installable_branches()))}); torch wheels for CUDA 12.x also run on an older "
            "branch that is already installed (CUDA minor-version compatibility)",
            rule="driver-no-pinning-package",
        )
    if "." in pins.driver and pins.driver not in f.driver_versions.get(branch, ()):
        releases = f.driver_versions.get(branch, ())
        raise StackConflict(
            "--driver",
            f"driver {pins.driver} is not a release gpuprov knows of on branch R{branch}, so there is no "
            f"nvidia-driver-pinning-{pins.driver} package to install",
            (f"known R{branch} releases: {', '.join(releases)}; " if releases else "")
            + f"or pin only the branch: --driver {branch}",
            rule="driver-version-unknown",
        )
    if "." in pins.driver and pins.driver not in f.driver_pinning.exact_versions:
        pinned = [v for v in f.driver_pinning.exact_versions if v.startswith(f"{branch}.")]
        raise StackConflict(
            "--driver",
            f"driver {pins.driver} is a real R{branch} release, but no source shows an "
            f"nvidia-driver-pinning-{pins.driver} package, which gpuprov needs to hold apt at that release",
            (f"R{branch} releases with one: {', '.join(pinned)}; " if pinned else "")
            + f"or pin only the branch: --driver {branch}",
            rule="driver-version-no-pinning-package",
        )


# --- the solver --------------------------------------------------------------------------------


def _torch_candidates(pins: StackPins) -> Iterator[tuple[str, str]]:
    """(release, variant) pairs in preference order: newest release first, the release's own
    PyPI default variant first (the one the PyTorch project ships to most users), then newer ones."""
    f = facts()
    releases = sorted(f.torch_releases, key=_version_tuple, reverse=True)
    if pins.torch:
        releases = [_family(pins.torch)]
    for rel in releases:
        info = f.torch_releases[rel]
        ordered = [
            info.pypi_default,
            *sorted((v for v in info.variants if v != info.pypi_default), key=lambda v: int(v[2:]), reverse=True),
        ]
        if pins.torch and pins.torch_cuda and pins.torch_cuda not in ordered:
            yield rel, pins.torch_cuda  # so the error says this release has no such wheels
        for variant in ordered:
            if pins.torch_cuda in (None, variant):
                yield rel, variant


def _wheel_archs(release: str, variant: str) -> _WheelArchs | None:
    for row in facts().wheel_archs:
        lo, hi = (_version_tuple(v) for v in row.torch)
        if lo <= _version_tuple(release) <= hi and variant in row.variants:
            return row
    return None


class _Problem(BaseModel):
    rule: str
    text: str
    hint: str = ""


def _torch_problem(gpu: Gpu, release: str, variant: str, pins: StackPins, allow_minor: bool = True) -> _Problem | None:
    """Why this wheel cannot serve this GPU with these pins, or None when it can.

    :param allow_minor: accept a driver older than the wheel's CUDA minimum when CUDA minor-version
        compatibility covers it (the wheel then runs with a limited feature set).
    """
    f = facts()
    arch = f.architectures[gpu.arch]
    info = f.torch_releases[release]
    if variant not in info.variants:
        return _Problem(rule="wheel-variant-missing",
                        text=f"torch {release} has no {variant} wheels (it ships {', '.join(info.variants)})")
    if arch.min_torch and _version_tuple(release) < _version_tuple(arch.min_torch):
        return _Problem(rule="arch-min-torch", text=f"{gpu.name} ({gpu.sm}) needs torch ≥ {arch.min_torch}")
    archs = _wheel_archs(release, variant)
    if archs is None or not _sm_runs(archs.sm, gpu.compute_capability):
        built = ", ".join("sm_" + s.replace(".", "") for s in archs.sm) if archs else "unknown archs"
        return _Problem(rule="wheel-no-sass",
                        text=f"torch {release}+{variant} wheels carry code for {built}, not {gpu.name}'s {gpu.sm}")
    # A wheel with code for the GPU is also within the architecture's CUDA range (max_cuda/min_cuda): no toolkit
    # outside it builds that code. stack.yaml keeps to this (test_compat.py checks it), so the arch list decides.
    cuda = variant_cuda(variant)
    if pins.cuda and pins.cuda.split(".")[0] != cuda.split(".")[0]:
        # PyTorch's extension builder refuses nvcc of another CUDA major (stack.yaml nvcc_must_match_torch)
        same_major = [v for v in info.variants if variant_cuda(v).split(".")[0] == pins.cuda.split(".")[0]]
        return _Problem(
            rule="nvcc-torch-major-mismatch",
            text=f"the CUDA {pins.cuda} toolkit (nvcc) cannot build extensions for torch {release}+{variant} "
                 f"(CUDA {cuda}): PyTorch's extension builder refuses a CUDA major version mismatch",
            hint=f"use --cuda {cuda} (the wheel's CUDA)"
                 + (f", or --torch-cuda {same_major[-1]} (a CUDA {pins.cuda.split('.')[0]} wheel of torch {release})"
                    if same_major else ""),
        )
    if pins.driver:
        ok, minor = driver_runs(cuda, pins.driver)
        if not ok or (minor and not allow_minor):
            minimum = f.cuda_min_driver[cuda].driver
            family = f.minor_version_compat.get(cuda.split(".")[0])
            compat = f" (or ≥ {family.min_driver} through CUDA minor-version compatibility)" if family else ""
            return _Problem(rule="wheel-needs-newer-driver",
                            text=f"{variant} wheels (CUDA {cuda}) need driver ≥ {minimum}{compat} "
                                 f"(R{_min_branch_for(minimum)}); driver {pins.driver} is older")
    if pins.python:
        lo, hi = info.python
        if not _version_tuple(lo) <= _version_tuple(pins.python) <= _version_tuple(hi):
            return _Problem(rule="python-range", text=f"torch {release} supports Python {lo}–{hi}, not {pins.python}")
    return None


def _choose_torch(gpu: Gpu, pins: StackPins) -> tuple[str, str, bool]:
    """(release, variant, needs minor-version compatibility): the newest release that fits; within it, a
    wheel the driver runs natively before one that runs only through minor-version compatibility."""
    problems: list[_Problem] = []
    for release, group in groupby(_torch_candidates(pins), key=lambda c: c[0]):
        variants = [v for _, v in group]
        for allow_minor in (False, True):
            for variant in variants:
                problem = _torch_problem(gpu, release, variant, pins, allow_minor)
                if problem is None:
                    return release, variant, allow_minor
                if allow_minor:
                    problems.append(problem)
    field = ("--torch-cuda" if pins.torch_cuda else "--torch" if pins.torch else "--driver" if pins.driver
             else "--cuda" if pins.cuda else "--python")
    if problems and problems[0].rule == "nvcc-torch-major-mismatch":
        field = "--cuda"
    first = problems[0]  # never empty: pins that pass check_pins leave at least one candidate wheel
    raise StackConflict(field, first.text, first.hint, rule=first.rule)


def variants_with_sass(release: str, compute_capability: str) -> list[str]:
    """The CUDA variants of a torch release whose wheels carry code a GPU of this compute capability runs
    (the release's PyPI default first). For `check` when a wheel fails with "no kernel image is available"."""
    info = facts().torch_releases.get(".".join(release.split("+")[0].split(".")[:2]))
    if info is None:
        return []
    name = ".".join(release.split("+")[0].split(".")[:2])
    fits = [v for v in info.variants if (archs := _wheel_archs(name, v)) and _sm_runs(archs.sm, compute_capability)]
    return sorted(fits, key=lambda v: v != info.pypi_default)


def choose_torch_for_driver(gpu: Gpu, driver: str) -> TorchWheel:
    """The newest torch wheel that runs on an already-installed driver (any branch, also ones gpuprov would not
    install), minor-version compatibility included. For doctor/check fixes on existing hosts."""
    release, variant, _ = _choose_torch(gpu, StackPins(driver=driver))
    return TorchWheel(version=release, variant=variant, cuda=variant_cuda(variant),
                      index_url=f"{facts().pytorch_index}/{variant}")


def _check_driver_pin(gpu: Gpu, pins: StackPins) -> None:
    if not pins.driver:
        return
    f = facts()
    arch = f.architectures[gpu.arch]
    branch = int(pins.driver.split(".")[0])
    if arch.max_driver_branch and branch > arch.max_driver_branch:
        raise StackConflict(
            "--driver",
            f"{gpu.name} ({gpu.arch.title()}, {gpu.sm}) is supported up to driver branch R{arch.max_driver_branch}; "
            f"R{branch} dropped it",
            f"use --driver {arch.max_driver_branch} (proprietary kernel module)",
            rule="gpu-max-driver-branch",
        )
    if arch.min_driver_branch and branch < arch.min_driver_branch:
        raise StackConflict(
            "--driver",
            f"{gpu.name} ({gpu.sm}) needs driver branch ≥ R{arch.min_driver_branch}",
            f"use --driver {arch.min_driver_branch} or newer",
            rule="gpu-min-driver-branch",
        )
    # The proprietary module's removal (R620, stack.yaml) comes after the last branch of every architecture that
    # needs it (Volta: R580), so max_driver_branch is the limit a user meets first (test_compat.py checks the data).


def _check_toolkit_arch(gpu: Gpu, pins: StackPins) -> None:
    """The toolkit against the GPU's architecture (before any wheel is chosen: it names the real cause)."""
    if not pins.cuda:
        return
    arch = facts().architectures[gpu.arch]
    cuda = pins.cuda
    if arch.max_cuda and _version_tuple(cuda) > _version_tuple(arch.max_cuda):
        raise StackConflict(
            "--cuda", f"{gpu.name} ({gpu.sm}) is supported by CUDA toolkits up to {arch.max_cuda}, not {cuda}",
            f"use --cuda {arch.max_cuda}", rule="toolkit-max-cuda",
        )
    if arch.min_cuda and _version_tuple(cuda) < _version_tuple(arch.min_cuda):
        raise StackConflict(
            "--cuda", f"{gpu.name} ({gpu.sm}) needs CUDA ≥ {arch.min_cuda}", f"use --cuda {arch.min_cuda} or newer",
            rule="toolkit-min-cuda",
        )


def _check_toolkit(gpu: Gpu, pins: StackPins, branch: int, exact: str | None) -> None:
    if not pins.cuda:
        return
    cuda = pins.cuda
    minimum = facts().cuda_min_driver[cuda].driver
    if pins.driver and not _driver_satisfies(branch, exact, minimum):
        raise StackConflict(
            "--driver",
            f"CUDA {cuda} needs driver ≥ {minimum}; driver {pins.driver} is older",
            f"use --driver {_min_branch_for(minimum)} or newer, or an older --cuda",
            rule="toolkit-needs-newer-driver",
        )


def _choose_branch(gpu: Gpu, pins: StackPins, cudas: list[str]) -> int:
    f = facts()
    arch = f.architectures[gpu.arch]
    if pins.driver:
        return int(pins.driver.split(".")[0])
    branch = f.default_driver_branch
    if arch.max_driver_branch:
        branch = min(branch, arch.max_driver_branch)
    needed = max((_min_branch_for(f.cuda_min_driver[c].driver) for c in cudas), default=0)
    if arch.min_driver_branch:
        needed = max(needed, arch.min_driver_branch)
    # every CUDA up to the architecture's max_cuda runs on its last branch (test_compat.py checks the data), and a
    # CUDA above it was refused before (toolkit-max-cuda, or no wheel with code for the GPU)
    return max(branch, needed)


def newest_cuda(gpu: Gpu, branch: int) -> str:
    """The newest CUDA toolkit that this driver branch runs and this GPU still supports."""
    f = facts()
    arch = f.architectures[gpu.arch]
    usable = [
        c for c, m in f.cuda_min_driver.items()
        if _version_tuple(m.driver)[0] <= branch and not m.unverified
        and not (arch.max_cuda and _version_tuple(c) > _version_tuple(arch.max_cuda))
    ]
    return max(usable, key=_version_tuple)


def _choose_python(pins: StackPins, release: str | None) -> str:
    f = facts()
    if pins.python:
        return pins.python
    if release is None:
        return f.python_default
    lo, hi = f.torch_releases[release].python
    if _version_tuple(lo) <= _version_tuple(f.python_default) <= _version_tuple(hi):
        return f.python_default
    return hi


def resolve(
    gpu: Gpu,
    os_name: str = "ubuntu-24.04",
    pins: StackPins | None = None,
    *,
    nvswitch: bool | None = None,
    want_torch: bool = True,
) -> Stack:
    """Resolve one stack, or raise StackConflict naming the rule and a combination that works.

    :param nvswitch: True for an NVSwitch instance type, False for one without, None when the
        host is not known in advance (Fabric Manager is then installed only if the host has NVSwitch).
    :param want_torch: False for playbooks that install the driver but no PyTorch.
    """
    pins = pins or StackPins()
    _check_pin_syntax(pins)
    if os_name not in SUPPORTED_OS:
        raise UserInputError("--os", f"unsupported OS {os_name!r}", f"choose one of: {', '.join(SUPPORTED_OS)}")
    try:
        return _resolve(gpu, os_name, pins, nvswitch, want_torch)
    except StackConflict as conflict:
        raise _with_alternative(conflict, gpu, os_name, pins, nvswitch, want_torch) from None


def _with_alternative(
    conflict: StackConflict, gpu: Gpu, os_name: str, pins: StackPins, nvswitch: bool | None, want_torch: bool
) -> StackConflict:
    """Append what would work: the same request with one pin dropped, the failing field first.

    At most two drops work: every rule weighs two pins against each other (or one against the GPU), so a third
    pin is never part of the conflict, and dropping it leaves the conflict in place."""
    if conflict.hint:
        return conflict
    flags = {"torch_cuda": "--torch-cuda", "torch": "--torch", "driver": "--driver", "cuda": "--cuda", "python": "--python"}
    order = sorted(flags, key=lambda k: flags[k] != conflict.field)
    options: list[str] = []
    for name in order:
        if getattr(pins, name) is None:
            continue
        try:
            alt = _resolve(gpu, os_name, pins.without(name), nvswitch, want_torch)
        except StackConflict:
            continue
        options.append(_describe_change(name, alt))
    if not options:
        return conflict
    return StackConflict(conflict.field, conflict.problem, "this works instead: " + "; or ".join(options),
                         rule=conflict.rule)


def _describe_change(name: str, alt: Stack) -> str:
    stack = f"driver R{alt.driver_branch}, {alt.kernel_module} kernel module"
    if alt.torch:
        stack = f"torch {alt.torch.version}+{alt.torch.variant}, " + stack
    change = {
        "torch_cuda": f"--torch-cuda {alt.torch.variant}" if alt.torch else "no --torch-cuda",
        "torch": f"--torch {alt.torch.version}" if alt.torch else "no --torch",
        "driver": f"--driver {alt.driver_branch}",
        "cuda": "no --cuda (the torch wheel bundles its own CUDA runtime)",
        "python": f"--python {alt.python}",
    }[name]
    return f"{change} ({stack})"


def _resolve(gpu: Gpu, os_name: str, pins: StackPins, nvswitch: bool | None, want_torch: bool) -> Stack:
    f = facts()
    arch = f.architectures[gpu.arch]
    unverified: list[str] = []
    reasons: list[str] = []
    if gpu.unverified:
        unverified.append(f"{gpu.name}: {gpu.unverified}")

    _check_driver_pin(gpu, pins)  # the GPU's own driver limits first: they are the cause when both refuse
    _check_driver_installable(pins)
    _check_toolkit_arch(gpu, pins)
    torch: TorchWheel | None = None
    release: str | None = None
    minor = False
    if want_torch:
        release, variant, minor = _choose_torch(gpu, pins)
        cuda = variant_cuda(variant)
        torch = TorchWheel(
            version=pins.torch or release, variant=variant, cuda=cuda, index_url=f"{f.pytorch_index}/{variant}"
        )
        archs = _wheel_archs(release, variant)
        if archs and archs.unverified:
            unverified.append(archs.unverified)
        if f.cuda_min_driver[cuda].unverified:
            unverified.append(f.cuda_min_driver[cuda].unverified or "")
        if pins.python:
            unverified.append(f.python_ranges_unverified)
        reasons.append(f"torch {release}+{variant}: newest wheel that carries code for {gpu.sm} and fits the pins")
        if minor:
            reasons.append(f"driver {pins.driver} {f.minor_version_compat_limits}")
        for plan in f.torch_plans:
            if variant in plan.drops_variants and _version_tuple(release) < _version_tuple(plan.release):
                unverified.append(f"{plan.effect} ({plan.unverified}; {plan.source})")
    elif pins.torch or pins.torch_cuda:
        raise UserInputError("--torch", "this playbook installs no PyTorch, so a torch pin has no effect",
                             "drop the pin or use -p pytorch")

    cudas = [c for c in (torch.cuda if torch else None, pins.cuda) if c]
    branch = _choose_branch(gpu, pins, cudas)
    exact = pins.driver if pins.driver and "." in pins.driver else None
    _check_toolkit(gpu, pins, branch, exact)
    if pins.cuda and f.cuda_min_driver[pins.cuda].unverified:
        unverified.append(f.cuda_min_driver[pins.cuda].unverified or "")
    if exact:
        unverified.append(f"--driver {exact}: {f.driver_versions_unverified}")
    if pins.driver:
        unverified.append(f"driver pinning packages: {f.driver_pinning.unverified}")
    if not pins.driver:
        reasons.append(
            f"driver R{branch}: "
            + ("the last branch that supports Volta" if arch.max_driver_branch and branch == arch.max_driver_branch
               else "the branch AWS ships in its current GPU images" if branch == f.default_driver_branch
               else "the oldest branch new enough for the requested CUDA")
        )
    kernel_module = arch.kernel_module
    reasons.append(
        f"{kernel_module} kernel module: "
        + ("Blackwell supports only the open module" if arch.open_only
           else "Volta has no open module" if kernel_module == "proprietary"
           else "NVIDIA's default since R560")
    )

    fm: FabricManager = "required" if nvswitch else "no" if nvswitch is False else "auto"
    fm_package = f.fabric_manager_package(branch)
    gen4 = f.nvswitch_gen4
    nvlsm = gpu.arch in gen4.archs and fm != "no"
    if nvlsm and gen4.unverified:
        unverified.append(f"HGX B200 InfiniBand modules: {gen4.unverified}")
    if fm == "required":
        reasons.append(f"Fabric Manager ({fm_package}): NVSwitch instance; pinned to the driver's exact version, "
                       "both held" + ("; with nvlsm and the ib_umad/mlx5_ib modules (NVSwitch gen 4)" if nvlsm else ""))

    return Stack(
        gpu=gpu.name,
        arch=gpu.arch,
        compute_capability=gpu.compute_capability,
        os=os_name,
        driver_branch=branch,
        driver_version=exact,
        kernel_module=kernel_module,
        driver_pinning_package=f"nvidia-driver-pinning-{exact or branch}",
        driver_package="nvidia-open" if kernel_module == "open" else "cuda-drivers",
        fabric_manager=fm,
        fabric_manager_package=fm_package,
        nvlsm=nvlsm,
        fabric_extra_packages=gen4.packages if nvlsm else (),
        fabric_kernel_modules=gen4.modules if nvlsm else (),
        fabric_modules_package=gen4.kernel_modules_package if nvlsm else None,
        fabric_modules_load_file=gen4.modules_load_file if nvlsm else None,
        cuda_toolkit=pins.cuda,
        cuda_toolkit_package=f"cuda-toolkit-{pins.cuda.replace('.', '-')}" if pins.cuda else None,
        torch=torch,
        python=_choose_python(pins, release),
        minor_version_compat=minor,
        unverified=tuple(dict.fromkeys(u for u in unverified if u)),
        reasons=tuple(reasons),
    )
