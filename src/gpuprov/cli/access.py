"""Living on a node: ssh, exec, tunnel, jupyter, sync, monitor."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import click

from gpuprov.cli.common import (
    CONNECT_TIMEOUT,
    PARALLEL,
    F,
    apply_options,
    host_settings,
    main,
    make_console,
    targets_from,
    warn,
)
from gpuprov.cli.complete import complete_node
from gpuprov.cli.params import Command, Number
from gpuprov.errors import GpuprovError

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpuprov.cli.option_sets import ReachOptions
    from gpuprov.hosts.access import ForwardSpec, GpuSample
    from gpuprov.hosts.remote import HostSettings, Remote
    from gpuprov.hosts.sshcli import S3Sync
    from gpuprov.plan.inventory import Target

# --- access: ssh, exec, tunnel, jupyter, sync, monitor ----------------------------------------


class _DashDashCommand(Command):
    """A command whose words after `--` are a remote command, kept out of click's parsing
    (in ctx.meta["gpuprov.argv"])."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["gpuprov.argv"] = list(args[cut + 1:])
            args = args[:cut]
        else:
            ctx.meta["gpuprov.argv"] = []
        return super().parse_args(ctx, args)


def _reach_options(accept_new: bool) -> Callable[[F], F]:
    """How to reach one or more hosts (the access commands)."""
    opts: list[Callable[[F], F]] = [
        click.option("-i", "--identity", default=None, envvar="GPUPROV_KEY", show_envvar=True,
                     help="Private key file (else the node's, ~/.ssh/config, ssh's defaults)."),
        click.option("--ssh-config", default=None, type=click.Path(exists=True, dir_okay=False),
                     help="ssh config file [~/.ssh/config]."),
        click.option("--connect-timeout", type=CONNECT_TIMEOUT, default=10.0, show_default=True,
                     help="Seconds to wait for SSH (0 < s ≤ 3600)."),
    ]
    if accept_new:
        opts.append(click.option("--accept-new-host-key", is_flag=True,
                                 help="Trust and pin the key of a host seen for the first time; a changed key is refused."))
    return lambda func: apply_options(func, opts)


def _reach(hosts: tuple[str, ...], inventory: str | None, kw: ReachOptions) -> tuple[list[Target], HostSettings]:
    return targets_from(hosts, inventory, kw["ssh_config"]), host_settings(kw)


def _one(host: str, kw: ReachOptions) -> tuple[Target, HostSettings]:
    from gpuprov.cluster import resolve

    named = resolve(host)
    if named is not None and named.rank is None:
        host = f"{host}:0"  # a cluster by name: its node 0, the rendezvous master
    targets, settings = _reach((host,), None, kw)
    return targets[0], settings


def _warn_unpinned(target: Target, settings: HostSettings) -> None:
    from gpuprov.hosts import sshcli
    from gpuprov.hosts.hostkeys import awaits_first_key

    if target.known_hosts and awaits_first_key(sshcli.known_hosts_for(target, settings)):
        return  # a node just launched: ssh pins its first key (sshcli.ssh_options)
    # only for a host that answers: for a closed port or a dead address ssh's own words say what is wrong
    if sshcli.is_pinned(target, settings) is False and sshcli.answers(target, settings):
        warn(sshcli.pin_hint(target, sshcli.known_hosts_for(target, settings)), "yellow")


def _need_tool(name: str, package: str) -> None:
    import shutil

    if shutil.which(name) is None:
        raise GpuprovError(f"no `{name}` on PATH; install {package}")


@main.command("ssh", cls=_DashDashCommand)
@click.argument("host", metavar="NODE|[USER@]HOST[:PORT] [-- CMD...]", shell_complete=complete_node)
@_reach_options(accept_new=False)
def ssh_cmd(host: str, **kw: Unpack[ReachOptions]) -> None:
    """A shell on a node or host through the system ssh, its host key pinned (`-- CMD` runs CMD).

    Keys are checked against the node's (or gpuprov's) known_hosts with StrictHostKeyChecking=yes;
    pin a new host once with `gpuprov exec --accept-new-host-key HOST -- true`.
    """
    import os

    from gpuprov.hosts import sshcli

    _need_tool("ssh", "the OpenSSH client (openssh-client)")
    target, settings = _one(host, kw)
    _warn_unpinned(target, settings)
    argv = sshcli.ssh_argv(target, settings, click.get_current_context().meta["gpuprov.argv"])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)


