"""A host whose driver is not gpuprov's (`bootstrap --keep-driver`, a playbook's `driver: keep`): a rented box whose
provider owns the driver, a shared lab server. Nothing touches the kernel, the driver, Fabric Manager or
persistence, and nothing reboots; the stack is the newest torch wheel whose CUDA runs on the installed driver and
GPU (CUDA minor-version compatibility included: the resolver doctor uses, compat.choose_torch_for_driver), or a
refusal naming the driver branch a wheel would need. Pure, like the rest of plan/.

`resolve_kept` checks the GPU's own driver limits against the installed version before the resolver picks a
wheel, and a refusal names the oldest branch a wheel runs on (`oldest_branch_for`). `--driver` and `--cuda` are
refused with a kept driver; a launched node has no driver to keep.
"""

from __future__ import annotations

import re

from gpuprov.errors import StackConflict, UserInputError
from gpuprov.plan import compat, oses
from gpuprov.plan.catalog import Gpu
from gpuprov.plan.pins import check_driver_pin
from gpuprov.plan.stack import (
    Stack,
    StackPins,
    driver_runs,
    facts,
    release_family,
    sm_runs,
    variant_cuda,
    version_tuple,
    wheel_archs,
)

FLAG = "--keep-driver"


def check_kept_pins(pins: StackPins, installed: str) -> None:
    """Pins that cannot apply to a driver gpuprov does not install."""
    if pins.driver:
        raise UserInputError("--driver", f"--keep-driver keeps the host's driver {installed}, so a driver pin does not "
                             "apply", "drop --driver, or drop --keep-driver to have gpuprov install that branch")
    if pins.cuda:
        raise UserInputError("--cuda", "with --keep-driver no CUDA toolkit is installed: it comes from NVIDIA's "
                             "repository, which only the driver step sets up",
                             "drop --cuda (the torch wheel bundles its CUDA runtime), or drop --keep-driver")


def oldest_branch_for(gpu: Gpu, pins: StackPins) -> tuple[int, str] | None:
    """(branch, minimum driver) of the oldest driver on which some torch wheel (within the pins) runs on this GPU,
    counting CUDA minor-version compatibility: the upgrade a refusal names."""
    f = facts()
    releases = [release_family(pins.torch)] if pins.torch else list(f.torch_releases)
    needs: list[str] = []
    for release in releases:
        for variant in f.torch_releases[release].variants:
            archs = wheel_archs(release, variant)
            if pins.torch_cuda not in (None, variant) or archs is None or not sm_runs(archs.sm, gpu.compute_capability):
                continue
            cuda = variant_cuda(variant)
            family = f.minor_version_compat.get(cuda.split(".")[0])
            needs.append(family.min_driver if family else f.cuda_min_driver[cuda].driver)
    if not needs:
        return None
    lowest = min(needs, key=version_tuple)
    return version_tuple(lowest)[0], lowest


def resolve_kept(gpu: Gpu, os_name: str, pins: StackPins, installed: str, want_torch: bool,
                 cpu_arch: str = "x86_64") -> Stack:
    """The stack for a host that keeps its driver `installed` ("550.54.14", from nvidia-smi)."""
    if not re.fullmatch(r"\d{3}\.\d+(\.\d+)?", installed):
        raise UserInputError(FLAG, f"the host's driver version {installed!r} is not one gpuprov can read",
                             "check `nvidia-smi --query-gpu=driver_version --format=csv,noheader` on the host")
    check_kept_pins(pins, installed)
    kept = pins.model_copy(update={"driver": installed})
    branch = int(installed.split(".")[0])
    try:
        check_driver_pin(gpu, kept)  # the GPU's own limits: a B200 needs R570 whatever the wheel
    except StackConflict as exc:
        raise StackConflict(FLAG, f"the host's driver {installed}: {exc.problem}",
                            "upgrade the host's driver (or drop --keep-driver and let gpuprov install one)",
                            rule=exc.rule) from None
    info = oses.table().oses.get(os_name)
    reasons = [f"driver {installed} (R{branch}): the host's own, kept (--keep-driver): no kernel, driver, Fabric "
               "Manager, persistence or reboot steps"]
    unverified: list[str] = []
    torch = None
    minor = False
    if want_torch:
        try:
            torch = compat.choose_torch_for_driver(gpu, installed, kept, cpu_arch)
        except StackConflict as exc:
            need = oldest_branch_for(gpu, pins)
            hint = (f"upgrade the host's driver to R{need[0]} (≥ {need[1]}) or newer, the oldest a torch wheel for "
                    f"{gpu.name} runs on" if need and version_tuple(need[1]) > version_tuple(installed) else
                    "drop the torch pins") + "; or drop --keep-driver and let gpuprov install a driver"
            raise StackConflict(FLAG, f"no torch wheel runs on the host's driver {installed} and {gpu.name}: "
                                f"{exc.problem}", hint, rule=exc.rule) from None
        minor = driver_runs(torch.cuda, installed)[1]
        native = facts().cuda_min_driver[torch.cuda].driver
        reasons.append(f"torch {torch.version}+{torch.variant}: the newest wheel with code for {gpu.sm} whose CUDA "
                       f"{torch.cuda} runs on driver {installed}"
                       + (f" through CUDA minor-version compatibility (natively it needs ≥ {native}): "
                          f"{facts().minor_version_compat_limits}" if minor else f" (it needs ≥ {native})"))
        if (archs := wheel_archs(release_family(torch.version), torch.variant)) and archs.unverified:
            unverified.append(archs.unverified)
    elif pins.torch or pins.torch_cuda:
        raise UserInputError("--torch", "this playbook installs no PyTorch, so a torch pin has no effect",
                             "drop the pin or use -p pytorch")
    return Stack(
        gpu=gpu.name, arch=gpu.arch, compute_capability=gpu.compute_capability, os=os_name,
        family=info.family if info else "apt", repo=info.repo if info else "", kept_driver=True,
        driver_branch=branch, driver_version=installed, kernel_module=facts().architectures[gpu.arch].kernel_module,
        driver_pinning_package="", driver_package="", fabric_manager="no", fabric_manager_package="", nvlsm=False,
        cuda_toolkit=None, cuda_toolkit_package=None, torch=torch,
        python=compat.choose_python(pins, release_family(torch.version) if torch else None),
        minor_version_compat=minor, unverified=tuple(unverified), reasons=tuple(reasons),
    )
