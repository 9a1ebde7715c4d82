"""torch.cuda.nccl for the fake torch: the NCCL version from GPUPROV_SHIM_NCCL, "2.21.5" (returned as a tuple,
as torch 2.x does) or "22105" (the single int older builds return); default 2.27.5."""

from __future__ import annotations


def version() -> tuple[int, ...] | int:
    from torch.cuda import _shim_setting

    setting = _shim_setting("GPUPROV_SHIM_NCCL") or "2.27.5"
    if setting.isdigit():
        return int(setting)
    return tuple(int(p) for p in setting.split("."))
