"""How each existing host gets its plan: its GPU (given, or detected from its facts) and OS (given, or its
own), refused before anything is installed when the host is not what the command line said. Hosts alike
share one plan object, and so one rendered bundle; a plan the command line already decides is known
`ahead`, before any host is contacted."""

from __future__ import annotations

import threading

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.hosts.detect import HostFacts
from gpuprov.plan.inventory import Target
from gpuprov.plan.monitoring import Monitoring
from gpuprov.plan.plan import GuardRequest, Plan
from gpuprov.plan.sources import Sources
from gpuprov.plan.stack import CpuArch, StackPins


class Planner:
    """How each existing host gets its plan: its GPU (given, or detected) and OS (given, or its own). Hosts alike
    share one plan object, and so one rendered bundle: 32 of them are planned once."""

    def __init__(self, gpu: str | None, playbook: str, os_name: str | None, pins: StackPins,
                 guard: GuardRequest | None = None, jupyter: bool = False, monitoring: Monitoring | None = None,
                 keep_driver: bool = False, docker: bool = False,
                 sources: tuple[Sources, str] | None = None) -> None:
        from gpuprov.plan.spec import load_playbook

        self.gpu, self.playbook, self.os_name, self.pins = gpu, playbook, os_name, pins
        self.guard, self.jupyter, self.monitoring, self.docker = guard, jupyter, monitoring, docker
        self.sources = sources  # --sources, with how it was named
        book = load_playbook(playbook)
        self.stack_none = book.stack == "none"
        # --keep-driver, or the playbook's `driver: keep`: the host's installed driver is used as it is
        self.keep_driver = keep_driver or book.driver == "keep"
        self._plans: dict[tuple[str | None, str, bool | None, str | None, str | None, CpuArch, str | None], Plan] = {}
        self._lock = threading.Lock()

    def __call__(self, target: Target, facts: HostFacts) -> Plan:
        from gpuprov.plan.stack import SUPPORTED_OS

        wanted = target.gpu or self.gpu
        if wanted and facts.gpus:
            from gpuprov.plan import catalog

            name = catalog.load().gpu(catalog.parse_gpu_request(wanted)[0]).name
            if set(facts.gpus) != {name} and set(facts.gpus) != {"unknown"}:
                field = target.field("gpu", "--gpu") if target.gpu else "--gpu"
                raise UserInputError(field, f"{target.name} has {', '.join(sorted(set(facts.gpus)))} "
                                     f"(from {facts.source}), not {name}; nothing was installed",
                                     f"drop {'its gpu:' if target.gpu and target.origin else '--gpu'} to use what "
                                     "the host has, or pick the right host")
        detected = facts.gpu if facts.gpu and facts.gpu != "unknown" else None
        if not wanted and facts.unknown_gpu_text:
            raise UserInputError("--gpu", f"{target.name} has {facts.unknown_gpu_text}: pass --gpu",
                                 "name the GPU model (`gpuprov gpus` lists them); nothing was installed")
        os_used = target.os or self.os_name or facts.os
        kept = self._kept_driver(target, facts) if self.keep_driver and not self.stack_none else None
        # a `stack: none` playbook, or a kept driver, installs no system package: any Linux with bash will do
        if os_used not in SUPPORTED_OS and not self.stack_none and kept is None:
            raise UserInputError("--os", f"{target.name} runs {facts.os or 'an unknown OS'}; gpuprov's scripts support "
                                 f"{', '.join(SUPPORTED_OS)}", "pass --os to run them anyway, at your own risk")
        if facts.home is not None and kept is None and not self.stack_none:
            raise UserInputError("--keep-driver", f"{target.name}: {target.user or 'this login'} has no root there (not "
                                 "uid 0, and `sudo -n true` fails), which installing the NVIDIA driver needs; nothing "
                                 "was installed", "pass --keep-driver to use the host's own driver, or log in as a "
                                 "user with sudo")
        if facts.arch not in (None, "x86_64", "aarch64"):
            raise UserInputError(target.name, f"an {facts.arch} host; NVIDIA's repositories and gpuprov's "
                                 "steps are for x86_64 and aarch64 hosts; nothing was installed", "pick another host")
        arch: CpuArch | None = "aarch64" if facts.arch == "aarch64" else "x86_64" if facts.arch else None
        # an ECS instance (its type read from ECS's metadata) has its interrupt watch read ECS's notice
        notice = "alibaba" if (facts.instance_type or "").startswith("ecs.") else None
        return self._plan(wanted or detected, os_used or "linux", True if facts.nvswitch else None, kept, facts.home,
                          arch, notice)

    @staticmethod
    def _kept_driver(target: Target, facts: HostFacts) -> str:
        if facts.driver_version is None:
            raise UserInputError("--keep-driver", f"{target.name} has no NVIDIA driver that answers (nvidia-smi, "
                                 "/proc/driver/nvidia/version), so there is none to keep; nothing was installed",
                                 "drop --keep-driver (and `driver: keep`) to have gpuprov install one")
        return facts.driver_version

    def ahead(self, target: Target) -> Plan | None:
        """The plan `target` gets unless its facts surprise (NVSwitch, or a GPU where none is named and the
        playbook installs no stack), when the command line already says its GPU (or needs none) and its OS.
        None when its facts decide."""
        from gpuprov.plan.spec import load_playbook
        from gpuprov.plan.stack import SUPPORTED_OS

        wanted, os_used = target.gpu or self.gpu, target.os or self.os_name
        if self.keep_driver and not self.stack_none:
            return None  # the host's driver decides the wheel
        if os_used not in SUPPORTED_OS:
            return None
        try:
            if not wanted and load_playbook(self.playbook).stack != "none":
                return None
            return self._plan(wanted, os_used, None)
        except GpuprovError:  # the host's own planning says so, in its result
            return None

    def _plan(self, gpu: str | None, os_used: str, nvswitch: bool | None, kept: str | None = None,
              home: str | None = None, arch: CpuArch | None = None, notice: str | None = None) -> Plan:
        """`arch`: the host's own (its facts); None: the GPU's only one (GH200: aarch64), else x86_64. `notice`: the
        cloud whose interruption notice the host's watch reads (None: AWS's)."""
        from gpuprov.plan.plan import make_host_plan

        if arch is None:
            arch = gpu_arch(gpu)
        key = (gpu, os_used, nvswitch, kept, home, arch, notice)
        with self._lock:
            if key not in self._plans:
                self._plans[key] = make_host_plan(gpu, self.playbook, os_used, self.pins, nvswitch=nvswitch,
                                                  guard=self.guard, jupyter=self.jupyter, monitoring=self.monitoring,
                                                  kept_driver=kept, docker=self.docker, home=home,
                                                  sources_flag=self.sources, arch=arch, notice_cloud=notice)
            return self._plans[key]


def gpu_arch(gpu: str | None) -> CpuArch:
    """The CPU a GPU comes with where it has only one (GH200: aarch64), else x86_64."""
    if not gpu:
        return "x86_64"
    from gpuprov.plan import catalog

    try:
        return catalog.load().gpu(catalog.parse_gpu_request(gpu)[0]).cpu_arch or "x86_64"
    except GpuprovError:  # the GPU's own planning names it
        return "x86_64"
