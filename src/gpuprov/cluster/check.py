"""`gpuprov check NAME --cluster`: prove the cluster's fabric before a training job finds out.

1. Connectivity, with real data: every node listens (templates/cluster_net.py.j2) on MASTER_PORT and
   on a few free ports sampled from its ephemeral range; every other node connects to each, sends
   random bytes and compares the echo. Why those ports: torchrun's static rendezvous serves its
   c10d store on MASTER_PORT; NCCL's bootstrap and socket transport listen on ports the kernel picks
   (they bind port 0, i.e. net.ipv4.ip_local_port_range; NCCL has no setting to choose them:
   github.com/NVIDIA/nccl/issues/388 and /680), so a firewall must let the nodes reach each other on
   that whole range. A dropped port is named with its node and what to open.
2. A torch.distributed all-reduce across all GPUs (templates/allreduce_probe.py.j2 under torchrun,
   NCCL with NCCL_DEBUG=INFO): algorithm and bus bandwidth per message size, judged by `judge_allreduce`
   against the interconnect the catalog expects (EFA types) or the NIC's line rate, with the usual
   causes named (EFA not used, the wrong interface, placement).

`judge_connectivity` names per blocked port the node, its sources, timeout or refused, and the security-group or
firewall fix (and MASTER_PORT in use). The all-reduce probe runs from `$(mktemp -d /tmp/gpuprov-allreduce.XXXXXXXXXX)/
probe.py` on each node, never a guessable /tmp name; `parse_allreduce` reads NCCL's output, `expectation` is the
catalog's `interconnect.efa_gbps` for the EC2 type, else the NIC's speed from /sys/class/net, and `judge_allreduce`
names sums that are wrong, EFA not used, NCCL on another interface, bus bandwidth under the floor.
3. On the trays of a GB200/GB300 NVL72 (`Cluster.imex`), IMEX: each node's daemon state as `nvidia-imex-ctl -q`
   prints it (READY when the node has joined the domain), judged by `judge_imex`.
cli/cluster_report.py draws the tables.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import secrets
import shlex
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from gpuprov.cluster import Cluster
from gpuprov.errors import GpuprovError
from gpuprov.hosts.access import LineSink
from gpuprov.hosts.fanout import run_parallel
from gpuprov.hosts.remote import HostSettings, Remote
from gpuprov.hosts.verify import Check
from gpuprov.plan.inventory import Target

_LISTEN, _SERVED, _CONNECT, _ALLREDUCE = "GPUPROV_LISTEN ", "GPUPROV_SERVED ", "GPUPROV_CONNECT ", "GPUPROV_ALLREDUCE "


# --- 1. connectivity ---------------------------------------------------------------------------


class Listener(BaseModel):
    """What one node listened on, and its interface on the cluster's network."""

    ports: list[int]
    busy: list[int] = []
    range: tuple[int, int]
    interface: str | None = None
    speed_mbps: int | None = None


class PortResult(BaseModel):
    src: int  # rank that connected
    dst: int  # rank that listened
    port: int
    outcome: str  # ok | mismatch | timeout | refused | unreachable | error: ...
    seconds: float = 0.0


class NetReport(BaseModel):
    master_port: int
    listeners: list[Listener | None]  # per rank; None: the node's listener never started
    results: list[PortResult]
    errors: list[str | None]  # per rank: why the node could not take part


def _script(name: str, **context: object) -> str:
    from gpuprov.plan.render import environment

    return environment().get_template(name).render(**context)


def _python(script: str, *args: str) -> str:
    """Run a rendered Python script on the node without a file: `python3 -c` of its text."""
    blob = base64.b64encode(script.encode()).decode()
    code = f"import base64;exec(compile(base64.b64decode('{blob}'),'gpuprov-probe','exec'))"
    return shlex.join(["python3", "-c", code, *args])


def _tagged(text: str, tag: str) -> str | None:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(tag):
            return line[len(tag):]
    return None


