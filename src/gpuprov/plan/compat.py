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

A GPU's own driver limits (`gpu-max-driver-branch`, `gpu-min-driver-branch`) are checked before whether the branch
is installable, so a B200 on R550 hears about its R570 floor. Minor-version compatibility: 12.x on >= 525, 13.x on
>= 580, and no PTX JIT of newer code. The driver's own packages drop the branch from their names at R590, a
cut-off separate from Fabric Manager's R580. Limits the data already implies (an architecture's CUDA range against
the wheels' arch lists, the proprietary module's removal after Volta's last branch) are checks on stack.yaml in
tests/test_compat.py, not rules here. `choose_torch_for_driver` answers "the newest wheel for an installed
driver" for fixes on existing hosts (doctor, a kept driver).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby

from pydantic import BaseModel

from gpuprov.errors import StackConflict, UserInputError
from gpuprov.plan import oses
from gpuprov.plan.catalog import Gpu
from gpuprov.plan.pins import (
    check_driver_installable,
    check_driver_pin,
    check_pin_syntax,
    check_toolkit,
    check_toolkit_arch,
    check_toolkit_os,
)
from gpuprov.plan.stack import (
    FabricManager,
    Stack,
    StackPins,
    TorchWheel,
    driver_runs,
    facts,
    min_branch_for,
    release_family,
    sm_runs,
    supported_branch_from,
    variant_cuda,
    version_tuple,
    wheel_archs,
)

# why the default driver branch is chosen, as a plan on AWS or on no cloud says it (a catalog of another cloud says
# its own: Catalog.default_branch_why)
DEFAULT_BRANCH_WHY = "the branch AWS ships in its current GPU images"


def _torch_candidates(pins: StackPins) -> Iterator[tuple[str, str]]:
    """(release, variant) pairs in preference order: newest release first, the release's own
    PyPI default variant first (the one the PyTorch project ships to most users), then newer ones."""
    f = facts()
    releases = sorted(f.torch_releases, key=version_tuple, reverse=True)
    if pins.torch:
        releases = [release_family(pins.torch)]
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


class _Problem(BaseModel):
    rule: str
    text: str
    hint: str = ""


def _torch_problem(gpu: Gpu, release: str, variant: str, pins: StackPins, allow_minor: bool = True,
                   cpu_arch: str = "x86_64") -> _Problem | None:
    """Why this wheel cannot serve this GPU with these pins, or None when it can.

    :param allow_minor: accept a driver older than the wheel's CUDA minimum when CUDA minor-version
        compatibility covers it (the wheel then runs with a limited feature set).
    :param cpu_arch: the host's CPU: an aarch64 host takes only the wheels PyTorch builds for Linux aarch64.
    """
    f = facts()
    arch = f.architectures[gpu.arch]
    info = f.torch_releases[release]
    if variant not in info.variants:
        return _Problem(rule="wheel-variant-missing",
                        text=f"torch {release} has no {variant} wheels (it ships {', '.join(info.variants)})")
    if arch.min_torch and version_tuple(release) < version_tuple(arch.min_torch):
        return _Problem(rule="arch-min-torch", text=f"{gpu.name} ({gpu.sm}) needs torch ≥ {arch.min_torch}")
    archs = wheel_archs(release, variant, cpu_arch)
    if archs is None and cpu_arch == "aarch64":
        return _Problem(rule="wheel-no-aarch64", text=f"torch {release}+{variant} has no Linux aarch64 wheel")
    if archs is None or not sm_runs(archs.sm, gpu.compute_capability):
        built = ", ".join("sm_" + s.replace(".", "") for s in archs.sm) if archs else "unknown archs"
        which = "Linux aarch64 wheels" if cpu_arch == "aarch64" else "wheels"
        return _Problem(rule="wheel-no-sass",
                        text=f"torch {release}+{variant} {which} carry code for {built}, not {gpu.name}'s {gpu.sm}")
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
                                 f"(R{min_branch_for(minimum)}); driver {pins.driver} is older")
    if pins.python:
        lo, hi = info.python
        if not version_tuple(lo) <= version_tuple(pins.python) <= version_tuple(hi):
            return _Problem(rule="python-range", text=f"torch {release} supports Python {lo}–{hi}, not {pins.python}")
    return None


