"""`gpuprov` processes for the tests without paying its imports each time: a fork server.

Every CLI test starts a real `python -m gpuprov` process, and about 0.9 s of CPU of each went on importing
click, rich, pydantic, boto3, paramiko and gpuprov itself before the command did anything: on CI's two
cores that was half of the suite's time. One server per test worker imports all of that once and forks
a child for each command. The child is still a separate process with its own pid, argv, environment,
working directory and standard streams, which receives signals and exits with its own status, and the
`Popen` that the test holds waits for it and kills it as for any other process; only the imports were done
before the fork. What a fresh interpreter decides at start-up (what `--help` imports, the exit without
teardown) is tested with plain subprocesses, which this module leaves alone.

`run` and `Popen` take the same arguments as `subprocess`'s; a command that is not
`[sys.executable, "-m", "gpuprov", ...]` is run as usual. GPUPROV_TEST_FORK=0 turns the server off.

The server is single-threaded (a fork copies only the calling thread), reaps its children on SIGCHLD and
writes each child's wait status to a pipe the test's `Popen` holds, which it reads where `subprocess` would
call waitpid (the child is the server's, not the test's).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import Any

_PREFIX = [sys.executable, "-m", "gpuprov"]
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STATUS = struct.Struct("i")


def enabled() -> bool:
    return os.environ.get("GPUPROV_TEST_FORK", "1") != "0"


def warm() -> None:
    """Start this process's server now, so that a test timing a command does not time the server's start."""
    if enabled():
        _Server.get()


def shell_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a shell whose `gpuprov` should come from the server: its client first on PATH."""
    if not enabled():
        return env
    server = _Server.get()
    return {**env, "PATH": f"{server.bin}:{env.get('PATH', '')}", "GPUPROV_TEST_FORK_SOCKET": server.listen_path}


# --- the test's side -----------------------------------------------------------------------------------

class _Server:
    """The fork server of this test process, started at its first use and gone with the process."""

    _lock = threading.Lock()
    _one: _Server | None = None

    def __init__(self) -> None:
        import atexit
        import shutil
        import tempfile

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = mine
        self.dir = tempfile.mkdtemp(prefix="gpuprov-fork-")
        atexit.register(shutil.rmtree, self.dir, True)
        self.listen_path = os.path.join(self.dir, "socket")
        self.bin = os.path.join(self.dir, "bin")
        os.mkdir(self.bin)
        script = os.path.join(self.bin, "gpuprov")
        with open(script, "w") as out:  # no site: the client needs the standard library only
            out.write(f"#!{sys.executable} -S\nimport sys\nsys.path.insert(0, {_ROOT!r})\n"
                      "from tests.forkcli import client\nclient()\n")
        os.chmod(script, 0o755)
        self.proc = subprocess.Popen([sys.executable, "-c", "import sys, tests.forkcli as f; "
                                      f"f.serve({theirs.fileno()}, sys.argv[1])", self.listen_path],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, cwd=_ROOT)
        theirs.close()
        ready = self.sock.recv(16)
        if ready != b"ready":
            raise RuntimeError(f"the gpuprov fork server did not start (got {ready!r})")

    @classmethod
    def get(cls) -> _Server:
        with cls._lock:
            if cls._one is None or cls._one.proc.poll() is not None:
                cls._one = cls()
            return cls._one

    def spawn(self, request: dict[str, Any], fds: list[int]) -> int:
        with self._lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            answer = self.sock.recv(64)
        if not answer.startswith(b"pid "):
            raise OSError(f"the gpuprov fork server refused: {answer.decode(errors='replace')}")
        return int(answer[4:])


