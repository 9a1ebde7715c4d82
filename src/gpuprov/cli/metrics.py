"""`gpuprov metrics targets | serve | dashboard`: the nodes' exporters for the user's Prometheus and Grafana.

\b
  gpuprov up train --gpu H100:8 --metrics
  gpuprov metrics serve --file-sd ~/prometheus/gpuprov.json      # keeps the tunnels open
  gpuprov metrics dashboard > gpu.json                             # import it into Grafana

Which machines: every live node whose plan has --metrics and every recorded cluster's nodes, or the NODE,
CLUSTER, CLUSTER:K or [USER@]HOST[:PORT] words given (hosts bootstrapped with --metrics).

`status` prints each node's last health finding beneath its table and in `--json`'s `health`.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gpuprov.cli.common import host_settings, main, make_console, quiet, targets_from, warn
from gpuprov.cli.complete import complete_node
from gpuprov.errors import UserInputError

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpuprov.cli.option_sets import ReachOptions
    from gpuprov.hosts.metrics import Machine
    from gpuprov.state import Node

F = TypeVar("F", bound=Callable[..., object])


@main.group()
def metrics() -> None:
    """GPU metrics for Prometheus and Grafana: scrape targets, the tunnels to them, a dashboard.

    The exporters listen on each node's 127.0.0.1 only (`up --metrics`, `bootstrap --metrics`); `serve`
    reaches them through SSH, so no port but SSH is ever open."""


def _where(func: F) -> F:
    for option in reversed([
        click.argument("names", nargs=-1, metavar="[NODE|CLUSTER|[USER@]HOST[:PORT]]...", shell_complete=complete_node),
        click.option("--base-port", type=click.IntRange(1024, 65000), default=19100, show_default=True,
                     help="Local ports for the tunnels are handed out from here (and kept: see metrics-ports.json in "
                          "gpuprov's state folder)."),
        click.option("--file-sd", "file_sd", default=None, type=click.Path(dir_okay=False), metavar="PATH",
                     help="Write the list to PATH (for Prometheus' file_sd_configs), whole or not at all."),
    ]):
        func = option(func)
    return func


@metrics.command()
@_where
def targets(names: tuple[str, ...], base_port: int, file_sd: str | None) -> None:
    """Print Prometheus' file_sd list of every machine's exporters, at the local ends of the tunnels
    `gpuprov metrics serve` holds (labels: node, cluster, instance_type, gpu_model, owner, exporter)."""
    from gpuprov.hosts import metrics as m

    machines = _machines(names)
    groups = m.file_sd(machines, m.assign_ports(machines, base_port))
    if file_sd:
        m.write_file_sd(Path(file_sd), groups)
        if not quiet():
            click.echo(f"wrote {len(groups)} targets to {file_sd}", err=True)
    else:
        click.echo(json.dumps(groups, indent=2))


@metrics.command()
@_where
@click.option("--poll", type=click.FloatRange(1), default=60.0, show_default=True, metavar="SECONDS",
              help="How often each node's last health finding is read (for `gpuprov status`).")
@click.option("-i", "--identity", default=None, envvar="GPUPROV_KEY", show_envvar=True,
              help="Private key file for hosts that are not gpuprov's nodes.")
@click.option("--ssh-config", default=None, type=click.Path(dir_okay=False), help="ssh config file [~/.ssh/config].")
@click.option("--connect-timeout", type=click.FloatRange(0, min_open=True), default=10.0, show_default=True,
              help="Seconds to wait for SSH.")
def serve(names: tuple[str, ...], base_port: int, file_sd: str | None, poll: float,
          **kw: Unpack[ReachOptions]) -> None:
    """Hold an SSH tunnel to every machine's exporters until Ctrl-C, reconnecting when one drops.

    Point Prometheus at the list `--file-sd PATH` writes (or `gpuprov metrics targets` prints):
    \b
      scrape_configs:
        - job_name: gpuprov
          file_sd_configs: [{files: [PATH]}]
    """
    import threading

    from gpuprov.hosts import metrics as m

    machines = _machines(names)
    if not machines:
        raise UserInputError("NODE", "no machine with metrics to serve",
                             "launch one with `gpuprov up NAME --metrics`, or name hosts bootstrapped with --metrics")
    ports = m.assign_ports(machines, base_port)
    lock = threading.Lock()
    console = make_console(stderr=True)

    def say(text: str) -> None:
        if not quiet():
            with lock:
                console.print(text, markup=False, highlight=False)

    def write() -> None:
        if file_sd:
            m.write_file_sd(Path(file_sd), m.file_sd(machines, m.assign_ports(machines, base_port)))

    def learned(name: str, exporters: tuple[str, ...]) -> None:
        with lock:
            fresh = m.assign_ports(machines, base_port, learned={name: exporters})
            ports.update(fresh)
            server.ports.update(fresh)
        write()

    write()
    if file_sd:
        say(f"file_sd list: {file_sd} ({len(machines)} machines)")
    server = m.Serve(machines, host_settings(kw), ports, say, poll=poll,
                     on_learned=learned)

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    server.start()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@metrics.command()
def dashboard() -> None:
    """Print gpuprov's Grafana dashboard (per GPU utilisation, memory, temperature, power, clocks, Xid and ECC,
    by cluster and node) as JSON: `gpuprov metrics dashboard > gpu.json`, then Dashboards → Import in Grafana."""
    from gpuprov.resources import data_file

    click.echo(data_file("grafana-gpu-dashboard.json").read_text(), nl=False)


def _machines(names: tuple[str, ...]) -> list[Machine]:
    """The machines to scrape: the named ones, else every live node with metrics and every recorded cluster."""
    from gpuprov import cluster
    from gpuprov.hosts.metrics import Machine
    from gpuprov.paths import state_folder

    nodes = {}
    if (state_folder() / "state.sqlite").exists():
        from gpuprov.state import open_store

        nodes = {n.name: n for n in open_store().nodes() if n.live}
    clusters = {c.name: c for c in (cluster.load(name) for name in cluster.names()) if c is not None}
    wanted = set(names)
    out: list[Machine] = []
    for name, node in sorted(nodes.items()):
        if node.cluster_size is not None or (wanted and name not in wanted):
            continue  # a launched cluster is served through its cluster record, node by node
        exporters = _exporters(node.plan)
        if exporters is None and name not in wanted:
            continue
        from gpuprov.cli.common import node_target

        target = node_target(name)
        if target is not None:
            out.append(Machine(name, target, exporters or ("node",), _labels(node, None)))
    for name, found in sorted(clusters.items()):
        if wanted and name not in wanted and not any(w.startswith(f"{name}:") for w in wanted):
            continue
        launched = nodes.get(found.node or "")
        exporters = _exporters(launched.plan) if launched else None
        for rank, member in enumerate(found.members):
            label = f"{name}:{rank}"
            if wanted and name not in wanted and label not in wanted:
                continue
            labels = _labels(launched, name) | {"instance_type": member.instance_type or
                                                (launched.instance_type or "" if launched else "")}
            out.append(Machine(label, member.target(name, rank), exporters, labels))
    named = {m.name for m in out} | set(clusters) | set(nodes)
    others = [w for w in names if w not in named and w.split(":")[0] not in clusters]
    if others:
        out += [Machine(t.name, t, None, {}) for t in targets_from(tuple(others), None, None)]
    if not names and not out:
        warn("no node has metrics: `gpuprov up NAME --metrics` (or name hosts bootstrapped with --metrics)")
    return out


def _exporters(plan: dict[str, Any]) -> tuple[str, ...] | None:
    """The exporters a recorded plan (its summary as JSON, arbitrary) installed; None when it asked for no metrics."""
    exporter = (plan.get("monitoring") or {}).get("exporter")
    return ("node", "dcgm") if exporter == "dcgm" else ("node",) if exporter == "textfile" else None


def _labels(node: Node | None, cluster_name: str | None) -> dict[str, str]:
    if node is None:
        return {"cluster": cluster_name or ""}
    return {"cluster": cluster_name or "", "instance_type": node.instance_type or "", "gpu_model": node.gpu or "",
            "owner": node.owner or ""}
