"""`gpuprov torchrun NAME -- SCRIPT ARGS`: one torchrun per node, wired from the cluster's record.

Each node runs `torchrun --nnodes N --nproc-per-node G --node-rank K --master-addr A --master-port P
SCRIPT ARGS` (torchrun's static rendezvous: node 0's agent hosts the c10d store on A:P; see
docs.pytorch.org/docs/stable/elastic/run.html) with its cluster.env exported, from the playbook's
env (`ENV/bin/torchrun`, else torchrun on PATH). Output comes back line by line, prefixed by node.

Stopping: every node's command runs on a pseudo-terminal. Ctrl-C here sends ^C down every channel
(the terminal driver turns it into SIGINT for torchrun and its workers, as a local Ctrl-C would),
and a node that is still running after `grace` seconds has its channel closed, which hangs up its
terminal: SIGHUP to the whole foreground process group. When one node fails, the others are
stopped the same way, instead of hanging in a collective until NCCL's timeout.
"""

from __future__ import annotations

import codecs
import contextlib
import select
import shlex
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpuprov.cluster import Cluster, env_command
from gpuprov.errors import GpuprovError
from gpuprov.hosts.access import UNREACHABLE, Emit, ExecResult, LineSink
from gpuprov.hosts.remote import HostSettings, Remote
from gpuprov.plan.inventory import Target
from gpuprov.plan.render import host_path

INTERRUPTED = 130  # a shell's code for a command stopped by SIGINT


def torchrun_flags(cluster: Cluster, rank: int, nproc_per_node: int | None = None) -> list[str]:
    """The rendezvous flags node `rank` gets (static rendezvous, from the cluster's record)."""
    return ["--nnodes", str(cluster.nnodes), "--nproc-per-node", str(nproc_per_node or cluster.nproc_per_node()),
            "--node-rank", str(rank), "--master-addr", cluster.master_addr, "--master-port", str(cluster.master_port)]


def torchrun_command(cluster: Cluster, rank: int, script_args: Sequence[str], env_path: str,
                     nproc_per_node: int | None = None, *, replace_shell: bool = True, script_word: str = "") -> str:
    """The remote shell command for node `rank`: cluster.env exported, then the env's torchrun (in place of
    the shell, so the terminal's signals reach it; `replace_shell=False` keeps the shell for an EXIT trap).
    `script_word`: a shell word put before `script_args` as it is (`"$probe"`, a path made on the node)."""
    env_bin = host_path(env_path.rstrip("/") + "/bin/torchrun")
    argv = " ".join(w for w in (shlex.join(torchrun_flags(cluster, rank, nproc_per_node)), script_word,
                                shlex.join(script_args)) if w)
    run = "exec " if replace_shell else ""
    return env_command(f"if [ -x {env_bin} ]; then {run}{env_bin} {argv}; else {run}torchrun {argv}; fi")


@dataclass
class _Node:
    target: Target
    command: str
    result: ExecResult | None = None


def run_on_nodes(targets: Sequence[Target], commands: Sequence[str], settings: HostSettings, emit: Emit,
                 stop: threading.Event, *, grace: float = 10.0, stop_on_failure: bool = True) -> list[ExecResult]:
    """Run commands[i] on targets[i], all at once, each on a pty; returns when every node is done.

    `stop` set (Ctrl-C, or a node failing with stop_on_failure): ^C to every node, then the channel
    closed after `grace` seconds."""
    nodes = [_Node(t, c) for t, c in zip(targets, commands, strict=True)]
    threads = [threading.Thread(target=_run_node, args=(n, settings, emit, stop, grace, stop_on_failure), daemon=True)
               for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)  # a short join keeps the main thread able to take Ctrl-C
    return [n.result or ExecResult(n.target, UNREACHABLE, "no result") for n in nodes]


def _run_node(node: _Node, settings: HostSettings, emit: Emit, stop: threading.Event, grace: float,
              stop_on_failure: bool) -> None:
    start = time.monotonic()
    remote = Remote(node.target, settings)
    sink = LineSink(lambda line: emit(node.target, "out", line))
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode  # a character may be cut between two reads
    try:
        remote.open()
        transport = remote.conn.transport
        if transport is None:
            raise GpuprovError("the SSH connection closed")
        channel = transport.open_session()
        channel.get_pty(term="dumb", width=200, height=50)
        channel.exec_command(node.command)
        interrupted_at: float | None = None
        while True:
            if stop.is_set() and interrupted_at is None:
                interrupted_at = time.monotonic()
                if not channel.exit_status_ready():
                    with contextlib.suppress(OSError, EOFError):  # it may end on its own meanwhile
                        channel.send(b"\x03")
            if interrupted_at is not None and time.monotonic() - interrupted_at > grace:
                channel.close()  # hangs up the node's terminal: SIGHUP to what is left
                node.result = ExecResult(node.target, INTERRUPTED, "stopped", time.monotonic() - start)
                return
            readable = select.select([channel], [], [], 0.2)[0]
            if readable or channel.recv_ready():
                data = channel.recv(65536)
                if data:
                    sink.write(decode(data))
                    continue
            if channel.exit_status_ready() and not channel.recv_ready():
                break
        code = channel.recv_exit_status()
        if interrupted_at is not None and code == -1:
            code = INTERRUPTED
        node.result = ExecResult(node.target, code, seconds=time.monotonic() - start)
    except (GpuprovError, OSError, EOFError) as exc:
        node.result = ExecResult(node.target, UNREACHABLE, str(exc), time.monotonic() - start)
    except Exception as exc:  # paramiko's own errors: this node's result, never the others'
        node.result = ExecResult(node.target, UNREACHABLE, f"{type(exc).__name__}: {exc}", time.monotonic() - start)
    finally:
        sink.close()
        remote.close()
        if stop_on_failure and node.result is not None and node.result.exit_code != 0:
            stop.set()
