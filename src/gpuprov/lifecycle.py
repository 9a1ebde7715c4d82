"""up / down / status / gc: ties the plan, a provider, bootstrap, verify and local state together.

up, in order (validation first, so bad input creates nothing):
  plan -> offerings + image (read-only) -> node row -> key pair + security group -> launch with
  failover (type x zone x market, cheapest first, AWS's code printed per attempt) -> running ->
  SSH up, host key pinned for this node -> bootstrap + verify -> ready -> ssh config entry.
Any failure or Ctrl-C before `ready` tears down everything the node got, so a failed `up`
costs nothing. A crash (SIGKILL) leaves state rows and tags that `down NAME` and `gc` follow.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.plan import Plan
from gpuprov.providers.base import SHARED, CloudResource, Instance, LaunchError, LaunchRequest, Market, Provider
from gpuprov.state import Node, Store

if TYPE_CHECKING:
    from gpuprov.inventory import Target
    from gpuprov.remote import HostSettings

Say = Callable[[str], None]

# EC2 vCPU quotas per family and market (gpu-stack-facts §5e)
QUOTAS = {
    ("P", "on-demand"): ("L-417A185B", "Running On-Demand P instances"),
    ("G", "on-demand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("P", "spot"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("G", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
}


@dataclass(frozen=True)
class UpOptions:
    name: str
    fallback_on_demand: bool = False
    max_price: float | None = None
    disk_gb: int = 100
    image: str | None = None
    ssh_cidr: str | None = None
    connect: str = "public"  # or "private" (VPN / bastion users)
    subnet: str | None = None
    ssh_user: str = "ubuntu"
    bootstrap: bool = True
    ssh_timeout: float = 600.0
    reboot_timeout: float = 600.0
    verbose_echo: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Candidate:
    instance_type: str
    zone: str
    market: Market
    price_usd_hour: float | None


@dataclass
class Attempt:
    candidate: Candidate
    code: str
    message: str


@dataclass
class UpResult:
    node: Node
    instance: Instance
    address: str
    attempts: list[Attempt] = field(default_factory=list)
    ssh_alias: str | None = None
    bootstrap: object | None = None  # bootstrap.HostResult when the playbook ran


class QuotaExceeded(GpuprovError):
    pass


def owner() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def check_name(name: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,38}", name):
        raise UserInputError("NAME", f"{name!r} is not a node name", "lowercase letters, digits and '-', up to 39")
    return name


def new_name() -> str:
    return f"node-{uuid.uuid4().hex[:6]}"


def ssh_cidr(given: str | None, lookup: Callable[[], str] | None = None) -> str:
    """The caller's address as /32 (or what the user gave); never the whole internet by default."""
    if given:
        try:
            return str(ipaddress.ip_network(given, strict=False))
        except ValueError:
            raise UserInputError("--ssh-cidr", f"{given!r} is not a CIDR", "e.g. 203.0.113.7/32") from None
    try:
        address = (lookup or _public_ip)()
        return str(ipaddress.ip_network(f"{address}/32"))
    except (OSError, ValueError):
        raise UserInputError("--ssh-cidr", "could not learn this machine's public IP address",
                             "pass --ssh-cidr <your address>/32 (SSH is opened to that only)") from None


def _public_ip() -> str:
    import urllib.request

    with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=5) as reply:
        return str(reply.read().decode().strip())


def candidates(plan: Plan, offerings: dict[str, list[str]], spot: bool, fallback_on_demand: bool,
               zone: str | None = None) -> list[Candidate]:
    """Every (instance type, zone, market) to try, in order: spot first (all types and zones,
    cheapest type first), then on-demand only with the fallback. Pure, so the order is testable."""
    markets: list[Market] = ["spot", "on-demand"] if spot and fallback_on_demand else ["spot"] if spot else ["on-demand"]
    found = []
    for market in markets:
        for it in plan.candidates:
            for z in offerings.get(it.name, []):
                if zone is None or z == zone:
                    found.append(Candidate(it.name, z, market, it.price_usd_hour))
    return found