def connectivity(cluster: Cluster, settings: HostSettings, *, sample: int = 4, timeout: float = 3.0,
                 payload: int = 4096) -> NetReport:
    """Listeners on every node, then every node connects to every other's ports; real bytes each way."""
    n = cluster.nnodes
    targets = cluster.targets()
    remotes = [Remote(t, settings) for t in targets]
    errors: list[str | None] = [None] * n
    listeners: list[Listener | None] = [None] * n
    ready = [threading.Event() for _ in range(n)]
    net = _script("cluster_net.py.j2")
    seconds = 2 * timeout + 60.0  # a listener outlives the connects; they end it sooner through `stop_file`
    stop_file = f"/tmp/gpuprov-net-stop-{secrets.token_hex(6)}"

    def open_one(rank: int) -> None:
        try:
            remotes[rank].open()
        except GpuprovError as exc:
            errors[rank] = str(exc)

    run_parallel(list(range(n)), open_one, n)

    def serve(rank: int) -> None:
        if errors[rank]:
            ready[rank].set()
            return

        def line(text: str) -> None:
            if text.startswith(_LISTEN):
                listeners[rank] = Listener.model_validate_json(text[len(_LISTEN):])
                ready[rank].set()

        spec = {"master_port": cluster.master_port, "sample": sample, "expect": (n - 1) * (sample + 1),
                "seconds": seconds, "address": cluster.members[rank].address, "stop": stop_file}
        sink = LineSink(line)
        try:
            result = remotes[rank].run(_python(net, "listen", json.dumps(spec)), out=sink, err=LineSink(lambda _: None),
                                       timeout=seconds + 30)
            if not result.ok and listeners[rank] is None:
                errors[rank] = f"the network probe exited {result.exited}: {result.stderr.strip()[-200:]}"
        except GpuprovError as exc:
            errors[rank] = errors[rank] or str(exc)
        finally:
            sink.close()
            ready[rank].set()

    servers = [threading.Thread(target=serve, args=(k,), daemon=True) for k in range(n)]
    for t in servers:
        t.start()
    for k in range(n):
        ready[k].wait(timeout=60)

    def probe(rank: int) -> list[PortResult]:
        if errors[rank] or listeners[rank] is None:
            return []
        peers = [{"node": k, "address": cluster.members[k].address, "ports": listener.ports}
                 for k, listener in enumerate(listeners) if k != rank and listener is not None]
        spec = {"peers": peers, "timeout": timeout, "bytes": payload}
        try:
            out = remotes[rank].run(_python(net, "connect", json.dumps(spec)), timeout=timeout * 4 + 30).stdout
        except GpuprovError as exc:
            errors[rank] = str(exc)
            return []
        found = _tagged(out, _CONNECT)
        if found is None:
            errors[rank] = "the network probe printed no result"
            return []
        return [PortResult(src=rank, dst=r["node"], port=r["port"], outcome=r["outcome"], seconds=r["seconds"])
                for r in json.loads(found)]

    results = [r for rs in run_parallel(list(range(n)), probe, n) for r in rs]

    def release(rank: int) -> None:  # every node has connected: the listeners may stop waiting
        if not errors[rank]:
            with contextlib.suppress(GpuprovError):
                remotes[rank].run(f"touch {stop_file}")

    run_parallel(list(range(n)), release, n)
    for t in servers:
        t.join(timeout=seconds + 40)
    for remote in remotes:
        remote.close()
    return NetReport(master_port=cluster.master_port, listeners=listeners, results=results, errors=errors)


def _firewall_fix(node: str, address: str, ports: str) -> str:
    return (f"let the other nodes reach {node} ({address}) on TCP {ports}: on AWS, an inbound rule on the nodes' "
            f"security group allowing all traffic from the group itself (self-referencing); on the host, find the "
            f"rule that drops it with `sudo iptables -S INPUT` or `sudo nft list ruleset` (ufw: `sudo ufw allow from "
            f"<the nodes' subnet>`)")