@main.command("exec", cls=_DashDashCommand)
@click.argument("hosts", nargs=-1, metavar="NODE|[USER@]HOST[:PORT]... -- CMD...", shell_complete=complete_node)
@click.option("--inventory", default=None, help="YAML inventory of hosts (user, port, key, proxy_jump).")
@_reach_options(accept_new=True)
@click.option("--parallel", type=PARALLEL, default=32, show_default=True, envvar="GPUPROV_PARALLEL",
              show_envvar=True, help="Hosts worked on at once (1 to 1024).")
@click.option("--sudo", is_flag=True, help="Run the command as root (sudo -n) where the login user is not root.")
@click.option("--timeout", type=Number(0, 604_800, low_open=True), default=None,
              help="Seconds before the command is given up on each host (at most 604_800, a week).")
@click.option("--no-prefix", is_flag=True, help="Print the hosts' lines as they are, without `HOST | `.")
def exec_cmd(hosts: tuple[str, ...], inventory: str | None, parallel: int, sudo: bool, timeout: float | None,
             no_prefix: bool, **kw: Unpack[ReachOptions]) -> None:
    """Run a command on one or many hosts at once, streaming each line prefixed by its host.

    Like ssh, the words after -- are joined by spaces for the remote shell. Exit code: the host's
    own for one host; for several, 0 when all succeeded, else the first failure's; 255 when a
    host cannot be reached (or its key is not pinned); 124 when the command ran past --timeout.
    """
    import threading

    from gpuprov.hosts import access

    words = click.get_current_context().meta["gpuprov.argv"]
    if not words:
        raise click.UsageError("give the command after --, e.g. gpuprov exec node-a node-b -- nvidia-smi -L")
    targets, settings = _reach(hosts, inventory, kw)
    width = max(len(t.name) for t in targets)
    lock = threading.Lock()
    pending: dict[bool, list[str]] = {False: [], True: []}  # stdout's and stderr's lines not yet printed

    def emit(target: Target, stream: str, line: str) -> None:
        text = line if no_prefix else f"{target.name:<{width}} | {line}"
        with lock:
            pending[stream == "err"].append(text)

    def flush() -> None:  # once per read: one click.echo per line was most of exec's time on a chatty host
        with lock:
            for err, lines in pending.items():
                if lines:
                    click.echo("\n".join(lines), err=err)
                    lines.clear()

    command = " ".join(words)
    results = access.exec_many(targets, settings, _with_cluster_env(hosts, command), emit, parallel=parallel, sudo=sudo,
                               timeout=timeout, flush=flush)
    flush()
    for r in results:
        if r.error:
            warn(f"{r.target.name:<{width}} | error: {r.error}", "red")
    if len(results) > 1:
        failed = [r for r in results if r.exit_code != 0]
        codes = ", ".join(f"{r.target.name}: exit {r.exit_code}" for r in failed)
        click.echo(f"{len(results) - len(failed)}/{len(results)} hosts ok" + (f"; {codes}" if codes else ""), err=True)
    sys.exit(access.combined_exit_code(results))


def _with_cluster_env(hosts: tuple[str, ...], command: str) -> Callable[[Target], str]:
    """The command per host: a cluster's nodes (named as NAME or NAME:K) run it with their cluster.env exported."""
    from gpuprov.cluster import env_command, resolve

    members = {t.label for h in hosts if (named := resolve(h)) is not None for t in named.targets()}
    return lambda target: env_command(command) if target.label in members else command


def _forward_until_stopped(remote: Remote, spec: ForwardSpec, announce: Callable[[int], str]) -> None:
    """Forward until Ctrl-C or SIGTERM (exit 0), or until the SSH connection drops (exit 255)."""
    import signal
    import time

    from gpuprov.hosts import access

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    forward = access.LocalForward(remote, spec, on_error=lambda text: warn(f"warning: {text}", "yellow"))
    port = forward.start()
    click.echo(announce(port))
    click.echo(f"forwarding 127.0.0.1:{port} -> {spec.remote_host}:{spec.remote_port} on {remote.target.name}; "
               "Ctrl-C to stop", err=True)
    try:
        while forward.alive:
            time.sleep(0.5)
        warn(f"error: the SSH connection to {remote.target.name} was lost", "red")
        code = 255
    except KeyboardInterrupt:
        code = 0
    finally:
        forward.stop()
        remote.close()
    sys.exit(code)


def _open(target: Target, settings: HostSettings) -> Remote:
    from gpuprov.hosts.remote import Remote

    remote = Remote(target, settings)
    remote.open()
    return remote


