"""Getting at a host once it runs: commands on many hosts at once, local port forwarding, JupyterLab's
token, and GPU samples for `monitor` (the system ssh and rsync command lines: sshcli.py).

Every way in checks the host key against a pinned file, never trust-on-first-use behind the
user's back: these paramiko paths go through `Remote`, which pins as the system `ssh` does
with StrictHostKeyChecking=yes. Library only: nothing here prints.

`exec` runs on many hosts at once with per-line prefixes and combined exit codes: `LineSink` hands on whole lines,
then a `flush` hook once per read, so the CLI prints a read's lines in one call. Port forwarding is paramiko's
direct-tcpip.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import paramiko

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.hosts.fanout import run_parallel
from gpuprov.hosts.remote import CommandTimeout, ConnectionLost, HostSettings, HostUnreachable, Remote
from gpuprov.hosts.verify import QUERY_FIELDS, GpuInfo, parse_query_csv
from gpuprov.plan.inventory import Target
from gpuprov.plan.render import host_path

UNREACHABLE = 255  # what ssh itself exits with when it cannot connect or authenticate
TIMED_OUT = 124  # what timeout(1) exits with: the command ran past exec --timeout
JUPYTER_TOKEN_PATH = "/var/lib/gpuprov/jupyter-token"
JUPYTER_PORT = 8888
SMI_COMMAND = f"nvidia-smi --query-gpu={QUERY_FIELDS} --format=csv,noheader,nounits"


# --- commands on many hosts ------------------------------------------------------------------


Emit = Callable[[Target, str, str], None]  # (host, "out" | "err", one line without its newline)


class LineSink:
    """A write()-able stream that hands on whole lines (the last partial one at close()), then calls `then`
    once per write that completed any (a printer can write a read's lines at once, not one call per line).
    The line so far is kept in pieces: appending to one string and searching all of it on every write made a
    long line cost the square of its length."""

    def __init__(self, emit: Callable[[str], None], then: Callable[[], None] | None = None) -> None:
        self._emit = emit
        self._then = then
        self._pieces: list[str] = []

    def write(self, text: str) -> int:
        if "\n" not in text:
            self._pieces.append(text)
            return len(text)
        first, *lines, last = text.split("\n")
        self._emit(("".join(self._pieces) + first).rstrip("\r"))
        for line in lines:
            self._emit(line.rstrip("\r"))
        self._pieces = [last] if last else []
        if self._then is not None:
            self._then()
        return len(text)

    def flush(self) -> None:  # lines are only complete at "\n"
        pass

    def close(self) -> None:
        if self._pieces:
            line, self._pieces = "".join(self._pieces), []
            self._emit(line)
            if self._then is not None:
                self._then()


@dataclass
class ExecResult:
    target: Target
    exit_code: int
    error: str | None = None
    seconds: float = 0.0


def exec_one(target: Target, settings: HostSettings, command: str, emit: Emit, *, sudo: bool = False,
             timeout: float | None = None, flush: Callable[[], None] | None = None) -> ExecResult:
    """Run `command` on one host, streaming its stdout and stderr line by line to `emit` (and `flush()` after
    each read's lines).

    The exit code is the command's; 255 (ssh's own) when the host cannot be reached, its key is not
    pinned or has changed, or the connection drops; 124 (timeout(1)'s) when it ran past `timeout`."""
    start = time.monotonic()
    out = LineSink(lambda line: emit(target, "out", line), flush)
    err = LineSink(lambda line: emit(target, "err", line), flush)
    remote = Remote(target, settings)
    try:
        remote.open()
        result = remote.run(command, sudo=sudo, out=out, err=err, timeout=timeout)
        return ExecResult(target, result.exited, seconds=time.monotonic() - start)
    except CommandTimeout as exc:
        return ExecResult(target, TIMED_OUT, str(exc), seconds=time.monotonic() - start)
    except (HostUnreachable, ConnectionLost, GpuprovError) as exc:
        return ExecResult(target, UNREACHABLE, str(exc), seconds=time.monotonic() - start)
    except Exception as exc:  # invoke's CommandTimedOut and the like: one host never stops the others
        return ExecResult(target, UNREACHABLE, f"{type(exc).__name__}: {exc}", seconds=time.monotonic() - start)
    finally:
        out.close()
        err.close()
        remote.close()


def exec_many(targets: Sequence[Target], settings: HostSettings, command: str | Callable[[Target], str], emit: Emit,
              *, parallel: int = 32, sudo: bool = False, timeout: float | None = None,
              flush: Callable[[], None] | None = None) -> list[ExecResult]:
    """`exec_one` on every host at once (bounded by `parallel`); results in the hosts' order. `command` may
    differ per host (a cluster's nodes source their own cluster.env)."""
    def one(t: Target) -> ExecResult:
        return exec_one(t, settings, command(t) if callable(command) else command, emit, sudo=sudo, timeout=timeout,
                        flush=flush)

    return run_parallel(list(targets), one, parallel)


def combined_exit_code(results: Sequence[ExecResult]) -> int:
    """One host: its own code. Several: 0 when all succeeded, else the first failure's code."""
    if len(results) == 1:
        return results[0].exit_code
    return next((r.exit_code for r in results if r.exit_code != 0), 0)


# --- local port forwarding ---------------------------------------------------------------------


@dataclass(frozen=True)
class ForwardSpec:
    local_port: int
    remote_host: str
    remote_port: int


def parse_forward(text: str) -> ForwardSpec:
    """`LOCAL`, `LOCAL:REMOTE` or `LOCAL:RHOST:RPORT` (the remote end as seen from the host)."""
    parts = text.split(":")
    try:
        ports = [int(p) for p in (parts[0], parts[-1])]
    except ValueError:
        ports = []
    if len(parts) > 3 or len(ports) != 2 or not all(0 <= p < 65536 for p in ports) or (
            len(parts) == 3 and not parts[1]):
        raise UserInputError("LOCAL[:REMOTE]", f"{text!r} is not a port forwarding",
                             "e.g. 8888 (same port on both ends), 8000:8888, or 0:8888 for any free local port")
    local, remote = ports
    if len(parts) == 1 and local == 0:
        raise UserInputError("LOCAL[:REMOTE]", "local port 0 needs the remote port too", "e.g. 0:8888")
    return ForwardSpec(local, parts[1] if len(parts) == 3 else "127.0.0.1", remote)


class LocalForward:
    """Forward 127.0.0.1:LOCAL to REMOTE_HOST:REMOTE_PORT as seen from the host, through an open
    Remote's SSH transport (direct-tcpip channels), until stop()."""

    def __init__(self, remote: Remote, spec: ForwardSpec, *, bind: str = "127.0.0.1",
                 on_error: Callable[[str], None] | None = None) -> None:
        self.remote = remote
        self.spec = spec
        self.bind = bind
        self.on_error = on_error
        self._stop = threading.Event()
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self.port = 0

    def start(self) -> int:
        """Listen and start forwarding; returns the local port (the chosen one for port 0)."""
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((self.bind, self.spec.local_port))
        except OSError as exc:
            server.close()
            raise GpuprovError(f"cannot listen on {self.bind}:{self.spec.local_port}: {exc.strerror or exc}; "
                               "pick another local port") from None
        server.listen(64)
        server.settimeout(0.2)
        self._server = server
        self.port = server.getsockname()[1]
        transport = self.remote.conn.transport
        if transport is not None:
            transport.set_keepalive(30)
        thread = threading.Thread(target=self._accept_loop, name="gpuprov-forward", daemon=True)
        thread.start()
        self._threads.append(thread)
        return int(self.port)

    @property
    def alive(self) -> bool:
        transport = self.remote.conn.transport
        return transport is not None and transport.is_active() and not self._stop.is_set()

    def _accept_loop(self) -> None:
        assert self._server is not None
        while not self._stop.is_set():
            try:
                client, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(client, peer), daemon=True)
            thread.start()

    def _serve(self, client: socket.socket, peer: tuple[str, int]) -> None:
        transport = self.remote.conn.transport
        try:
            if transport is None:
                raise paramiko.SSHException("the SSH connection is closed")
            channel = transport.open_channel("direct-tcpip", (self.spec.remote_host, self.spec.remote_port), peer,
                                             timeout=10)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            if self.on_error:
                self.on_error(f"{self.spec.remote_host}:{self.spec.remote_port} on the host refused the forwarded "
                              f"connection: {exc}")
            return
        try:
            _pump(client, channel, self._stop)
        finally:
            channel.close()
            client.close()

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
        for thread in self._threads:
            thread.join(timeout=2)


def _pump(sock: socket.socket, channel: paramiko.Channel, stop: threading.Event) -> None:
    """Copy bytes both ways until either side closes."""
    while not stop.is_set():
        readable = select.select([sock.fileno(), channel.fileno()], [], [], 0.5)[0]
        if sock.fileno() in readable:
            data = sock.recv(65536)
            if not data:
                return
            channel.sendall(data)
        if channel.fileno() in readable:
            data = channel.recv(65536)
            if not data:
                return
            sock.sendall(data)


# --- JupyterLab --------------------------------------------------------------------------------


def read_jupyter_token(remote: Remote) -> str:
    """The token the `jupyter` step generated on the host (root-only file)."""
    path = host_path(JUPYTER_TOKEN_PATH)
    command = f"cat {path}" if remote.is_root else f"sudo -n cat -- {path}"
    result = remote.run(command)
    token = result.stdout.strip()
    if not result.ok or not token:
        raise GpuprovError(
            f"{remote.target.name}: no JupyterLab token at {JUPYTER_TOKEN_PATH} ({result.stderr.strip() or 'empty'}); "
            "set the host up with a playbook that has `jupyter: true`, e.g. gpuprov bootstrap HOST -p jupyter"
        )
    return token


def jupyter_url(port: int, token: str) -> str:
    return f"http://127.0.0.1:{port}/lab?token={token}"


# --- GPU samples for `monitor` -----------------------------------------------------------------


@dataclass
class GpuSample:
    target: Target
    gpus: list[GpuInfo] = field(default_factory=list)
    error: str | None = None
    at: float = 0.0  # time.time() of the sample

    @property
    def ok(self) -> bool:
        return self.error is None


class Monitor:
    """One open connection per host, reused sample after sample (reopened after a failure)."""

    def __init__(self, targets: Sequence[Target], settings: HostSettings, parallel: int = 32) -> None:
        self.targets = list(targets)
        self.settings = settings
        self.parallel = parallel
        self._remotes: dict[int, Remote] = {}

    def _sample_one(self, index: int) -> GpuSample:
        target = self.targets[index]
        remote = self._remotes.get(index)
        try:
            if remote is None:
                remote = Remote(target, self.settings)
                remote.open()
                self._remotes[index] = remote
            result = remote.run(SMI_COMMAND, timeout=30)
            if not result.ok:
                text = (result.stdout.strip() or result.stderr.strip()).splitlines()
                return GpuSample(target, error=f"nvidia-smi exited {result.exited}: {text[0] if text else ''}",
                                 at=time.time())
            return GpuSample(target, parse_query_csv(result.stdout), at=time.time())
        except Exception as exc:  # one host's failure is its own sample's error
            dropped = self._remotes.pop(index, None)
            if dropped is not None:
                dropped.close()
            message = str(exc) if isinstance(exc, GpuprovError) else f"{type(exc).__name__}: {exc}"
            return GpuSample(target, error=message, at=time.time())

    def sample(self) -> list[GpuSample]:
        return run_parallel(list(range(len(self.targets))), self._sample_one, self.parallel)

    def close(self) -> None:
        for remote in self._remotes.values():
            remote.close()
        self._remotes.clear()