def judge_connectivity(cluster: Cluster, report: NetReport) -> list[Check]:
    """One finding per node that took no part, per blocked port of a node, per master port in use."""
    checks: list[Check] = []
    name = cluster.name
    for rank, error in enumerate(report.errors):
        if error:
            checks.append(Check(name=f"{name}:{rank} reachable", ok=False, detail=error,
                                fix="fix SSH to the node first (gpuprov doctor / gpuprov ssh)"))
    for rank, listener in enumerate(report.listeners):
        if listener and listener.busy:
            checks.append(Check(
                name=f"{name}:{rank} port {report.master_port}", ok=False,
                detail=f"MASTER_PORT {report.master_port} is already in use on {name}:{rank} (a job still running?)",
                fix=f"stop what listens there (`sudo ss -ltnp 'sport = :{report.master_port}'`), or rewire with "
                    f"bootstrap --cluster {name} --master-port PORT"))
    bad: dict[tuple[int, int], list[PortResult]] = {}
    for r in report.results:
        if r.outcome != "ok":
            bad.setdefault((r.dst, r.port), []).append(r)
    for (dst, port), failures in sorted(bad.items()):
        member = cluster.members[dst]
        listener = report.listeners[dst]
        what = ("MASTER_PORT, torchrun's rendezvous" if port == report.master_port else
                f"a sampled port of its ephemeral range {listener.range[0]}-{listener.range[1]}, where NCCL's "
                f"sockets listen" if listener else "an NCCL port")
        outcomes = sorted({f.outcome for f in failures})
        how = ("no answer within the timeout: dropped by a firewall or security group" if outcomes == ["timeout"] else
               "refused: a firewall rejects it" if outcomes == ["refused"] else ", ".join(outcomes))
        sources = ", ".join(f"{name}:{f.src}" for f in failures)
        ports = (str(port) if port == report.master_port or listener is None
                 else f"{report.master_port} and {listener.range[0]}-{listener.range[1]}")
        checks.append(Check(name=f"{name}:{dst} TCP {port}", ok=False,
                            detail=f"{name}:{dst} ({member.address}) TCP {port} ({what}) from {sources}: {how}",
                            fix=_firewall_fix(f"{name}:{dst}", member.address, ports)))
    if not checks:
        pairs = cluster.nnodes * (cluster.nnodes - 1)
        sampled = max((len(x.ports) - 1 for x in report.listeners if x), default=0)
        checks.append(Check(name="node to node", ok=True,
                            detail=f"{pairs} node pairs exchanged data on MASTER_PORT {report.master_port} and "
                                   f"{sampled} sampled ephemeral ports each; every echo matched"))
    return checks


# --- 2. the all-reduce -------------------------------------------------------------------------


class SizeResult(BaseModel):
    bytes: int
    seconds: float
    algbw_gbs: float
    busbw_gbs: float


class AllReduce(BaseModel):
    """What the probe printed (rank 0), and the NCCL lines every node printed."""

    backend: str
    world: int
    nnodes: int
    nproc_per_node: int
    correct: bool
    nccl: str | None = None
    host: str | None = None
    results: list[SizeResult]
    nccl_lines: list[str] = []


class FabricExpectation(BaseModel):
    """What the interconnect between nodes should carry (the judge's yardstick)."""

    fabric: str  # "efa" or "tcp"
    line_rate_gbs: float | None  # GB/s per node; None: unknown
    source: str
    unverified: str | None = None
    min_fraction: float = 0.25
    interface: str | None = None  # the node's interface on the cluster's network


def parse_allreduce(outputs: Sequence[str]) -> AllReduce:
    """The probe's result line (from whichever node printed it) and every NCCL INFO/WARN line."""
    found = next((t for t in (_tagged(o, _ALLREDUCE) for o in outputs) if t), None)
    if found is None:
        tail = " | ".join(line for o in outputs for line in o.strip().splitlines()[-2:])
        raise GpuprovError(f"the all-reduce probe printed no result: {tail[-400:]}")
    data = json.loads(found)
    data["nccl_lines"] = [line.strip() for o in outputs for line in o.splitlines() if "NCCL INFO" in line
                          or "NCCL WARN" in line]
    return AllReduce.model_validate(data)


_NETWORK = re.compile(r"NCCL INFO Using network (\S+(?: \S+)?)")
_BOOTSTRAP = re.compile(r"NCCL INFO (?:Bootstrap|NET/Socket) ?: Using \[?\d*\]?([A-Za-z0-9_.:-]+?):([0-9a-fA-F.:]+)")


