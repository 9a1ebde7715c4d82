"""Getting at a host once it runs: ssh and rsync command lines, commands on many hosts at once,
local port forwarding, JupyterLab's token, and GPU samples for `monitor`.

Every way in checks the host key against a pinned file, never trust-on-first-use behind the
user's back: the system `ssh` (and rsync through it) gets `StrictHostKeyChecking=yes` with the
node's own known_hosts or gpuprov's; the paramiko paths go through `Remote`, which pins the
same way. Library only: nothing here prints.
"""

from __future__ import annotations

import contextlib
import math
import re
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.hosts.fanout import run_parallel
from gpuprov.hosts.remote import CommandTimeout, ConnectionLost, HostSettings, Remote, Unreachable
from gpuprov.hosts.verify import QUERY_FIELDS, GpuInfo, parse_query_csv
from gpuprov.plan.inventory import Target, parse_target
from gpuprov.plan.render import host_path

UNREACHABLE = 255  # what ssh itself exits with when it cannot connect or authenticate
TIMED_OUT = 124  # what timeout(1) exits with: the command ran past exec --timeout
JUPYTER_TOKEN_PATH = "/var/lib/gpuprov/jupyter-token"
JUPYTER_PORT = 8888
SMI_COMMAND = f"nvidia-smi --query-gpu={QUERY_FIELDS} --format=csv,noheader,nounits"


# --- the system ssh client and rsync ---------------------------------------------------------


def known_hosts_for(target: Target, settings: HostSettings) -> Path:
    """The pinned keys `target` is checked against: a launched node's own file, else gpuprov's."""
    return Path(target.known_hosts) if target.known_hosts else settings.known_hosts


def ssh_options(target: Target, settings: HostSettings) -> list[str]:
    """OpenSSH client options for `target` (no host, no command): pinned host key, key, user, port."""
    known = known_hosts_for(target, settings)
    files = [known, *([] if target.known_hosts else settings.trusted)]  # a launched node: its own file only
    opts = [
        "-o", "UserKnownHostsFile=" + " ".join(f'"{f}"' if " " in str(f) else str(f) for f in files),
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "UpdateHostKeys=no",
        "-o", f"ConnectTimeout={max(1, math.ceil(settings.connect_timeout))}",
    ]
    config = settings.ssh_config or Path.home() / ".ssh" / "config"
    if config.is_file():  # the config gpuprov read, even where ssh's own home (passwd) is another (sudo -E, CI)
        opts += ["-F", str(config)]
    key = target.key or settings.key_filename
    if key:
        opts += ["-i", str(Path(key).expanduser()), "-o", "IdentitiesOnly=yes"]
    if target.port:
        opts += ["-p", str(target.port)]
    if target.user:
        opts += ["-l", target.user]
    if target.proxy_jump:
        opts += _jump_options(target.proxy_jump, settings, known)
    return opts


def _jump_options(jump: str, settings: HostSettings, known: Path) -> list[str]:
    """A single-hop jump host is checked against the same pinned file (a ProxyCommand running our
    own ssh); a chain goes to ssh's -J, which checks each hop with the user's ssh settings."""
    if "," in jump:
        return ["-J", jump]
    try:
        entry = parse_target(jump)
        hop = Target(host=entry.host, user=entry.user, port=entry.port, known_hosts=str(known))
    except UserInputError:
        hop = Target(host=jump, known_hosts=str(known))
    inner = ["ssh", *ssh_options(hop, settings), "-W", "[%h]:%p", "--", hop.host]
    return ["-o", "ProxyCommand=" + shlex.join(inner)]


def ssh_argv(target: Target, settings: HostSettings, command: Sequence[str] = (), *, tty: bool = False) -> list[str]:
    """`ssh … -- HOST [COMMAND…]`. Like ssh, the command words are joined by spaces for the remote shell."""
    argv = ["ssh", *ssh_options(target, settings)]
    if tty:
        argv.append("-t")
    return [*argv, "--", target.host, *command]


