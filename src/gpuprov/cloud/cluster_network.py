"""The network of a cluster per instance type, from its facts: a cluster placement group where the family takes
one, the EFA interfaces AWS's layout asks for on the cards that carry EFA, and the transport NCCL gets (EFA,
with device RDMA only where the EFA device does RDMA read, or TCP). Pure: `gpuprov plan --nodes N` prints the
same layout `up --nodes N` launches with.

AWS's EFA (its interfaces, its installer and how the plan says them) is providers/aws_efa.py. Device RDMA
(`efa_rdma`) is the P types' from p4d. `describe` is what `plan --nodes N` prints; `with_efa_step` adds the `efa`
step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gpuprov.cloud.providers import aws_efa
from gpuprov.cloud.providers.aws_efa import DEVICE_RDMA_ENV, EFA_INSTALLER, efa_interfaces
from gpuprov.cloud.providers.base import Nic
from gpuprov.plan.catalog import InstanceType
from gpuprov.plan.plan import Plan

Transport = Literal["efa", "tcp"]


@dataclass(frozen=True)
class ClusterLayout:
    """How one instance type is laid out as a cluster: placement group, network interfaces, transport."""

    instance_type: str
    placement_group: bool
    interfaces: tuple[Nic, ...]  # empty: the single ENA interface every launch gets
    transport: Transport
    notes: tuple[str, ...] = ()  # unverified facts this layout relies on, and why a choice was made
    device_rdma: bool = False  # the EFA device does RDMA read: FI_EFA_USE_DEVICE_RDMA=1
    cloud: str = "aws"  # whose group `placement_group` means: AWS's cluster placement group, ECS's deployment set
    spot_placement: bool = True  # a spot instance may join the group (ECS launches none into a deployment set)
    group_limit: int | None = None  # the most instances one group holds (None: the account's limits alone)
    group_words: str = "cluster placement group"  # how the cloud calls the group

    @property
    def elastic_ip(self) -> bool:
        """EC2 gives no public address to an instance launched with more than one network interface."""
        return len(self.interfaces) > 1


def network_for(it: InstanceType, cloud: str = "aws") -> ClusterLayout:
    """The cluster layout of one instance type, from its facts (the catalog's, or EC2's with `plan --live`/`up`)."""
    from gpuprov.plan import catalog

    if cloud == "alibaba":
        return alibaba_layout(it)
    net = catalog.load().cluster_network
    family = it.name.split(".")[0]
    notes: list[str] = []
    placement = net.cluster_placement(it.name)
    if placement and family in net.cluster_placement_unverified:
        notes.append(f"unverified: cluster placement for {family}: {net.cluster_placement_unverified[family]}")
    if not it.efa:
        return ClusterLayout(it.name, placement, (), "tcp", tuple(notes))
    if not it.efa_rdma:
        notes.append(f"EFA on {it.name} without RDMA read: NCCL uses EFA send/receive, no FI_EFA_USE_DEVICE_RDMA"
                     + (f" (unverified: {net.rdma_unverified})" if net.rdma_unverified else ""))
    return ClusterLayout(it.name, placement, efa_interfaces(it.efa_card_indexes()), "efa", tuple(notes),
                          device_rdma=it.efa_rdma)


# Alibaba Cloud keeps a cluster close with a deployment set of strategy LowLatency: "all instances must be in the same
# zone", at most 20 of them in it; no spot instance may be created in a deployment set (ECS user guide, "Deployment
# sets", doc-detail/91258 and 130139, read 2026-12-04: the limits as the Chinese page lists them). RunInstances puts the
# whole Amount into the set (its DeploymentSetId). No eRDMA in gpuprov: NCCL goes over TCP.
ALIBABA_SET_LIMIT = 20


def alibaba_layout(it: InstanceType) -> ClusterLayout:
    """An ECS cluster: a LowLatency deployment set for on-demand nodes, none for spot ones, TCP between nodes."""
    return ClusterLayout(it.name, True, (), "tcp", cloud="alibaba", spot_placement=False, group_limit=ALIBABA_SET_LIMIT,
                         group_words="deployment set (LowLatency)")


def grouped(layout: ClusterLayout, market: str, nodes: int) -> bool:
    """Whether a launch of `nodes` in this market goes into a group of its own: where the type takes one, the market
    may join it and the group holds them all (else the nodes go in one zone without one, as the plan says)."""
    return layout.placement_group and (market == "on-demand" or layout.spot_placement) \
        and (layout.group_limit is None or nodes <= layout.group_limit)


def instance_of(plan: Plan, name: str) -> InstanceType:
    """The plan's own facts of one of its candidate types."""
    return next(c for c in plan.candidates if c.name == name)


