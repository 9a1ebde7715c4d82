"""Build the Plan: which instance, which stack, which steps. Pure: no network, no credentials.

The Plan is what `gpuprov plan` prints and what `up` and `bootstrap` execute, so a dry run
cannot say one thing and do another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpuprov import catalog, compat
from gpuprov.catalog import Gpu, InstanceType
from gpuprov.compat import Stack, StackPins
from gpuprov.errors import UserInputError
from gpuprov.render import Bundle, StepPlan, render_steps
from gpuprov.spec import Playbook, load_playbook


class NodeRequest(BaseModel):
    """What the user asked for, from flags and the playbook, before any decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str
    count: int = 1
    spot: bool = False
    region: str = "us-east-1"
    playbook: str = "pytorch"
    os: str = "ubuntu-24.04"
    pins: StackPins = StackPins()
    instance_type: str | None = None


@dataclass(frozen=True)
class Plan:
    request: NodeRequest
    gpu: Gpu | None  # None: a host without a GPU stack (a `stack: none` playbook on a CPU host)
    count: int
    instance: InstanceType | None  # None for hosts gpuprov did not launch
    candidates: tuple[InstanceType, ...]  # every instance type that fits, cheapest first
    playbook: Playbook
    stack: Stack | None
    steps: tuple[StepPlan, ...]

    @property
    def price_usd_hour(self) -> float | None:
        return self.instance.price_usd_hour if self.instance else None

    @property
    def unverified(self) -> tuple[str, ...]:
        notes = list(self.stack.unverified) if self.stack else []
        if self.instance and self.instance.unverified:
            notes.append(f"{self.instance.name}: {self.instance.unverified}")
        return tuple(notes)

    def bundle(self) -> Bundle:
        context = {"plan": self, "stack": self.stack, "playbook": self.playbook, "env": self.playbook.env}
        return render_steps(self.steps, context, {"gpuprov_plan": self.summary()})

    def summary(self) -> dict[str, Any]:
        """The plan as JSON-ready data (what `plan --json` prints and manifest.json records)."""
        return {
            "gpu": self.gpu.name if self.gpu else None,
            "count": self.count,
            "market": "spot" if self.request.spot else "on-demand",
            "region": self.request.region,
            "instance_type": self.instance.name if self.instance else None,
            "price_usd_hour_on_demand": self.price_usd_hour,
            "candidates": [
                {"instance_type": c.name, "gpus": c.gpus, "price_usd_hour": c.price_usd_hour} for c in self.candidates
            ],
            "playbook": self.playbook.name,
            "env_path": self.playbook.env.path if self.playbook.env else None,
            "os": self.request.os,
            "stack": self.stack.model_dump(mode="json") if self.stack else None,
            "steps": [{"name": s.name, "kind": s.kind, "summary": s.summary} for s in self.steps],
            "unverified": list(self.unverified),
        }


def _merge_pins(playbook: StackPins, flags: StackPins) -> StackPins:
    """Flags win over the playbook, field by field."""
    return playbook.model_copy(update={k: v for k, v in flags.model_dump().items() if v is not None})


def choose_instances(gpu: Gpu, count: int, instance_type: str | None = None) -> tuple[InstanceType, ...]:
    """Instance types carrying at least `count` of this GPU, cheapest first (unpriced last)."""
    cat = catalog.load()
    if instance_type:
        it = cat.instance_type(instance_type)
        if it.gpu != gpu.name or it.gpus < count:
            raise UserInputError("--instance-type", f"{it.name} carries {it.gpus}× {it.gpu}, not {count}× {gpu.name}")
        return (it,)
    fits = [it for it in cat.instance_types_for(gpu) if it.gpus >= count]
    if not fits:
        most = max((it.gpus for it in cat.instance_types_for(gpu)), default=0)
        raise UserInputError("--gpu", f"no instance type carries {count}× {gpu.name}", f"the most on one instance is {most}")
    return tuple(sorted(fits, key=lambda it: (it.price_usd_hour is None, it.price_usd_hour or 0.0, it.gpus)))