def is_pinned(target: Target, settings: HostSettings) -> bool | None:
    """Whether the pinned file holds a key for the host; None when the name ssh will use is unknown
    (an alias from ~/.ssh/config), where ssh alone decides."""
    from gpuprov.hosts.hostkeys import known_host_name

    files = [f for f in (known_hosts_for(target, settings), *([] if target.known_hosts else settings.trusted))
             if f.exists()]
    if not files:
        return False
    if "." not in target.host and ":" not in target.host:
        return None  # probably an ssh config alias: its HostName is not ours to guess
    keys = paramiko.HostKeys()
    for known in files:
        with contextlib.suppress(OSError, paramiko.SSHException, UnicodeDecodeError, ValueError):
            keys.load(str(known))
    return keys.lookup(known_host_name(target.host, target.port or 22)) is not None


def answers(target: Target, settings: HostSettings) -> bool:
    """Whether the host's SSH port accepts a TCP connection (through a ProxyJump: assumed yes)."""
    if target.proxy_jump:
        return True
    try:
        socket.create_connection((target.host, target.port or 22), timeout=settings.connect_timeout).close()
    except OSError:
        return False
    return True


def pin_hint(target: Target, known: Path) -> str:
    """What to tell a user whose host is not pinned yet."""
    spec = target.label if target.label and target.label != target.host else _spec(target)
    return (f"{target.name}: its host key is not pinned in {known}, so ssh refuses it. Check the key's fingerprint out "
            f"of band, then pin it once with: gpuprov exec --accept-new-host-key {spec} -- true")


def _spec(target: Target) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{target.user + '@' if target.user else ''}{host}{':' + str(target.port) if target.port else ''}"


@dataclass(frozen=True)
class SyncPlan:
    """Which side of a `sync` is remote."""

    upload: bool  # local -> remote
    local: str
    remote_path: str


_REMOTE_SIDE = re.compile(r"^((?:[A-Za-z0-9._-]+@)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)):")


def sync_host(src: str, dst: str) -> str:
    """rsync's shape: the host of whichever side is `HOST:PATH` (`NODE:PATH`, `USER@HOST:PATH`). A colon
    after a slash is part of a local path, as for rsync; `./a:b` is local."""
    hosts = [m.group(1) for m in (_REMOTE_SIDE.match(arg) for arg in (src, dst)) if m]
    if len(hosts) != 1:
        raise UserInputError("SRC DST", "exactly one of SRC and DST must be NODE:PATH (or [USER@]HOST:PATH)",
                             "e.g. gpuprov sync ./code exp1:/work/code, or back: gpuprov sync exp1:/work/out ./out")
    return hosts[0]


def split_sync(host: str, src: str, dst: str) -> SyncPlan:
    """`HOST:path` (or `:path`) marks the remote side; exactly one side must be remote."""

    def remote_part(arg: str) -> str | None:
        for prefix in (f"{host}:", ":"):
            if arg.startswith(prefix):
                return arg[len(prefix):] or "."
        return None

    r_src, r_dst = remote_part(src), remote_part(dst)
    if (r_src is None) == (r_dst is None):
        raise UserInputError(
            "SRC DST", "exactly one of SRC and DST must be on the host",
            f"mark the remote side as {host}:PATH (or :PATH), e.g. gpuprov sync {host} ./data {host}:data",
        )
    if r_dst is not None:
        return SyncPlan(upload=True, local=src, remote_path=r_dst)
    assert r_src is not None
    return SyncPlan(upload=False, local=dst, remote_path=r_src)


def as_copy(plan: SyncPlan, source_is_dir: bool) -> SyncPlan:
    """`sync`'s one rule for slashes: DST becomes a copy of SRC. A folder's contents land in DST whatever
    slashes either side has (rsync's `SRC/ DST/`, so `sync ./code node:code` makes ~/code, never
    ~/code/code); a file lands at DST, or inside DST when DST ends in `/`."""
    if not source_is_dir:
        return plan
    return SyncPlan(plan.upload, plan.local.rstrip("/") + "/", plan.remote_path.rstrip("/") + "/")