class Popen(subprocess.Popen):  # type: ignore[type-arg]
    """subprocess.Popen, with `python -m gpuprov ...` forked from the server instead of executed."""

    _status_fd = -1

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,  # type: ignore[no-untyped-def]
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                       errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, process_group):
        words = [os.fspath(a) for a in args] if not isinstance(args, (str, bytes)) else []
        if (not enabled() or shell or words[:3] != _PREFIX or executable or preexec_fn or pass_fds
                or uid is not None or gid is not None or gids or umask != -1):
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                                          startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
                                          c2pwrite, errread, errwrite, restore_signals, gid, gids, uid,
                                          umask, start_new_session, process_group)
        status_read, status_write = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY) if p2cread == -1 else -1
        streams = [p2cread if p2cread != -1 else devnull, c2pwrite if c2pwrite != -1 else 1,
                   errwrite if errwrite != -1 else 2]
        request = {"argv": words[3:], "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                   "env": {os.fsdecode(k): os.fsdecode(v) for k, v in (env if env is not None else os.environ).items()},
                   "new_session": bool(start_new_session),
                   "process_group": process_group if process_group is not None else -1}
        try:
            self.pid = _Server.get().spawn(request, [*streams, status_write])
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
            if devnull != -1:
                os.close(devnull)
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self._child_created = True
        self._status_fd = status_read

    def _read_status(self, block: bool) -> tuple[int, int]:
        if not block and not select.select([self._status_fd], [], [], 0)[0]:
            return 0, 0
        data = b""
        while len(data) < _STATUS.size:
            part = os.read(self._status_fd, _STATUS.size - len(data))
            if not part:  # the server died before it could say: as good as killed
                return self.pid, signal.SIGKILL
            data += part
        os.close(self._status_fd)
        self._status_fd = -1
        return self.pid, _STATUS.unpack(data)[0]

    def _try_wait(self, wait_flags):  # type: ignore[no-untyped-def]
        if self._status_fd == -1:
            return super()._try_wait(wait_flags)
        return self._read_status(block=not wait_flags & os.WNOHANG)

    def _internal_poll(self, _deadstate=None, **_kw):  # type: ignore[no-untyped-def]
        if self._status_fd == -1 or self.returncode is not None:
            return super()._internal_poll(_deadstate)
        if not self._waitpid_lock.acquire(False):
            return None
        try:
            if self.returncode is None:
                pid, sts = self._read_status(block=False)
                if pid == self.pid:
                    self._handle_exitstatus(sts)
        finally:
            self._waitpid_lock.release()
        return self.returncode