def _choose_torch(gpu: Gpu, pins: StackPins, cpu_arch: str = "x86_64") -> tuple[str, str, bool]:
    """(release, variant, needs minor-version compatibility): the newest release that fits; within it, a
    wheel the driver runs natively before one that runs only through minor-version compatibility."""
    problems: list[_Problem] = []
    for release, group in groupby(_torch_candidates(pins), key=lambda c: c[0]):
        variants = [v for _, v in group]
        for allow_minor in (False, True):
            for variant in variants:
                problem = _torch_problem(gpu, release, variant, pins, allow_minor, cpu_arch)
                if problem is None:
                    return release, variant, allow_minor
                if allow_minor:
                    problems.append(problem)
    field = ("--torch-cuda" if pins.torch_cuda else "--torch" if pins.torch else "--driver" if pins.driver
             else "--cuda" if pins.cuda else "--python")
    if problems and problems[0].rule == "nvcc-torch-major-mismatch":
        field = "--cuda"
    first = problems[0]  # never empty: pins that pass check_pins leave at least one candidate wheel
    if cpu_arch == "aarch64" and not first.hint and not _any_aarch64_wheel(gpu):  # no pin could help: the GPU
        field = "--gpu"
        first = first.model_copy(update={"hint": f"no Linux aarch64 torch wheel carries {gpu.sm}: a playbook without "
                                                 "torch (-p minimal) installs the driver alone"})
    raise StackConflict(field, first.text, first.hint, rule=first.rule)


def _any_aarch64_wheel(gpu: Gpu) -> bool:
    return any(sm_runs(row.sm, gpu.compute_capability) for row in facts().aarch64_wheel_archs)


def variants_with_sass(release: str, compute_capability: str) -> list[str]:
    """The CUDA variants of a torch release whose wheels carry code a GPU of this compute capability runs
    (the release's PyPI default first). For `check` when a wheel fails with "no kernel image is available"."""
    info = facts().torch_releases.get(".".join(release.split("+")[0].split(".")[:2]))
    if info is None:
        return []
    name = ".".join(release.split("+")[0].split(".")[:2])
    fits = [v for v in info.variants if (archs := wheel_archs(name, v)) and sm_runs(archs.sm, compute_capability)]
    return sorted(fits, key=lambda v: v != info.pypi_default)


def choose_torch_for_driver(gpu: Gpu, driver: str, pins: StackPins | None = None,
                            cpu_arch: str = "x86_64") -> TorchWheel:
    """The newest torch wheel that runs on an already-installed driver (any branch, also ones gpuprov would not
    install), minor-version compatibility included, within the torch/wheel/Python pins given. For doctor's fixes
    and for hosts whose driver is kept (plan/kept.py); StackConflict when none runs."""
    pins = (pins or StackPins()).model_copy(update={"driver": driver})
    release, variant, _ = _choose_torch(gpu, pins, cpu_arch)
    return TorchWheel(version=pins.torch or release, variant=variant, cuda=variant_cuda(variant),
                      index_url=f"{facts().pytorch_index}/{variant}")


def _choose_branch(gpu: Gpu, pins: StackPins, cudas: list[str]) -> int:
    f = facts()
    arch = f.architectures[gpu.arch]
    if pins.driver:
        return int(pins.driver.split(".")[0])
    branch = supported_branch_from(f.default_driver_branch)
    if arch.max_driver_branch:
        branch = min(branch, arch.max_driver_branch)
    needed = max((min_branch_for(f.cuda_min_driver[c].driver) for c in cudas), default=0)
    if arch.min_driver_branch:
        needed = max(needed, arch.min_driver_branch)
    # every CUDA up to the architecture's max_cuda runs on its last branch (test_compat.py checks the data), and a
    # CUDA above it was refused before (toolkit-max-cuda, or no wheel with code for the GPU)
    return max(branch, needed)


def newest_cuda(gpu: Gpu, branch: int, os_name: str | None = None) -> str:
    """The newest CUDA toolkit that this driver branch runs, this GPU still supports and (given an OS) NVIDIA's
    repository for that OS carries."""
    f = facts()
    arch = f.architectures[gpu.arch]
    in_repo = f.repo_toolkits.get(os_name or "")
    usable = [
        c for c, m in f.cuda_min_driver.items()
        if version_tuple(m.driver)[0] <= branch and not m.unverified
        and not (arch.max_cuda and version_tuple(c) > version_tuple(arch.max_cuda))
        and (in_repo is None or c in in_repo)
    ]
    return max(usable, key=version_tuple)


