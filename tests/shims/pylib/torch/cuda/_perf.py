"""The fake GPUs' clocks: what each operation costs on the GPU model the nvidia-smi shim reports.

Work runs at once in this fake; each device keeps a clock (milliseconds) that an operation advances
by its cost, and torch.cuda.Event reads it, so the bench probe times modelled work with real code.
The rates are what a healthy GPU of each model delivers, from public reports (the same derivations
as tests/fixtures/bench/README.md): matmul at the measured "maximum achievable" share of NVIDIA's
dense peak, HBM/GDDR copies at ~85 % of peak, pinned PCIe copies at ~80 % of the link.
GPUPROV_SHIM_GPU_SPEED (a fraction per GPU index, comma list like the other readings) holds a GPU's
clocks down: its matmuls take 1/speed as long (a power cap, a hot or clock-locked GPU).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rates:
    tflops: dict[str, float]  # fp16, bf16 (native only), tf32 (8.0+), fp32
    memory_gbps: float  # device copy, bytes read + written per second
    pcie_gbps: float  # pinned host<->device, one direction
    busbw_gbps: float  # NCCL all-reduce bus bandwidth within the node


_RATES = {
    "Tesla T4": Rates({"fp16": 52.0, "fp32": 6.9}, 255.0, 12.3, 9.0),
    "NVIDIA A100-SXM4-40GB": Rates({"fp16": 267.9, "bf16": 267.9, "tf32": 128.0, "fp32": 18.2}, 1320.0, 24.6, 228.0),
    "NVIDIA H100 80GB HBM3": Rates({"fp16": 792.1, "bf16": 792.1, "tf32": 396.0, "fp32": 51.0}, 2850.0, 50.4, 362.0),
    "NVIDIA B200": Rates({"fp16": 1800.0, "bf16": 1800.0, "tf32": 880.0, "fp32": 60.0}, 6800.0, 50.4, 700.0),
    # derived as tests/fixtures/bench/README.md's assumptions say, from the catalog's published figures: matmul at
    # A100's MAMF efficiency (85.9 % of dense; no Ada measurement was read), copies at 85 % of memory, pinned PCIe at
    # 80 % of Gen4 x16's 31.5 GB/s; the all-reduce within a node as A100's over NVLink, or 20 GB/s over PCIe (an
    # assumption: L4 and L40S have no NVLink)
    "NVIDIA A100-SXM4-80GB": Rates({"fp16": 267.9, "bf16": 267.9, "tf32": 134.0, "fp32": 16.8}, 1733.0, 25.2, 230.0),
    "NVIDIA L40S": Rates({"fp16": 311.0, "bf16": 311.0, "tf32": 157.2, "fp32": 78.7}, 734.4, 25.2, 20.0),
    "NVIDIA L4": Rates({"fp16": 103.9, "bf16": 103.9, "tf32": 51.5, "fp32": 26.0}, 255.0, 25.2, 20.0),
}
EMULATED_BF16 = 0.1  # bf16 on a GPU without bf16 tensor cores: torch emulates it, far slower than fp16

_clock: dict[int, float] = {}


def rates(name: str) -> Rates:
    return _RATES.get(name, Rates({"fp16": 50.0, "fp32": 10.0}, 200.0, 10.0, 8.0))


def now(index: int) -> float:
    return _clock.get(index, 0.0)


def advance(index: int, ms: float) -> None:
    _clock[index] = now(index) + ms
