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
from gpuprov.plan.stack import StackPins


class Planner:
    """How each existing host gets its plan: its GPU (given, or detected) and OS (given, or its own). Hosts alike
    share one plan object, and so one rendered bundle: 32 of them are planned once."""

    def __init__(self, gpu: str | None, playbook: str, os_name: str | None, pins: StackPins,
                 guard: GuardRequest | None = None, jupyter: bool = False, monitoring: Monitoring | None = None) -> None:
        self.gpu, self.playbook, self.os_name, self.pins = gpu, playbook, os_name, pins
        self.guard, self.jupyter, self.monitoring = guard, jupyter, monitoring
        self._plans: dict[tuple[str | None, str, bool | None], Plan] = {}
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
        if os_used not in SUPPORTED_OS:
            raise UserInputError("--os", f"{target.name} runs {facts.os or 'an unknown OS'}; gpuprov's scripts support "
                                 f"{', '.join(SUPPORTED_OS)}", "pass --os to run them anyway, at your own risk")
        return self._plan(wanted or detected, os_used, True if facts.nvswitch else None)

    def ahead(self, target: Target) -> Plan | None:
        """The plan `target` gets unless its facts surprise (NVSwitch, or a GPU where none is named and the
        playbook installs no stack), when the command line already says its GPU (or needs none) and its OS.
        None when its facts decide."""
        from gpuprov.plan.spec import load_playbook
        from gpuprov.plan.stack import SUPPORTED_OS

        wanted, os_used = target.gpu or self.gpu, target.os or self.os_name
        if os_used not in SUPPORTED_OS:
            return None
        try:
            if not wanted and load_playbook(self.playbook).stack != "none":
                return None
            return self._plan(wanted, os_used, None)
        except GpuprovError:  # the host's own planning says so, in its result
            return None

    def _plan(self, gpu: str | None, os_used: str, nvswitch: bool | None) -> Plan:
        from gpuprov.plan.plan import make_host_plan

        key = (gpu, os_used, nvswitch)
        with self._lock:
            if key not in self._plans:
                self._plans[key] = make_host_plan(gpu, self.playbook, os_used, self.pins, nvswitch=nvswitch,
                                                  guard=self.guard, jupyter=self.jupyter, monitoring=self.monitoring)
            return self._plans[key]