def transport(report: AllReduce) -> str | None:
    """The network NCCL says it used between nodes ("Using network X"): "Socket", "IB", or EFA through the
    AWS OFI NCCL plugin ("AWS Libfabric", "Libfabric"; or its "NET/OFI Selected Provider is efa")."""
    for line in report.nccl_lines:
        m = _NETWORK.search(line)
        if m:
            return m.group(1).strip()
        if re.search(r"NET/OFI Selected [Pp]rovider is efa", line):
            return "AWS Libfabric"
    return None


def uses_efa(network: str | None) -> bool:
    return network is not None and "Libfabric" in network


def interfaces(report: AllReduce) -> set[str]:
    return {m.group(1) for line in report.nccl_lines if (m := _BOOTSTRAP.search(line))}


def _size(n: int) -> str:
    for unit, step in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= step:
            return f"{n / step:g} {unit}"
    return f"{n} B"


def judge_allreduce(cluster_name: str, report: AllReduce, expect: FabricExpectation) -> list[Check]:
    checks: list[Check] = []
    largest = max(report.results, key=lambda r: r.bytes) if report.results else None
    checks.append(Check(
        name="all-reduce sums", ok=report.correct,
        detail=(f"{report.world} ranks on {report.nnodes} nodes ({report.backend}"
                f"{', NCCL ' + report.nccl if report.nccl else ''}): every rank got the sum" if report.correct else
                f"{report.world} ranks on {report.nnodes} nodes: a rank got a wrong sum from the all-reduce"),
        fix=None if report.correct else "a GPU or link corrupts data: run `gpuprov check` on each node, "
                                        "then NCCL's all_reduce_perf with -c 1 to find the rank"))
    if report.nnodes < 2:
        return checks
    used = transport(report)
    if expect.fabric == "efa" and used is not None and not uses_efa(used):
        checks.append(Check(
            name="EFA in use", ok=False,
            detail=f"the instance type has EFA but NCCL used its {used} transport between the nodes",
            fix="install the EFA software and the AWS OFI NCCL plugin (aws-ofi-nccl) on every node, check "
                "`fi_info -p efa` lists the EFA devices, launch with the EFA interfaces, and allow all traffic "
                "within the security group (EFA needs the self-referencing rule, inbound and outbound)"))
    wrong = sorted(interfaces(report) - {expect.interface}) if expect.interface else []
    if wrong:
        checks.append(Check(
            name="NCCL interface", ok=False,
            detail=f"NCCL's sockets used {', '.join(wrong)}, not {expect.interface} (the interface of the cluster's "
                   "addresses)",
            fix=f"add NCCL_SOCKET_IFNAME=={expect.interface} to /etc/gpuprov/cluster.env on every node (NCCL's "
                "environment variables: docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)"))
    if largest is not None and expect.line_rate_gbs:
        floor = expect.min_fraction * expect.line_rate_gbs
        ok = largest.busbw_gbs >= floor
        checks.append(Check(
            name="bus bandwidth", ok=ok, severity="warn" if expect.unverified else "fail",
            detail=f"{largest.busbw_gbs:.3g} GB/s bus bandwidth at {_size(largest.bytes)}; the {expect.fabric.upper()} "
                   f"line rate is {expect.line_rate_gbs:g} GB/s per node ({expect.source}), the floor "
                   f"{expect.min_fraction:.0%} of it" + (f" [unverified: {expect.unverified}]" if expect.unverified else ""),
            fix=None if ok else "far below the fabric: check NCCL used the fast network (NCCL_DEBUG=INFO: 'Using "
                                "network'), NCCL_SOCKET_IFNAME names the interface of the cluster's addresses, and "
                                "the nodes share a placement group (AWS: a cluster placement group in one zone)"))
    return checks


