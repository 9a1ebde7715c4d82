"""`up NAME --nodes N`: N instances of one type in one zone, launched, kept and taken down as one cluster.

In order (validation first, so bad input creates nothing):
  options checked -> offerings, network, image, Elastic IP quota -> cluster row (`cluster_size` N) -> key pair,
  security group with SSH from the caller and all traffic between its own members, cluster placement group (where the
  type supports one), each recorded before it is created and tagged on creation -> per candidate (type x zone x
  market, as for one node) ONE RunInstances for N instances with MinCount = --min-nodes (N by default): EC2 launches
  at least MinCount "or does not launch any instances", so a zone that cannot hold the cluster refuses it whole and
  failover moves the whole cluster on, never splitting it -> every node running (a node lost on the way is dropped
  when --min-nodes allows, else the cluster goes) -> Elastic IPs on the primary interface where the type launches with
  several (no public address then; none for IPv6) -> SSH + host keys pinned per node -> bootstrap on every node (a
  node that fails is dropped the same way) -> ready.

Any failure or Ctrl-C before `ready` tears the whole cluster down (cloud/teardown.py: instances, then
volumes, the security group, the Elastic IPs and the placement group). The network layout per type (placement
group, EFA interfaces, transport) is `network_for`, pure, and `gpuprov plan --nodes N` prints the same one.

The security group gets a self-referencing all-traffic rule both ways; no `--persistent` spot (EC2 refuses a
stop-on-interruption spot instance in a placement group). Each Elastic IP is recorded, tagged, and associated with
the primary interface (card 0, device 0: EC2 refuses an instance id with several interfaces). After the bootstrap
the known_hosts are merged, the survivors re-ranked 0..M-1, and the cluster is wired as `bootstrap --cluster` wires
one (`as_cluster`: reached at the connect address with the cluster's pinned keys, known by its PRIVATE address,
MASTER_ADDR node 0's, GPUs per node the type's; cluster.install; a node that cannot be wired fails the `up`); then
`members_json` (rank, instance, private/public/connect address, Elastic IP) with node 0's address as the node's.
On Alibaba Cloud the group is a LowLatency deployment set, for on-demand nodes of at most 20 (cluster_network.py
`grouped`: a spot cluster goes in one zone without one, as the launch line says), and the nodes talk TCP.
One notion of cluster: `NAME`/`NAME:K`, `exec`, `torchrun`, `check --cluster` read the same record for both kinds;
`up` refuses a name recorded for existing hosts; teardown forgets a launched cluster's record once everything is
gone. Its timeline has a node's phases, each RunInstances of the whole cluster as an attempt, one row per node in
the bootstrap phase and a `cluster wiring` phase; `--json` returns it with the node row and the nodes dropped.

The `efa` step (templates/efa.sh.j2, on EFA types): AWS's EFA installer at the version in
providers/aws_efa.EFA_INSTALLER (source: AWS's EFA release notes) and /etc/gpuprov/efa.env (`FI_PROVIDER=efa`, the
plugin's and libfabric's library path, and `FI_EFA_USE_DEVICE_RDMA=1` only where the type's EFA device does RDMA
read).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gpuprov.cloud import addresses, destroy, launch, reservations, stop_role
from gpuprov.cloud import timeline as tl
from gpuprov.cloud.cluster_network import ClusterLayout, grouped, instance_of, network_for, with_efa_step
from gpuprov.cloud.contact import bootstrap_launched, pin_host_key
from gpuprov.cloud.failover import Candidate, Order
from gpuprov.cloud.providers.base import Access, Instance, LaunchError, LaunchRequest, Market, Network, NotFound, Provider
from gpuprov.cloud.providers.capabilities import ADDRESSES, PLACEMENT, RDMA, need, service
from gpuprov.cloud.settle import settle_window
from gpuprov.cloud.tags import owner
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.plan.plan import Plan
from gpuprov.state import Member, Node, NodeState, Store, locks, members_json

if TYPE_CHECKING:
    from gpuprov import cluster
    from gpuprov.say import Say

MAX_NODES = 64  # a sanity bound on --nodes; EC2's own limit is the account's vCPU quota

@dataclass(frozen=True)
class ClusterOptions:
    nodes: int
    min_nodes: int | None = None  # None: all of them

    @property
    def at_least(self) -> int:
        return self.nodes if self.min_nodes is None else self.min_nodes


@dataclass
class ClusterResult:
    node: Node
    members: list[Member]
    network: ClusterLayout
    attempts: list[launch.Attempt] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # "node 2 (i-…): why"
    ssh_alias: str | None = None
    timeline: tl.Timeline | None = None


def check_cluster_options(plan: Plan, opts: launch.UpOptions, copts: ClusterOptions) -> None:
    if copts.nodes == 1 and copts.min_nodes is not None:  # --min-nodes alone: the user typed no --nodes
        raise UserInputError("--min-nodes", "applies to a cluster", f"add --nodes N (2 to {MAX_NODES}), or drop --min-nodes")
    if not 2 <= copts.nodes <= MAX_NODES:
        raise UserInputError("--nodes", f"{copts.nodes} is not a cluster size", f"2 to {MAX_NODES} (leave it out for one node)")
    if copts.min_nodes is not None and not 1 <= copts.min_nodes <= copts.nodes:
        raise UserInputError("--min-nodes", f"{copts.min_nodes} is not between 1 and --nodes {copts.nodes}",
                             f"e.g. --min-nodes {max(1, copts.nodes - 1)}")
    if plan.cpu_only:  # a cluster is for training across GPUs: NCCL's all-reduce, EFA, the cluster check
        raise UserInputError("--nodes", f"{plan.instance.name if plan.instance else 'a CPU-only type'} is a CPU-only "
                             "type; a cluster is GPU nodes training together", "launch each CPU-only node with its "
                             "own `gpuprov up NAME --cpu N`")
    if plan.request.budget_usd is not None:  # each node would turn it into its own deadline at its own price
        raise UserInputError("--budget", "a budget is per node; a cluster's is not supported yet",
                             "use --ttl for the cluster's deadline (every node gets it)")
    if plan.request.spot and plan.request.persistent:  # EC2 guide, "Placement group rules and limitations"
        raise UserInputError("--persistent", f"{service(plan.request.cloud)} cannot launch a spot instance that "
                             "stops on interruption into a placement group",
                             "drop --persistent (a cluster's spot nodes terminate on interruption)")


def up(plan: Plan, opts: launch.UpOptions, copts: ClusterOptions, provider: Provider, store: Store,
       say: Say) -> ClusterResult:
    check_cluster_options(plan, opts, copts)
    need(provider, PLACEMENT, what="--nodes")  # before anything is made: this cloud launches no cluster
    _not_a_host_cluster(launch.check_name(opts.name))
    with locks.claim(opts.name, "up --nodes"):  # as for one node: held from before the record until ready
        rec = tl.Recorder("up", opts.name)
        rec.phase(tl.CHECKS)
        pad = launch.launchpad(plan, opts, provider, store, say)
        name, region, network, cidr, order, image = pad.name, pad.region, pad.network, pad.cidr, pad.order, pad.image
        rec.image = pad.image_line
        # what the launch asks for: the root volume, SSH's CIDR, the reservation by its own id
        opts = replace(opts, disk_gb=pad.disk_gb, ssh_cidr=cidr, **reservations.resolved(opts, pad.held))
        addresses.check_quota(provider, region, copts.nodes, opts, order,
                              lambda t: network_for(instance_of(plan, t), plan.request.cloud).elastic_ip)

        market = "spot" if plan.request.spot else "on-demand"
        store.create_node(name, provider.name, region, gpu=plan.gpu.name if plan.gpu else None, gpu_count=plan.count,
                          market=market, owner=owner(), plan_json=launch.plan_json(plan),
                          ssh_user=opts.ssh_user, pid=os.getpid(), host=socket.gethostname(),
                          autostop_seconds=plan.guards.autostop_seconds, ttl_seconds=plan.request.ttl_seconds,
                          on_interrupt=plan.guards.on_interrupt, spot_type="one-time" if plan.request.spot else None,
                          shutdown_action=plan.guards.shutdown_action, disk_gb=opts.disk_gb, connect=opts.connect,
                          cluster_size=copts.nodes, guards_locked_by=owner() if opts.locked else None)
        store.event(name, "up", f"launching {copts.nodes} nodes of {plan.count}× {plan.gpu.name if plan.gpu else ''} "
                    f"in {region}")
        try:
            done = _launch_and_bootstrap(plan, opts, copts, provider, store, say, order, image, network, cidr, rec)
        except BaseException as exc:  # failure or Ctrl-C before `ready`: the whole cluster goes, then re-raise
            launch.take_back(exc, name, region, provider, store, say, rec, " (all of its nodes)")
            raise
        done.timeline = launch.kept_timeline(name, store, rec)
        return done


def _not_a_host_cluster(name: str) -> None:
    """One name, one cluster: a recorded cluster of existing hosts keeps its name (`ssh NAME:K` would be ambiguous)."""
    from gpuprov import cluster

    found = cluster.load(name)
    if found is not None and found.node is None:
        raise UserInputError("NAME", f"{name!r} is already a cluster of existing hosts (bootstrap --cluster)",
                             f"pick another name, or forget that one: gpuprov cluster rm {name}")


def _launch_and_bootstrap(plan: Plan, opts: launch.UpOptions, copts: ClusterOptions, provider: Provider,
                          store: Store, say: Say, order: Order, image: str, network: Network,
                          cidr: str, rec: tl.Recorder) -> ClusterResult:
    name, region = opts.name, plan.request.region
    public_ip = opts.connect == "public" and network.subnet_id is not None and not network.maps_public_ip
    rec.phase(tl.ACCESS)
    role = stop_role.for_launch(provider, store, say)  # where the guards' stop needs a role of the cloud's
    if role is not None:
        opts = replace(opts, instance_profile=role)
    anywhere = ", anywhere on the internet" if launch.open_to_all(cidr) else ""
    say(f"key pair and security group (SSH from {cidr}{anywhere}; all traffic between the cluster's nodes)")
    access = launch.prepare_access(name, region, provider, store, network, cidr, public_ip)
    need(provider, PLACEMENT, what="--nodes").authorize_self(region, access.security_group_id, settle=settle_window())
    rec.phase(tl.CAPACITY)
    instances, layout, attempts = _launch(plan, opts, copts, provider, store, say, order, image, access, rec)

    result = ClusterResult(store.node(name), [], layout, attempts)
    rec.phase(tl.RUNNING)
    say(f"{len(instances)} instances launched ({', '.join(i.id for i in instances)}); waiting for them to run")
    running: list[Instance] = []
    for rank, inst in enumerate(instances):
        try:
            running.append(provider.wait_running(region, inst.id, timeout=opts.ssh_timeout, settle=settle_window()))
        except GpuprovError as exc:
            _drop_or_fail(copts, len(instances), [rank], {rank: f"{inst.id}: {exc}"}, result, say)
            _terminate(name, region, [inst.id], provider, store, say)
    for inst in running:
        for volume in inst.volume_ids:
            store.add_resource(name, "volume", region, volume)
    members = [_member(name, region, rank, inst, opts, layout, provider, store, say)
               for rank, inst in enumerate(running)]
    _record(store, name, members, state=NodeState.RUNNING)
    result.members = members

    from gpuprov.paths import keys_dir, region_key

    key_path = str(region_key(keys_dir(), region))
    if opts.wait:
        rec.phase(tl.BOOTSTRAP if opts.bootstrap else tl.SSH)
        members = _contact_all(plan, opts, copts, members, key_path, provider, store, say, result, layout, rec)
        result.members = members
        from gpuprov.hosts import sshconfig

        _merge_known_hosts(name, members)
        members = [replace(m, rank=rank, state="ready") for rank, m in enumerate(members)]  # ranks 0..n-1 after a drop
        rec.phase(tl.WIRE)
        wire(name, store.node(name), members, opts.ssh_user, key_path, say)
        store.update_node(name, state=NodeState.READY, ready_at=time.time())
        _record(store, name, members, state=NodeState.READY)
        result.members = members
        result.ssh_alias = sshconfig.add_node(name, members[0].address or "", opts.ssh_user, key_path)
    else:
        store.update_node(name, state=NodeState.READY, ready_at=time.time())
        say("not waiting for SSH (--no-wait): host keys are not pinned and the nodes are not wired as a cluster "
            "(no cluster.env), so `ssh gpuprov-NAME`, `exec NAME` and `torchrun NAME` are not set up")
    result.node = store.node(name)
    store.event(name, "ready", f"{len(members)} × {result.node.instance_type} {result.node.zone}")
    return result


def _launch(plan: Plan, opts: launch.UpOptions, copts: ClusterOptions, provider: Provider, store: Store, say: Say,
            order: Order, image: str, access: Access,
            rec: tl.Recorder) -> tuple[list[Instance], ClusterLayout, list[launch.Attempt]]:
    """Ask each candidate for the whole cluster in one request; a refusal moves the whole cluster on."""
    name, region = opts.name, plan.request.region
    attempts: list[launch.Attempt] = []
    closed: set[Market] = set()
    group: str | None = None
    targeted, reserved_group = reservations.held_group(opts, provider, region)
    for i, cand in enumerate(order.candidates):
        if cand.market in closed:
            continue
        layout = network_for(instance_of(plan, cand.instance_type), plan.request.cloud)
        if layout.interfaces:  # the type's RDMA interfaces are asked for at launch
            need(provider, RDMA, what="--nodes")
        into = grouped(layout, cand.market, copts.nodes)
        if into and group is None and not targeted:
            group = _placement_group(name, region, provider, store, layout.group_words, say)
        elif targeted:  # into the reservation's own group, if it was made in one; never a new one
            group = reserved_group
        token = f"gpuprov-{name}-{i}-{uuid.uuid4().hex[:12]}"
        say(f"asking for {copts.nodes} × {cand.instance_type} in {cand.zone} ({cand.market}"
            + (f", at least {copts.at_least}" if copts.at_least < copts.nodes else "")
            + (", EFA" if layout.transport == "efa" else "")
            + (f", no {layout.group_words}" if layout.placement_group and not into and not targeted else "")
            + (", TCP: no RDMA fabric" if layout.cloud != "aws" else "") + ")")
        rid = store.intend(name, "instance", region, token)
        asked = rec.now()
        try:
            instances = need(provider, PLACEMENT, what="--nodes").launch_group(LaunchRequest(
                node=name, region=region, zone=cand.zone, instance_type=cand.instance_type, market=cand.market,
                image_id=image, access=access, disk_gb=opts.disk_gb, client_token=token, max_price=opts.max_price,
                shutdown_behavior=launch.shutdown_behavior(plan, cand.market), count=copts.nodes,
                spot_duration=plan.request.spot_duration if cand.market == "spot" else None,
                min_count=copts.at_least, placement_group=group if into or targeted else None,
                interfaces=layout.interfaces, instance_profile=opts.instance_profile,
                **reservations.reservation_of(opts)), settle=settle_window())
        except LaunchError as exc:  # a refusal launched none of them (MinCount)
            attempt = launch.note_refusal(exc, cand, rid, asked, f"{copts.nodes} × ", name, attempts, store, rec, say)
            launch.go_on_after(exc, attempt, opts, closed, provider, region, say, copts.nodes)
            continue
        rec.attempt(cand.instance_type, cand.zone, cand.market, asked)
        _recorded(store, name, region, rid, token, instances)
        _landed(plan, store, name, cand)
        store.update_node(name, **reservations.recorded(opts, provider, region))
        if len(instances) < copts.nodes:
            say(f"  {service(provider)} launched {len(instances)} of {copts.nodes} (at least {copts.at_least} asked for)")
        return instances, layout, attempts
    tried = "; ".join(f"{a.candidate.instance_type}/{a.candidate.zone}/{a.candidate.market}: {a.code}" for a in attempts)
    raise launch.NoCapacity(f"no zone could hold all {copts.at_least} nodes of the cluster: {tried}", attempts)


def _placement_group(name: str, region: str, provider: Provider, store: Store, words: str, say: Say) -> str:
    """The cluster's group, recorded by its name before it is asked for; what the launch names it by is what the
    cloud answered (AWS: the name itself; Alibaba Cloud: the deployment set's id)."""
    group = f"gpuprov-{name}-{uuid.uuid4().hex[:8]}"
    say(f"{words} {group}")
    rid = store.intend(name, "placement-group", region, group)
    made = need(provider, PLACEMENT, what="--nodes").create_placement_group(region, name, group)
    store.created(rid, made)
    return made


def _recorded(store: Store, name: str, region: str, rid: int, token: str, instances: list[Instance]) -> None:
    store.created(rid, instances[0].id)
    for inst in instances[1:]:
        store.add_resource(name, "instance", region, inst.id, token)
    for inst in instances:
        if inst.spot_request_id:
            store.add_resource(name, "spot-request", region, inst.spot_request_id)


def _landed(plan: Plan, store: Store, name: str, cand: Candidate) -> None:
    store.update_node(name, instance_type=cand.instance_type, zone=cand.zone, market=cand.market,
                      price_usd_hour=cand.price_usd_hour,
                      spot_type="one-time" if cand.market == "spot" else None,
                      shutdown_action=launch.shutdown_behavior(plan, cand.market))


def _member(name: str, region: str, rank: int, inst: Instance, opts: launch.UpOptions, layout: ClusterLayout,
            provider: Provider, store: Store, say: Say) -> Member:
    public = inst.ipv6 if opts.ipv6 else inst.public_ip  # an IPv6 address is public: no Elastic IP needed
    allocation = None
    if opts.connect == "public" and layout.elastic_ip and not opts.ipv6:
        label = f"gpuprov-{name}-{rank}-{uuid.uuid4().hex[:8]}"
        rid = store.intend(name, "address", region, label)
        addresses = need(provider, ADDRESSES, what="--nodes")
        allocation = addresses.allocate_address(region, name, label)
        store.created(rid, allocation)
        public = addresses.associate_address(region, allocation, inst.id, settle=settle_window())
        say(f"  node {rank}: {addresses.address_name} {public}")
    address = inst.private_ip if opts.connect == "private" else public
    if not address:
        raise GpuprovError(f"{inst.id} has no {opts.connect} address; use --connect private (VPN/bastion) "
                           "or a subnet that assigns public IPs")
    return Member(rank, inst.id, inst.private_ip, public, address, "running", allocation)


def _record(store: Store, name: str, members: list[Member], state: NodeState) -> None:
    store.update_node(name, state=state, members_json=members_json(members),
                      address=members[0].address if members else None)


def _drop_or_fail(copts: ClusterOptions, launched: int, ranks: list[int], why: dict[int, str], result: ClusterResult,
                  say: Say) -> None:
    """Keep the cluster without the failed nodes when --min-nodes allows it; otherwise raise (all come down)."""
    left = launched - len(result.dropped) - len(ranks)
    reasons = "; ".join(f"node {r}: {why[r]}" for r in ranks)
    if left < copts.at_least:
        raise GpuprovError(f"{reasons}\n  {left} healthy node(s) left, {copts.at_least} needed"
                           + ("" if copts.min_nodes is not None else " (--min-nodes M keeps a smaller cluster)"))
    for r in ranks:
        result.dropped.append(f"node {r} ({why[r]})")
        say(f"  dropping node {r} ({why[r]}); {left} left (--min-nodes {copts.at_least})")


def _terminate(name: str, region: str, ids: list[str], provider: Provider, store: Store, say: Say) -> None:
    """Take some of a cluster's instances down, one id per call (EC2 terminates none of a request in which one id
    is wrong), each row marked gone only once EC2 confirmed it; the rest stays."""
    gone = []
    for iid in ids:
        try:
            with destroy.take_back(name, "up --nodes"):  # instances this launch made, dropped before any user data
                destroy.end(provider, name, region, [iid], settle=settle_window())
            provider.wait_terminated(region, [iid])
        except NotFound:
            pass  # past the settle time: it is gone
        except GpuprovError as exc:
            say(f"  could not remove {iid}: {exc} (`gpuprov down {name}` finishes it)")
            continue
        gone.append(iid)
    for row in store.resources(name, region=region, kind="instance"):
        if row.cloud_id in gone:
            store.deleted(row.id)
    if gone:
        say(f"  removed {', '.join(gone)}")


def _release(name: str, region: str, members: list[Member], provider: Provider, store: Store) -> None:
    from gpuprov.cloud.providers.base import CloudResource

    allocations = {m.allocation_id for m in members if m.allocation_id}
    for row in store.resources(name, region=region, kind="address"):
        if row.cloud_id in allocations:
            with contextlib.suppress(NotFound), destroy.take_back(name, "up --nodes"):  # already gone
                destroy.remove(provider, CloudResource("address", row.cloud_id or "", region, name),
                               settle=settle_window())
            store.deleted(row.id)


def _contact_all(plan: Plan, opts: launch.UpOptions, copts: ClusterOptions, members: list[Member], key_path: str,
                 provider: Provider, store: Store, say: Say, result: ClusterResult,
                 layout: ClusterLayout, rec: tl.Recorder) -> list[Member]:
    """SSH to every node (host key pinned per node) and bootstrap it, all at once; failed nodes are dropped
    when --min-nodes allows, else the cluster fails. Each node is a row of the timeline's phase."""
    from gpuprov.hosts.fanout import run_parallel

    name, region = opts.name, plan.request.region
    if opts.bootstrap:
        store.update_node(name, state=NodeState.BOOTSTRAPPING)
        plan = with_efa_step(plan, layout)

    def one(m: Member) -> str | None:
        node_opts = replace(opts, name=f"{name}.{m.rank}")

        def tell(line: str) -> None:
            say(f"[node {m.rank}] {line}")

        start = rec.now()
        try:
            if opts.bootstrap:
                bootstrap_launched(plan, node_opts, key_path, m.address or "", tell)
            else:
                pin_host_key(node_opts, key_path, m.address or "", tell)
        except GpuprovError as exc:
            rec.row(f"node {m.rank} ({m.instance_id})", start, "failed", str(exc))
            return str(exc)
        rec.row(f"node {m.rank} ({m.instance_id})", start, "ok")
        return None

    errors = run_parallel(members, one, parallel=len(members))
    failed = [m for m, err in zip(members, errors, strict=True) if err is not None]
    if failed:
        _drop_or_fail(copts, len(members) + len(result.dropped), [m.rank for m in failed],
                      {m.rank: str(err) for m, err in zip(members, errors, strict=True) if err is not None}, result, say)
        _terminate(name, region, [m.instance_id for m in failed], provider, store, say)
        _release(name, region, failed, provider, store)
        members = [m for m in members if m not in failed]
        _record(store, name, members, state=NodeState.BOOTSTRAPPING if opts.bootstrap else NodeState.RUNNING)
    return members


def as_cluster(name: str, node: Node, members: list[Member], user: str, key_path: str) -> cluster.Cluster:
    """The launched cluster in the form `bootstrap --cluster` records (gpuprov/cluster/): the same `NAME`/`NAME:K`,
    `exec`, `torchrun` and `check --cluster` then work on it. Each node is reached at its connect address with
    the cluster's pinned keys; the others know it by its private address (MASTER_ADDR = node 0's, the hostfile);
    GPUs per node are the instance type's, from the catalog."""
    from gpuprov import cluster
    from gpuprov.hosts import sshconfig
    from gpuprov.plan import catalog

    gpus = catalog.load().instance_type(node.instance_type).gpus if node.instance_type and node.provider == "aws" \
        else node.gpu_count or 0  # another cloud's type is in its own catalog; the record keeps its GPUs a node
    known = str(sshconfig.node_known_hosts(name))
    nodes = [cluster.ClusterHost(host=m.address or "", user=user, key=key_path, known_hosts=known,
                                 address=m.private_ip or m.address or "", gpus=gpus, instance_type=node.instance_type)
             for m in members]
    return cluster.Cluster(name=name, master_addr=nodes[0].address, master_port=cluster.DEFAULT_PORT, members=nodes,
                           node=name)


def wire(name: str, node: Node, members: list[Member], user: str, key_path: str, say: Say) -> cluster.Cluster:
    """Record the cluster and write /etc/gpuprov/cluster.env and hostfile on every node (ranks as they are
    after any drop); a node that cannot be wired fails the `up`, as a failed bootstrap does."""
    from gpuprov import cluster
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.hosts.sshconfig import node_known_hosts

    wired = as_cluster(name, node, members, user, key_path)
    say(f"wiring {wired.nnodes} nodes as cluster {name}: MASTER_ADDR={wired.master_addr}, "
        f"{wired.nproc_per_node()} process(es) a node")
    settings = HostSettings(known_hosts=node_known_hosts(name), connect_timeout=15)
    failed = [r for r in cluster.install(wired, settings, parallel=len(members)) if r.outcome == "failed"]
    if failed:
        raise GpuprovError("wiring the cluster failed: " + "; ".join(f"{r.target.name}: {r.error}" for r in failed))
    return wired


def _merge_known_hosts(name: str, members: list[Member]) -> None:
    """Each node's pinned key, gathered into the cluster's own known_hosts (what `ssh gpuprov-NAME` uses)."""
    from gpuprov.hosts import sshconfig

    sshconfig.merge_known_hosts(name, [f"{name}.{m.rank}" for m in members])