@main.command()
@click.argument("host", metavar="NODE|[USER@]HOST[:PORT]", shell_complete=complete_node)
@click.argument("ports", metavar="LOCAL[:REMOTE]")
@_reach_options(accept_new=True)
def tunnel(host: str, ports: str, **kw: Unpack[ReachOptions]) -> None:
    """Forward a local port to a port on the host (SSH local forwarding) until Ctrl-C.

    LOCAL:REMOTE forwards 127.0.0.1:LOCAL to the host's 127.0.0.1:REMOTE (one port: the same on both sides; a
    LOCAL of 0: any free port). Listens on 127.0.0.1 only; prints the local URL.
    """
    from gpuprov.hosts import access

    spec = access.parse_forward(ports)
    target, settings = _one(host, kw)
    _forward_until_stopped(_open(target, settings), spec, lambda port: f"http://127.0.0.1:{port}/")


@main.command()
@click.argument("host", metavar="NODE|[USER@]HOST[:PORT]", shell_complete=complete_node)
@click.option("--port", type=Number(0, 65535, whole=True), default=8888, show_default=True,
              help="Local port (0: any free one).")
@click.option("--remote-port", type=Number(1, 65535, whole=True), default=8888, show_default=True,
              help="JupyterLab's port on the host.")
@_reach_options(accept_new=True)
def jupyter(host: str, port: int, remote_port: int, **kw: Unpack[ReachOptions]) -> None:
    """Open a node's JupyterLab through an SSH tunnel and print its URL with the token.

    For hosts set up with a `jupyter: true` playbook (e.g. bootstrap -p jupyter): reads the token
    over SSH, forwards 127.0.0.1:PORT to it, prints http://127.0.0.1:PORT/lab?token=... and keeps
    the tunnel open until Ctrl-C."""
    from gpuprov.hosts import access

    target, settings = _one(host, kw)
    remote = _open(target, settings)
    try:
        token = access.read_jupyter_token(remote)
    except BaseException:
        remote.close()
        raise
    spec = access.ForwardSpec(port, "127.0.0.1", remote_port)
    _forward_until_stopped(remote, spec, lambda local: access.jupyter_url(local, token))


@main.command()
@click.argument("args", nargs=-1, required=True, metavar="[NODE|[USER@]HOST[:PORT]] SRC DST",
                shell_complete=complete_node)
@_reach_options(accept_new=False)
@click.option("--delete", is_flag=True, help="Delete files on the receiving side that the sending side lacks.")
@click.option("--progress/--no-progress", default=None, help="Show transfer progress [default: on a terminal].")
def sync(args: tuple[str, ...], delete: bool, progress: bool | None, **kw: Unpack[ReachOptions]) -> None:
    """Copy files to or from a host with rsync over the same pinned SSH settings.

    DST becomes a copy of SRC: a folder's contents land in DST, with or without a trailing / on either
    side (never in DST/SRC); a file lands at DST, or inside DST when DST ends in /. `HOST:PATH` marks
    the remote side; relative paths are in the login's home. A download from a cluster is node 0's.

    A cluster's NAME:PATH is every node (an upload), NAME:K:PATH node K alone. `HOST SRC :DST` names the host
    first, `:PATH` for its side. s3://… and a node: `aws s3 sync` runs on the node.
    """
    import subprocess
    from pathlib import Path

    from gpuprov.cluster import resolve
    from gpuprov.errors import UserInputError
    from gpuprov.hosts import sshcli

    if len(args) not in (2, 3):
        raise UserInputError("SRC DST", f"{len(args)} paths", "e.g. gpuprov sync ./code exp1:/work/code")
    if any(a.startswith("s3://") for a in args):
        _s3_sync(sshcli.split_s3_sync(args), delete, kw)
    host, src, dst = args if len(args) == 3 else (sshcli.sync_host(*args), *args)
    host, src, dst = _cluster_node(host, src, dst)
    _need_tool("rsync", "rsync (here and on the host)")
    plan = sshcli.split_sync(host, src, dst)
    if plan.upload and not Path(plan.local).exists():
        raise UserInputError("SRC", f"no such file or folder here: {plan.local}", "give a path that exists on this machine")
    named = resolve(host)
    if named is not None and named.rank is None and plan.upload:
        targets, settings = _reach((host,), None, kw)  # a cluster by name: every node gets the copy
    else:
        target, settings = _one(host, kw)
        targets = [target]
    for target in targets:
        _warn_unpinned(target, settings)
    source_is_dir = Path(plan.local).is_dir() if plan.upload else sshcli.remote_is_dir(targets[0], settings,
                                                                                         plan.remote_path)
    plan = sshcli.as_copy(plan, source_is_dir)
    show = sys.stdout.isatty() if progress is None else progress
    code = 0
    for target in targets:
        done = subprocess.call(sshcli.rsync_argv(target, settings, plan, progress=show, delete=delete))
        if done == 255:  # rsync passes on ssh's own exit: the connection, not the copy, failed (ssh said why above)
            warn(f"error: rsync exited 255: ssh could not reach {target.name}, or lost it", "red")
        elif done != 0:  # rsync's own codes are not gpuprov's (errors.py's table): the copy failed, exit 1
            why = RSYNC_EXITS.get(done, "the copy failed")
            warn(f"error: rsync exited {done}" + (f" on {target.name}" if len(targets) > 1 else "")
                 + f": {why}; rsync said why above", "red")
            done = 1
        elif len(targets) > 1:
            click.echo(f"{target.name}: synced {plan.remote_path}", err=True)
        code = code or done
    sys.exit(code)


