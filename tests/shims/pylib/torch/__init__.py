"""A small, honest fake of the part of `torch` the gpuprov verify probe uses (tests only).

Tensors are 2-D lists of floats with real arithmetic; a "cuda:N" tensor is the same data tagged
with a device, and its matmul is computed column-wise (a separate code path from the CPU one).
The GPUs are whatever the nvidia-smi shim reports (GPUPROV_SHIM_GPU, GPUPROV_SHIM_GPU_COUNT), so
CUDA is unavailable whenever nvidia-smi fails. GPUPROV_SHIM_FAIL=torch-newer-cuda makes CUDA
unavailable like a wheel built for a newer CUDA than the driver; =bad-matmul corrupts GPU results.
"""

from __future__ import annotations

import operator
import random as _random

from torch import (
    cuda,
    distributed,  # noqa: F401
    version,  # noqa: F401
)
from torch.version import __version__  # noqa: F401

_rng = _random.Random(0)
float32 = "float32"  # the only dtype: 4 bytes an element, as torch.distributed sends them


def manual_seed(seed: int) -> None:
    _rng.seed(seed)


class device:
    def __init__(self, spec: str) -> None:
        self.type, _, index = str(spec).partition(":")
        self.index = int(index) if index else (0 if self.type == "cuda" else None)

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


class Tensor:
    def __init__(self, rows: list[list[float]], dev: device | None = None) -> None:
        self.rows = rows
        self.device = dev or device("cpu")

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows), len(self.rows[0]) if self.rows else 0)

    def to(self, target: object) -> Tensor:
        dev = target if isinstance(target, device) else device(str(target))
        if dev.type == "cuda":
            cuda._lazy_check(dev.index or 0)
        return Tensor([list(r) for r in self.rows], dev)

    def cpu(self) -> Tensor:
        return Tensor([list(r) for r in self.rows], device("cpu"))

    def _same_device(self, other: Tensor) -> None:
        if str(self.device) != str(other.device):
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{other.device} and {self.device}!"
            )

    def __matmul__(self, other: Tensor) -> Tensor:
        self._same_device(other)
        if self.shape[1] != other.shape[0]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({self.shape} and {other.shape})")
        cols = list(zip(*other.rows, strict=True))
        if self.device.type == "cpu":
            out = [[sum(map(operator.mul, r, c)) for c in cols] for r in self.rows]
        else:
            cuda._kernel_check(self.device.index or 0)
            out_t = [[sum(map(operator.mul, r, c)) for r in self.rows] for c in cols]
            out = [list(r) for r in zip(*out_t, strict=True)]
            if cuda._shim_setting("GPUPROV_SHIM_FAIL") == "bad-matmul":
                out[0][0] += 1000.0
        return Tensor(out, self.device)

    def __sub__(self, other: Tensor) -> Tensor:
        self._same_device(other)
        rows = zip(self.rows, other.rows, strict=True)
        return Tensor([[a - b for a, b in zip(r, s, strict=True)] for r, s in rows], self.device)

    def abs(self) -> Tensor:
        return Tensor([[abs(a) for a in r] for r in self.rows], self.device)

    def max(self) -> Tensor:
        return Tensor([[max(max(r) for r in self.rows)]], self.device)

    def numel(self) -> int:
        rows, cols = self.shape
        return rows * cols

    def element_size(self) -> int:
        return 4

    def item(self) -> float:
        if self.shape != (1, 1):
            raise RuntimeError("a Tensor with more than one element cannot be converted to Scalar")
        return float(self.rows[0][0])


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return a @ b


def randn(n: int, m: int) -> Tensor:
    return Tensor([[_rng.gauss(0.0, 1.0) for _ in range(m)] for _ in range(n)])


def full(size: tuple[int, int], fill_value: float, *, dtype: str = float32, device: object = None) -> Tensor:
    """A 2-D tensor of one value (the fake keeps 2-D tensors; real torch takes any shape)."""
    if len(size) != 2:
        raise RuntimeError("the fake torch keeps 2-D tensors: torch.full((rows, cols), value)")
    rows, cols = size
    t = Tensor([[float(fill_value)] * cols for _ in range(rows)])
    return t.to(device) if device is not None else t