def _quota_error(attempt: Attempt, plan: Plan, provider: Provider, region: str) -> QuotaExceeded:
    from gpuprov import catalog

    it = catalog.load().instance_type(attempt.candidate.instance_type)
    code, title = QUOTAS[(it.family, attempt.candidate.market)]
    current = provider.quota(region, code)
    now = f"; its current value is {current:g} vCPUs" if current is not None else ""
    return QuotaExceeded(
        f"{attempt.code}: {attempt.message}\n  AWS counts GPU quotas in vCPUs: {it.name} needs {it.vcpu}. Raise "
        f"'{title}' ({code}) in {region}{now}:\n  aws service-quotas request-service-quota-increase --service-code ec2 "
        f"--quota-code {code} --desired-value {it.vcpu} --region {region}"
    )


def up(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say) -> UpResult:
    region = plan.request.region
    name = check_name(opts.name)
    asked = plan.guards.autostop_seconds is not None or plan.guards.ttl_seconds is not None or plan.guards.on_interrupt
    if asked and not opts.bootstrap:  # the spot watcher alone is implied by --spot: it is simply not installed
        raise UserInputError("--no-bootstrap", "--autostop, --ttl and --on-interrupt are installed by the bootstrap",
                             "drop --no-bootstrap, or drop those options")
    if store.find_node(name) and store.node(name).live:
        raise UserInputError("NAME", f"a node called {name!r} already exists", f"pick another name, or `gpuprov down {name}`")
    cidr = ssh_cidr(opts.ssh_cidr)
    offerings = provider.offerings(region, [c.name for c in plan.candidates])
    vpc, subnet_zone = provider.network(region, opts.subnet)
    order = candidates(plan, offerings, plan.request.spot, opts.fallback_on_demand, subnet_zone)
    if not order:
        where = f"zone {subnet_zone}" if subnet_zone else region
        raise UserInputError("--region", f"no instance type with {plan.count}× {plan.gpu.name if plan.gpu else '?'} "
                             f"is offered in {where}", "try us-east-1 or us-west-2, or another --gpu")
    image = opts.image or provider.image(region, plan.request.os)

    market = "spot" if plan.request.spot else "on-demand"
    store.create_node(name, provider.name, region, gpu=plan.gpu.name if plan.gpu else None, gpu_count=plan.count,
                      market=market, owner=owner(), plan_json=_plan_json(plan), ssh_user=opts.ssh_user,
                      pid=os.getpid(), host=socket.gethostname(), autostop_seconds=plan.guards.autostop_seconds,
                      ttl_seconds=plan.guards.ttl_seconds, on_interrupt=plan.guards.on_interrupt)
    store.event(name, "up", f"launching {plan.count}× {plan.gpu.name if plan.gpu else ''} in {region}")
    try:
        return _launch_and_bootstrap(plan, opts, provider, store, say, order, image, vpc, cidr)
    except BaseException as exc:  # failure or Ctrl-C before `ready`: take back everything, then re-raise
        say(f"{type(exc).__name__ if isinstance(exc, KeyboardInterrupt) else 'failed'}: removing what {name} got")
        store.update_node(name, state="failed", state_reason=str(exc)[:500])
        _teardown(name, region, provider, store, say)
        raise


