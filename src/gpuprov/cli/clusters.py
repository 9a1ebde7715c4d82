"""`gpuprov cluster list|rm`: the clusters gpuprov has recorded (bootstrap --cluster, up --nodes).

`status` also lists the clusters of existing hosts, beneath the nodes.
"""

from __future__ import annotations

import json

import click

from gpuprov.cli.common import main, make_console
from gpuprov.errors import UserInputError


@main.group()
def cluster() -> None:
    """Recorded clusters: those of existing hosts (`bootstrap --cluster`) and launched ones (`up --nodes`)."""


@cluster.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """Each recorded cluster: its nodes, MASTER_ADDR and where it came from."""
    from gpuprov import cluster as clusters
    from gpuprov.cli.cluster_report import clusters_table

    found = [c for c in (clusters.load(n) for n in clusters.names()) if c is not None]
    if as_json:
        click.echo(json.dumps([c.model_dump(mode="json") for c in found], indent=2))
    else:
        make_console().print(clusters_table(found))


@cluster.command("rm")
@click.argument("name")
def rm(name: str) -> None:
    """Forget a cluster of existing hosts (its hosts and their files are left as they are). A launched
    cluster goes with `gpuprov down NAME`."""
    from gpuprov import cluster as clusters

    found = clusters.load(name)
    if found is None:
        known = clusters.names()
        raise UserInputError("NAME", f"no cluster called {name!r}",
                             f"clusters: {', '.join(known)}" if known else "`gpuprov cluster list` shows them")
    if found.node is not None:
        raise UserInputError("NAME", f"{name} is a launched cluster", f"`gpuprov down {name}` takes it down and forgets it")
    clusters.forget(name)
    click.echo(f"{name}: forgotten (its hosts keep /etc/gpuprov/cluster.env and hostfile)")