def expectation(cluster: Cluster, net: NetReport | None) -> FabricExpectation:
    """EFA's rate from the catalog for an EC2 type the catalog lists there; else the NIC's line rate as
    the nodes report it (/sys/class/net/IFACE/speed, the slowest node); else unknown (not judged)."""
    from gpuprov.plan import catalog

    fabric = catalog.load().interconnect
    listeners = [x for x in (net.listeners if net else []) if x]
    interface = listeners[0].interface if listeners else None
    types = {m.instance_type for m in cluster.members}
    kind = next(iter(types)) if len(types) == 1 else None
    if kind and kind in fabric.efa_gbps:
        return FabricExpectation(fabric="efa", line_rate_gbs=fabric.efa_gbps[kind] / 8, source=fabric.efa_source,
                                 unverified=fabric.efa_unverified, min_fraction=fabric.min_fraction, interface=interface)
    speeds = [x.speed_mbps for x in listeners if x.speed_mbps]
    return FabricExpectation(fabric="tcp", line_rate_gbs=min(speeds) / 8000 if speeds else None,
                             source="the NIC's link speed, /sys/class/net/IFACE/speed",
                             unverified=fabric.min_fraction_unverified, min_fraction=fabric.min_fraction, interface=interface)


def allreduce(cluster: Cluster, settings: HostSettings, *, sizes: Sequence[int], iterations: int = 10,
              env_path: str = "/opt/gpuprov/env", timeout: float = 120.0,
              emit: Callable[[Target, str, str], None] | None = None) -> tuple[AllReduce | None, str | None]:
    """Run the probe under torchrun on every node; (report, None) or (None, why not)."""
    from gpuprov.cluster.run import run_on_nodes, torchrun_command

    probe = _script("allreduce_probe.py.j2", sizes=list(sizes), iterations=iterations, timeout=timeout)
    blob = base64.b64encode(probe.encode()).decode()
    targets = cluster.targets()
    outputs: dict[str, list[str]] = {t.name: [] for t in targets}
    lock = threading.Lock()

    def collect(target: Target, stream: str, line: str) -> None:
        with lock:
            outputs[target.name].append(line)
        if emit:
            emit(target, stream, line)

    # the probe goes into a folder mktemp makes on each node (its own random name, 0700, made or failed): a
    # fixed or guessable /tmp name written with `>` lets anyone on the node plant a link there first
    command = ("gp_probe_dir=$(mktemp -d /tmp/gpuprov-allreduce.XXXXXXXXXX) && trap 'rm -rf -- \"$gp_probe_dir\"' EXIT "
               f"&& printf %s {blob} | base64 -d > \"$gp_probe_dir/probe.py\" && "
               "export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET && ")
    commands = [command + torchrun_command(cluster, k, [], env_path, replace_shell=False,
                                           script_word='"$gp_probe_dir/probe.py"') for k in range(cluster.nnodes)]
    stop = threading.Event()
    timer = threading.Timer(timeout + 60, stop.set)  # a hung rendezvous or collective is stopped, not waited on
    timer.start()
    try:
        results = run_on_nodes(targets, commands, settings, collect, stop, grace=5.0)
    finally:
        timer.cancel()
    texts = ["\n".join(outputs[t.name]) for t in targets]
    try:
        return parse_allreduce(texts), None
    except GpuprovError as exc:
        failed = [f"{r.target.name}: exit {r.exit_code}" for r in results if r.exit_code != 0]
        return None, f"{exc}" + (f" ({', '.join(failed)})" if failed else "")


def parse_sizes(text: str) -> list[int]:
    """'64K,1M,256M,1G' -> bytes."""
    from gpuprov.errors import UserInputError

    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = []
    for word in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:IB|B)?\s*", word.upper())
        if not m or int(m.group(1)) == 0:
            raise UserInputError("--sizes", f"{word!r} is not a message size", "e.g. 1M,64M,256M,1G")
        sizes.append(int(m.group(1)) * units[m.group(2)])
    return sizes


# --- 3. IMEX (GB200/GB300 NVL72 trays) --------------------------------------------------------------

# The IMEX daemon's states, as DCGM reads them from `nvidia-imex-ctl -q` (dcgm_fields.h, DCGM_FI_IMEX_DAEMON_STATUS,
# read 2026-12-03); READY is the one a job needs (the DRA driver and public health checks compare with it).
IMEX_STATES = ("INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY", "INIT_GPU",
               "READY", "SHUTTING_DOWN", "UNAVAILABLE")