def run(*popenargs: Any, input: Any = None, capture_output: bool = False, timeout: float | None = None,
        check: bool = False, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """subprocess.run, through this module's Popen (the same steps as the standard library's)."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = subprocess.PIPE
        kwargs["stderr"] = subprocess.PIPE
    with Popen(*popenargs, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        except BaseException:
            process.kill()
            raise
        retcode = process.poll()
        if check and retcode:
            raise subprocess.CalledProcessError(retcode, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, retcode, stdout, stderr)


# --- the server's side ---------------------------------------------------------------------------------

# gpuprov's own reads of the environment while its modules are imported, allowed because the child sees the
# same: the CLI sets this variable for pydantic, which has read it by then in the server as in a fresh process
IMPORT_TIME_READS_ALLOWED = {("gpuprov.cli", "PYDANTIC_DISABLE_PLUGINS")}
# modules that read the environment on their caller's behalf (collections.abc is _collections_abc's __name__)
_READ_FOR_THE_CALLER = {"os", "_collections_abc", "collections", "posixpath", "genericpath", "pathlib", "platformdirs"}


def import_gpuprov() -> list[tuple[str, str]]:
    """Import every gpuprov module; return each (module, variable) its import read from the environment.
    A value read at import would be the server's in every child (whose environment is the test's), so a
    test that sets the variable would not reach the command: GPUPROV_TEST_SETTLE_SECONDS read at import once made
    every forked `down` after a lost launch wait EC2's three minutes instead of the test's fifteen seconds."""
    import pkgutil

    reads: list[tuple[str, str]] = []
    getitem = os._Environ.__getitem__

    def recorded(self: Any, key: Any) -> Any:
        frame = sys._getframe(1)
        while frame is not None and str(frame.f_globals.get("__name__")).partition(".")[0] in _READ_FOR_THE_CALLER:
            frame = frame.f_back  # os.getenv, Mapping.get, Path.home, platformdirs: the reader is their caller
        name = frame.f_globals.get("__name__", "") if frame is not None else ""
        if self is os.environ and (name == "gpuprov" or name.startswith("gpuprov.")):
            reads.append((name, os.fsdecode(key)))  # gpuprov's own read (a library's, say click's, is not)
        return getitem(self, key)

    os._Environ.__getitem__ = recorded  # type: ignore[method-assign]
    try:
        import gpuprov
        import gpuprov.cli
        for mod in pkgutil.walk_packages(gpuprov.__path__, "gpuprov."):
            if mod.name != "gpuprov.__main__":  # which would run the CLI
                __import__(mod.name)
    finally:
        os._Environ.__getitem__ = getitem  # type: ignore[method-assign]
    return reads


def _preload() -> None:
    """What a command may import, imported once here; nothing is called (no session, no client), so
    every child starts from the state a fresh interpreter would reach by importing."""
    frozen = sorted(set(import_gpuprov()) - IMPORT_TIME_READS_ALLOWED)
    if frozen:  # each child would see the server's value: refuse to serve rather than run tests on it
        raise RuntimeError("gpuprov reads the environment at import, which a forked command would not see: "
                           + ", ".join(f"{var} in {mod}" for mod, var in frozen))
    import boto3
    import botocore.loaders
    import fabric  # noqa: F401

    # botocore parses its JSON service models (EC2's alone is ~0.15 s) in every process that makes a client;
    # the parse is kept here by path, so a child reads the same bytes' result without parsing them again.
    # botocore already shares one parsed model between the clients of a process, so it never mutates them.
    parsed: dict[str, Any] = {}
    load_file = botocore.loaders.JSONFileLoader.load_file

    def cached(self: Any, file_path: str) -> Any:
        if file_path not in parsed:
            parsed[file_path] = load_file(self, file_path)
        return parsed[file_path]

    botocore.loaders.JSONFileLoader.load_file = cached  # type: ignore[method-assign]
    warm = boto3.session.Session(aws_access_key_id="warm", aws_secret_access_key="warm", region_name="us-east-1")
    for service in ("ec2", "s3", "iam", "ssm", "service-quotas"):
        warm.client(service, endpoint_url="http://127.0.0.1:9")  # parses; connects nowhere


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become `python -m gpuprov ARGV` as exec would have made it."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if request["new_session"]:
            os.setsid()
        elif request["process_group"] >= 0:
            os.setpgid(0, request["process_group"])
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        os.closerange(3, 65536)  # the server's socket and pipes, the other children's status pipes
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import io
        encoding = os.environ.get("PYTHONIOENCODING", "utf-8").split(":")[0] or "utf-8"
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=encoding)
        for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
            raw = io.FileIO(fd, "w", closefd=False)
            stream = io.TextIOWrapper(io.BufferedWriter(raw), encoding=encoding, errors=errors,
                                      line_buffering=fd == 2 or os.isatty(fd), write_through=fd == 2)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has it
        sys.argv = [os.path.join(os.path.dirname(sys.modules["gpuprov"].__file__ or ""), "__main__.py"),
                    *request["argv"]]  # what `-m` makes argv[0]
    except BaseException as exc:
        os.write(2, f"gpuprov fork server: the child could not start: {exc!r}\n".encode())
        os._exit(code)
    try:
        from gpuprov.cli import run as gpuprov_run
        gpuprov_run()  # leaves with os._exit
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def serve(sock_fd: int, listen_path: str) -> None:
    """The server: preload, then fork one child per request until the test process goes. Requests come on
    the test process's socket, and from `gpuprov` run by a shell (`client`) on `listen_path`."""
    _preload()
    first = socket.socket(fileno=sock_fd)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(listen_path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the children; the server stays
    status_fds: dict[int, int] = {}
    conns = [first]
    first.send(b"ready")
    while True:
        readable = select.select([*conns, listener, wake_read], [], [])[0]
        if wake_read in readable:
            os.read(wake_read, 4096)
        _reap(status_fds)
        if listener in readable:
            conns.append(listener.accept()[0])
        for conn in conns:
            if conn in readable and not _answer(conn, status_fds):
                if conn is first:
                    return  # the test process is gone; its children carry on as orphans
                conns.remove(conn)
                conn.close()


def _reap(status_fds: dict[int, int]) -> None:
    while status_fds:
        try:
            pid, sts = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status_fds.pop(pid, -1)
        if fd != -1:
            with contextlib.suppress(OSError):  # the test gave up on it
                os.write(fd, _STATUS.pack(sts))
            os.close(fd)


def _answer(conn: socket.socket, status_fds: dict[int, int]) -> bool:
    """One request: fork its child and say its pid. False when the other side has gone."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 8)
    except InterruptedError:
        return True
    except OSError:
        return False
    if not data:
        return False
    try:
        request = json.loads(data)
        pid = os.fork()
    except Exception as exc:
        conn.send(f"error {exc}".encode())
        for fd in fds:
            os.close(fd)
        return True
    if pid == 0:
        _child(request, fds)
    for fd in fds[:3]:
        os.close(fd)
    status_fds[pid] = fds[3]
    with contextlib.suppress(OSError):
        conn.send(f"pid {pid}".encode())
    return True


def client() -> None:
    """`gpuprov` for a shell (the README's examples): this process's streams, argv, environment and
    directory to a child of the server, its signals passed on, its exit status as this process's."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(os.environ["GPUPROV_TEST_FORK_SOCKET"])
    status_read, status_write = os.pipe()
    request = {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ), "new_session": False,
               "process_group": -1}
    socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2, status_write])
    os.close(status_write)
    answer = sock.recv(64)
    if not answer.startswith(b"pid "):
        sys.exit(f"gpuprov fork server: {answer.decode(errors='replace')}")
    pid = int(answer[4:])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, lambda sig, _frame: os.kill(pid, sig))
    data = b""
    while len(data) < _STATUS.size:
        part = os.read(status_read, _STATUS.size - len(data))
        if not part:
            os._exit(137)
        data += part
    code = os.waitstatus_to_exitcode(_STATUS.unpack(data)[0])
    if code < 0:  # killed by a signal: so is this process, as the shell would see the real one
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)
