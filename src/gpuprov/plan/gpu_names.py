"""NVIDIA GPUs by the name EC2's DescribeInstanceTypes gives them (GpuInfo.Gpus[].Name): architecture and compute
capability, so a type EC2 describes and the shipped catalog lacks is still planned (`plan --live`, `up`, `gpus
--live`, `facts refresh`). The compute capabilities are NVIDIA's CUDA GPUs page; a row whose figure or EC2 name
was not read there says why in `unverified`.

Only the architectures the stack's facts know (stack.yaml `architectures`) are here: an older GPU (K80, M60) has
no driver, toolkit or wheel gpuprov could plan, and is refused like any GPU the table lacks, by its type's name.
A type's architecture is EC2's own (ProcessorInfo.SupportedArchitectures): an arm64 type is planned for aarch64 hosts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CUDA_GPUS = "developer.nvidia.com/cuda-gpus (CUDA GPU Compute Capability), read 2026-12-03"
LEGACY_GPUS = "developer.nvidia.com/cuda-legacy-gpus (Legacy CUDA GPU Compute Capability), read 2026-12-03"
REFRESH = "`gpuprov facts refresh` after updating gpuprov (`pip install -U gpuprov`) brings GPUs it learned"


@dataclass(frozen=True)
class NamedGpu:
    """One GPU as EC2 names it, with NVIDIA's compute capability and where that was read."""

    ec2_name: str
    arch: str
    compute_capability: str
    source: str
    unverified: str | None = None
    name: str | None = None  # the catalog's name when EC2's is not the one people use ("RTX PRO Server 6000")

    @property
    def catalog_name(self) -> str:
        """The name `--gpu` and the catalog use, spaces as dashes ("RTX PRO 4500" -> "RTX-PRO-4500")."""
        return "-".join((self.name or self.ec2_name).split())


NAMES: tuple[NamedGpu, ...] = (
    NamedGpu("V100", "volta", "7.0", LEGACY_GPUS),
    NamedGpu("T4", "turing", "7.5", CUDA_GPUS,
             "the page as stored was cut above 8.6; NVIDIA's earlier copies of the table list the T4 at 7.5"),
    NamedGpu("T4g", "turing", "7.5", CUDA_GPUS, "g5g's T4 for Arm servers; NVIDIA's page lists the T4 at 7.5",
             name="T4G"),
    NamedGpu("A10G", "ampere", "8.6", CUDA_GPUS, "AWS's variant of the A10 (g5); NVIDIA's page lists the A10 at 8.6"),
    NamedGpu("A10", "ampere", "8.6", CUDA_GPUS),
    NamedGpu("A100", "ampere", "8.0", CUDA_GPUS,
             "the page as stored was cut above 8.6; NVIDIA's earlier copies of the table list the A100 at 8.0"),
    NamedGpu("L4", "ada", "8.9", CUDA_GPUS),
    NamedGpu("L40", "ada", "8.9", CUDA_GPUS),
    NamedGpu("L40S", "ada", "8.9", CUDA_GPUS),
    NamedGpu("H100", "hopper", "9.0", CUDA_GPUS),
    NamedGpu("H200", "hopper", "9.0", CUDA_GPUS),
    NamedGpu("GH200", "hopper", "9.0", CUDA_GPUS),
    NamedGpu("B200", "blackwell", "10.0", CUDA_GPUS),
    NamedGpu("GB200", "blackwell", "10.0", CUDA_GPUS),
    NamedGpu("B300", "blackwell", "10.3", CUDA_GPUS),
    NamedGpu("GB300", "blackwell", "10.3", CUDA_GPUS),
    # g7e's GPU, the RTX PRO 6000 Blackwell Server Edition: EC2 names it "RTX PRO Server 6000" (AWS's
    # DescribeInstanceTypes data as moto 5.2.5 ships it); issue 37 calls it "RTX PRO 6000", which is taken too
    NamedGpu("RTX PRO Server 6000", "blackwell", "12.0", CUDA_GPUS, name="RTX PRO 6000"),
    NamedGpu("RTX PRO 6000", "blackwell", "12.0", CUDA_GPUS),
    NamedGpu("RTX PRO 4500", "blackwell", "12.0", CUDA_GPUS),  # g7's, the RTX PRO 4500 Blackwell Server Edition
)


def _key(name: str) -> str:
    return "-".join(name.lower().replace("_", " ").split())


_BY_KEY = {_key(n.ec2_name): n for n in NAMES}


def named(ec2_name: str) -> NamedGpu | None:
    """The table's row for EC2's GPU name (any case, spaces or dashes), or None."""
    return _BY_KEY.get(_key(ec2_name))


def catalog_row(gpu: NamedGpu, memory_mib: int, instance_type: str, on: str) -> dict[str, Any]:
    """A catalog `gpus` row for a GPU EC2 described and the snapshot lacks: NVIDIA's figures, EC2's memory."""
    note = (f"not in gpuprov's catalog: read from EC2 DescribeInstanceTypes ({instance_type}) on {on}, compute "
            f"capability from {gpu.source}; no published figures for `gpuprov bench`")
    return {"name": gpu.catalog_name, "aliases": sorted({_key(gpu.ec2_name), _key(gpu.catalog_name)}), "arch": gpu.arch,
            "compute_capability": gpu.compute_capability, "memory_mib": memory_mib,
            "good_for": f"{gpu.ec2_name} as EC2 describes it (no notes of gpuprov's own)",
            "unverified": note + (f"; {gpu.unverified}" if gpu.unverified else "")}


def refusal(instance_type: str, ec2_name: str) -> str:
    """Why a type EC2 describes is not planned: its GPU is not in the table."""
    return (f"{instance_type} carries {ec2_name!r}, a GPU gpuprov has no compute capability for "
            f"(not in its table of NVIDIA GPU names); {REFRESH}")
