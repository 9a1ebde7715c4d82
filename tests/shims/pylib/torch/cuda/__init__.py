"""torch.cuda for the fake torch: devices come from the nvidia-smi shim."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache

from torch.cuda import _perf, nccl  # noqa: F401


@dataclass(frozen=True)
class _CudaDeviceProperties:
    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int


_SMS = {"7.5": 40, "8.0": 108, "9.0": 132}


def _shim_setting(name: str) -> str | None:
    """A shim setting: the per-host file ($GPUPROV_SHIM_STATE/env, `export K=V` lines) wins over
    the environment, as in tests/shims/lib/common.sh."""
    path = os.path.join(os.environ.get("GPUPROV_SHIM_STATE", "/var/lib/gpuprov-shim"), "env")
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.strip().removeprefix("export ").partition("=")
                if key == name:
                    return value.strip("'\"")
    except OSError:
        pass
    return os.environ.get(name)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


@cache
def _devices() -> tuple[tuple[_CudaDeviceProperties, ...], str | None]:
    """(devices, why CUDA is unavailable or None)."""
    from torch import version

    try:
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60,
        )
        s = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return (), f"Found no NVIDIA driver on your system ({exc})"
    if q.returncode != 0 or s.returncode != 0:
        return (), ("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
                    "installed a driver")
    m = re.search(r"CUDA Version:\s*([0-9.]+)", s.stdout)
    driver_cuda = m.group(1) if m else "0.0"
    too_old = (
        _shim_setting("GPUPROV_SHIM_FAIL") == "torch-newer-cuda"
        or (version.cuda and _version_tuple(version.cuda)[:1] > _version_tuple(driver_cuda)[:1])
    )
    if too_old:
        code = "".join(f"{p:d}" for p in _version_tuple(driver_cuda)[:1]) + f"{_version_tuple(driver_cuda)[1]:d}0"
        return (), (
            f"The NVIDIA driver on your system is too old (found version {code}). Please update your GPU "
            "driver by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx"
        )
    devs = []
    for line in q.stdout.splitlines():
        name, mem, cc = (p.strip() for p in line.split(","))
        major, minor = (int(p) for p in cc.split("."))
        devs.append(_CudaDeviceProperties(name, major, minor, int(mem) * 1024 * 1024, _SMS.get(cc, 80)))
    return tuple(devs), None


def _warn_once(reason: str) -> None:
    if not getattr(_warn_once, "done", False):
        _warn_once.done = True  # type: ignore[attr-defined]
        print(f"UserWarning: CUDA initialization: {reason}", file=sys.stderr)


def is_available() -> bool:
    devs, reason = _devices()
    if reason:
        _warn_once(reason)
        return False
    return bool(devs)


def device_count() -> int:
    devs, reason = _devices()
    return 0 if reason else len(devs)


def _lazy_check(index: int) -> None:
    devs, reason = _devices()
    if reason:
        raise RuntimeError(reason)
    if not 0 <= index < len(devs):
        raise RuntimeError("CUDA error: invalid device ordinal")


def get_device_properties(index: int) -> _CudaDeviceProperties:
    _lazy_check(index)
    return _devices()[0][index]


def get_device_name(index: int = 0) -> str:
    return get_device_properties(index).name


def get_arch_list() -> list[str]:
    from torch import version

    if not is_available():
        return []
    return list(getattr(version, "arch_list", []))


def _kernel_check(index: int) -> None:
    """A kernel launch: the wheel must carry SASS the GPU runs (X.y runs on X.z with z >= y, same major),
    else CUDA fails as it does for a GPU outside the wheel's arch list."""
    props = get_device_properties(index)
    digits = [re.sub(r"\D", "", a) for a in get_arch_list()]  # "sm_86" -> "86", "sm_100" -> "100"
    runs = any(int(d[:-1]) == props.major and int(d[-1]) <= props.minor for d in digits if len(d) >= 2)
    if not runs:
        sm = f"sm_{props.major}{props.minor}"
        if not getattr(_kernel_check, "warned", False):
            _kernel_check.warned = True  # type: ignore[attr-defined]
            print(f"UserWarning: {props.name} with CUDA capability {sm} is not compatible with the current PyTorch "
                  f"installation. The current PyTorch install supports CUDA capabilities {' '.join(get_arch_list())}.",
                  file=sys.stderr)
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device\n"
                           "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                           "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")


