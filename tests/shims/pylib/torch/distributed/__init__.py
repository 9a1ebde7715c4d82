"""torch.distributed for the fake torch: a process group whose all_reduce moves real bytes over TCP.

Like the real env:// rendezvous, init_process_group reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT;
rank 0 serves a small key-value store on MASTER_PORT (all interfaces, as c10d's TCPStore does), every
rank listens on an ephemeral port (as NCCL's socket transport does: the OS picks it) and publishes
ADDRESS:PORT through the store, then each rank connects to the next one: a ring. all_reduce sends
the tensor's float32 bytes round the ring (world-1 steps, each rank adding what it receives), so the
sum is only right when every byte crossed between the hosts; a dropped port hangs until `timeout`
and fails as a real process group does. With NCCL_DEBUG=INFO, backend "nccl" says which network it
uses ("Using network Socket") and from which interface, as NCCL does.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from array import array

_state: dict[str, object] = {}


class ReduceOp:
    SUM = "sum"


class DistBackendError(RuntimeError):
    pass


def is_available() -> bool:
    return True


def is_nccl_available() -> bool:
    return True


def is_initialized() -> bool:
    return "rank" in _state


# --- framing ---------------------------------------------------------------------------------


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack("!Q", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise DistBackendError("Connection closed by peer")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> bytes:
    (n,) = struct.unpack("!Q", _recv_exact(sock, 8))
    return _recv_exact(sock, n)


# --- the store (rank 0) ----------------------------------------------------------------------


class _StoreServer(threading.Thread):
    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.data: dict[str, str] = {}
        self.cond = threading.Condition()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("0.0.0.0", port))
        except OSError as exc:
            raise DistBackendError(f"The server socket has failed to listen on any local network address. "
                                   f"port: {port}, useIpv6: 0, code: -98, name: EADDRINUSE, message: {exc}") from None
        self.sock.listen(128)

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                req = json.loads(_recv(conn))
                with self.cond:
                    if req["op"] == "set":
                        self.data[req["key"]] = req["value"]
                        self.cond.notify_all()
                        answer = "ok"
                    else:  # get: wait until the key is there
                        while req["key"] not in self.data:
                            self.cond.wait()
                        answer = self.data[req["key"]]
                _send(conn, answer.encode())
        except (OSError, DistBackendError, ValueError):
            conn.close()


def _connect(addr: str, port: int, deadline: float, what: str) -> socket.socket:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((addr, port), timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            last = exc
            time.sleep(0.1)
    raise DistBackendError(f"{what}: timed out connecting to {addr}:{port} ({last})")


class _Client:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def set(self, key: str, value: str) -> None:
        _send(self.sock, json.dumps({"op": "set", "key": key, "value": value}).encode())
        _recv(self.sock)

    def get(self, key: str) -> str:
        _send(self.sock, json.dumps({"op": "get", "key": key}).encode())
        return _recv(self.sock).decode()


def _interface_of(address: str) -> str:
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return "?"
    for line in out.splitlines():
        words = line.split()
        if len(words) > 3 and words[3].split("/")[0] == address:
            return words[1]
    return "?"


def _info(text: str) -> None:
    if os.environ.get("NCCL_DEBUG", "").upper() == "INFO" and _state.get("backend") == "nccl":
        print(f"{socket.gethostname()}:{os.getpid()}:{os.getpid()} [{_state.get('local_rank', 0)}] NCCL INFO {text}",
              flush=True)


# --- the process group -----------------------------------------------------------------------


def _env(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"Error initializing torch.distributed using env:// rendezvous: environment variable "
                         f"{name} expected, but not set")
    return value


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: datetime.timedelta | None = None, world_size: int = -1, rank: int = -1,
                       **_: object) -> None:
    from torch import cuda

    if is_initialized():
        raise ValueError("trying to initialize the default process group twice!")
    if init_method not in (None, "env://"):
        raise ValueError(f"the fake torch supports the env:// rendezvous only, not {init_method}")
    backend = backend or ("nccl" if cuda.is_available() else "gloo")
    if backend == "nccl" and not cuda.is_available():
        raise DistBackendError("ProcessGroupNCCL is only supported with GPUs, no GPUs found!")
    rank = rank if rank >= 0 else int(_env("RANK"))
    world = world_size if world_size > 0 else int(_env("WORLD_SIZE"))
    master, port = _env("MASTER_ADDR"), int(_env("MASTER_PORT"))
    deadline = time.monotonic() + (timeout.total_seconds() if timeout else 1800.0)
    _state.update(backend=backend, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    if rank == 0:
        server = _StoreServer(port)
        server.start()
        _state["server"] = server
    store = _Client(_connect(master, port, deadline, f"rank {rank}: TCPStore at MASTER_ADDR:MASTER_PORT"))
    me = store.sock.getsockname()[0]  # the interface that routes to the master, as NCCL's bootstrap picks
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))  # an ephemeral port: what NCCL's socket transport listens on
    listener.listen(4)
    _state.update(rank=rank, world=world, store=store, listener=listener)
    _info(f"Bootstrap : Using {_interface_of(me)}:{me}<0>")
    _info("Using network Socket")
    store.set(f"addr/{rank}", f"{me}:{listener.getsockname()[1]}")
    if world > 1:
        host, _, p = store.get(f"addr/{(rank + 1) % world}").rpartition(":")
        accepted: dict[str, socket.socket] = {}

        def accept() -> None:
            listener.settimeout(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(OSError):
                accepted["sock"] = listener.accept()[0]

        waiter = threading.Thread(target=accept, daemon=True)
        waiter.start()
        _state["next"] = _connect(host, int(p), deadline, f"rank {rank}: ring connection to rank {(rank + 1) % world}")
        waiter.join()
        if "sock" not in accepted:
            raise DistBackendError(f"rank {rank}: no connection from rank {(rank - 1) % world} before the timeout")
        _state["prev"] = accepted["sock"]
        _info(f"Channel 00 : {rank} -> {(rank + 1) % world} via NET/Socket/0")


def _group() -> tuple[int, int]:
    if not is_initialized():
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    return int(_state["rank"]), int(_state["world"])  # type: ignore[call-overload]


def get_rank(group: object = None) -> int:
    return _group()[0]


def get_world_size(group: object = None) -> int:
    return _group()[1]


def get_backend(group: object = None) -> str:
    _group()
    return str(_state["backend"])


def all_reduce(tensor: object, op: str = ReduceOp.SUM, group: object = None, async_op: bool = False) -> None:
    """In place: every rank ends with the element-wise sum of all ranks' tensors."""
    rank, world = _group()
    dev = getattr(tensor, "device", None)
    if _state["backend"] == "nccl" and getattr(dev, "type", "cpu") != "cuda":
        raise ValueError("Tensors must be CUDA and dense")
    if op != ReduceOp.SUM:
        raise ValueError("the fake torch reduces with ReduceOp.SUM only")
    rows = tensor.rows  # type: ignore[attr-defined]
    cols = len(rows[0]) if rows else 0
    acc = array("f", [v for r in rows for v in r])
    if world > 1:
        outgoing = acc.tobytes()
        nxt, prev = _state["next"], _state["prev"]
        for _step in range(world - 1):
            error: list[BaseException] = []

            def send(data: bytes = outgoing, error: list[BaseException] = error) -> None:
                try:
                    _send(nxt, data)  # type: ignore[arg-type]
                except OSError as exc:
                    error.append(exc)

            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            incoming = _recv(prev)  # type: ignore[arg-type]
            sender.join()
            if error:
                raise DistBackendError(f"rank {rank}: send failed: {error[0]}")
            got = array("f")
            got.frombytes(incoming)
            if len(got) != len(acc):
                raise DistBackendError(f"rank {rank}: got {len(got)} elements, expected {len(acc)}")
            for i, v in enumerate(got):
                acc[i] += v
            outgoing = incoming
    tensor.rows = [list(acc[i * cols:(i + 1) * cols]) for i in range(len(rows))]  # type: ignore[attr-defined]


def barrier(group: object = None) -> None:
    from torch import Tensor, device

    dev = device("cuda:0") if _state.get("backend") == "nccl" else device("cpu")
    all_reduce(Tensor([[1.0]], dev))


def destroy_process_group(group: object = None) -> None:
    for key in ("next", "prev", "listener"):
        sock = _state.get(key)
        if isinstance(sock, socket.socket):
            sock.close()
    store = _state.get("store")
    if isinstance(store, _Client):
        store.sock.close()
    _state.clear()
    sys.stdout.flush()