IMEX_QUERY = "nvidia-imex-ctl -q"


def imex_states(cluster: Cluster, settings: HostSettings, parallel: int = 32) -> list[str]:
    """Each node's answer to `nvidia-imex-ctl -q` (its last line), or why there was none."""
    def ask(target: Target) -> str:
        remote = Remote(target, settings)
        try:
            remote.open()
            result = remote.run(IMEX_QUERY, sudo=True)
        except GpuprovError as exc:
            return f"unreachable: {exc}"
        finally:
            remote.close()
        lines = (result.stdout.strip() or result.stderr.strip() or f"exit {result.exited}").splitlines()
        return lines[-1].strip()

    return run_parallel(cluster.targets(), ask, parallel)


def judge_imex(cluster: Cluster, states: Sequence[str]) -> list[Check]:
    """One finding per node whose IMEX daemon is not READY; one passing line when all are."""
    name = cluster.name
    fix = (f"on that node: `sudo systemctl status nvidia-imex`, `sudo journalctl -u nvidia-imex`; every node's "
           f"/etc/nvidia-imex/nodes_config.cfg must list the same addresses (`gpuprov bootstrap --cluster {name} …` "
           "rewrites them), and the nodes must reach each other on TCP 50000 (IMEX's SERVER_PORT)")
    checks = [Check(name=f"{name}:{rank} IMEX", ok=False,
                    detail=f"{name}:{rank} IMEX daemon: {state}" + (
                        "" if state in IMEX_STATES else f" (not a state `{IMEX_QUERY}` reports)"), fix=fix)
              for rank, state in enumerate(states) if state != "READY"]
    return checks or [Check(name="IMEX", ok=True, detail=f"IMEX READY on all {len(states)} nodes ({IMEX_QUERY})")]


@dataclass
class ClusterCheck:
    cluster: Cluster
    net: NetReport
    net_checks: list[Check]
    allreduce: AllReduce | None = None
    allreduce_error: str | None = None
    allreduce_checks: list[Check] = field(default_factory=list)
    expectation: FabricExpectation | None = None
    imex_checks: list[Check] = field(default_factory=list)  # on NVL72 trays only

    @property
    def checks(self) -> list[Check]:
        return self.net_checks + self.imex_checks + self.allreduce_checks

    @property
    def ok(self) -> bool:
        from gpuprov.hosts.verify import passed

        return passed(self.checks)


def check_cluster(cluster: Cluster, settings: HostSettings, *, sizes: Sequence[int], sample: int = 4,
                  timeout: float = 3.0, run_allreduce: bool = True, env_path: str = "/opt/gpuprov/env",
                  allreduce_timeout: float = 120.0) -> ClusterCheck:
    net = connectivity(cluster, settings, sample=sample, timeout=timeout)
    result = ClusterCheck(cluster, net, judge_connectivity(cluster, net))
    if cluster.imex:
        result.imex_checks = judge_imex(cluster, imex_states(cluster, settings))
    if not run_allreduce:
        return result
    if not all(c.ok for c in result.net_checks):
        result.allreduce_error = "skipped: the nodes cannot reach each other on every port (fix that first)"
        result.allreduce_checks = [Check(name="all-reduce", ok=False, detail=result.allreduce_error,
                                         fix="see the connectivity findings above")]
        return result
    report, error = allreduce(cluster, settings, sizes=sizes, env_path=env_path, timeout=allreduce_timeout)
    result.expectation = expectation(cluster, net)
    if report is None:
        result.allreduce_error = error
        result.allreduce_checks = [Check(name="all-reduce", ok=False, detail=error or "no result",
                                         fix="run it by hand to see NCCL's words: gpuprov torchrun "
                                             f"{cluster.name} -- your_script.py, with NCCL_DEBUG=INFO")]
        return result
    result.allreduce = report
    result.allreduce_checks = judge_allreduce(cluster.name, report, result.expectation)
    return result
