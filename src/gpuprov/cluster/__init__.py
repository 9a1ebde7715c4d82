"""Clusters of existing hosts: the model, its record, and the wiring each node gets.

A cluster is a name with its ordered members; member k is node k (NODE_RANK k), member 0 the
rendezvous master. `gpuprov bootstrap --cluster NAME HOST...` bootstraps the hosts as usual, then
runs `wire()` as a separate pass, because every node's files depend on facts from all of them:

  discover   per node: the address SSH reached it at (the server half of $SSH_CONNECTION, the node's
             own interface address even behind NAT) and its GPUs (the bootstrap's facts command)
  master     MASTER_ADDR = the source address node 0 uses toward node 1 (`ip route get`): the address
             the others reach node 0 at on the network they share. `--master-addr` overrides it;
             a one-node cluster uses the address SSH reached it at.
  addresses  node k > 0 appears in the hostfile under the source address it uses toward MASTER_ADDR
  write      one rendered step per node (templates/cluster_wiring.sh.j2): /etc/gpuprov/cluster.env and
             /etc/gpuprov/hostfile under ${GPUPROV_SYSROOT:-}, replaced only when they differ; on the
             trays of a GB200/GB300 NVL72 (`Cluster.imex`) also NVIDIA's IMEX service at the driver's
             version, its node list (/etc/nvidia-imex/nodes_config.cfg: every node's address), started

The record (state/sqlite.py's clusters table, this module's JSON) is written before the files, so a
failed write can be rerun and `ssh NAME:k`, `exec NAME`, `torchrun NAME`, `check NAME --cluster`
all name the same nodes in the same order.

The part works on hosts, whoever made them, so `bootstrap --cluster` and `up --nodes` share it; it sits on hosts/
and never calls a cloud. Here: the pydantic `Cluster` (name, MASTER_ADDR/PORT, ordered `Member`s: how gpuprov
reaches each, its address on the cluster's network, GPUs, EC2 type) and its record (`node` names the launched node
of an `up --nodes` cluster, None for existing hosts; `forget` removes it); `resolve` (`NAME` = every node, `NAME:K`
= node K; a recorded cluster name wins over `HOST:PORT`); `env_command` (a command with the node's cluster.env
exported, and /etc/gpuprov/efa.env where the `efa` step wrote it: cluster.env cannot include it, systemd reads it
as an EnvironmentFile); `install`, the record and files for a cluster whose addresses are already known (`up
--nodes`). run.py is `gpuprov torchrun`, check.py `check --cluster`.

The files: cluster.env holds GPUPROV_CLUSTER, MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, NPROC_PER_NODE (values
shell-quoted and validated before rendering: a name `[a-z0-9-]`, IP addresses, integers); hostfile holds
`ADDRESS slots=GPUS` per node (DeepSpeed's and Open MPI's format); both 0644, so the login user can source them.
`exec NAME`/`NAME:K` sources cluster.env (and efa.env) before the command; `torchrun` passes the flags explicitly
from the record and sources both too. A launched cluster gets the same files: MASTER_ADDR and the hostfile carry
EC2's private addresses, NPROC_PER_NODE the instance type's GPUs. No file is written unless every node answered.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.hosts.fanout import run_parallel
from gpuprov.hosts.remote import HostSettings, Remote
from gpuprov.plan.inventory import Target

if TYPE_CHECKING:
    from gpuprov.state import Store

DEFAULT_PORT = 29500  # torch.distributed's default MASTER_PORT (torchrun --master-port)
ENV_PATH = "/etc/gpuprov/cluster.env"
HOSTFILE_PATH = "/etc/gpuprov/hostfile"
EFA_ENV_PATH = "/etc/gpuprov/efa.env"  # written by the `efa` step on EFA instance types (cloud/cluster_network.py)
# NVLink across compute trays (GB200/GB300 NVL72) needs IMEX (NVIDIA's IMEX guide, Deployment Models; AWS
# ParallelCluster's cookbook starts nvidia-imex on p6e-gb200 only): its node list, one address a line
IMEX_GPUS = ("GB200", "GB300")
IMEX_TYPES = ("p6e-gb200.", "p6e-gb300.")
IMEX_NODES_PATH = "/etc/nvidia-imex/nodes_config.cfg"
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_WORD = re.compile(r"(?P<name>[a-z0-9][a-z0-9-]{0,62})(?::(?P<rank>[0-9]+))?")


class ClusterHost(BaseModel):
    """One host of a recorded cluster: how gpuprov reaches it, and what the others know it by (a launched
    cluster's instances are state's `Member` records; cloud/cluster_up.as_cluster makes these of them)."""

    host: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    proxy_jump: str | None = None
    known_hosts: str | None = None
    address: str  # the node's address on the cluster's network (hostfile, MASTER_ADDR for node 0)
    gpus: int = Field(ge=0)
    instance_type: str | None = None  # on EC2, from IMDSv2 (the all-reduce judge's EFA expectation)
    gpu: str | None = None  # the GPU's model from the node's facts (GB200: the trays of an NVL72 need IMEX)

    def target(self, cluster: str, rank: int) -> Target:
        return Target(host=self.host, user=self.user, port=self.port, key=self.key, proxy_jump=self.proxy_jump,
                      known_hosts=self.known_hosts, label=f"{cluster}:{rank}")


class Cluster(BaseModel):
    name: str
    master_addr: str
    master_port: int = Field(ge=1, le=65535)
    members: list[ClusterHost]
    node: str | None = None  # the launched node (`up NAME --nodes N`) this cluster is; None: existing hosts

    @property
    def nnodes(self) -> int:
        return len(self.members)

    @property
    def imex(self) -> bool:
        """The nodes are compute trays of a GB200/GB300 NVL72 (by their GPU, or EC2's p6e UltraServer types): NVLink
        between trays goes through NVIDIA's IMEX service, which needs every node's address (nodes_config.cfg)."""
        return any((m.gpu or "") in IMEX_GPUS or (m.instance_type or "").startswith(IMEX_TYPES) for m in self.members)

    def nproc_per_node(self) -> int:
        """GPUs per node: torchrun starts the same number of processes on every node, so the smallest
        count (at least 1: a CPU-only node still runs one process)."""
        return max(1, min(m.gpus for m in self.members))

    def env(self, rank: int) -> list[tuple[str, str]]:
        """cluster.env of node `rank`, in file order."""
        return [
            ("GPUPROV_CLUSTER", self.name),
            ("MASTER_ADDR", self.master_addr),
            ("MASTER_PORT", str(self.master_port)),
            ("NNODES", str(self.nnodes)),
            ("NODE_RANK", str(rank)),
            ("NPROC_PER_NODE", str(self.nproc_per_node())),
        ]

    def hostfile(self) -> list[tuple[str, int]]:
        """(address, slots) per node in rank order; slots = the node's GPUs (1 for a CPU-only node)."""
        return [(m.address, max(1, m.gpus)) for m in self.members]

    def target(self, rank: int) -> Target:
        return self.members[rank].target(self.name, rank)

    def targets(self) -> list[Target]:
        return [self.target(k) for k in range(self.nnodes)]


# --- names and the record --------------------------------------------------------------------


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise UserInputError("--cluster", f"{name!r} is not a cluster name",
                             "lower-case letters, digits and '-', starting with a letter or digit, e.g. train-a")
    return name


def check_not_a_node(name: str) -> str:
    """Nodes and clusters share one namespace: with a node and a cluster both called NAME, `exec/ssh/check NAME`
    would reach the cluster and `down NAME` the node. A node's name is refused for a cluster, naming the node."""
    from gpuprov.paths import state_folder
    from gpuprov.state.url import configured

    if configured() is None and not (state_folder() / "state.sqlite").exists():
        return name
    node = _store().find_node(name)
    if node is not None and node.live:
        raise UserInputError("--cluster", f"{name!r} is already a node's name (gpuprov status {name})",
                             "pick another cluster name: nodes and clusters share one namespace")
    return name


def _store() -> Store:
    from gpuprov.state import open_store

    return open_store()


def load(name: str) -> Cluster | None:
    """The recorded cluster called `name`, or None (no state file, or no such cluster)."""
    from gpuprov.paths import state_folder

    if not _NAME.fullmatch(name) or not (state_folder() / "state.sqlite").exists():
        return None
    text = _store().cluster_json(name)
    return Cluster.model_validate_json(text) if text else None


def save(cluster: Cluster) -> None:
    _store().save_cluster(cluster.name, cluster.model_dump_json())


def forget(name: str) -> bool:
    """Remove the record of cluster `name` (its nodes' files stay); False when there was none."""
    from gpuprov.paths import state_folder

    if not (state_folder() / "state.sqlite").exists():
        return False
    return _store().delete_cluster(name)


def names() -> list[str]:
    from gpuprov.paths import state_folder

    if not (state_folder() / "state.sqlite").exists():
        return []
    return list(_store().cluster_names())


@dataclass(frozen=True)
class Named:
    """What a word on the command line named: a whole cluster (rank None) or one of its nodes."""

    cluster: Cluster
    rank: int | None

    def targets(self) -> list[Target]:
        return self.cluster.targets() if self.rank is None else [self.cluster.target(self.rank)]


def resolve(word: str) -> Named | None:
    """`NAME` (every node) or `NAME:K` (node K) when NAME is a recorded cluster; None otherwise, so the
    word goes on to be a node or a host (`HOST:PORT` has the same shape: a cluster name wins)."""
    match = _WORD.fullmatch(word)
    if not match:
        return None
    cluster = load(match.group("name"))
    if cluster is None:
        return None
    if match.group("rank") is None:
        return Named(cluster, None)
    rank = int(match.group("rank"))
    if rank >= cluster.nnodes:
        raise UserInputError("NODE", f"cluster {cluster.name} has nodes 0..{cluster.nnodes - 1}, not {rank}",
                             f"e.g. {cluster.name}:0 (the master) or {cluster.name}:{cluster.nnodes - 1}")
    return Named(cluster, rank)


def env_command(command: str) -> str:
    """`command` run with the node's cluster.env exported (a missing file fails, naming it), and the
    NCCL/libfabric settings of the `efa` step (/etc/gpuprov/efa.env) too where that file exists. cluster.env
    cannot include efa.env itself: systemd reads it as an EnvironmentFile, which has no include."""
    root = '"${GPUPROV_SYSROOT:-}"'
    efa = f"{root}{EFA_ENV_PATH}"
    return f"set -a && . {root}{ENV_PATH} && {{ [ ! -f {efa} ] || . {efa}; }} && set +a && {command}"


# --- discovery and wiring --------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFacts:
    ssh_address: str  # the node's own address that SSH reached (server half of $SSH_CONNECTION)
    gpus: int
    instance_type: str | None = None
    gpu: str | None = None  # the first GPU's model (gpuprov's name: GB200)


def _ip(text: str, what: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise GpuprovError(f"{what}: {text!r} is not an IP address") from None


def check_master_addr(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise UserInputError("--master-addr", f"{text!r} is not an IP address",
                             "give node 0's address on the network the nodes share, e.g. 10.0.1.17") from None


def discover(remote: Remote) -> NodeFacts:
    from gpuprov.hosts.detect import FACTS_COMMAND, parse_facts

    conn = remote.run("printf '%s\\n' \"${SSH_CONNECTION:-}\"").stdout.split()
    if len(conn) != 4:
        raise GpuprovError(f"{remote.target.name}: the SSH server did not say which address it was reached at "
                           "($SSH_CONNECTION is empty); pass --master-addr")
    facts = parse_facts(remote.run(FACTS_COMMAND, sudo=True).stdout)
    return NodeFacts(_ip(conn[2], f"{remote.target.name}: $SSH_CONNECTION"), len(facts.gpus), facts.instance_type,
                     facts.gpus[0] if facts.gpus else None)


_SRC = re.compile(r"\bsrc\s+(\S+)")


def source_address(remote: Remote, toward: str) -> str | None:
    """The address this node sends from toward `toward` (`ip route get`), None when it has no route."""
    result = remote.run(f"ip route get {toward}")
    found = _SRC.search(result.stdout)
    return _ip(found.group(1), f"{remote.target.name}: ip route get {toward}") if result.ok and found else None


def plan_cluster(name: str, targets: Sequence[Target], facts: Sequence[NodeFacts], master_addr: str,
                 addresses: Sequence[str], port: int, key: str | None = None) -> Cluster:
    """The record: each member as reached (its key, or the run's -i, so later commands need no -i)."""
    from pathlib import Path

    key = str(Path(key).expanduser().resolve()) if key else None
    members = [ClusterHost(host=t.host, user=t.user, port=t.port, key=t.key or key, proxy_jump=t.proxy_jump,
                      known_hosts=t.known_hosts, address=a, gpus=f.gpus, instance_type=f.instance_type, gpu=f.gpu)
               for t, f, a in zip(targets, facts, addresses, strict=True)]
    return Cluster(name=name, master_addr=master_addr, master_port=port, members=members)


def render(cluster: Cluster, rank: int) -> str:
    """The wiring step for node `rank` (a self-contained step script, result protocol as every step)."""
    from gpuprov.plan.render import STATE_DIR, environment

    return environment().get_template("cluster_wiring.sh.j2").render(
        cluster=cluster, rank=rank, env=cluster.env(rank), hostfile=cluster.hostfile(),
        imex_nodes=[m.address for m in cluster.members] if cluster.imex else [], imex_path=IMEX_NODES_PATH,
        step_name="cluster-wiring", state_dir=STATE_DIR)


@dataclass
class WireResult:
    target: Target
    outcome: str  # "changed", "unchanged", "failed"
    error: str | None = None


def wire(name: str, targets: Sequence[Target], settings: HostSettings, *, master_addr: str | None = None,
         port: int = DEFAULT_PORT, parallel: int = 32) -> tuple[Cluster | None, list[WireResult]]:
    """Discover, record and write the cluster's files on every node. No file is written unless every
    node answered discovery (a cluster with a missing node is no cluster)."""
    check_name(name)
    remotes = [Remote(t, settings) for t in targets]
    try:
        def look(remote: Remote) -> NodeFacts | str:
            try:
                remote.open()
                return discover(remote)
            except GpuprovError as exc:
                return str(exc)

        found = run_parallel(remotes, look, parallel)
        failed = [WireResult(r.target, "failed", f) for r, f in zip(remotes, found, strict=True) if isinstance(f, str)]
        if failed:
            return None, failed
        facts = [f for f in found if isinstance(f, NodeFacts)]
        master = master_addr or facts[0].ssh_address
        if master_addr is None and len(remotes) > 1:
            master = source_address(remotes[0], facts[1].ssh_address) or facts[0].ssh_address

        def own(index: int) -> str:
            if index == 0:
                return master
            return source_address(remotes[index], master) or facts[index].ssh_address

        addresses = run_parallel(list(range(len(remotes))), own, parallel)
        cluster = plan_cluster(name, targets, facts, master, addresses, port, settings.key_filename)
        save(cluster)
        return cluster, _write(cluster, remotes, parallel)
    finally:
        for remote in remotes:
            remote.close()


def install(cluster: Cluster, settings: HostSettings, parallel: int = 32) -> list[WireResult]:
    """Record a cluster whose addresses are already known (a launched one: EC2 said them) and write
    every node's files; the record comes first, as in `wire`."""
    save(cluster)
    remotes = [Remote(t, settings) for t in cluster.targets()]
    try:
        return _write(cluster, remotes, parallel)
    finally:
        for remote in remotes:
            remote.close()


def _write(cluster: Cluster, remotes: Sequence[Remote], parallel: int) -> list[WireResult]:
    def write(index: int) -> WireResult:
        script = render(cluster, index)
        blob = base64.b64encode(script.encode()).decode()
        try:
            if not remotes[index].conn.is_connected:  # wire's are open from discovery; install's are not
                remotes[index].open()
            result = remotes[index].run(f"printf %s {blob} | base64 -d | bash", sudo=True)
        except GpuprovError as exc:
            return WireResult(cluster.target(index), "failed", str(exc))
        if not result.ok:
            last = (result.stderr.strip().splitlines() or [f"exit {result.exited}"])[-1]
            return WireResult(cluster.target(index), "failed", last)
        outcome = "changed" if "GPUPROV_RESULT=changed" in result.stdout else "unchanged"
        return WireResult(cluster.target(index), outcome)

    return run_parallel(list(range(len(remotes))), write, parallel)
