"""A small, honest fake of the part of `torch` the gpuprov verify and bench probes use (tests only).

Small tensors are 2-D lists of floats with real arithmetic; a "cuda:N" tensor is the same data tagged
with a device, and its matmul is computed column-wise (a separate code path from the CPU one).
Tensors too large to hold as lists (the bench's 8192×8192 matrices, its GiB buffers) keep their shape
and dtype and, where every element is known to be equal (zeros, full, ones, copies and products of
those), that value, computed exactly; a large random tensor's values are never read (reading one is
refused). GPU work advances the device's clock in torch/cuda/_perf.py by what the operation costs on
that GPU model, and CUDA events read that clock: timings are modelled, results are computed.
The GPUs are whatever the nvidia-smi shim reports (GPUPROV_SHIM_GPU, GPUPROV_SHIM_GPU_COUNT), so
CUDA is unavailable whenever nvidia-smi fails. GPUPROV_SHIM_FAIL=torch-newer-cuda makes CUDA
unavailable like a wheel built for a newer CUDA than the driver; =bad-matmul corrupts GPU results.
torch.distributed combines tensors between processes for real (torch/distributed/__init__.py).
"""

from __future__ import annotations

import operator
import random as _random

from torch import (
    backends,  # noqa: F401
    cuda,
    version,  # noqa: F401
)
from torch.version import __version__  # noqa: F401

_rng = _random.Random(0)
SMALL = 1 << 16  # elements: tensors up to this size hold their values as lists


class dtype:
    def __init__(self, name: str, itemsize: int, is_floating_point: bool = True) -> None:
        self.name, self.itemsize, self.is_floating_point = name, itemsize, is_floating_point

    def __repr__(self) -> str:
        return f"torch.{self.name}"


float32 = dtype("float32", 4)
float16 = dtype("float16", 2)
bfloat16 = dtype("bfloat16", 2)
uint8 = dtype("uint8", 1, False)


def manual_seed(seed: int) -> None:
    _rng.seed(seed)


class device:
    def __init__(self, spec: str) -> None:
        self.type, _, index = str(spec).partition(":")
        self.index = int(index) if index else (0 if self.type == "cuda" else None)

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Tensor:
    """`rows`: the values of a small 2-D tensor; else None, with `fill` the value of every element when
    known (None: a large random tensor, whose values this fake does not hold)."""

    def __init__(self, rows: list[list[float]] | None, dev: device | None = None, *, shape: tuple[int, ...] = (),
                 dtype: dtype = float32, fill: float | None = None) -> None:
        self.rows = rows
        self._shape = shape if rows is None else (len(rows), len(rows[0]) if rows else 0)
        self.fill = fill
        self.dtype = dtype
        self.device = dev or device("cpu")
        self.pinned = False

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def numel(self) -> int:
        return _numel(self._shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def _like(self, dev: device) -> Tensor:
        rows = [list(r) for r in self.rows] if self.rows is not None else None
        return Tensor(rows, dev, shape=self._shape, dtype=self.dtype, fill=self.fill)

    def to(self, target: object) -> Tensor:
        dev = target if isinstance(target, device) else device(str(target))
        if dev.type == "cuda":
            cuda._lazy_check(dev.index or 0)
            cuda._allocate(dev.index or 0, self.numel() * self.dtype.itemsize)
        return self._like(dev)

    def cpu(self) -> Tensor:
        return self._like(device("cpu"))

    def copy_(self, src: Tensor, non_blocking: bool = False) -> Tensor:
        if src.numel() != self.numel():
            raise RuntimeError(f"The size of tensor a ({self.numel()}) must match the size of tensor b ({src.numel()}) "
                               "at non-singleton dimension 0")
        cuda._copy_cost(src, self)
        self.rows = [list(r) for r in src.rows] if src.rows is not None and self.rows is not None else None
        self.fill = src.fill
        return self

    def _same_device(self, other: Tensor) -> None:
        if str(self.device) != str(other.device):
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{other.device} and {self.device}!"
            )

    def __matmul__(self, other: Tensor) -> Tensor:
        self._same_device(other)
        if len(self.shape) != 2 or len(other.shape) != 2 or self.shape[1] != other.shape[0]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({self.shape} and {other.shape})")
        if self.dtype is not other.dtype:
            raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {self.dtype} != {other.dtype}")
        if self.device.type == "cuda":
            cuda._kernel_check(self.device.index or 0)
            cuda._matmul_cost(self.device.index or 0, self.shape[0], self.shape[1], other.shape[1], self.dtype)
        if self.rows is None or other.rows is None:
            if self.device.type == "cpu":
                raise NotImplementedError("the fake torch multiplies large matrices on a GPU only")
            fill = self.fill * other.fill * self.shape[1] if self.fill is not None and other.fill is not None else None
            return Tensor(None, self.device, shape=(self.shape[0], other.shape[1]), dtype=self.dtype, fill=fill)
        cols = list(zip(*other.rows, strict=True))
        if self.device.type == "cpu":
            out = [[sum(map(operator.mul, r, c)) for c in cols] for r in self.rows]
        else:
            out_t = [[sum(map(operator.mul, r, c)) for r in self.rows] for c in cols]
            out = [list(r) for r in zip(*out_t, strict=True)]
            if cuda._shim_setting("GPUPROV_SHIM_FAIL") == "bad-matmul":
                out[0][0] += 1000.0
        return Tensor(out, self.device, dtype=self.dtype)

    def __sub__(self, other: Tensor) -> Tensor:
        self._same_device(other)
        if self.numel() != other.numel():
            raise RuntimeError(f"The size of tensor a ({self.numel()}) must match the size of tensor b "
                               f"({other.numel()}) at non-singleton dimension 0")
        if self.rows is None or other.rows is None:  # a constant tensor (torch.full) held by its one value
            if self.fill is None or other.fill is None:
                raise NotImplementedError("the fake torch does not hold the values of a large random tensor")
            return Tensor(None, self.device, shape=self._shape, dtype=self.dtype, fill=self.fill - other.fill)
        rows = zip(self.rows, other.rows, strict=True)
        return Tensor([[a - b for a, b in zip(r, s, strict=True)] for r, s in rows], self.device)

    def _values(self) -> list[list[float]]:
        if self.rows is None:
            raise NotImplementedError("the fake torch does not hold the values of a large random tensor")
        return self.rows

    def abs(self) -> Tensor:
        if self.rows is None and self.fill is not None:
            return Tensor(None, self.device, shape=self._shape, dtype=self.dtype, fill=abs(self.fill))
        return Tensor([[abs(a) for a in r] for r in self._values()], self.device)

    def _reduce(self, fn) -> Tensor:  # type: ignore[no-untyped-def]
        if self.rows is None and self.fill is not None:
            return Tensor(None, self.device, shape=(), dtype=self.dtype, fill=self.fill)
        return Tensor([[fn(fn(r) for r in self._values())]], self.device)

    def max(self) -> Tensor:
        return self._reduce(max)

    def min(self) -> Tensor:
        return self._reduce(min)

    def item(self) -> float:
        if self.numel() != 1:
            raise RuntimeError("a Tensor with more than one element cannot be converted to Scalar")
        if self.rows is None:
            return float(self.fill)  # type: ignore[arg-type]
        return float(self.rows[0][0])


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return a @ b