def remote_is_dir(target: Target, settings: HostSettings, path: str) -> bool:
    """Whether `path` on the host is a folder (relative paths: in the login's home, `~/` expanded there)."""
    word = "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)
    remote = Remote(target, settings)
    try:
        remote.open()
        return remote.run(f"test -d {word}").ok
    finally:
        remote.close()


def rsync_argv(target: Target, settings: HostSettings, plan: SyncPlan, *, progress: bool = False,
               delete: bool = False, extra: Sequence[str] = ()) -> list[str]:
    """rsync -a over the same pinned ssh settings (`-e "ssh -o UserKnownHostsFile=… …"`)."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    remote = f"{host}:{plan.remote_path}"
    argv = ["rsync", "-a", "-e", shlex.join(["ssh", *ssh_options(target, settings)])]
    if progress:
        argv += ["--info=progress2", "--human-readable"]
    if delete:
        argv.append("--delete")
    argv += list(extra)
    parent = plan.remote_path.rstrip("/").rpartition("/")[0]
    if plan.upload and parent not in ("", ".", "~"):  # rsync makes DST's last folder only: its parents first
        word = "~/" + shlex.quote(parent[2:]) if parent.startswith("~/") else shlex.quote(parent)
        argv.append(f"--rsync-path=mkdir -p {word} && rsync")
    return [*argv, plan.local, remote] if plan.upload else [*argv, remote, plan.local]


# --- commands on many hosts ------------------------------------------------------------------


Emit = Callable[[Target, str, str], None]  # (host, "out" | "err", one line without its newline)


class LineSink:
    """A write()-able stream that hands on whole lines (the last partial one at close())."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._buffer = ""

    def write(self, text: str) -> int:
        self._buffer += text
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            self._emit(line.rstrip("\r"))
        return len(text)

    def flush(self) -> None:  # invoke flushes after every chunk: lines are only complete at "\n"
        pass

    def close(self) -> None:
        if self._buffer:
            line, self._buffer = self._buffer, ""
            self._emit(line)


@dataclass
class ExecResult:
    target: Target
    exit_code: int
    error: str | None = None
    seconds: float = 0.0


def exec_one(target: Target, settings: HostSettings, command: str, emit: Emit, *, sudo: bool = False,
             timeout: float | None = None) -> ExecResult:
    """Run `command` on one host, streaming its stdout and stderr line by line to `emit`.

    The exit code is the command's; 255 (ssh's own) when the host cannot be reached, its key is not
    pinned or has changed, or the connection drops; 124 (timeout(1)'s) when it ran past `timeout`."""
    start = time.monotonic()
    out = LineSink(lambda line: emit(target, "out", line))
    err = LineSink(lambda line: emit(target, "err", line))
    remote = Remote(target, settings)
    try:
        remote.open()
        result = remote.run(command, sudo=sudo, out=out, err=err, timeout=timeout)
        return ExecResult(target, result.exited, seconds=time.monotonic() - start)
    except CommandTimeout as exc:
        return ExecResult(target, TIMED_OUT, str(exc), seconds=time.monotonic() - start)
    except (Unreachable, ConnectionLost, GpuprovError) as exc:
        return ExecResult(target, UNREACHABLE, str(exc), seconds=time.monotonic() - start)
    except Exception as exc:  # invoke's CommandTimedOut and the like: one host never stops the others
        return ExecResult(target, UNREACHABLE, f"{type(exc).__name__}: {exc}", seconds=time.monotonic() - start)
    finally:
        out.close()
        err.close()
        remote.close()


def exec_many(targets: Sequence[Target], settings: HostSettings, command: str | Callable[[Target], str], emit: Emit,
              *, parallel: int = 32, sudo: bool = False, timeout: float | None = None) -> list[ExecResult]:
    """`exec_one` on every host at once (bounded by `parallel`); results in the hosts' order. `command` may
    differ per host (a cluster's nodes source their own cluster.env)."""
    def one(t: Target) -> ExecResult:
        return exec_one(t, settings, command(t) if callable(command) else command, emit, sudo=sudo, timeout=timeout)

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