def _launch_and_bootstrap(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say,
                          order: list[Candidate], image: str, vpc: str, cidr: str) -> UpResult:
    name, region = opts.name, plan.request.region
    say(f"key pair and security group (SSH from {cidr} only)")
    access = provider.prepare(name, region, vpc, opts.subnet, cidr)
    attempts: list[Attempt] = []
    instance = None
    for i, cand in enumerate(order):
        token = f"gpuprov-{name}-{i}-{uuid.uuid4().hex[:12]}"
        say(f"asking for {cand.instance_type} in {cand.zone} ({cand.market})")
        try:
            instance = provider.launch(LaunchRequest(
                node=name, region=region, zone=cand.zone, instance_type=cand.instance_type, market=cand.market,
                image_id=image, access=access, disk_gb=opts.disk_gb, client_token=token, max_price=opts.max_price))
        except LaunchError as exc:
            attempt = Attempt(cand, exc.code, exc.message)
            attempts.append(attempt)
            say(f"  {exc.code}: {exc.message}")
            store.event(name, "launch-refused", f"{cand.instance_type} {cand.zone} {cand.market}: {exc.code}")
            if exc.kind == "quota":
                raise _quota_error(attempt, plan, provider, region) from None
            if exc.kind != "capacity":
                raise GpuprovError(f"AWS refused the launch: {exc.code}: {exc.message}") from None
            continue
        store.update_node(name, instance_type=cand.instance_type, zone=cand.zone, market=cand.market,
                          price_usd_hour=cand.price_usd_hour)
        break
    if instance is None:
        tried = "; ".join(f"{a.candidate.instance_type}/{a.candidate.zone}/{a.candidate.market}: {a.code}" for a in attempts)
        hint = "" if opts.fallback_on_demand or not plan.request.spot else " (add --fallback on-demand to try on-demand too)"
        raise GpuprovError(f"no capacity anywhere it was asked for{hint}: {tried}")

    say(f"{instance.id} launched; waiting for it to run")
    instance = provider.wait_running(region, instance.id, timeout=opts.ssh_timeout)
    address = instance.private_ip if opts.connect == "private" else instance.public_ip
    if not address:
        raise GpuprovError(f"{instance.id} has no {opts.connect} address; use --connect private (VPN/bastion) "
                           "or a subnet that assigns public IPs")
    store.update_node(name, state="running", address=address, zone=instance.zone)
    result = UpResult(store.node(name), instance, address, attempts)
    if opts.bootstrap:
        # the guard steps run first, so the node's TTL deadline is a few seconds after this one
        ttl = plan.guards.ttl_seconds
        store.update_node(name, state="bootstrapping", ttl_deadline=time.time() + ttl if ttl is not None else None)
        result.bootstrap = _bootstrap(plan, opts, access.key_path, address, say)
    store.update_node(name, state="ready", ready_at=time.time())
    from gpuprov import sshconfig

    result.ssh_alias = sshconfig.add_node(name, address, opts.ssh_user, access.key_path)
    result.node = store.node(name)
    store.event(name, "ready", f"{instance.instance_type} {instance.zone} {address}")
    return result


def _bootstrap(plan: Plan, opts: UpOptions, key_path: str, address: str, say: Say) -> object:
    from gpuprov import bootstrap as engine
    from gpuprov import sshconfig
    from gpuprov.inventory import Target
    from gpuprov.remote import HostSettings

    say(f"waiting for SSH on {address}")
    _wait_tcp(address, 22, opts.ssh_timeout)
    known_hosts = sshconfig.node_known_hosts(opts.name)
    known_hosts.unlink(missing_ok=True)  # a new machine: a key pinned for an old one at this address is void
    # We launched this machine moments ago and cannot learn its key first: trust on first use, pinned per node.
    settings = HostSettings(known_hosts=known_hosts, accept_new_host_key=True, connect_timeout=15)
    target = Target(host=address, user=opts.ssh_user, key=key_path, label=opts.name)
    say("bootstrapping: " + ", ".join(s.name for s in plan.steps))
    options = engine.Options(reboot_timeout=opts.reboot_timeout, echo=opts.verbose_echo)
    (result,) = engine.bootstrap([target], settings, lambda _t, _f: plan, options, reporter=_StepLines(say))
    if result.status not in ("ok", "changed"):
        raise GpuprovError(f"bootstrap {result.summary}: {result.error} (log: {result.log_path})")
    return result