def choose_python(pins: StackPins, release: str | None) -> str:
    f = facts()
    if pins.python:
        return pins.python
    if release is None:
        return f.python_default
    lo, hi = f.torch_releases[release].python
    if version_tuple(lo) <= version_tuple(f.python_default) <= version_tuple(hi):
        return f.python_default
    return hi


def resolve(
    gpu: Gpu,
    os_name: str = "ubuntu-24.04",
    pins: StackPins | None = None,
    *,
    nvswitch: bool | None = None,
    want_torch: bool = True,
    cpu_arch: str = "x86_64",
    default_why: str = DEFAULT_BRANCH_WHY,
) -> Stack:
    """Resolve one stack, or raise StackConflict naming the rule and a combination that works.

    :param nvswitch: True for an NVSwitch instance type, False for one without, None when the
        host is not known in advance (Fabric Manager is then installed only if the host has NVSwitch).
    :param want_torch: False for playbooks that install the driver but no PyTorch.
    :param cpu_arch: the host's CPU (`uname -m`): an aarch64 host's wheel must be one PyTorch builds for it.
    :param default_why: why the default driver branch is the default, in the words of the plan's cloud.
    """
    pins = pins or StackPins()
    check_pin_syntax(pins)
    oses.info(os_name)  # an unknown name is refused, naming the ones there are
    try:
        return _resolve(gpu, os_name, pins, nvswitch, want_torch, cpu_arch, default_why)
    except StackConflict as conflict:
        raise _with_alternative(conflict, gpu, os_name, pins, nvswitch, want_torch, cpu_arch, default_why) from None


