"""torch.distributed for the fake torch: a process group whose collectives really combine the ranks' tensors.

`init_process_group(backend, init_method="tcp://HOST:PORT", rank=R, world_size=N)`: rank 0 listens on
HOST:PORT, the others connect to it (retrying until `timeout`), as torch's TCP rendezvous does. A
collective sends each rank's tensor to rank 0 over that socket, rank 0 combines them and sends the
result back; nothing is canned, a rank that contributes the wrong value changes every rank's answer.
What crosses the socket is what the fake holds of a tensor: its values when small, else its shape and
the one value all its elements share; a large random tensor cannot cross (refused, never faked).
The GPU clock advances by the all-reduce's cost at the model's bus bandwidth (torch/cuda/_perf.py).
Refused as torch refuses: the nccl backend without a GPU, a CPU tensor on nccl, a collective before
init_process_group, ranks whose tensors differ in size.
"""

from __future__ import annotations

import json
import socket
import time
from datetime import timedelta
from typing import Any


class ReduceOp:
    SUM = "sum"
    MAX = "max"
    MIN = "min"


class DistBackendError(RuntimeError):
    pass


class _Group:
    def __init__(self, backend: str, rank: int, world: int, peers: list[tuple[socket.socket, Any]]) -> None:
        self.backend, self.rank, self.world = backend, rank, world
        self.peers = [p for p, _ in peers]
        self.files = [f for _, f in peers]  # one buffered reader/writer per socket, from the first byte on


_group: _Group | None = None


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _group is not None


def _need() -> _Group:
    if _group is None:
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    return _group


def get_rank() -> int:
    return _need().rank


def get_world_size() -> int:
    return _need().world


def init_process_group(backend: str | None = None, init_method: str | None = None, timeout: timedelta | None = None,
                       world_size: int = -1, rank: int = -1, **_: Any) -> None:
    global _group
    import os

    from torch import cuda

    backend = backend or "nccl"
    if backend == "nccl" and not cuda.is_available():
        raise DistBackendError("ProcessGroupNCCL is only supported with GPUs, no GPUs found!")
    if init_method is None:
        init_method = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        world_size = int(os.environ.get("WORLD_SIZE", world_size))
        rank = int(os.environ.get("RANK", rank))
    if not init_method.startswith("tcp://") or rank < 0 or world_size < 1:
        raise ValueError(f"the fake torch rendezvous takes tcp://HOST:PORT with a rank and world_size, got {init_method}")
    host, _, port = init_method.removeprefix("tcp://").rpartition(":")
    wait = (timeout or timedelta(minutes=10)).total_seconds()
    peers: list[tuple[socket.socket, Any]] = []
    if rank == 0:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, int(port)))
        server.listen(world_size)
        server.settimeout(wait)
        by_rank: dict[int, tuple[socket.socket, Any]] = {}
        while len(by_rank) < world_size - 1:
            conn, _addr = server.accept()
            conn.settimeout(None)
            f = conn.makefile("rwb")
            by_rank[int(f.readline())] = (conn, f)
        server.close()
        peers = [by_rank[r] for r in sorted(by_rank)]
    else:
        deadline = time.monotonic() + wait
        while True:
            try:
                conn = socket.create_connection((host, int(port)), timeout=wait)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise DistBackendError(f"timed out connecting to the rendezvous at {host}:{port}") from None
                time.sleep(0.05)
        conn.settimeout(None)
        conn.sendall(f"{rank}\n".encode())
        peers = [(conn, conn.makefile("rwb"))]
    _group = _Group(backend, rank, world_size, peers)
    if backend == "nccl" and os.environ.get("NCCL_DEBUG", "").upper() == "INFO":
        _nccl_info(peers[0][0].getsockname()[0] if peers else host)


def _nccl_info(address: str) -> None:
    """What NCCL says with NCCL_DEBUG=INFO about the interface and network it uses (its format: host:pid:tid
    [local rank] NCCL INFO ...): the fake's sockets are plain TCP, NCCL's socket transport."""
    import os
    import subprocess

    name = "?"
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
        name = next((w[1] for w in (line.split() for line in out.splitlines())
                     if len(w) > 3 and w[3].split("/")[0] == address), "?")
    except OSError:
        pass
    head = f"{socket.gethostname()}:{os.getpid()}:{os.getpid()} [{os.environ.get('LOCAL_RANK', '0')}] NCCL INFO"
    print(f"{head} Bootstrap : Using {name}:{address}<0>", flush=True)
    nics = _efa_devices()
    if nics:  # aws-ofi-nccl's and NCCL's own lines (tests/fixtures/allreduce/p5-2nodes-efa.txt)
        print(f"{head} NET/OFI Selected Provider is efa (found {nics} nics)", flush=True)
        print(f"{head} Using network AWS Libfabric", flush=True)
    else:
        print(f"{head} Using network Socket", flush=True)