def steps_for(playbook: Playbook, stack: Stack | None, python: str = "3.12") -> tuple[StepPlan, ...]:
    steps: list[StepPlan] = []
    if stack is not None:
        steps += [
            StepPlan("kernel-headers", "headers.sh.j2", "stack", "headers for the running kernel (DKMS builds against them)"),
            StepPlan("nouveau-off", "nouveau.sh.j2", "stack", "blacklist nouveau so the NVIDIA module can load"),
            StepPlan(
                "nvidia-driver", "driver.sh.j2", "stack",
                f"NVIDIA R{stack.driver_branch} {stack.kernel_module} driver from NVIDIA's CUDA repo, held; reboot if fresh",
            ),
        ]
        if stack.fabric_manager != "no":
            when = "" if stack.fabric_manager == "required" else " if the host has NVSwitch"
            steps.append(StepPlan(
                "fabric-manager", "fabricmanager.sh.j2", "stack",
                f"{stack.fabric_manager_package} at the driver's exact version, held{when}"
                + (" (+ NVLSM)" if stack.nvlsm else ""),
            ))
        steps.append(StepPlan("persistence", "persistence.sh.j2", "stack", "nvidia-persistenced enabled and running"))
        if stack.cuda_toolkit_package:
            steps.append(StepPlan("cuda-toolkit", "cuda_toolkit.sh.j2", "stack", f"{stack.cuda_toolkit_package} (nvcc)"))
    if playbook.env is not None:
        python = stack.python if stack else python
        steps.append(StepPlan(
            "python-env", "python_env.sh.j2", "env",
            f"Python {python} env at {playbook.env.path} ({playbook.env.manager})", (("python", python),),
        ))
        if stack is not None and stack.torch is not None:
            steps.append(StepPlan("pytorch", "torch.sh.j2", "env", f"{stack.torch.requirement} from {stack.torch.index_url}"))
        if playbook.env.packages:
            steps.append(StepPlan("packages", "packages.sh.j2", "env", ", ".join(playbook.env.packages)))
    for user_step in playbook.steps:
        what = "run a command" if user_step.run else ""
        if user_step.files:
            what = (what + " and " if what else "") + f"write {len(user_step.files)} file(s)"
        steps.append(StepPlan(user_step.name, "user_step.sh.j2", "user", what, (("user_step", user_step),)))
    if stack is not None:
        steps.append(StepPlan("verify", "verify.sh.j2", "verify", "nvidia-smi + torch.cuda probe, a matmul on every GPU"))
    return tuple(steps)


def resolve_stack(
    playbook: Playbook, gpu: Gpu, os_name: str, pins: StackPins, nvswitch: bool | None
) -> Stack | None:
    if playbook.stack == "none":
        if pins.model_copy(update={"python": None}) != StackPins():
            raise UserInputError("--playbook", f"playbook {playbook.name!r} installs no GPU stack, so driver, CUDA "
                                 "and torch pins do not apply", "drop them, or use a playbook with `stack: gpu`")
        return None
    merged = _merge_pins(playbook.pins, pins)
    stack = compat.resolve(gpu, os_name, merged, nvswitch=nvswitch, want_torch=playbook.installs_torch)
    if playbook.cuda_toolkit and not merged.cuda:
        # the toolkit that matches the wheel keeps nvcc-built extensions ABI-compatible with torch
        cuda = stack.torch.cuda if stack.torch else compat.newest_cuda(gpu, stack.driver_branch)
        stack = compat.resolve(
            gpu, os_name, merged.model_copy(update={"cuda": cuda}),
            nvswitch=nvswitch, want_torch=playbook.installs_torch,
        )
    return stack


def make_plan(request: NodeRequest) -> Plan:
    """The plan for a node gpuprov launches: instance choice + stack + steps."""
    cat = catalog.load()
    cat.check_region(request.region)
    name, count_in_name = catalog.parse_gpu_request(request.gpu)
    gpu = cat.gpu(name)
    count = count_in_name if ":" in request.gpu else request.count
    if count < 1:
        raise UserInputError("--count", "must be at least 1")
    candidates = choose_instances(gpu, count, request.instance_type)
    instance = candidates[0]
    playbook = load_playbook(request.playbook)
    stack = resolve_stack(playbook, gpu, request.os, request.pins, instance.nvswitch)
    steps = steps_for(playbook, stack, request.pins.python or "3.12")
    return Plan(request, gpu, count, instance, candidates, playbook, stack, steps)


def make_host_plan(
    gpu_name: str | None, playbook_name: str, os_name: str, pins: StackPins, nvswitch: bool | None = None
) -> Plan:
    """The plan for an existing host: no instance type; Fabric Manager follows what the host has.

    :param nvswitch: True when the host showed NVSwitch devices; None installs Fabric Manager only
        if the host turns out to have them.
    """
    playbook = load_playbook(playbook_name)
    gpu, count = None, 0
    if gpu_name:
        name, count = catalog.parse_gpu_request(gpu_name)
        gpu = catalog.load().gpu(name)
    if gpu is None and playbook.stack != "none":
        raise UserInputError("--gpu", "no NVIDIA GPU found on the host, and none given",
                             "pass --gpu, or use a `stack: none` playbook for CPU hosts")
    stack = resolve_stack(playbook, gpu, os_name, pins, nvswitch) if gpu else None
    if gpu is None and pins.model_copy(update={"python": None}) != StackPins():
        raise UserInputError("--playbook", "driver, CUDA and torch pins need a GPU host")
    request = NodeRequest(gpu=gpu_name or "none", count=max(count, 1), playbook=playbook_name, os=os_name, pins=pins)
    return Plan(request, gpu, count, None, (), playbook, stack, steps_for(playbook, stack, pins.python or "3.12"))
