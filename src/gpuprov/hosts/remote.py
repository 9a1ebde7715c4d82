"""SSH to one host with Fabric: connect with pinned host keys, run, upload, reboot and wait.

One `Remote` per host per thread. Fabric honours ~/.ssh/config (Host aliases, HostName, User,
Port, IdentityFile, ProxyJump); every hop, ProxyJump gateways included, checks its host key
against gpuprov's known_hosts (see hostkeys.py) instead of Fabric's default, which trusts any new key.

Every host's Connection shares one Fabric Config per ssh config file (as a Group's do), which making a Connection
only reads: `_Connection` declares the attribute Fabric 3.2 assigns undeclared, whose write re-merged the shared
Config under other threads, and every host's `connect_kwargs` is its own dict.

`run` is one paramiko exec channel of its own (stdin at EOF, the timeout a deadline in `Session.pump`), its output
streamed to a sink and returned whole, kept in pieces and joined once (invoke's Runner joined all the output so
far on every read: the capture took the square of the output, and decoded each read apart, cutting UTF-8
characters; bench/exec_output.py). `stream` sends bytes on stdin and hands stdout/stderr to callbacks, with a
silence bound (`HostLost`); `session` drives the same channel in parts (`read_until` a marker line, `send` stdin
then EOF, `pump` the rest). A command ends at its exit status *and* its EOF, since sshd may report the exit before
the last output. A read takes all paramiko holds (up to 4 MiB), and before a stdout read the stderr already
buffered is handed on, so a step's last stderr lines come before the runner's `end` event. `wait_gone` sees a
reboot drop the connection.

Keepalives are OpenSSH's ServerAliveInterval x ServerAliveCountMax (from the ssh config, else 15 s x 4): paramiko's
transport keepalive plus TCP_USER_TIMEOUT = their product, so a link whose keepalive goes unacknowledged dies
instead of waiting on TCP's ~15 minutes of retries. A dropped connection to a host that then takes no new TCP
connection within 3 s is `HostLost`; one that does is `ConnectionLost` (it closed ours). `why_unreachable` puts a
failed connect in words (refused, no route, timed out, name not resolved, not an SSH server, a banner without a
finished handshake, authentication failed with the keys tried); a command past its timeout is `CommandTimeout`
(`exec` exits 124).
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import io
import logging
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import paramiko
from fabric import Config, Connection

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.hosts import hostkeys
from gpuprov.hosts.wire import aead_transport, connect_tcp
from gpuprov.plan.inventory import Target

# paramiko logs transport errors (a banner read while sshd restarts, say) with tracebacks; we report
# them ourselves, once, as HostUnreachable or ConnectionLost
logging.getLogger("paramiko").setLevel(logging.CRITICAL)


class Ended(GpuprovError):
    """A command that ended before it printed the line it was read up to: its exit status and last stderr line."""

    def __init__(self, code: int, last: str, marker: str) -> None:
        self.code = code
        self.last = last
        super().__init__(f"the command ended (exit {code}) before it printed {marker!r}" + (f": {last}" if last else ""))


class HostUnreachable(GpuprovError):
    """The host did not answer SSH (refused, timed out, auth failed)."""


class ConnectionLost(GpuprovError):
    """The connection dropped while a command was running."""


class HostLost(ConnectionLost):
    """The host stopped answering mid-command: keepalives unanswered, or no output for too long."""


class CommandTimeout(GpuprovError):
    """A command ran past the time it was given."""


class ShellRefused(GpuprovError):
    """The login's shell runs no command (nologin, /bin/false): every command fails alike, whatever it was."""