def describe(layout: ClusterLayout, nodes: int) -> list[str]:
    """The plan's lines for the cluster's network (what `plan --nodes N` and `up --nodes N` print)."""
    if layout.cloud == "alibaba":
        return _alibaba_lines(layout, nodes)
    family = layout.instance_type.split(".")[0]
    lines = [f"{nodes} × {layout.instance_type} in one zone, asked for in one launch",
             "placement group: strategy cluster, created before the launch" if layout.placement_group
             else f"placement group: none ({family} is not listed for cluster placement)"]
    if layout.transport == "efa":
        lines += aws_efa.lines(layout.interfaces, layout.device_rdma)
    else:
        lines.append(f"network: TCP between nodes (no EFA on {layout.instance_type})")
    lines.append("security group: SSH from you; all traffic between the cluster's nodes")
    return lines + [f"  {note}" for note in layout.notes]


def _alibaba_lines(layout: ClusterLayout, nodes: int) -> list[str]:
    full = nodes > (layout.group_limit or nodes)
    return [f"{nodes} × {layout.instance_type} in one zone, asked for in one RunInstances (Amount {nodes}, MinAmount "
            "--min-nodes or all: fewer in stock launches none)",
            "deployment set: strategy LowLatency (one zone, one network topology), created before the launch, for "
            "on-demand nodes" + (f"; none here: ECS holds at most {layout.group_limit} instances in one" if full else ""),
            "  spot nodes launch without one: ECS creates no spot instance in a deployment set",
            "network: TCP between nodes (no eRDMA on Alibaba Cloud in gpuprov yet)",
            "security group: SSH from you; all traffic between the cluster's nodes"]


def layout_summary(layout: ClusterLayout, nodes: int) -> dict[str, object]:
    """The cluster part of `plan --json`."""
    return {"nodes": nodes, "instance_type": layout.instance_type, "placement_group": layout.placement_group,
            **({"deployment_set": "LowLatency", "spot_placement": False} if layout.cloud == "alibaba" else {}),
            "transport": layout.transport, "elastic_ip": layout.elastic_ip, "device_rdma": layout.device_rdma,
            "interfaces": [{"network_card": n.card, "device_index": n.device, "type": n.kind} for n in layout.interfaces],
            "notes": list(layout.notes)}


def with_efa_step(plan: Plan, layout: ClusterLayout) -> Plan:
    """The plan with the `efa` step (EFA software, AWS OFI NCCL plugin, NCCL/libfabric environment) before
    `verify`, on EFA types; unchanged for TCP."""
    if layout.transport != "efa" or any(s.name == "efa" for s in plan.steps):
        return plan
    from gpuprov.plan.render import StepPlan

    steps = list(plan.steps)
    at = next((i for i, s in enumerate(steps) if s.kind == "verify"), len(steps))
    installer = replace(EFA_INSTALLER, env=(*EFA_INSTALLER.env, DEVICE_RDMA_ENV)) if layout.device_rdma else EFA_INSTALLER
    steps.insert(at, StepPlan("efa", "efa.sh.j2", "stack",
                              aws_efa.step_words(installer, layout.instance_type, layout.device_rdma),
                              (("efa", installer),)))
    return replace(plan, steps=tuple(steps))