# rsync's exit codes (its manual's EXIT VALUES) that a sync meets, in words
RSYNC_EXITS = {
    3: "a path could not be used", 10: "its connection failed", 11: "a file could not be read or written",
    12: "its data stream broke off", 23: "some files were not copied: the copy is partial",
    24: "some source files vanished while it copied them", 30: "it timed out sending or receiving",
}


def _s3_sync(job: S3Sync, delete: bool, kw: ReachOptions) -> None:
    """A node's path to or from S3: `aws s3 sync` runs on the node, with its own credentials (`up --s3-access`); S3
    into a cluster by name reaches every node."""
    from gpuprov.cluster import resolve
    from gpuprov.hosts import access

    named = resolve(job.host)
    targets, settings = _reach((job.host,), None, kw) if named is not None and named.rank is None and \
        job.src.startswith("s3://") else ([(one := _one(job.host, kw))[0]], one[1])

    def emit(target: Target, stream: str, line: str) -> None:
        click.echo(f"{target.name} | {line}" if len(targets) > 1 else line, err=stream == "err")

    results = access.exec_many(targets, settings, job.command(delete), emit)
    for r in results:
        if r.error:
            warn(f"error: {r.target.name}: {r.error}", "red")
        elif r.exit_code != 0:
            warn(f"error: aws s3 sync exited {r.exit_code} on {r.target.name}", "red")
    sys.exit(access.combined_exit_code(results))


def _cluster_node(host: str, src: str, dst: str) -> tuple[str, str, str]:
    """`NAME:K:PATH` (node K of a recorded cluster) as host `NAME:K` with its remote side `NAME:K:PATH`."""
    import re

    from gpuprov.cluster import resolve

    named = resolve(host)
    if named is None or named.rank is not None:
        return host, src, dst
    for arg in (src, dst):
        match = re.match(rf"^{re.escape(host)}:(\d+):", arg)
        if match:
            return f"{host}:{match.group(1)}", src, dst
    return host, src, dst


@main.command()
@click.argument("hosts", nargs=-1, metavar="NODE|[USER@]HOST[:PORT]...", shell_complete=complete_node)
@click.option("--inventory", default=None, help="YAML inventory of hosts (user, port, key, proxy_jump).")
@_reach_options(accept_new=True)
@click.option("--parallel", type=PARALLEL, default=32, show_default=True, envvar="GPUPROV_PARALLEL",
              show_envvar=True, help="Hosts sampled at once (1 to 1024).")
@click.option("--interval", type=Number(0.2, 3600), default=2.0, show_default=True,
              help="Seconds between samples (0.2 to 3600).")