class _StepLines:
    """Bootstrap progress as one line per finished step."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.last = ""

    def event(self, host: str, step: str, state: str) -> None:
        line = f"  {step}: {state}"
        if step and state != "running" and step not in ("connect", "upload") and line != self.last:
            self.say(line)
            self.last = line


def _wait_tcp(address: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address, port), timeout=3).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise GpuprovError(f"SSH on {address}:{port} did not answer within {timeout:.0f}s") from None
            time.sleep(1)


def _plan_json(plan: Plan) -> str:
    import json

    return json.dumps(plan.summary())


def _teardown(name: str, region: str, provider: Provider, store: Store, say: Say) -> list[str]:
    store.update_node(name, state="terminating")
    removed = provider.terminate(name, region)
    for what in removed:
        say(f"  removed {what}")
    if not [n for n in store.nodes() if n.region == region and n.name != name and n.state != "terminating"]:
        provider.release_key(region)
    from gpuprov import sshconfig

    sshconfig.remove_node(name)
    store.update_node(name, state="terminated", ended_at=time.time())
    store.event(name, "down", ", ".join(removed) or "nothing left to remove")
    return removed


def down(names: Sequence[str], provider: Provider, store: Store, say: Say) -> dict[str, list[str]]:
    """Terminate each node and remove everything it owns; idempotent (an already-gone node is fine)."""
    nodes = [store.node(n) for n in names]
    return {n.name: _teardown(n.name, n.region, provider, store, say) for n in nodes}


def orphans(regions: Sequence[str], provider: Provider, store: Store) -> list[CloudResource]:
    """Resources tagged as this user's that no live local node owns (a node whose `up` crashed owns nothing)."""
    alive = [n for n in store.nodes() if not n.crashed]
    live = {n.name for n in alive}
    regions_in_use = {n.region for n in alive}
    found = []
    for region in regions:
        for res in provider.tagged(region):
            owned = res.node in live or (res.node == SHARED and region in regions_in_use)
            if not owned:
                found.append(res)
    return found


def gc(found: list[CloudResource], provider: Provider, store: Store, say: Say) -> None:
    order = {"instance": 0, "spot-request": 1, "volume": 2, "security-group": 3, "key-pair": 4}
    for res in sorted(found, key=lambda r: order.get(r.kind, 9)):
        provider.delete(res)
        say(f"deleted {res.kind} {res.id} ({res.region}, node {res.node})")
    for node in store.nodes():
        if node.crashed:  # its resources are gone now; so is the node
            for r in store.resources(node.name):
                store.deleted(r.id)
            store.update_node(node.name, state="terminated", state_reason="its `up` crashed; collected by gc",
                              ended_at=time.time())
            from gpuprov import sshconfig

            sshconfig.remove_node(node.name)


def set_autostop(name: str, seconds: int | None, store: Store, target: Target, settings: HostSettings, say: Say) -> str:
    """Change a running node's autostop window (None: off) over SSH, then record it locally.

    Runs the same `autostop` step the bootstrap runs, rendered with the new window: it rewrites
    /etc/gpuprov/autostop.conf and enables or disables gpuprov-autostop.timer. Returns its result.
    """
    import shlex

    from gpuprov.plan import autostop_script
    from gpuprov.remote import Remote

    node = store.node(name)
    if node.state not in ("ready", "running", "bootstrapping"):
        raise UserInputError("NAME", f"{name} is {node.state}", "autostop changes a running node")
    script = autostop_script(seconds)
    path = f"/tmp/gpuprov-autostop-{uuid.uuid4().hex[:12]}.sh"
    remote = Remote(target, settings)
    remote.open()
    try:
        remote.put_bytes(script.text.encode(), path)
        result = remote.run(f"bash {shlex.quote(path)}; rc=$?; rm -f {shlex.quote(path)}; exit $rc", sudo=True)
    finally:
        remote.close()
    lines = result.stdout.strip().splitlines()
    if not result.ok or not lines or not lines[-1].startswith("GPUPROV_RESULT="):
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise GpuprovError(f"{name}: the autostop step failed (exit {result.exited}): {tail}")
    store.update_node(name, autostop_seconds=seconds)
    from gpuprov.spec import format_duration

    store.event(name, "autostop", f"autostop {format_duration(seconds)}")
    say(f"{name}: autostop {'off' if seconds is None else 'after ' + format_duration(seconds) + ' idle'}")
    return lines[-1].split("=", 1)[1]


def refresh(store: Store, provider: Provider) -> list[Node]:
    """Update live nodes from the cloud: one batched describe per region."""
    nodes = store.nodes()
    for region in sorted({n.region for n in nodes}):
        by_node = {i.node: i for i in provider.describe(region) if i.node}
        for n in nodes:
            if n.region != region or n.state in ("terminating",):
                continue
            inst = by_node.get(n.name)
            if (inst is None or inst.state == "terminated") and n.state in ("ready", "running", "bootstrapping"):
                store.update_node(n.name, state="interrupted" if n.market == "spot" else "gone",
                                  state_reason=inst.state_reason if inst else "instance no longer exists")
    return store.nodes()
