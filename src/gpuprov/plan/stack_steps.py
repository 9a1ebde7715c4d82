"""The driver stack's steps for one OS family: headers, nouveau off, the driver, Fabric Manager, persistence and
the toolkit, from templates/ (apt: Ubuntu, Debian) or templates/el/ (dnf: Rocky, RHEL, Amazon Linux). A kept
driver (--keep-driver) gets none of them. Pure.

dnf's steps: the repository file, EPEL + CRB, `dnf module enable nvidia-driver:<branch>-open`,
the running kernel's devel package (`kernel-devel-$(uname -r)`, or `kernel6.12-devel-$(uname -r)` where Amazon
Linux 2023 namespaces its 6.12/6.18 kernels), dracut, Fabric Manager at the driver's version with `dnf versionlock`,
the toolkit (templates/el/lib_dnf.sh.j2: `gp_rpm_installed`, `gp_dnf_install`, `gp_dnf_require`,
`gp_dnf_kernel_package`). `--metrics` is refused on
dnf (its steps install with apt).

What the steps hold to. The driver step first looks for a driver that came with the image (nvidia-smi answers,
NVIDIA's pinning package is not installed: a Deep Learning AMI's): of the planned branch it is kept
(`unchanged`); of another it fails naming `--driver` and `--image fresh`, never installing a second driver over it.
The Fabric Manager step installs the package compat.py names for the branch at the driver's exact version (where
the plan does not know whether the host has NVSwitch, it looks itself, as hosts/detect.NVSWITCH_SCAN does); on HGX
B200 it also installs nvlsm, infiniband-diags and the running kernel's modules-extra package
(linux-modules-extra-$(uname -r) on apt, kernel-modules-extra or kernel6.12-modules-extra on dnf), loads ib_umad
and mlx5_ib and lists them in /etc/modules-load.d/gpuprov-nvswitch.conf. The persistence step's drop-in runs the daemon with
`--persistence-mode` (the packaged unit says `--no-persistence-mode`) and fails if nvidia-smi still reports it
Disabled.

apt and dpkg. Every call that takes their locks (`apt-get update`/`install`, `dpkg -i`, `apt-mark hold`) goes
through `gp_locked` (templates/lib.sh.j2): they lock with fcntl(2) record locks, which flock(1) neither sees nor
takes, and only `apt-get install` waits for them itself; so `gp_locked` reruns the command while it fails with a
lock message, up to GPUPROV_APT_LOCK_TIMEOUT (900 s), then fails naming the holder. "Installed" is
`${db:Status-Status}` = `installed` (a held package's `${Status}` is `hold ok installed`). A step acts only on what
is missing, so once NVIDIA publishes a newer point release a rerun keeps the installed, held version (a plain
`apt-get install` of a held package would fail). The branch's pinning package (`nvidia-driver-pinning-<branch>`,
whose preferences file keeps every driver package in the branch) is installed in its own call before the driver:
in one call the pin is not in effect yet and apt picks the newest branch. A package or version the repositories
lack fails before anything is installed: right after NVIDIA's repository is set up the driver step asks
`apt-cache policy` for every package of the plan, the Fabric Manager and toolkit steps for their own
(`gp_apt_require`), naming the package, the OS and what the repository has of its kind. The dnf steps ask
`dnf repoquery --available` the same way.
"""

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
                 + (": the running kernel's devel package and kernel-headers" if stack.family == "dnf" else "")),
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
