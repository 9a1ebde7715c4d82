"""Tables for clusters (bootstrap --cluster, check --cluster). Presentation only, like report.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from gpuprov.report import _STYLE, Column, FitTable

if TYPE_CHECKING:
    from gpuprov.cluster import Cluster, WireResult


def cluster_table(cluster: Cluster, nodes: list[WireResult]) -> FitTable:
    """One row per node: rank, how gpuprov reaches it, its address in the cluster, GPUs, the wiring's outcome."""
    table = FitTable([Column("node"), Column("host"), Column("address"), Column("GPUs", "right"), Column("wiring"),
                      Column("error", prose=True, drop=1)],
                     title=f"cluster {cluster.name}: MASTER_ADDR={cluster.master_addr} MASTER_PORT={cluster.master_port}"
                           f" NNODES={cluster.nnodes} NPROC_PER_NODE={cluster.nproc_per_node()}",
                     title_justify="left")
    for rank, (member, node) in enumerate(zip(cluster.members, nodes, strict=True)):
        table.add_row(f"{cluster.name}:{rank}", node.target.host, member.address, str(member.gpus),
                      Text(node.outcome, style=_STYLE.get(node.outcome, "")), node.error or "")
    return table