@click.option("--once", is_flag=True, help="One sample, then exit (exit 1 when a host could not be sampled).")
@click.option("--json", "as_json", is_flag=True, help="JSON: one array per sample (with --once, one document).")
def monitor(hosts: tuple[str, ...], inventory: str | None, parallel: int, interval: float, once: bool, as_json: bool,
            **kw: Unpack[ReachOptions]) -> None:
    """Live GPU utilisation, memory, temperature and power of several hosts (like `watch nvidia-smi`)."""
    import time

    from gpuprov.cli.report_hosts import monitor_table
    from gpuprov.hosts import access

    targets, settings = _reach(hosts, inventory, kw)
    mon = access.Monitor(targets, settings, parallel=parallel)

    def as_data(samples: list[GpuSample]) -> list[dict[str, object]]:
        return [{"host": s.target.name, "ok": s.ok, "error": s.error, "time": round(s.at, 3),
                 "gpus": [g.model_dump(mode="json") for g in s.gpus]} for s in samples]

    try:
        if once:
            samples = mon.sample()
            if as_json:
                click.echo(json.dumps(as_data(samples), indent=2))
            else:
                make_console().print(monitor_table(samples))
            sys.exit(0 if all(s.ok for s in samples) else 1)
        if as_json:
            while True:
                start = time.monotonic()
                click.echo(json.dumps(as_data(mon.sample())))
                time.sleep(max(0.0, interval - (time.monotonic() - start)))
        console = make_console()
        if not sys.stdout.isatty():  # `monitor NODE > file`: a live display draws nothing there; a table per sample
            while True:
                start = time.monotonic()
                console.print(monitor_table(mon.sample(), interval))
                time.sleep(max(0.0, interval - (time.monotonic() - start)))
        from rich.live import Live

        with Live(monitor_table(mon.sample(), interval), console=console, auto_refresh=False) as live:
            while True:
                start = time.monotonic()
                time.sleep(max(0.0, interval - (time.monotonic() - start)))
                live.update(monitor_table(mon.sample(), interval), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        mon.close()


@main.command("torchrun", cls=_DashDashCommand)
@click.argument("name", metavar="CLUSTER -- SCRIPT [ARGS...]", shell_complete=complete_node)
@_reach_options(accept_new=False)
@click.option("--env", "env_path", default="/opt/gpuprov/env", show_default=True,
              help="Python env on the nodes whose torchrun to use (else torchrun on PATH).")
@click.option("--nproc-per-node", type=Number(1, 1024, whole=True), default=None,
              help="Processes per node, 1 to 1024 [the cluster's GPUs per node].")
@click.option("--grace", type=Number(0, 3600), default=10.0, show_default=True,
              help="Seconds a node gets after ^C before its terminal is hung up (0 to 3600).")
def torchrun_cmd(name: str, env_path: str, nproc_per_node: int | None, grace: float,
                 **kw: Unpack[ReachOptions]) -> None:
    """Run torchrun on every node of a cluster, wired for it; output prefixed by node.

    Each node gets --nnodes, --nproc-per-node, --node-rank, --master-addr and --master-port from
    the cluster's record, with its /etc/gpuprov/cluster.env exported. Exit code: 0 when every node
    succeeded, else the first node's failure. Ctrl-C (or one node failing) stops it on every node.
    """
    import signal
    import threading

    from gpuprov.cluster import load
    from gpuprov.cluster import run as cluster_run
    from gpuprov.errors import UserInputError

    words = click.get_current_context().meta["gpuprov.argv"]
    if not words:
        raise click.UsageError("give the script after --, e.g. gpuprov torchrun train -- train.py --epochs 3")
    cluster = load(name)
    if cluster is None:
        from gpuprov.cluster import names

        known = names()
        raise UserInputError("CLUSTER", f"no cluster called {name!r}",
                             f"clusters: {', '.join(known)}" if known else
                             "make one with gpuprov bootstrap --cluster NAME HOST1 HOST2 ...")
    settings = host_settings(kw)  # no --accept-new-host-key here: a first key is not pinned
    targets = cluster.targets()
    commands = [cluster_run.torchrun_command(cluster, k, words, env_path, nproc_per_node) for k in range(len(targets))]
    width = max(len(t.name) for t in targets)
    lock = threading.Lock()

    def emit(target: Target, stream: str, line: str) -> None:
        with lock:
            click.echo(f"{target.name:<{width}} | {line}", err=stream == "err")

    stop = threading.Event()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if not stop.is_set():
            warn(f"stopping torchrun on {len(targets)} nodes (^C to each; hang-up after {grace:g}s)", "yellow")
        stop.set()

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    results = cluster_run.run_on_nodes(targets, commands, settings, emit, stop, grace=grace)
    for r in results:
        if r.error and r.exit_code != cluster_run.INTERRUPTED:
            warn(f"{r.target.name:<{width}} | error: {r.error}", "red")
    failed = [r for r in results if r.exit_code != 0]
    codes = ", ".join(f"{r.target.name}: exit {r.exit_code}" for r in failed)
    click.echo(f"{len(results) - len(failed)}/{len(results)} nodes ok" + (f"; {codes}" if codes else ""), err=True)
    first = next((r.exit_code for r in failed if r.exit_code != cluster_run.INTERRUPTED), None)
    sys.exit(first if first is not None else (cluster_run.INTERRUPTED if failed else 0))