def synchronize(index: int | None = None) -> None:
    _lazy_check(current_device() if index is None else index)


# --- the parts the bench probe uses: current device, memory, events, modelled costs --------------

_current = 0
_allocated: dict[int, int] = {}


class OutOfMemoryError(RuntimeError):
    pass


def set_device(index: object) -> None:
    global _current
    i = int(str(index).rpartition(":")[2] or 0) if not isinstance(index, int) else index
    _lazy_check(i)
    _current = i


def current_device() -> int:
    _lazy_check(_current)
    return _current


def _reading(name: str, index: int, default: str) -> str:
    values = (_shim_setting(name) or default).split(",")
    return values[min(index, len(values) - 1)].strip()


def mem_get_info(index: int | None = None) -> tuple[int, int]:
    i = current_device() if index is None else index
    total = get_device_properties(i).total_memory
    used = int(float(_reading("GPUPROV_SHIM_MEM_USED", i, "0"))) * 1024 * 1024
    return max(0, total - used - _allocated.get(i, 0)), total


def _allocate(index: int, nbytes: int) -> None:
    """Refuses what does not fit, as the caching allocator does (memory is never given back here:
    empty_cache forgets it, which is what the bench probe calls between measurements)."""
    free, total = mem_get_info(index)
    if nbytes > free:
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {nbytes / 2**30:.2f} GiB. GPU {index} has a "
                               f"total capacity of {total / 2**30:.2f} GiB of which {free / 2**30:.2f} GiB is free.")
    _allocated[index] = _allocated.get(index, 0) + nbytes


def empty_cache() -> None:
    _allocated.clear()


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """As torch's: native on compute capability 8.0+; below that, True only when emulation counts."""
    from torch import version

    if not is_available():
        return False
    if version.cuda is not None and get_device_properties(current_device()).major >= 8:
        return True
    return including_emulation


def is_tf32_supported() -> bool:
    return is_bf16_supported(including_emulation=False)


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._at: float | None = None
        self._device: int | None = None

    def record(self, stream: object = None) -> None:
        self._device = current_device()
        self._at = _perf.now(self._device)

    def synchronize(self) -> None:
        if self._device is not None:
            _lazy_check(self._device)

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Event) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._at is None or end._at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if self._device != end._device:
            raise RuntimeError("Both events must be recorded on the same device.")
        return end._at - self._at


def _speed(index: int) -> float:
    return float(_reading("GPUPROV_SHIM_GPU_SPEED", index, "1"))


def _matmul_cost(index: int, m: int, k: int, n: int, dtype: object) -> None:
    from torch.backends.cuda import matmul as switch

    props = get_device_properties(index)
    rates = _perf.rates(props.name)
    name = getattr(dtype, "name", "float32")
    if name == "float16":
        rate = rates.tflops["fp16"]
    elif name == "bfloat16":
        rate = rates.tflops.get("bf16") or rates.tflops["fp16"] * _perf.EMULATED_BF16
    elif switch.allow_tf32 and props.major >= 8:
        rate = rates.tflops["tf32"]
    else:
        rate = rates.tflops["fp32"]
    _perf.advance(index, 2 * m * k * n / (rate * _speed(index) * 1e12) * 1e3)


def _copy_cost(src: object, dst: object) -> None:
    """A copy costs its bytes over the path: within a GPU, read + write at memory speed; to or from the
    host, the PCIe link (half as fast from pageable memory, which the driver stages through a pinned buffer)."""
    nbytes = dst.numel() * dst.dtype.itemsize  # type: ignore[attr-defined]
    s, d = src.device, dst.device  # type: ignore[attr-defined]
    if s.type == "cuda" and d.type == "cuda":
        _perf.advance(d.index, 2 * nbytes / (_perf.rates(get_device_properties(d.index).name).memory_gbps * 1e9) * 1e3)
    elif s.type == "cuda" or d.type == "cuda":
        gpu, host = (s, dst) if s.type == "cuda" else (d, src)
        rate = _perf.rates(get_device_properties(gpu.index).name).pcie_gbps * (1.0 if host.pinned else 0.5)
        _perf.advance(gpu.index, nbytes / (rate * 1e9) * 1e3)
