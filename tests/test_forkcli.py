"""The fork server (`tests/forkcli.py`) must give a test what a fresh `python -m gpuprov` would: its own
pid, argv, environment, directory and streams, signals that reach it, its exit status, and a timeout that
kills it. If it did not, every CLI test would be testing something other than the command a user runs."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import forkcli

GP = [sys.executable, "-m", "gpuprov"]
pytestmark = pytest.mark.skipif(not forkcli.enabled(), reason="GPUPROV_TEST_FORK=0: plain subprocesses")


def both(args: list[str], **kw: object) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    forked = forkcli.run([*GP, *args], capture_output=True, text=True, **kw)  # type: ignore[arg-type]
    fresh = subprocess.run([*GP, *args], capture_output=True, text=True, **kw)  # type: ignore[arg-type,call-overload]
    return forked, fresh


def test_a_forked_command_prints_and_exits_as_a_fresh_one(tmp_path: Path) -> None:
    env = {**os.environ, "GPUPROV_HOME": str(tmp_path / "home"), "COLUMNS": "80", "NO_COLOR": "1"}
    codes = []
    for args in (["status"], ["plan", "--gpu", "nope"], ["ttl", "--help"]):
        forked, fresh = both(args, env=env, cwd=tmp_path)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
        codes.append(forked.returncode)
    assert codes == [0, 2, 0]


def test_no_gpuprov_module_reads_the_environment_at_import() -> None:
    """A value read at import is the server's in every forked child: the test's variable never reaches the
    command (GPUPROV_TEST_SETTLE_SECONDS once did that, and each forked `down` after a lost launch waited three
    minutes). The server refuses to start on such a read; this names it on its own."""
    code = "import json, tests.forkcli as f; print(json.dumps(sorted(set(f.import_gpuprov()))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1],
                         env={**os.environ, "GPUPROV_TEST_SETTLE_SECONDS": "7", "GPUPROV_HOME": "/nonexistent"}).stdout
    reads = {(mod, var) for mod, var in json.loads(out)}
    assert reads <= forkcli.IMPORT_TIME_READS_ALLOWED, reads - forkcli.IMPORT_TIME_READS_ALLOWED


def test_the_child_gets_its_own_environment_directory_and_stdin(tmp_path: Path) -> None:
    (tmp_path / "pb.yml").write_text("name: mine\nstack: none\nsteps: [\n")  # a broken playbook, found by cwd
    env = {**os.environ, "GPUPROV_HOME": str(tmp_path / "h"), "NO_COLOR": "1"}
    forked = forkcli.run([*GP, "plan", "--gpu", "T4", "-p", "pb.yml"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, input="")
    assert forked.returncode == 2 and "pb.yml" in forked.stderr
    assert not (Path.cwd() / "pb.yml").exists()
    # an environment variable only the child has decides where it keeps its state
    said = forkcli.run([*GP, "status"], env=env, capture_output=True, text=True, check=True)
    assert str(tmp_path / "h") in said.stdout + said.stderr  # "no nodes" names the state it read


@pytest.fixture
def waits(tmp_path: Path) -> Iterator[list[str]]:
    """An `exec` that waits: its SSH server accepts the connection and never says a word (for 60 s)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        yield ["exec", f"root@127.0.0.1:{silent.getsockname()[1]}", "-i", str(tmp_path / "k"),
               "--connect-timeout", "60", "--", "true"]


def wait_for_connection(waits: list[str], pid: int | None, timeout: float = 60) -> None:
    """Until a gpuprov process (`pid`, or any, for a shell's) holds a TCP connection to the silent server."""
    port = waits[1].rsplit(":", 1)[1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ss = subprocess.run(["ss", "-tnpH", "state", "established", "dport", f"= :{port}"], capture_output=True,
                            text=True).stdout
        if any("python" in line and (pid is None or f"pid={pid}," in line) for line in ss.splitlines()):
            return
        time.sleep(0.05)
    raise AssertionError("the command never connected")


def test_signals_reach_the_child_and_a_timeout_kills_it(tmp_path: Path, waits: list[str]) -> None:
    env = {**os.environ, "GPUPROV_HOME": str(tmp_path / "h")}
    codes = []
    for popen in (forkcli.Popen, subprocess.Popen):
        proc = popen([*GP, *waits], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_connection(waits, proc.pid)  # a signal before its handlers are set would kill it outright
        proc.send_signal(signal.SIGTERM)
        codes.append((proc.wait(20), proc.communicate()[1]))
    assert codes[0] == codes[1] and "SIGTERM" in codes[0][1]  # the same exit and the same last words
    proc = forkcli.Popen([*GP, *waits], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.kill()
    assert proc.wait(20) == -signal.SIGKILL and proc.poll() == -signal.SIGKILL
    with pytest.raises(subprocess.TimeoutExpired):
        forkcli.run([*GP, *waits], env=env, timeout=0.5, capture_output=True)


def test_a_shell_runs_the_servers_gpuprov_with_its_exit_status_and_ctrl_c(tmp_path: Path, waits: list[str]) -> None:
    env = forkcli.shell_env({**os.environ, "GPUPROV_HOME": str(tmp_path / "h"), "NO_COLOR": "1"})
    out = subprocess.run(["bash", "-c", "command -v gpuprov; gpuprov plan --gpu nope; echo rc=$?"],
                         capture_output=True, text=True, env=env)
    assert out.stdout.splitlines()[0].startswith(forkcli._Server.get().bin)
    assert "rc=2" in out.stdout and "unknown GPU 'nope'" in out.stderr
    proc = subprocess.Popen(["bash", "-c", f"gpuprov {shlex.join(waits)}; echo after=$?"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    wait_for_connection(waits, None)
    os.killpg(proc.pid, signal.SIGINT)
    said = proc.communicate(timeout=20)[0]
    assert "after=130" in said and "interrupted" in said, said
