"""The driver stack's steps for one OS family: headers, nouveau off, the driver, Fabric Manager, persistence and
the toolkit, from templates/ (apt: Ubuntu, Debian) or templates/el/ (dnf: Rocky, RHEL, Amazon Linux). A kept
driver (--keep-driver) gets none of them. Pure."""

from __future__ import annotations

from gpuprov.errors import UserInputError
from gpuprov.plan import oses
from gpuprov.plan.monitoring import Monitoring
from gpuprov.plan.render import StepPlan
from gpuprov.plan.stack import Stack


def _template(stack: Stack, name: str) -> str:
    return f"el/{name}" if stack.family == "dnf" else name


def driver_stack_steps(stack: Stack) -> list[StepPlan]:
    if stack.kept_driver:
        return []
    lock = (f"held by the module stream {stack.driver_stream}" if stack.driver_stream else
            f"held by dnf versionlock {stack.driver_versionlock}" if stack.driver_versionlock else "held")
    steps = [
        StepPlan("kernel-headers", _template(stack, "headers.sh.j2"), "stack",
                 "headers for the running kernel (DKMS builds against them)"
                 + (": kernel-devel and kernel-headers of uname -r" if stack.family == "dnf" else "")),
        StepPlan("nouveau-off", _template(stack, "nouveau.sh.j2"), "stack",
                 "blacklist nouveau so the NVIDIA module can load"
                 + (" (initramfs rebuilt with dracut)" if stack.family == "dnf" else "")),
        StepPlan("nvidia-driver", _template(stack, "driver.sh.j2"), "stack",
                 f"NVIDIA R{stack.driver_branch} {stack.kernel_module} driver from NVIDIA's CUDA repo"
                 + (f" ({stack.repo})" if stack.family == "dnf" else "") + f", {lock}; reboot if fresh",
                 (("os_info", oses.table().oses.get(stack.os)),)),
    ]
    if stack.fabric_manager != "no":
        when = "" if stack.fabric_manager == "required" else " if the host has NVSwitch"
        steps.append(StepPlan(
            "fabric-manager", _template(stack, "fabricmanager.sh.j2"), "stack",
            f"{stack.fabric_manager_package} at the driver's exact version, held{when}"
            + (f" (+ {', '.join(stack.fabric_extra_packages)}; {', '.join(stack.fabric_kernel_modules)} loaded "
               f"at every boot from {stack.fabric_modules_package})" if stack.nvlsm else ""),
        ))
    steps.append(StepPlan("persistence", "persistence.sh.j2", "stack",
                          "nvidia-persistenced with --persistence-mode (systemd drop-in), enabled and running"))
    if stack.cuda_toolkit_package:
        steps.append(StepPlan("cuda-toolkit", _template(stack, "cuda_toolkit.sh.j2"), "stack",
                              f"{stack.cuda_toolkit_package} (nvcc)"))
    return steps


def check_monitoring_os(monitoring: Monitoring, os_name: str) -> None:
    """The exporters' steps install with apt (the node exporter, DCGM from NVIDIA's apt repositories)."""
    info = oses.table().oses.get(os_name)
    if monitoring.metrics != "off" and info is not None and info.family == "dnf":
        raise UserInputError("--metrics", f"gpuprov's metrics steps install with apt; {os_name} uses dnf",
                             "leave --metrics out on this OS (the health watch needs them too)")