def _with_alternative(
    conflict: StackConflict, gpu: Gpu, os_name: str, pins: StackPins, nvswitch: bool | None, want_torch: bool,
    cpu_arch: str = "x86_64", default_why: str = DEFAULT_BRANCH_WHY,
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
            alt = _resolve(gpu, os_name, pins.without(name), nvswitch, want_torch, cpu_arch, default_why)
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


def _resolve(gpu: Gpu, os_name: str, pins: StackPins, nvswitch: bool | None, want_torch: bool,
             cpu_arch: str = "x86_64", default_why: str = DEFAULT_BRANCH_WHY) -> Stack:
    f = facts()
    arch = f.architectures[gpu.arch]
    unverified: list[str] = []
    reasons: list[str] = []
    if gpu.unverified:
        unverified.append(f"{gpu.name}: {gpu.unverified}")

    check_driver_pin(gpu, pins)  # the GPU's own driver limits first: they are the cause when both refuse
    check_driver_installable(pins)
    os_info = oses.info(os_name)
    if os_info.family == "dnf" and pins.driver and "." in pins.driver:
        raise StackConflict("--driver", f"on {os_name} gpuprov holds a driver branch with NVIDIA's module stream "
                            f"(nvidia-driver:{pins.driver.split('.')[0]}-open), not an exact release",
                            f"pin the branch: --driver {pins.driver.split('.')[0]}", rule="dnf-exact-driver")
    check_toolkit_arch(gpu, pins)
    check_toolkit_os(os_name, pins)
    torch: TorchWheel | None = None
    release: str | None = None
    minor = False
    if want_torch:
        release, variant, minor = _choose_torch(gpu, pins, cpu_arch)
        cuda = variant_cuda(variant)
        torch = TorchWheel(
            version=pins.torch or release, variant=variant, cuda=cuda, index_url=f"{f.pytorch_index}/{variant}"
        )
        archs = wheel_archs(release, variant, cpu_arch)
        if archs and archs.unverified:
            unverified.append(archs.unverified)
        if f.torch_releases[release].unverified:
            unverified.append(f"torch {release}: {f.torch_releases[release].unverified}")
        if f.cuda_min_driver[cuda].unverified:
            unverified.append(f.cuda_min_driver[cuda].unverified or "")
        if pins.python and f.python_ranges_unverified:
            unverified.append(f.python_ranges_unverified)
        reasons.append(f"torch {release}+{variant}: newest wheel that carries code for {gpu.sm} and fits the pins")
        if minor:
            reasons.append(f"driver {pins.driver} {f.minor_version_compat_limits}")
        for plan in f.torch_plans:
            if variant in plan.drops_variants and version_tuple(release) < version_tuple(plan.release):
                unverified.append(f"{plan.effect} ({plan.unverified}; {plan.source})")
    elif pins.torch or pins.torch_cuda:
        raise UserInputError("--torch", "this playbook installs no PyTorch, so a torch pin has no effect",
                             "drop the pin or use -p pytorch")

    cudas = [c for c in (torch.cuda if torch else None, pins.cuda) if c]
    branch = _choose_branch(gpu, pins, cudas)
    exact = pins.driver if pins.driver and "." in pins.driver else None
    check_toolkit(gpu, pins, branch, exact)
    if pins.cuda and f.cuda_min_driver[pins.cuda].unverified:
        unverified.append(f.cuda_min_driver[pins.cuda].unverified or "")
    if exact and f.driver_versions_unverified:
        unverified.append(f"--driver {exact}: {f.driver_versions_unverified}")
    if pins.driver and f.driver_pinning.unverified:
        unverified.append(f"driver pinning packages: {f.driver_pinning.unverified}")
    if pins.cuda and f.repo_toolkits_unverified:
        unverified.append(f"cuda-toolkit packages per OS: {f.repo_toolkits_unverified}")
    if f.driver_pinning.branches and branch not in f.driver_pinning.branches:
        unverified.append(f"nvidia-driver-pinning-{branch}: no source read shows it in NVIDIA's repository (branches "
                          f"with one: {', '.join(map(str, f.driver_pinning.branches))}); the host's apt is asked for it "
                          "before anything is installed")
    warnings = [f"driver {ended}; --driver {supported_branch_from(branch)} is supported"
                for ended in [f.branch_ended(branch)] if ended]
    if not pins.driver:
        reasons.append(
            f"driver R{branch}: "
            + ("the last branch that supports Volta" if arch.max_driver_branch and branch == arch.max_driver_branch
               else default_why if branch == f.default_driver_branch
               else "the supported branch after the default, which NVIDIA has ended"
               if branch == supported_branch_from(f.default_driver_branch)
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
    if os_info.family == "dnf" and branch < f.fabric_manager_unversioned_from.branch:
        # NVIDIA/gpu-driver-container rhel9/install.sh @ 038c8b5: `nvidia-fabric-manager-${DRIVER_VERSION}` before R580
        fm_package = "nvidia-fabric-manager"
    gen4 = f.nvswitch_gen4
    nvlsm = gpu.arch in gen4.archs and fm != "no"
    if nvlsm and gen4.unverified:
        unverified.append(f"HGX B200 InfiniBand modules: {gen4.unverified}")
    if fm == "required":
        reasons.append(f"Fabric Manager ({fm_package}): NVSwitch instance; pinned to the driver's exact version, "
                       "both held" + ("; with nvlsm and the ib_umad/mlx5_ib modules (NVSwitch gen 4)" if nvlsm else ""))

    if os_info.unverified:
        unverified.append(f"{os_name}: {os_info.unverified}")
    # NVIDIA's guide, Table 5: `dnf module enable nvidia-driver:<branch>-open` (the proprietary module's stream is
    # `<branch>-dkms`, as NVIDIA's driver container enables it); data/os.yaml
    stream = (f"nvidia-driver:{branch}-{'open' if kernel_module == 'open' else 'dkms'}"
              if os_info.family == "dnf" and os_info.lock == "module" else None)
    # EL10 (no modularity), the same Table 5: `dnf versionlock \*nvidia\*<branch>\*` before `dnf install nvidia-open`
    versionlock = f"*nvidia*{branch}*" if os_info.lock == "versionlock" else None
    return Stack(
        gpu=gpu.name,
        arch=gpu.arch,
        compute_capability=gpu.compute_capability,
        os=os_name,
        family=os_info.family,
        repo=os_info.repo,
        driver_stream=stream,
        driver_versionlock=versionlock,
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
        fabric_modules_package=gen4.kernel_modules_package[os_info.family] if nvlsm else None,
        fabric_modules_load_file=gen4.modules_load_file if nvlsm else None,
        cuda_toolkit=pins.cuda,
        cuda_toolkit_package=f"cuda-toolkit-{pins.cuda.replace('.', '-')}" if pins.cuda else None,
        torch=torch,
        python=choose_python(pins, release),
        minor_version_compat=minor,
        unverified=tuple(dict.fromkeys(u for u in unverified if u)),
        reasons=tuple(reasons),
        warnings=tuple(warnings),
    )