def why_unreachable(exc: BaseException, remote: Remote) -> str:
    """What a failed connect means, in words: refused, timed out, no route, name not resolved, not an
    SSH server, a handshake that stalled after the banner, authentication failed (naming the keys tried)."""
    import errno

    timeout = remote.settings.connect_timeout
    causes: list[BaseException] = [exc]
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        causes = list(exc.errors.values()) or causes
    codes = {getattr(c, "errno", None) for c in causes}
    if isinstance(exc, socket.gaierror):
        return (f"the name {remote.conn.host!r} does not resolve (DNS: {exc.strerror or exc}); check the spelling, "
                "or give the address")
    if errno.ECONNREFUSED in codes or any(isinstance(c, ConnectionRefusedError) for c in causes):
        return f"connection refused on port {remote.conn.port}: no SSH server listens there (is sshd running? right port?)"
    if codes & {errno.EHOSTUNREACH, errno.ENETUNREACH}:
        return "no route to host: the network cannot reach this address (VPN, subnet, or the host is down)"
    if isinstance(exc, (TimeoutError, socket.timeout)) or errno.ETIMEDOUT in codes:
        return (f"timed out after {timeout:g}s with no answer (host down, a firewall or security group dropping "
                f"port {remote.conn.port}, or a wrong address; --connect-timeout to wait longer)")
    transport = remote.conn.client.get_transport()
    if "protocol banner" in str(exc) or isinstance(exc, EOFError) or (transport is not None and not transport.remote_version):
        return (f"something answered on port {remote.conn.port} but did not speak SSH within {timeout:g}s "
                "(not an SSH server, or one still starting)")
    if transport is not None and not transport.initial_kex_done:
        # paramiko's connect gives up on the key exchange at its timeout without a word, then fails to authenticate
        return (f"the server sent its SSH banner but did not finish the handshake within {timeout:g}s "
                f"({transport.remote_version!r}: a hung or overloaded sshd, or something in between that stalls)")
    if isinstance(exc, paramiko.AuthenticationException) or "No existing session" in str(exc) or \
            "No authentication methods available" in str(exc):
        keys = remote.conn.connect_kwargs.get("key_filename") or []
        tried = ", ".join(str(k) for k in ([keys] if isinstance(keys, str) else keys)) or \
            "the ssh agent's and ~/.ssh/id_* (no -i, no IdentityFile)"
        return f"authentication failed as {remote.conn.user!r}; keys tried: {tried} (-i KEY, or the right USER@)"
    return f"{type(exc).__name__}: {exc or 'no answer'}"


class Sink(Protocol):
    """Where a command's output streams to (a host's log)."""

    def write(self, text: str) -> int: ...

    def flush(self) -> None: ...


_READ = 4 << 20  # the most one read of a channel takes

KEEPALIVE = (15.0, 4)  # OpenSSH's ServerAliveInterval / ServerAliveCountMax when the ssh config sets none


@dataclass(frozen=True)
class HostSettings:
    """How to reach hosts; one per run, shared by every host."""

    known_hosts: Path
    accept_new_host_key: bool = False
    connect_timeout: float = 10.0
    ssh_config: Path | None = None  # None: ~/.ssh/config when it exists
    key_filename: str | None = None
    trusted: tuple[Path, ...] = ()  # the user's own known_hosts files: their keys count as pinned (read only)

    def __post_init__(self) -> None:
        if self.key_filename and not Path(self.key_filename).expanduser().is_file():
            raise UserInputError("--identity", f"no such key file: {self.key_filename}",
                                 "give the private key's path, e.g. -i ~/.ssh/id_ed25519")


@dataclass
class RunResult:
    command: str
    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exited == 0


def _config(settings: HostSettings) -> Config:
    """Fabric's Config for these settings: one per ssh config file as it is now, shared by every host's
    Connection (as a Fabric Group shares one), so 32 hosts do not read and merge it 32 times."""
    ssh_config = settings.ssh_config or (Path.home() / ".ssh" / "config")
    try:
        stat = ssh_config.stat()
        stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = None
    return _shared_config(settings.connect_timeout, str(ssh_config), stamp)


