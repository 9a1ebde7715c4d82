"""Pins checked before the solver runs: malformed or unknown values, drivers gpuprov cannot hold apt at,
and a pinned driver or toolkit against the GPU's own limits. Each refusal names the flag and the rule.

Rule ids: `driver-no-pinning-package`, `driver-version-unknown`, `gpu-max-driver-branch`, `gpu-min-driver-branch`,
`toolkit-max-cuda`, …, and against the OS's repository `toolkit-not-for-os` (`--cuda 12.4 --os ubuntu-24.04`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gpuprov.errors import StackConflict, UserInputError
from gpuprov.plan.stack import StackPins, driver_satisfies, facts, min_branch_for, release_family, version_tuple

if TYPE_CHECKING:  # the type only: `bootstrap` checks pins before any GPU is known, and need not import the catalog
    from gpuprov.plan.catalog import Gpu


def check_pins(pins: StackPins) -> None:
    """Reject malformed or unknown pins, and drivers gpuprov cannot install (before any GPU is known)."""
    check_pin_syntax(pins)
    check_driver_installable(pins)


def check_pin_syntax(pins: StackPins) -> None:
    """Malformed or unknown pins."""
    if not (pins.driver is None and pins.cuda is None and pins.torch is None and pins.torch_cuda is None):
        check_known_pins(pins)  # stack.yaml is read only when a pin needs a look-up (most runs pin nothing)
    if pins.python is not None and not re.fullmatch(r"3\.\d+", pins.python):
        raise UserInputError("--python", f"{pins.python!r} is not a Python version", "e.g. 3.12")


def check_known_pins(pins: StackPins) -> None:
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
        not re.fullmatch(r"\d+\.\d+(\.\d+)?", pins.torch) or release_family(pins.torch) not in f.torch_releases
    ):
        raise UserInputError(
            "--torch", f"unknown torch release {pins.torch!r}",
            f"known: {', '.join(f.torch_releases)} (optionally with a patch, e.g. 2.9.1)",
        )
    if pins.torch_cuda is not None:
        known = sorted({v for r in f.torch_releases.values() for v in r.variants})
        if pins.torch_cuda not in known:
            raise UserInputError("--torch-cuda", f"unknown wheel variant {pins.torch_cuda!r}", f"known: {', '.join(known)}")


def check_driver_installable(pins: StackPins) -> None:
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


def check_driver_pin(gpu: Gpu, pins: StackPins) -> None:
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


def check_toolkit_arch(gpu: Gpu, pins: StackPins) -> None:
    """The toolkit against the GPU's architecture (before any wheel is chosen: it names the real cause)."""
    if not pins.cuda:
        return
    arch = facts().architectures[gpu.arch]
    cuda = pins.cuda
    if arch.max_cuda and version_tuple(cuda) > version_tuple(arch.max_cuda):
        raise StackConflict(
            "--cuda", f"{gpu.name} ({gpu.sm}) is supported by CUDA toolkits up to {arch.max_cuda}, not {cuda}",
            f"use --cuda {arch.max_cuda}", rule="toolkit-max-cuda",
        )
    if arch.min_cuda and version_tuple(cuda) < version_tuple(arch.min_cuda):
        raise StackConflict(
            "--cuda", f"{gpu.name} ({gpu.sm}) needs CUDA ≥ {arch.min_cuda}", f"use --cuda {arch.min_cuda} or newer",
            rule="toolkit-min-cuda",
        )


def check_toolkit(gpu: Gpu, pins: StackPins, branch: int, exact: str | None) -> None:
    if not pins.cuda:
        return
    cuda = pins.cuda
    minimum = facts().cuda_min_driver[cuda].driver
    if pins.driver and not driver_satisfies(branch, exact, minimum):
        raise StackConflict(
            "--driver",
            f"CUDA {cuda} needs driver ≥ {minimum}; driver {pins.driver} is older",
            f"use --driver {min_branch_for(minimum)} or newer, or an older --cuda",
            rule="toolkit-needs-newer-driver",
        )


def check_toolkit_os(os_name: str, pins: StackPins) -> None:
    """A toolkit NVIDIA's repository for this OS does not carry (stack.yaml `repo_toolkits`, refreshed from its
    Packages index): refused here, before a host installs a driver and then fails at the toolkit."""
    if not pins.cuda:
        return
    have = facts().repo_toolkits.get(os_name)
    if have is None or pins.cuda in have:
        return
    package = f"cuda-toolkit-{pins.cuda.replace('.', '-')}"
    elsewhere = [os for os, kits in sorted(facts().repo_toolkits.items()) if pins.cuda in kits]
    raise StackConflict(
        "--cuda",
        f"NVIDIA's {os_name} repository has no {package} (CUDA {pins.cuda}): its toolkits are "
        f"{have[0]} to {have[-1]}",
        f"use --cuda {next((k for k in have if version_tuple(k) >= version_tuple(pins.cuda)), have[-1])}"
        + (f", or --os {elsewhere[0]} (whose repository has it)" if elsewhere else ""),
        rule="toolkit-not-for-os",
    )