def _place(shape: tuple[int, ...], dtype: dtype, dev: object, pin_memory: bool) -> device:
    where = dev if isinstance(dev, device) else device(str(dev or "cpu"))
    if where.type == "cuda":
        cuda._lazy_check(where.index or 0)
        cuda._allocate(where.index or 0, _numel(shape) * dtype.itemsize)
    elif pin_memory:
        cuda._lazy_check(0)  # pinning host memory needs the driver, as in torch
    return where


def _shape_of(size: tuple[object, ...]) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    return tuple(int(d) for d in size)  # type: ignore[call-overload]


def randn(*size: object, dtype: dtype = float32, device: object = None) -> Tensor:
    shape = _shape_of(size)
    where = _place(shape, dtype, device, False)
    if len(shape) == 2 and _numel(shape) <= SMALL:
        return Tensor([[_rng.gauss(0.0, 1.0) for _ in range(shape[1])] for _ in range(shape[0])], where, dtype=dtype)
    return Tensor(None, where, shape=shape, dtype=dtype, fill=None)


def full(size: tuple[int, ...], fill_value: float, *, dtype: dtype = float32, device: object = None,
         pin_memory: bool = False) -> Tensor:
    shape = _shape_of((size,))
    t = Tensor(None, _place(shape, dtype, device, pin_memory), shape=shape, dtype=dtype, fill=float(fill_value))
    t.pinned = pin_memory
    return t


def zeros(*size: object, dtype: dtype = float32, device: object = None, pin_memory: bool = False) -> Tensor:
    return full(_shape_of(size), 0.0, dtype=dtype, device=device, pin_memory=pin_memory)


def ones(*size: object, dtype: dtype = float32, device: object = None, pin_memory: bool = False) -> Tensor:
    return full(_shape_of(size), 1.0, dtype=dtype, device=device, pin_memory=pin_memory)


def empty(*size: object, dtype: dtype = float32, device: object = None, pin_memory: bool = False) -> Tensor:
    return zeros(*size, dtype=dtype, device=device, pin_memory=pin_memory)  # uninitialised in torch; zeros here


def tensor(data: list[float], *, dtype: dtype = float32, device: object = None) -> Tensor:
    t = Tensor([list(map(float, data))], _place((1, len(data)), dtype, device, False), dtype=dtype)
    return t