@functools.lru_cache(maxsize=8)
def _shared_config(connect_timeout: float, ssh_config: str, stamp: tuple[int, int] | None) -> Config:
    overrides: dict[str, Any] = {"run": {"in_stream": False, "warn": True}, "timeouts": {"connect": connect_timeout}}
    if stamp is not None:
        return Config(overrides=overrides, runtime_ssh_path=ssh_config)
    return Config(overrides=overrides)


def _secure(conn: Connection, settings: HostSettings) -> tuple[hostkeys.Revoked, ...]:
    """Replace Fabric's trust-any-new-key client with one that checks gpuprov's pins, for every hop; the
    revoked keys that apply to them (what a refusal names)."""
    conn.client = paramiko.SSHClient()
    trusted = settings.trusted
    if trusted:  # and the host's UserKnownHostsFile from the ssh config, if it names one
        named = conn.ssh_config.get("userknownhostsfile")
        for word in (named if isinstance(named, list) else str(named or "").split()):
            path = Path(word).expanduser()
            trusted += (path,) if path.is_file() and path not in trusted else ()
    revoked = hostkeys.prepare_client(conn.client, settings.known_hosts, settings.accept_new_host_key, trusted,
                                      host=hostkeys.known_host_name(conn.host, int(conn.port or 22)))
    if isinstance(conn.gateway, Connection):
        revoked += _secure(conn.gateway, settings)
    return revoked


class _Connection(Connection):  # type: ignore[misc]  # fabric ships no type hints
    """Fabric's Connection, made by many threads over one shared Config. Fabric 3.2 assigns `inline_ssh_env`,
    which no class declares, so invoke took it for a config change and merged the shared Config again, emptying
    it first: a thread reading it then failed with "No attribute or config key found for 'port'" (with many hosts
    at once; scylladb/scylla-cluster-tests#2187 has the same words). Declared, it is a plain attribute."""

    inline_ssh_env = None


def connection(target: Target, settings: HostSettings) -> tuple[Connection, tuple[hostkeys.Revoked, ...]]:
    """A not-yet-open Fabric Connection to `target` (opens lazily, on first use), and the revoked keys that
    apply to its hops."""
    # never empty: for {} Fabric uses the shared Config's own, and the socket `Remote.open` puts there is every host's
    connect_kwargs: dict[str, Any] = {"key_filename": []}
    key = target.key or settings.key_filename
    if key:
        connect_kwargs.update(key_filename=[str(Path(key).expanduser())], look_for_keys=False)
    gateway = _Connection(target.proxy_jump, config=_config(settings), connect_timeout=int(settings.connect_timeout),
                          connect_kwargs={"key_filename": []}) if target.proxy_jump else None
    conn = _Connection(
        target.host, user=target.user, port=target.port, config=_config(settings),
        connect_timeout=int(settings.connect_timeout), connect_kwargs=connect_kwargs, gateway=gateway,
    )
    return conn, _secure(conn, settings)


