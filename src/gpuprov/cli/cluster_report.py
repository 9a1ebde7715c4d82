"""Tables for clusters (bootstrap --cluster, check --cluster). Presentation only, like report.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from gpuprov.cli.fittable import STYLE as _STYLE
from gpuprov.cli.fittable import Column, FitTable

if TYPE_CHECKING:
    from gpuprov.cluster import Cluster, WireResult
    from gpuprov.cluster.check import ClusterCheck
    from gpuprov.hosts.verify import Check


def cluster_table(cluster: Cluster, nodes: list[WireResult]) -> FitTable:
    """One row per node: rank, how gpuprov reaches it, its address in the cluster, GPUs, the wiring's outcome."""
    table = FitTable([Column("node"), Column("host"), Column("address"), Column("GPUs", "right"), Column("wiring"),
                      Column("error", prose=True, drop=1)],
                     title=f"cluster {cluster.name}: MASTER_ADDR={cluster.master_addr} MASTER_PORT={cluster.master_port}"
                           f" NNODES={cluster.nnodes} NPROC_PER_NODE={cluster.nproc_per_node()}",
                     title_justify="left")
    for rank, (member, node) in enumerate(zip(cluster.members, nodes, strict=True)):
        table.add_row(f"{cluster.name}:{rank}", node.target.host, member.address, str(member.gpus),
                      Text(node.outcome, style=_STYLE.get(node.outcome, "")), Text(node.error or ""))
    return table


def clusters_table(clusters: list[Cluster]) -> FitTable | Text:
    """One row per recorded cluster: name, nodes, MASTER_ADDR:PORT, processes a node, where it came from."""
    if not clusters:
        return Text("no clusters; `gpuprov bootstrap --cluster NAME HOST1 HOST2` or `gpuprov up NAME --nodes 2` makes one")
    table = FitTable([Column("cluster"), Column("nodes", "right"), Column("master"), Column("procs/node", "right"),
                      Column("from"), Column("hosts", prose=True, drop=1)])
    for c in clusters:
        table.add_row(c.name, str(c.nnodes), f"{c.master_addr}:{c.master_port}", str(c.nproc_per_node()),
                      f"up {c.node}" if c.node else "bootstrap --cluster", Text(" ".join(m.host for m in c.members)))
    return table


def _checks(title: str, checks: list[Check]) -> FitTable:
    table = FitTable([Column("check"), Column("result"), Column("detail", prose=True), Column("fix", prose=True)],
                     title=title, title_justify="left")
    for c in checks:
        state = "ok" if c.ok else ("warn" if c.severity == "warn" else "failed")
        # Text, not str: a detail's "[unverified: …]" is data, not rich markup
        table.add_row(c.name, Text(state, style={"ok": "green", "warn": "yellow"}.get(state, "red")), Text(c.detail),
                      Text(c.fix or ""))
    return table


def _size(n: int) -> str:
    for unit, step in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= step:
            return f"{n / step:g} {unit}"
    return f"{n} B"


def cluster_check_tables(result: ClusterCheck) -> list[FitTable]:
    """Connectivity findings; the all-reduce per message size; its judgement."""
    name = result.cluster.name
    out = [_checks(f"cluster {name}: node to node ({result.cluster.nnodes} nodes)", result.net_checks)]
    if result.imex_checks:
        out.append(_checks(f"cluster {name}: IMEX", result.imex_checks))
    report = result.allreduce
    if report is not None:
        table = FitTable([Column("size", "right"), Column("time", "right"), Column("algbw GB/s", "right"),
                          Column("busbw GB/s", "right")],
                         title=f"all-reduce: {report.world} ranks, {report.nnodes} nodes × {report.nproc_per_node}, "
                               f"{report.backend}", title_justify="left")
        for r in report.results:
            table.add_row(_size(r.bytes), f"{r.seconds * 1e3:.3g} ms", f"{r.algbw_gbs:.3g}", f"{r.busbw_gbs:.3g}")
        out.append(table)
    if result.allreduce_checks:
        out.append(_checks(f"cluster {name}: all-reduce", result.allreduce_checks))
    return out


def cluster_check_json(result: ClusterCheck) -> dict[str, object]:
    out: dict[str, object] = {
        "cluster": result.cluster.name, "ok": result.ok,
        "connectivity": {"checks": [c.model_dump(mode="json") for c in result.net_checks],
                         **result.net.model_dump(mode="json")},
        "allreduce": {"checks": [c.model_dump(mode="json") for c in result.allreduce_checks],
                      "report": result.allreduce.model_dump(mode="json") if result.allreduce else None,
                      "expectation": result.expectation.model_dump(mode="json") if result.expectation else None,
                      "error": result.allreduce_error},
    }
    if result.cluster.imex:
        out["imex"] = {"checks": [c.model_dump(mode="json") for c in result.imex_checks]}
    return out