def _efa_devices() -> int:
    """The EFA devices NCCL would use through the AWS OFI plugin: only with FI_PROVIDER=efa, the plugin on
    LD_LIBRARY_PATH (under the test sysroot) and libfabric's fi_info listing EFA devices; 0 means sockets."""
    import os
    import subprocess

    root = os.environ.get("GPUPROV_SYSROOT", "")
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    if os.environ.get("FI_PROVIDER") != "efa" or not any(
            os.path.exists(f"{root}{p}/libnccl-net-ofi.so") for p in paths):
        return 0
    try:
        out = subprocess.run([f"{root}/opt/amazon/efa/bin/fi_info", "-p", "efa"], capture_output=True, text=True,
                             timeout=10)
    except OSError:
        return 0
    return out.stdout.count("provider: efa") if out.returncode == 0 else 0


def get_backend(group: object = None) -> str:
    return _need().backend


def destroy_process_group(group: object = None) -> None:
    global _group
    if _group is not None:
        for f in _group.files:
            f.close()
        for p in _group.peers:
            p.close()
    _group = None


def _payload(tensor: Any) -> dict[str, Any]:
    if tensor.rows is not None:
        return {"numel": tensor.numel(), "rows": tensor.rows}
    if tensor.fill is None:
        raise NotImplementedError("the fake torch cannot all-reduce a large random tensor (it does not hold its values)")
    return {"numel": tensor.numel(), "fill": tensor.fill}


def _combine(op: str, payloads: list[dict[str, Any]]) -> dict[str, Any]:
    if len({p["numel"] for p in payloads}) != 1:
        raise DistBackendError("the ranks' tensors differ in size: " + ", ".join(str(p["numel"]) for p in payloads))
    pick = {ReduceOp.SUM: sum, ReduceOp.MAX: max, ReduceOp.MIN: min}[op]
    if all("fill" in p for p in payloads):
        return {"numel": payloads[0]["numel"], "fill": pick(p["fill"] for p in payloads)}
    rows = [p.get("rows") for p in payloads]
    if any(r is None for r in rows):
        raise DistBackendError("the fake torch cannot mix held and constant tensors in one collective")
    out = [[pick(vals) for vals in zip(*cols, strict=True)] for cols in zip(*rows, strict=True)]
    return {"numel": payloads[0]["numel"], "rows": out}


def _exchange(group: _Group, message: dict[str, Any], op: str) -> dict[str, Any]:
    """Rank 0 gathers every rank's message, combines, answers all; the others send and wait."""
    if group.rank == 0:
        payloads = [message]
        for f in group.files:
            line = f.readline()
            if not line:
                raise DistBackendError("a rank left the process group (connection closed)")
            payloads.append(json.loads(line))
        result = _combine(op, payloads) if "numel" in message else {}
        data = (json.dumps(result) + "\n").encode()
        for f in group.files:
            f.write(data)
            f.flush()
        return result
    f = group.files[0]
    f.write((json.dumps(message) + "\n").encode())
    f.flush()
    line = f.readline()
    if not line:
        raise DistBackendError("rank 0 left the process group (connection closed)")
    return json.loads(line)


def all_reduce(tensor: Any, op: str = ReduceOp.SUM, group: object = None, async_op: bool = False) -> None:
    from torch import cuda
    from torch.cuda import _perf

    g = _need()
    if g.backend == "nccl" and tensor.device.type != "cuda":
        raise RuntimeError("No backend type associated with device type cpu")
    result = _exchange(g, _payload(tensor), op)
    if "fill" in result:
        tensor.fill = float(result["fill"])
    else:
        tensor.rows = result["rows"]
    if tensor.device.type == "cuda":
        nbytes = tensor.numel() * tensor.dtype.itemsize
        busbw = _perf.rates(cuda.get_device_properties(tensor.device.index).name).busbw_gbps
        _perf.advance(tensor.device.index, nbytes * 2 * (g.world - 1) / g.world / (busbw * 1e9) * 1e3)


def barrier(group: object = None, **_: Any) -> None:
    _exchange(_need(), {}, ReduceOp.SUM)
