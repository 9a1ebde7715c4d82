"""Host-side CPU of the SSH test hosts: what every login costs the host, children included.

Each host's sshd listener is moved into a cpuacct cgroup (v1) of its own; every process it forks afterwards (the
per-connection sshd, the session's shell, the runner, the step scripts and every command they start) inherits
it, and `cpuacct.usage` counts their CPU in nanoseconds, including processes that have already exited. The
bench's own look inside the hosts (`nsenter`: resets, the scripts' floor) starts outside sshd, so it is not
counted. Without a writable cpuacct hierarchy the listener's /proc/PID/stat is read instead: its utime + stime +
cutime + cstime, clock ticks (10 ms), counting a login once its sshd has exited and been reaped.

A reading is taken once every login of the hosts has ended (the listener has no child left), so a client that
exits before sshd has finished is not undercounted.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
TICK = os.sysconf("SC_CLK_TCK")


def listener_pid(host: Any) -> int:
    """The pid of a test host's sshd listener (its supervisor writes "up BOOTS PID" into ctl/state)."""
    state = (Path(host.base) / "ctl" / "state").read_text().split()
    if len(state) != 3 or state[0] != "up":
        raise RuntimeError(f"{host.name} is not up: {' '.join(state)!r}")
    return int(state[2])


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _stat_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid`, in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 (state) is fields[0]
    return sum(int(f) for f in fields[11:15]) / TICK


class HostCPU:
    """CPU seconds used on each host of `hosts` since `attach`, by everything its sshd runs."""

    def __init__(self, hosts: Sequence[Any], name: str) -> None:
        self.hosts = list(hosts)
        self.root = CPUACCT / name
        self.pids: list[int] = []
        self.mode = ""

    def attach(self) -> str:
        """Put every host's listener into its cgroup; returns the mode: "cgroup" or "stat"."""
        self.pids = [listener_pid(h) for h in self.hosts]
        try:
            self.root.mkdir(exist_ok=True)
            for host, pid in zip(self.hosts, self.pids, strict=True):
                group = self.root / host.name
                group.mkdir(exist_ok=True)
                (group / "cgroup.procs").write_text(str(pid))
            self.mode = "cgroup"
        except OSError:
            self.mode = "stat"
        return self.mode

    def settle(self, n: int, timeout: float = 10.0, only_new: bool = False) -> None:
        """Wait until the first n hosts' logins have all ended (no per-connection sshd left); with `only_new`,
        all but the oldest one (a connection held open on purpose)."""
        deadline = time.monotonic() + timeout
        while any(len(_children(pid)) > int(only_new) for pid in self.pids[:n]):
            if time.monotonic() > deadline:
                raise RuntimeError("SSH logins still open on the hosts after the client exited")
            time.sleep(0.02)

    def read(self, n: int, settle: bool = True) -> list[float]:
        """Seconds of CPU each of the first n hosts has used so far; first, with `settle`, every login ended
        (without: a connection left open on purpose; a session's shell is reaped before sshd sends its exit
        status, so a command that returned has been counted)."""
        if settle:
            self.settle(n)
        if self.mode == "cgroup":
            return [int((self.root / h.name / "cpuacct.usage").read_text()) / 1e9 for h in self.hosts[:n]]
        return [_stat_seconds(pid) for pid in self.pids[:n]]

    def detach(self) -> None:
        if self.mode != "cgroup":
            return
        for host in self.hosts:
            group = self.root / host.name
            for pid in (group / "cgroup.procs").read_text().split() if group.exists() else []:
                with contextlib.suppress(OSError):  # gone meanwhile
                    (CPUACCT / "cgroup.procs").write_text(pid)
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            self.root.rmdir()


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it."""
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(_children(found[-1]))
    return found


def processes_started(pid: int, run: Any) -> tuple[int, int]:
    """(processes started, programs executed) under `pid` (a host's sshd listener) while `run()` runs: `strace -f`
    on it and every process below it (an open connection's sshd forks that connection's sessions), each process
    counted once by its pid. strace slows every process it follows, so this is a pass of its own, apart from any
    timed or CPU-measured one."""
    out = Path(f"/tmp/gpuprov-strace-{os.getpid()}.txt")
    traced = _tree(pid)
    argv = ["strace", "-f", "-qq", "-e", "trace=execve,exit_group", "-e", "signal=none", "-o", str(out)]
    for p in traced:
        argv += ["-p", str(p)]
    tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # strace attached
        run()
        time.sleep(0.5)
    finally:
        tracer.terminate()
        tracer.wait(10)
    lines = out.read_text(errors="replace").splitlines()
    out.unlink(missing_ok=True)
    pids = {int(m[1]) for line in lines if (m := re.match(r"(\d+)\s", line))} - set(traced)
    execs = sum(1 for line in lines if "execve(" in line) - sum(1 for line in lines if "execve" in line and "= -1" in line)
    return len(pids), execs