class Remote:
    """A host we talk to: run commands (as root through sudo when needed), upload bytes, reboot."""

    def __init__(self, target: Target, settings: HostSettings) -> None:
        self.target = target
        if target.known_hosts:  # a launched node: its own pinned keys and nothing else
            settings = dataclasses.replace(settings, known_hosts=Path(target.known_hosts), trusted=())
        self.settings = settings
        self.conn, self.revoked = connection(target, settings)
        self._shell_runs = False  # known once a command succeeded, or `exit 0` did after one failed

    @property
    def is_root(self) -> bool:
        return bool(self.conn.user == "root")

    @property
    def keepalive(self) -> tuple[float, int]:
        """(ServerAliveInterval, ServerAliveCountMax) from the ssh config, else 15 s x 4; interval 0 = off."""
        config = self.conn.ssh_config
        try:
            interval = float(config.get("serveraliveinterval", KEEPALIVE[0]))
            count = int(config.get("serveralivecountmax", KEEPALIVE[1]))
        except (TypeError, ValueError):
            return KEEPALIVE
        return max(0.0, interval), max(1, count)

    def open(self) -> None:
        try:
            if not self.conn.gateway and not self.conn.is_connected:  # through a gateway, SSH runs on its channel
                self.conn.connect_kwargs["sock"] = connect_tcp(self.conn.host, int(self.conn.port or 22),
                                                        float(self.conn.connect_timeout or self.settings.connect_timeout))
            self.conn.connect_kwargs["transport_factory"] = aead_transport
            try:
                self.conn.open()
            finally:  # one socket, one connection: a later reopen by Fabric makes its own
                self.conn.connect_kwargs.pop("sock", None)
            transport = self.conn.transport
            sock = transport.sock if transport else None
            interval, count = self.keepalive
            if transport and interval:
                # as OpenSSH's ServerAlive*: a keepalive after `interval` s of quiet, and a link whose data
                # (that keepalive included) stays unacknowledged interval x count s is dead (ETIMEDOUT)
                transport.set_keepalive(max(1, int(interval)))
                if isinstance(sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(interval * count * 1000))
        except paramiko.BadHostKeyException as exc:
            raise hostkeys.explain(exc, self.revoked) from None
        except (hostkeys.UnknownHostKey, hostkeys.RevokedHostKey):
            raise
        except (TimeoutError, OSError, paramiko.SSHException, EOFError) as exc:
            where = f"{self.conn.user}@{self.conn.host}:{self.conn.port}"
            raise HostUnreachable(f"{where}: {why_unreachable(exc, self)}") from None

    def close(self) -> None:
        self.conn.close()

    def run(self, command: str, *, sudo: bool = False, out: Sink | None = None, timeout: float | None = None,
            err: Sink | None = None) -> RunResult:
        """Run `command` in the remote shell (stdin at EOF). A dropped connection raises ConnectionLost; past
        `timeout` seconds the channel is closed and CommandTimeout raised.

        Output streams to `out` (stderr too, unless `err` is given) and is returned whole in the result. It is
        kept in pieces and joined once: invoke's Runner, which ran this before, joined all the output so far on
        every 1000-byte read (for its stream watchers, which gpuprov has none of), so the time grew with the square
        of the output (pyinvoke/invoke#1079); and it decoded each read on its own, so a UTF-8 character cut between
        two reads became two U+FFFD."""
        outs: list[str] = []
        errs: list[str] = []

        def on_out(text: str) -> None:
            outs.append(text)
            if out is not None:
                out.write(text)

        def on_err(text: str) -> None:
            errs.append(text)
            sink = err or out
            if sink is not None:
                sink.write(text)

        if self.conn.transport is None:  # never opened: open now, as Fabric's run did
            self.open()
        session = self.session(command, sudo=sudo)
        try:
            session.send(b"")
            code = session.pump(on_out, on_err, deadline=None if timeout is None else time.monotonic() + timeout)
        except CommandTimeout:
            raise CommandTimeout(f"still running after {timeout:g}s (--timeout); gave up on it") from None
        finally:
            session.close()
        result = RunResult(session.command, code, "".join(outs), "".join(errs))
        if code == 0:
            self._shell_runs = True
        elif not self._shell_runs:  # a first failure: the command's own, or a shell that runs none
            self._check_shell(result)
        return result

    def _check_shell(self, failed: RunResult) -> None:
        """After a failed command on a connection where none has succeeded yet: does the login's shell run commands
        at all? Asked only then, so a host whose commands succeed pays nothing for it."""
        self._shell_runs = True  # asked once, and not again by the probe's own run
        if self.run("exit 0").ok:
            return
        said = (failed.stdout.strip() or failed.stderr.strip()).splitlines()
        raise ShellRefused(f"{self.conn.user}@{self.conn.host}: the login shell of {self.conn.user} did not run the "
                           f"command" + (f" (it said: {said[0][:200]})" if said else "")
                           + f"; log in as a user whose shell runs commands, or give {self.conn.user} one")

    def stream(self, command: str, *, sudo: bool = False, stdin: bytes = b"", on_out: Callable[[str], None],
               on_err: Callable[[str], None], silence: float | None = None) -> int:
        """Run `command` on one exec channel: send `stdin` then EOF, hand stdout and stderr text to the
        callbacks as it arrives, return the exit status (see Session for what a lost host raises)."""
        session = self.session(command, sudo=sudo)
        try:
            session.send(stdin)
            return session.pump(on_out, on_err, silence)
        finally:
            session.close()

    def session(self, command: str, *, sudo: bool = False) -> Session:
        """Start `command` on a new exec channel and leave its stdin open: read part of what it prints,
        decide what to send it, then pump the rest (bootstrap's facts-then-bundle exec)."""
        if sudo and not self.is_root:
            command = "sudo -n -- bash -c " + _quote(command)
        transport = self.conn.transport
        what = f"connection lost while running {command[:60]!r}"
        if transport is None or not transport.is_active():
            raise ConnectionLost(what)
        try:
            chan = transport.open_session()
            chan.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionLost(f"{what}: {exc}") from None
        return Session(self, chan, what, command)

    def answers(self, timeout: float = 3.0) -> bool:
        """After a dropped connection: does the host still take a TCP connection (then it closed ours,
        and it is not gone)? Behind a ProxyJump gateway we cannot tell: yes."""
        if self.conn.gateway:
            return True
        try:
            socket.create_connection((self.conn.host, int(self.conn.port or 22)), timeout=timeout).close()
        except OSError:
            return False
        return True

    def wait_gone(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the host to drop this connection (a reboot); True when it did."""
        deadline = time.monotonic() + timeout
        transport = self.conn.transport
        while transport is not None and transport.is_active() and time.monotonic() < deadline:
            time.sleep(0.05)
        return transport is None or not transport.is_active()

    def put_bytes(self, data: bytes, remote_path: str) -> None:
        # a fresh file object per host: sharing one between threads corrupts uploads
        self.conn.put(io.BytesIO(data), remote=remote_path)


class Session:
    """One exec channel with its stdin still open. No output for `silence` seconds, or a connection that died
    (keepalives unanswered) to a host that takes no new one, is HostLost; any other dropped connection is
    ConnectionLost."""

    def __init__(self, remote: Remote, chan: paramiko.Channel, what: str, command: str = "") -> None:
        self.remote = remote
        self.chan = chan
        self.what = what
        self.command = command  # as the host's shell got it (sudo included)
        self._out = codecs.getincrementaldecoder("utf-8")("replace").decode
        self._err = codecs.getincrementaldecoder("utf-8")("replace").decode
        self._unread = ""  # stdout that came after what read_until waited for

    def send(self, data: bytes) -> None:
        """Send `data` on stdin, then EOF."""
        try:
            if data:
                self.chan.sendall(data)
            self.chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionLost(f"{self.what}: {exc}") from None

    def read_until(self, marker: str, on_err: Callable[[str], None], silence: float | None = None) -> str:
        """Stdout up to the first line that is `marker` (that line left out), while stderr goes to `on_err`.
        A command that ends first is a GpuprovError naming its exit status and last stderr line."""
        needle = f"\n{marker}\n"
        seen: list[str] = []
        window = ["\n", ""]  # the text just before the newest read (a marker cut in two), and "hit" once found
        tail = [""]

        def out(text: str) -> None:
            seen.append(text)
            probe = window[0] + text
            window[0] = probe[-len(needle):]
            if needle in probe:
                window[1] = "hit"

        def err(text: str) -> None:
            tail[0] = (tail[0] + text)[-2000:]
            on_err(text)

        code = self._pump(out, err, silence, until=lambda: bool(window[1]))
        text = "\n" + "".join(seen)
        if code is not None:
            last = [line for line in tail[0].splitlines() if line.strip()]
            raise Ended(code, last[-1][:300] if last else "", marker)
        before, _, after = text.partition(needle)
        self._unread = after
        return before[1:] + ("\n" if before[1:] else "")

    def pump(self, on_out: Callable[[str], None], on_err: Callable[[str], None], silence: float | None = None,
             deadline: float | None = None) -> int:
        """Hand stdout and stderr text to the callbacks as it arrives; the exit status. Past `deadline`
        (time.monotonic()), CommandTimeout."""
        code = self._pump(on_out, on_err, silence, until=None, deadline=deadline)
        assert code is not None  # without `until`, only the end of the command stops it
        return code

    def _pump(self, on_out: Callable[[str], None], on_err: Callable[[str], None], silence: float | None,
              until: Callable[[], bool] | None, deadline: float | None = None) -> int | None:
        """pump, stopping early (None) once `until()` holds after some output.

        Each read takes all that paramiko holds (up to 4 MiB): its buffer moves what is left to its front on
        every read, so small reads of a full window copied it over and over. Before stdout, the stderr that
        came in ahead of it is handed on: a step's last stderr lines belong before the runner's `end` event,
        which it prints on stdout after the step exits."""
        chan, transport = self.chan, self.remote.conn.transport
        if self._unread:
            text, self._unread = self._unread, ""
            on_out(text)
        heard = time.monotonic()
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise CommandTimeout(f"still running past its deadline: {self.what}")
            if chan.recv_ready():
                ahead = len(chan.in_stderr_buffer)
                if ahead:
                    on_err(self._err(chan.recv_stderr(ahead)))
                on_out(self._out(chan.recv(_READ)))
                if until is not None and until():
                    return None
            elif chan.recv_stderr_ready():
                on_err(self._err(chan.recv_stderr(_READ)))
            elif chan.exit_status_ready() and chan.exit_status != -1 and (chan.eof_received or chan.closed):
                # the end is the exit status *and* the end of the data: sshd reports the exit as the process
                # ends, and its last output (a verify probe, the runner's last events) may still follow it.
                # What came in since the checks above is buffered by now (EOF follows the data).
                while chan.recv_stderr_ready():
                    on_err(self._err(chan.recv_stderr(_READ)))
                while chan.recv_ready():
                    on_out(self._out(chan.recv(_READ)))
                return int(chan.exit_status)
            elif chan.closed or transport is None or not transport.is_active():
                if not self.remote.answers():  # closed without a status
                    interval, count = self.remote.keepalive
                    raise HostLost(f"the connection died and the host takes no new one (keepalive every "
                                   f"{interval:g}s, given up after {interval * count:g}s unanswered)")
                raise ConnectionLost(self.what)
            else:
                if silence is not None and time.monotonic() - heard > silence:
                    raise HostLost(f"no output for {silence:g}s (--step-silence): the host vanished or hangs")
                if chan.eof_received:
                    chan.status_event.wait(0.2)
                else:
                    select.select([chan], [], [], 0.5)
                continue
            heard = time.monotonic()

    def close(self) -> None:
        self.chan.close()


class Judged(Protocol):
    @property
    def ok(self) -> bool: ...


R = TypeVar("R", bound=Judged)


@dataclass
class HostOutcome(Generic[R]):
    """One host's result of a read-only command (check, doctor): a report, or why there is none."""

    target: Target
    report: R | None
    error: str | None = None
    unreachable: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.report is not None and self.report.ok


def on_host(target: Target, settings: HostSettings, work: Callable[[Remote], R]) -> HostOutcome[R]:
    """Open `target`, run `work`, close; every failure becomes this host's outcome, never an exception."""
    start = time.monotonic()
    remote = Remote(target, settings)
    try:
        remote.open()
        return HostOutcome(target, work(remote), seconds=time.monotonic() - start)
    except HostUnreachable as exc:
        return HostOutcome(target, None, str(exc), unreachable=True, seconds=time.monotonic() - start)
    except GpuprovError as exc:
        return HostOutcome(target, None, str(exc), seconds=time.monotonic() - start)
    finally:
        remote.close()


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
