"""A node on a CPU-only instance type: the work around the GPU (preparing data on a cheap CPU node, training on a
GPU one). Pure.

Asked for with `--cpu N --memory GIB` (the cheapest CPU-only type with at least that many vCPUs and GiB, as `--gpu`
chooses among GPU types; the others are the failover's candidates) or `--instance-type c7i.8xlarge`. Such a node has
the guards, env, data and steps of any node, and none of the GPU's: no driver, toolkit or Fabric Manager, no
container toolkit or GPU metrics; torch is the CPU wheel of the newest release (or the `--torch` pin) from the
PyTorch index's `cpu` variant, and its check runs torch on the CPU instead of nvidia-smi and a GPU matmul.

A request that mixes the two (`--gpu` with `--cpu`, `--cpu` with a GPU type, a GPU pin on a CPU-only type) is
refused naming the flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpuprov.errors import UserInputError
from gpuprov.plan.render import StepPlan
from gpuprov.plan.stack import StackPins, TorchWheel, facts, release_family, version_tuple

if TYPE_CHECKING:
    from gpuprov.plan.catalog import Catalog, InstanceType
    from gpuprov.plan.monitoring import Monitoring
    from gpuprov.plan.spec import Playbook


class NodeRequest(Protocol):
    """What this module reads of plan.NodeRequest (which imports this module)."""

    @property
    def gpu(self) -> str | None: ...
    @property
    def count(self) -> int | None: ...
    @property
    def cpu(self) -> int | None: ...
    @property
    def memory_gib(self) -> float | None: ...
    @property
    def instance_type(self) -> str | None: ...
    @property
    def pins(self) -> StackPins: ...
    @property
    def docker(self) -> bool: ...
    @property
    def monitoring(self) -> Monitoring: ...


# The GPU stack's steps a CPU-only node goes without, as `plan` lists them
GPU_STEPS_SKIPPED = ("kernel-headers", "nouveau-off", "nvidia-driver", "fabric-manager", "persistence", "cuda-toolkit",
                     "verify (nvidia-smi, torch.cuda)")
NO_FIT = "no CPU-only type gpuprov knows has"  # a size EC2's answer may have: `plan --live` and `up` ask it
CPU_VARIANT = "cpu"  # the PyTorch index's CPU-only wheels: <index>/cpu, torch-X.Y.Z+cpu
CPU_WHEEL_UNVERIFIED = ("torch's CPU wheels: the PyTorch wheel index's `cpu` variant (versions X.Y.Z+cpu), as PyTorch's "
                        "install instructions give it for CPU-only machines; read in quotations of them "
                        "(docs/cpu-nodes.md), not on the index for each release")


def _size_flag(request: NodeRequest) -> str:
    return "--cpu" if request.cpu is not None else "--memory"


def wanted(request: NodeRequest, cat: Catalog) -> bool:
    """Whether the request is for a CPU-only node; a request that mixes GPU and CPU-only is refused."""
    if request.cpu is not None or request.memory_gib is not None:
        flag = _size_flag(request)
        if request.gpu:
            raise UserInputError(flag, f"--gpu {request.gpu} with {flag}: {flag} chooses a CPU-only type, --gpu a GPU one",
                                 "drop --gpu for a CPU-only node (e.g. --cpu 32 --memory 64), or drop --cpu and "
                                 "--memory for a GPU node")
        if request.instance_type and not (it := cat.instance_type(request.instance_type)).cpu_only:
            raise UserInputError(flag, f"{it.name} carries {it.gpus}× {it.gpu}: {flag} chooses a CPU-only type",
                                 f"drop {flag} to launch {it.name}, or name a CPU-only type (e.g. c7i.8xlarge)")
        _no_count(request)
        return True
    if request.gpu:
        return False
    if request.instance_type:
        if cat.instance_type(request.instance_type).cpu_only:
            _no_count(request)
            return True
        return False
    raise UserInputError("--gpu", "required (or --cpu/--memory for a CPU-only node, or --instance-type)",
                         "e.g. --gpu A100, --cpu 32 --memory 64 (a CPU-only node), or --instance-type c7i.8xlarge")


def _no_count(request: NodeRequest) -> None:
    if request.count is not None:
        raise UserInputError("--count", f"--count {request.count} counts GPUs; a CPU-only type has none",
                             "drop --count, or ask for a GPU with --gpu")


def gpu_of_type(request: NodeRequest, cat: Catalog) -> str:
    """`--instance-type g5.12xlarge` alone: the GPU it carries, with its count (A10G:4)."""
    it = cat.instance_type(request.instance_type or "")
    return f"{it.gpu}:{it.gpus}"


def choose_types(request: NodeRequest, cat: Catalog) -> tuple[InstanceType, ...]:
    """The CPU-only types with at least the vCPUs and memory asked, cheapest first (unpriced last), or the one named."""
    vcpu, ram = request.cpu or 1, request.memory_gib or 0.0
    if request.instance_type:
        it = cat.instance_type(request.instance_type)
        if it.retired:
            raise UserInputError("--instance-type", f"{it.name} is retired: {it.retired}",
                                 f"other CPU-only types: {', '.join(t.name for t in cat.cpu_types()) or 'none'}")
        if not it.fits(vcpu, ram):
            raise UserInputError(_size_flag(request), f"{it.name} has {it.vcpu} vCPUs and {it.ram_gib} GiB, not "
                                 f"{vcpu} vCPUs and {ram:g} GiB", "drop --instance-type to choose the cheapest that fits")
        return (it,)
    fits = [it for it in cat.cpu_types() if it.fits(vcpu, ram)]
    if not fits:
        biggest = sorted(cat.cpu_types(), key=lambda it: (it.vcpu, it.ram_gib))[-3:]
        raise UserInputError(_size_flag(request), f"{NO_FIT} {vcpu} vCPUs and {ram:g} GiB",
                             "the largest: " + ", ".join(f"{it.name} ({it.vcpu} vCPUs, {it.ram_gib} GiB)" for it in biggest))
    return tuple(sorted(fits, key=lambda it: (it.price_usd_hour is None, it.price_usd_hour or 0.0, it.vcpu, it.ram_gib)))


def check_playbook(playbook: Playbook, request: NodeRequest, type_name: str) -> None:
    """What needs a GPU is refused on a CPU-only type, naming where it was asked for."""
    why = f"{type_name} is a CPU-only type (no GPU)"
    pins = request.pins
    for flag, value in (("--driver", pins.driver), ("--cuda", pins.cuda), ("--torch-cuda", pins.torch_cuda)):
        if value is not None:
            raise UserInputError(flag, f"{why}: no driver, CUDA toolkit or CUDA wheel is installed on it",
                                 f"drop {flag} (torch comes as its CPU wheel; --torch pins its release)")
    for field, value in (("driver", playbook.pins.driver), ("cuda", playbook.pins.cuda),
                         ("torch_cuda", playbook.pins.torch_cuda)):
        if value is not None:
            raise UserInputError(playbook.where("pins", field) or "--playbook",
                                 f"{why}: playbook {playbook.name!r} pins the GPU stack's {field}", "use a playbook "
                                 "without GPU pins (e.g. -p pytorch), or a GPU type")
    if playbook.driver == "keep":
        raise UserInputError(playbook.where("driver") or "--playbook", f"{why}: `driver: keep` keeps a GPU driver",
                             "use a playbook that installs no driver, e.g. -p pytorch")
    if playbook.cuda_toolkit:
        raise UserInputError(playbook.where("cuda_toolkit") or "--playbook",
                             f"{why}: playbook {playbook.name!r} installs the CUDA toolkit", "e.g. -p pytorch or -p minimal")
    if playbook.docker:
        raise UserInputError("--docker" if request.docker else (playbook.where("docker") or "--playbook"),
                             f"{why}: the docker step installs NVIDIA's container toolkit, which needs a GPU",
                             "drop --docker on a CPU-only node")
    if request.monitoring.metrics != "off" or request.monitoring.health:
        raise UserInputError("--metrics" if request.monitoring.metrics != "off" else "--health",
                             f"{why}: the metrics and the health watch read the GPUs (nvidia-smi, DCGM)",
                             "leave them out on a CPU-only node")
    if not playbook.installs_torch and pins.torch is not None:
        raise UserInputError("--torch", f"playbook {playbook.name!r} installs no PyTorch, so a torch pin has no effect",
                             "drop the pin or use -p pytorch")


def torch_wheel(pins: StackPins) -> TorchWheel:
    """torch's CPU wheel: the newest release gpuprov knows, or the `--torch` pin's."""
    f = facts()
    release = release_family(pins.torch) if pins.torch else max(f.torch_releases, key=version_tuple)
    if release not in f.torch_releases:
        raise UserInputError("--torch", f"torch {pins.torch} is not a release gpuprov knows",
                             f"known: {', '.join(sorted(f.torch_releases, key=version_tuple))}")
    return TorchWheel(version=pins.torch or release, variant=CPU_VARIANT, cuda="", index_url=f"{f.pytorch_index}/{CPU_VARIANT}")


def python_for(pins: StackPins, wheel: TorchWheel | None) -> str:
    """The env's Python: the pin, else the default within the torch release's range (as for a GPU stack)."""
    from gpuprov.plan.compat import choose_python
    from gpuprov.plan.pins import check_pin_syntax

    check_pin_syntax(pins)
    return choose_python(pins, release_family(wheel.version) if wheel else None)


@dataclass(frozen=True)
class CpuStack:
    """What templates/torch.sh.j2 reads of a stack (`stack.torch`), for the CPU wheel."""

    torch: TorchWheel


def torch_step(wheel: TorchWheel) -> StepPlan:
    return StepPlan("pytorch", "torch.sh.j2", "env", f"{wheel.requirement} CPU wheel ({wheel.variant}) from {wheel.index_url}",
                    (("stack", CpuStack(wheel)),))


def verify_step() -> StepPlan:
    """The CPU-only node's check, in place of the GPU verify: torch imports, has no CUDA, and multiplies on the CPU."""
    return StepPlan("verify-cpu", "verify_cpu.sh.j2", "env",
                    "CPU-only node, no GPU checks: torch (CPU wheel) imports, reports no CUDA, a matmul on the CPU "
                    "matches")
