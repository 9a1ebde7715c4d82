"""up / down / status / gc: ties the plan, a provider, bootstrap, verify and local state together.

up, in order (validation first, so bad input creates nothing):
  plan -> offerings + network + image (read-only) -> node row -> key pair + security group ->
  launch with failover (type x zone x market, cheapest first, under the price cap, AWS's code
  printed per attempt; cloud/failover.py orders, providers/aws_refusals.py says what each refusal
  means) -> running -> SSH up, host key pinned for this node -> bootstrap + verify -> ready ->
  ssh config entry.
Every resource is recorded here, in the state store, before the provider is asked to create it.
Any failure or Ctrl-C before `ready` tears down everything the node got (cloud/teardown.py), so a
failed `up` costs nothing. A crash (SIGKILL) leaves rows and tags that `down NAME` and `gc` follow.
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

from gpuprov.cloud import keys
from gpuprov.cloud import timeline as tl
from gpuprov.cloud.failover import Candidate, Order, candidates, default_cap
from gpuprov.cloud.providers.base import (
    SHARED,
    Access,
    CloudResource,
    Instance,
    LaunchError,
    LaunchRequest,
    Market,
    Network,
    NotFound,
    Provider,
)
from gpuprov.cloud.teardown import SETTLE_SECONDS, Teardown, settle, teardown
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.plan.plan import Plan
from gpuprov.state import Node, Store

if TYPE_CHECKING:
    from gpuprov.hosts import bootstrap as engine
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target

Say = Callable[[str], None]

@dataclass(frozen=True)
class UpOptions:
    name: str
    fallback_on_demand: bool = False
    max_price: float | None = None  # spot: the most to pay per hour
    max_hourly: float | None = None  # failover never picks a type whose list price is above this
    disk_gb: int = 100
    image: str | None = None
    ssh_cidr: str | None = None  # None: the caller's public address /32 (or the VPC's CIDR with --connect private)
    connect: str = "public"  # or "private" (VPN / bastion users)
    subnet: str | None = None
    ssh_user: str = "ubuntu"
    bootstrap: bool = True
    wait: bool = True  # wait for SSH and pin the host key (off: return once the instance runs)
    ssh_timeout: float = 600.0
    reboot_timeout: float = 600.0
    step_silence: float | None = 1200.0  # a step silent this long: the node is lost (bootstrap.Options)
    verbose_echo: Callable[[str], None] | None = None


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
    timeline: tl.Timeline | None = None


class QuotaExceeded(GpuprovError):
    pass


class TeardownIncomplete(GpuprovError):
    """Some of a node's resources could not be removed (yet); rerunning `down` finishes the job."""

    def __init__(self, results: Sequence[Teardown]) -> None:
        self.results = list(results)
        lines = [f"  {r.node}: {what}" for r in results for what in r.left]
        names = " ".join(r.node for r in results)
        super().__init__("could not remove everything; still there:\n" + "\n".join(lines) +
                         f"\n  the nodes stay listed; rerun: gpuprov down {names}")


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
    if given is not None:
        try:
            if not given.strip():
                raise ValueError(given)
            return str(ipaddress.ip_network(given.strip(), strict=False))
        except ValueError:
            raise UserInputError("--ssh-cidr", f"{given!r} is not a CIDR",
                                 "e.g. 203.0.113.7/32 or 2001:db8::7/128; leave it out for your public address") from None
    try:
        address = ipaddress.ip_address((lookup or _public_ip)())
        return str(ipaddress.ip_network(f"{address}/{address.max_prefixlen}"))
    except (OSError, ValueError):
        raise UserInputError("--ssh-cidr", "could not learn this machine's public IP address",
                             "pass --ssh-cidr <your address>/32 (SSH is opened to that only)") from None


def _public_ip() -> str:
    import urllib.request

    with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=5) as reply:
        return str(reply.read().decode().strip())


def check_options(plan: Plan, opts: UpOptions) -> None:
    """Refuse option combinations that cannot mean what the user wants, before anything is asked of AWS."""
    spot = plan.request.spot
    from gpuprov.cloud.images import check_spec

    check_spec(opts.image)
    if opts.ssh_cidr is not None:
        ssh_cidr(opts.ssh_cidr)  # a malformed CIDR is refused before anything else
    if opts.max_price is not None and opts.max_price <= 0:
        raise UserInputError("--max-price", f"{opts.max_price:g} is not a price", "a spot price in $/h above 0, or leave it out")
    if opts.max_hourly is not None and opts.max_hourly <= 0:
        raise UserInputError("--max-hourly", f"{opts.max_hourly:g} is not a price", "$/h above 0, e.g. 5")
    if not spot and opts.max_price is not None:
        raise UserInputError("--max-price", "applies to spot requests only", "add --spot, or drop --max-price")
    if not spot and opts.fallback_on_demand:
        raise UserInputError("--fallback", "on-demand fallback applies to spot requests only",
                             "add --spot, or drop --fallback")
    asked = plan.guards.autostop_seconds is not None or plan.guards.ttl_seconds is not None or plan.guards.on_interrupt
    if asked and not opts.bootstrap:  # the spot watcher alone is implied by --spot: it is simply not installed
        raise UserInputError("--no-bootstrap", "--autostop, --ttl, --budget and --on-interrupt are installed by the "
                             "bootstrap", "drop --no-bootstrap, or drop those options")
    if opts.bootstrap and not opts.wait:
        raise UserInputError("--no-wait", "the bootstrap needs SSH", "add --no-bootstrap, or drop --no-wait")


def _quota_error(attempt: Attempt, provider: Provider, region: str, also: str = "") -> QuotaExceeded:
    from gpuprov.cloud.quotas import increase_command, quota_for
    from gpuprov.plan import catalog

    it = catalog.load().instance_type(attempt.candidate.instance_type)
    q = quota_for(it.name, attempt.candidate.market)
    head = f"{attempt.code}: {attempt.message}"
    if q is None:
        return QuotaExceeded(f"{head}\n  AWS counts GPU quotas in vCPUs: {it.name} needs {it.vcpu}{also}")
    current = provider.quota(region, q.code)
    now = f"; its current value is {current:g} vCPUs" if current is not None else ""
    unverified = f"\n  (unverified: {q.unverified})" if q.unverified else ""
    return QuotaExceeded(
        f"{head}\n  AWS counts GPU quotas in vCPUs: {it.name} needs {it.vcpu}. Raise '{q.name}' ({q.code}) in "
        f"{region}{now}:\n  {increase_command(q, region, current, it.vcpu)}{unverified}{also}")


@dataclass(frozen=True)
class Launchpad:
    """What every `up` (one node or a cluster) settles before it records anything: the checked name, the
    network, SSH's CIDR, the candidates in order and the image."""

    name: str
    region: str
    network: Network
    cidr: str
    order: Order
    image: str
    image_line: str  # "baked NAME ami-…", "ubuntu ami-…" (the timeline's words)


def launchpad(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say) -> Launchpad:
    """Checks and look-ups shared by `up` and `up --nodes`; nothing is created or recorded here."""
    region = plan.request.region
    name = check_name(opts.name)
    check_options(plan, opts)
    if store.find_node(name) and store.node(name).live:
        raise UserInputError("NAME", f"a node called {name!r} already exists", f"pick another name, or `gpuprov down {name}`")
    cidr = None if opts.ssh_cidr is None and opts.connect == "private" else ssh_cidr(opts.ssh_cidr)
    offerings = provider.offerings(region, [c.name for c in plan.candidates])
    network = provider.network(region, opts.subnet)
    cap = opts.max_hourly if opts.max_hourly is not None else default_cap(plan)
    order = candidates(plan, offerings, plan.request.spot, opts.fallback_on_demand, network.zone, cap)
    for skip in order.skipped:
        say(f"skipping {skip.instance_type}: {skip.reason}")
    if not order.candidates:
        where = f"zone {network.zone}" if network.zone else region
        if order.skipped:
            raise UserInputError("--max-hourly", f"every instance type with {plan.count}× "
                                 f"{plan.gpu.name if plan.gpu else '?'} offered in {where} is over the price cap",
                                 f"raise --max-hourly (now ${cap:.2f}/h)")
        raise UserInputError("--region", f"no instance type with {plan.count}× {plan.gpu.name if plan.gpu else '?'} "
                             f"is offered in {where}", "try us-east-1 or us-west-2, or another --gpu")
    if cidr is None:
        cidr = network.vpc_cidr
        say(f"SSH will be open to the VPC's CIDR {cidr} (--connect private without --ssh-cidr)")
    from gpuprov.cloud.images import choose

    chosen = choose(plan, opts.image, provider)  # a baked image of this stack, else Ubuntu (or --image)
    say(chosen.line())
    image = chosen.image_id or provider.image(region, plan.request.os)
    line = " ".join(w for w in (chosen.source, chosen.name, image) if w)
    return Launchpad(name, region, network, cidr, order, image, line)


def up(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say) -> UpResult:
    rec = tl.Recorder("up", opts.name)
    rec.phase(tl.CHECKS)
    pad = launchpad(plan, opts, provider, store, say)
    name, region, network, cidr, order, image = pad.name, pad.region, pad.network, pad.cidr, pad.order, pad.image
    rec.image = pad.image_line

    market = "spot" if plan.request.spot else "on-demand"
    store.create_node(name, provider.name, region, gpu=plan.gpu.name if plan.gpu else None, gpu_count=plan.count,
                      market=market, owner=owner(), plan_json=_plan_json(plan), ssh_user=opts.ssh_user,
                      pid=os.getpid(), host=socket.gethostname(), autostop_seconds=plan.guards.autostop_seconds,
                      ttl_seconds=plan.request.ttl_seconds, on_interrupt=plan.guards.on_interrupt,
                      spot_type=("persistent" if plan.request.persistent else "one-time") if plan.request.spot else None,
                      shutdown_action=plan.guards.shutdown_action, disk_gb=opts.disk_gb, connect=opts.connect,
                      budget_usd=plan.request.budget_usd)
    store.event(name, "up", f"launching {plan.count}× {plan.gpu.name if plan.gpu else ''} in {region}")
    try:
        done = _launch_and_bootstrap(plan, opts, provider, store, say, order, image, network, cidr, rec)
    except BaseException as exc:  # failure or Ctrl-C before `ready`: take back everything, then re-raise
        take_back(exc, name, region, provider, store, say, rec)
        raise
    done.timeline = kept_timeline(name, store, rec)
    return done


def take_back(exc: BaseException, name: str, region: str, provider: Provider, store: Store, say: Say,
              rec: tl.Recorder, what: str = "") -> None:
    """After a failed or interrupted `up` (a node's, or a cluster's: `what` says so): everything recorded comes
    down, the timeline keeps the failure and the teardown, and what could not be removed is named with the rerun."""
    say(f"{type(exc).__name__ if isinstance(exc, KeyboardInterrupt) else 'failed'}: removing what {name} got{what}")
    store.update_node(name, state="failed", state_reason=str(exc)[:500])
    rec.failed(str(exc) or type(exc).__name__)
    rec.phase(tl.TEARDOWN)
    result = _teardown(name, region, provider, store, say)
    kept_timeline(name, store, rec, "failed")
    for left in result.left:
        say(f"  still there: {left}")
    if result.left:
        say(f"  {name} stays listed; rerun: gpuprov down {name}")


def kept_timeline(name: str, store: Store, rec: tl.Recorder, outcome: tl.Outcome = "ok") -> tl.Timeline:
    """The finished timeline, stored as the node's last (`status NAME --timeline`)."""
    timeline = rec.finish(outcome)
    store.event(name, tl.EVENT_KIND, timeline.model_dump_json())
    return timeline


def _ensure_key_pair(provider: Provider, store: Store, region: str) -> keys.LocalKey:
    """This user's key pair in the region: imported once (serialised across processes), recorded first."""
    from gpuprov.paths import keys_dir

    me = owner()
    with keys.region_lock(keys_dir(), region):
        key = keys.local_key(keys_dir(), region, me)
        name = keys.key_name(me)
        rows = store.resources(None, region=region, kind="key-pair")
        # a key imported moments ago may not be visible yet: its fresh record is trusted
        if any(r.status == "created" and settle(r) > 0 for r in rows) or provider.key_pair_exists(region, name):
            if rows:
                return key
            provider.delete_key_pair(region, name)  # ours by name, from a lost local state: replace it with ours
        for r in rows:
            store.deleted(r.id)
        rid = store.intend(None, "key-pair", region, name)
        store.created(rid, provider.import_key_pair(region, name, key.public))
        return key


def _prepare(node: str, region: str, provider: Provider, store: Store, network: Network, cidr: str,
             public_ip: bool) -> Access:
    _ensure_key_pair(provider, store, region)
    group_name = f"gpuprov-{node}-{int(time.time())}"
    rid = store.intend(node, "security-group", region, group_name)
    group = provider.create_security_group(region, node, network.vpc_id, group_name, f"gpuprov node {node}: SSH from {cidr}")
    store.created(rid, group)
    provider.authorize_ssh(region, group, cidr, settle=SETTLE_SECONDS)
    return Access(key_name=keys.key_name(owner()), security_group_id=group, subnet_id=network.subnet_id,
                  public_ip=public_ip)


def _launch(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say, order: Order, image: str,
            access: Access, rec: tl.Recorder) -> tuple[Instance, list[Attempt]]:
    """Ask each candidate in turn; AWS's code per refusal, and what the refusal means decides what is next."""
    name, region = opts.name, plan.request.region
    attempts: list[Attempt] = []
    closed: set[Market] = set()
    for i, cand in enumerate(order.candidates):
        if cand.market in closed:
            continue
        token = f"gpuprov-{name}-{i}-{uuid.uuid4().hex[:12]}"
        say(f"asking for {cand.instance_type} in {cand.zone} ({cand.market})")
        rid = store.intend(name, "instance", region, token)
        asked = rec.now()
        try:
            instance = provider.launch(LaunchRequest(
                node=name, region=region, zone=cand.zone, instance_type=cand.instance_type, market=cand.market,
                image_id=image, access=access, disk_gb=opts.disk_gb, client_token=token, max_price=opts.max_price,
                persistent=plan.request.persistent and cand.market == "spot",
                shutdown_behavior=_shutdown_behavior(plan, cand.market)),
                settle=SETTLE_SECONDS)
        except LaunchError as exc:
            attempt = note_refusal(exc, cand, rid, asked, "", name, attempts, store, rec, say)
            go_on_after(exc, attempt, opts, closed, provider, region, say)
            continue
        store.created(rid, instance.id)
        rec.attempt(cand.instance_type, cand.zone, cand.market, asked)
        if instance.spot_request_id:
            store.add_resource(name, "spot-request", region, instance.spot_request_id)
        store.update_node(name, instance_type=cand.instance_type, zone=cand.zone, market=cand.market,
                          price_usd_hour=cand.price_usd_hour,
                          spot_type=("persistent" if plan.request.persistent else "one-time")
                          if cand.market == "spot" else None,
                          shutdown_action=_shutdown_behavior(plan, cand.market))
        return instance, attempts
    tried = "; ".join(f"{a.candidate.instance_type}/{a.candidate.zone}/{a.candidate.market}: {a.code}" for a in attempts)
    hint = "" if opts.fallback_on_demand or not plan.request.spot else " (add --fallback on-demand to try on-demand too)"
    raise GpuprovError(f"no capacity anywhere it was asked for{hint}: {tried}")


def note_refusal(exc: LaunchError, cand: Candidate, rid: int, asked: float, what: str, name: str,
                 attempts: list[Attempt], store: Store, rec: tl.Recorder, say: Say) -> Attempt:
    """AWS refused a candidate (one node, or a whole cluster: `what` is "N × "): the attempt in the list, the
    timeline, the output and the node's events. A refusal made nothing for its token, so its intent row goes; a
    transient error keeps it, and teardown asks EC2 by the token whether a launch went through."""
    if exc.then != "retry":
        store.deleted(rid)
    attempt = Attempt(cand, exc.code, exc.message)
    attempts.append(attempt)
    rec.attempt(cand.instance_type, cand.zone, cand.market, asked, exc.code, exc.message)
    say(f"  {exc.code}: {exc.message}")
    store.event(name, "launch-refused", f"{what}{cand.instance_type} {cand.zone} {cand.market}: {exc.code}")
    return attempt


def go_on_after(exc: LaunchError, attempt: Attempt, opts: UpOptions, closed: set[Market], provider: Provider,
                region: str, say: Say) -> None:
    """After AWS refused a candidate (one node or a whole cluster): return to go on with the next one (spot
    closed for the rest when AWS says so and --fallback on-demand allows it), or raise what stops the launch."""
    if exc.then == "next-candidate":
        return
    if exc.then == "next-market" and attempt.candidate.market == "spot" and opts.fallback_on_demand:
        closed.add("spot")
        say(f"  spot is closed to this account here ({exc.code}); going on with on-demand"
            + (f"\n  fix for spot: {exc.fix}" if exc.fix else ""))
        return
    fallback = ("\n  or add --fallback on-demand to go on with on-demand when spot is refused"
                if exc.then == "next-market" else "")
    if exc.quota:
        raise _quota_error(attempt, provider, region, fallback) from None
    fix = f"\n  fix: {exc.fix}" if exc.fix else ""
    raise GpuprovError(f"AWS refused the launch: {exc.code}: {exc.message}{fix}{fallback}") from None


def _shutdown_behavior(plan: Plan, market: Market) -> str:
    """The instance's InstanceInitiatedShutdownBehavior, i.e. what the guards' `shutdown` does: a one-time
    spot instance cannot stop; anything else follows --autostop-action, by default stop (disk kept)."""
    if market == "spot" and not plan.request.persistent:
        return "terminate"
    return plan.request.autostop_action or "stop"


def price_obtained(plan: Plan, provider: Provider, instance: Instance, list_price: float | None, say: Say) -> float | None:
    """What the node costs per hour: the spot price in its zone at launch, or the on-demand list price."""
    if instance.market != "spot":
        return list_price
    try:
        prices = provider.prices(plan.request.region, [instance.instance_type])
    except GpuprovError as exc:
        say(f"  could not read the spot price ({exc}); the budget uses the on-demand list price")
        return list_price
    here = [p.price for p in prices if p.zone == instance.zone and p.instance_type == instance.instance_type]
    if not here:
        say("  no spot price published for this zone; the budget uses the on-demand list price")
        return list_price
    return here[0]


def _launch_and_bootstrap(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say,
                          order: Order, image: str, network: Network, cidr: str, rec: tl.Recorder) -> UpResult:
    name, region = opts.name, plan.request.region
    public_ip = opts.connect == "public" and network.subnet_id is not None and not network.maps_public_ip
    say(f"key pair and security group (SSH from {cidr} only)")
    rec.phase(tl.ACCESS)
    access = _prepare(name, region, provider, store, network, cidr, public_ip)
    rec.phase(tl.CAPACITY)
    instance, attempts = _launch(plan, opts, provider, store, say, order, image, access, rec)

    say(f"{instance.id} launched; waiting for it to run")
    rec.phase(tl.RUNNING)
    instance = provider.wait_running(region, instance.id, timeout=opts.ssh_timeout, settle=SETTLE_SECONDS)
    for volume in instance.volume_ids:
        store.add_resource(name, "volume", region, volume)
    address = instance.private_ip if opts.connect == "private" else instance.public_ip
    if not address:
        raise GpuprovError(f"{instance.id} has no {opts.connect} address; use --connect private (VPN/bastion) "
                           "or a subnet that assigns public IPs")
    store.update_node(name, state="running", address=address, zone=instance.zone)
    result = UpResult(store.node(name), instance, address, attempts)
    from gpuprov.paths import keys_dir, region_key

    key_path = str(region_key(keys_dir(), region))
    action = store.node(name).shutdown_action
    if action != plan.guards.shutdown_action:  # spot fell back to on-demand: the guards say what it does now
        from gpuprov.plan.plan import replace_guards

        plan = replace_guards(plan, plan.guards.model_copy(update={"shutdown_action": action}))
    budget = plan.request.budget_usd
    if budget is not None:
        from gpuprov.plan.plan import replace_guards, with_budget

        node = store.node(name)
        price = price_obtained(plan, provider, instance, node.price_usd_hour, say)
        guards = with_budget(plan.guards.model_copy(update={"ttl_seconds": plan.request.ttl_seconds}), budget, price)
        plan = replace_guards(plan, guards)
        if price:
            hours = budget / price
            say(f"budget ${budget:g} at ${price:.4g}/h ({instance.market}): {hours:.1f}h, "
                f"enforced on the node")
            store.update_node(name, budget_price=price,
                              budget_deadline=time.time() + hours * 3600)
    if opts.bootstrap:
        # the guard steps run first, so the node's TTL deadline is a few seconds after this one
        ttl = plan.guards.ttl_seconds
        store.update_node(name, state="bootstrapping", ttl_deadline=time.time() + ttl if ttl is not None else None)
        result.bootstrap = _bootstrap(plan, opts, key_path, address, say, rec)
    elif opts.wait:
        rec.phase(tl.SSH)
        _pin_host_key(opts, key_path, address, say)
    store.update_node(name, state="ready", ready_at=time.time())
    if opts.wait:
        from gpuprov.hosts import sshconfig

        result.ssh_alias = sshconfig.add_node(name, address, opts.ssh_user, key_path)
    else:
        say("not waiting for SSH (--no-wait): the host key is not pinned, so `ssh gpuprov-NAME` is not set up")
    result.node = store.node(name)
    store.event(name, "ready", f"{instance.instance_type} {instance.zone} {address}")
    return result


def _first_contact(opts: UpOptions, key_path: str, address: str, say: Say) -> tuple[Target, HostSettings]:
    """Wait for SSH; the new machine's key is trusted on first use and pinned per node (we launched it
    moments ago and cannot learn its key first)."""
    from gpuprov.hosts import sshconfig
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target

    say(f"waiting for SSH on {address}")
    wait_tcp(address, 22, opts.ssh_timeout)
    known_hosts = sshconfig.node_known_hosts(opts.name)
    known_hosts.unlink(missing_ok=True)  # a new machine: a key pinned for an old one at this address is void
    settings = HostSettings(known_hosts=known_hosts, accept_new_host_key=True, connect_timeout=15)
    return Target(host=address, user=opts.ssh_user, key=key_path, label=opts.name), settings


def _pin_host_key(opts: UpOptions, key_path: str, address: str, say: Say) -> None:
    from gpuprov.hosts.remote import Remote

    target, settings = _first_contact(opts, key_path, address, say)
    deadline = time.monotonic() + opts.ssh_timeout
    while True:  # sshd can answer before cloud-init has installed the key: retry the login, bounded
        remote = Remote(target, settings)
        try:
            remote.open()
            remote.run("true")
            say(f"host key pinned for {opts.name}")
            return
        except GpuprovError:
            raise
        except Exception as exc:  # paramiko/Fabric raise many types for "not yet": retried, then reported
            if time.monotonic() > deadline:
                raise GpuprovError(f"SSH login to {address} failed: {exc}") from None
            time.sleep(2)
        finally:
            remote.close()


def _bootstrap(plan: Plan, opts: UpOptions, key_path: str, address: str, say: Say,
               rec: tl.Recorder | None = None) -> object:
    from gpuprov.hosts import bootstrap as engine

    rec = rec or tl.Recorder("up", opts.name)  # a cluster's node: the cluster's timeline has a row per node instead
    rec.phase(tl.SSH)
    target, settings = _first_contact(opts, key_path, address, say)
    say("bootstrapping: " + ", ".join(s.name for s in plan.steps))
    options = engine.Options(reboot_timeout=opts.reboot_timeout, step_silence=opts.step_silence,
                             echo=opts.verbose_echo)
    result = bootstrap_node(plan, target, settings, options, rec, say)
    if result.status not in ("ok", "changed"):
        raise GpuprovError(f"bootstrap {result.summary}: {result.error} (log: {result.log_path})")
    return result


def bootstrap_node(plan: Plan, target: Target, settings: HostSettings, options: engine.Options, rec: tl.Recorder,
                   say: Say) -> engine.HostResult:
    """A launched node's bootstrap (after `up` or `start`), its steps put on the timeline as they go."""
    from gpuprov.hosts import bootstrap as engine

    rec.phase(tl.BOOTSTRAP)
    (result,) = engine.bootstrap([target], settings, lambda _t, _f: plan, options,
                                 reporter=rec.reporter(StepLines(say)))
    rec.bootstrap_done(result.steps, {s.name for s in plan.steps if s.kind == "verify"},
                       None if result.status in ("ok", "changed") else result.error)
    return result


class StepLines:
    """Bootstrap progress as one line per finished step."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.last = ""

    def event(self, host: str, step: str, state: str) -> None:
        line = f"  {step}: {state}"
        if step and state != "running" and step not in ("connect", "upload") and line != self.last:
            self.say(line)
            self.last = line


def wait_tcp(address: str, port: int, timeout: float) -> None:
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


def _poll(provider: Provider) -> float:
    return float(getattr(provider, "poll", 1.0))


def _teardown(name: str, region: str, provider: Provider, store: Store, say: Say) -> Teardown:
    store.update_node(name, state="terminating")
    result = teardown(name, region, provider, store, say, poll=_poll(provider))
    if not result.complete:
        store.update_node(name, state_reason="teardown incomplete: " + "; ".join(result.left)[:500])
        store.event(name, "down-incomplete", "; ".join(result.left))
        return result
    _release_key_if_unused(region, provider, store, say)
    from gpuprov.hosts import sshconfig

    sshconfig.remove_node(name)
    if store.node(name).cluster_size:  # a launched cluster's record (`exec NAME`, `NAME:K`) goes with it
        from gpuprov import cluster

        cluster.forget(name)
    store.update_node(name, state="terminated", ended_at=time.time())
    store.event(name, "down", ", ".join(result.removed) or "nothing left to remove")
    return result


def _release_key_if_unused(region: str, provider: Provider, store: Store, say: Say) -> None:
    """The shared key pair goes with the region's last node (a crashed `up` does not count as a user)."""
    if [n for n in store.nodes() if n.region == region and n.state != "terminating" and not n.crashed]:
        return
    for row in store.resources(None, region=region, kind="key-pair"):
        try:
            provider.delete(CloudResource("key-pair", row.client_token or row.cloud_id or "", region, SHARED),
                            settle=settle(row))
        except NotFound:
            pass
        except GpuprovError as exc:
            say(f"  could not delete the key pair {row.client_token}: {exc} (`gpuprov gc` finds it)")
            continue
        store.deleted(row.id)


def down(names: Sequence[str], provider: Provider, store: Store, say: Say) -> dict[str, Teardown]:
    """Terminate each node and remove everything it owns; idempotent (an already-gone node is fine).
    Every node is tried; TeardownIncomplete afterwards names what is left of which."""
    nodes = [store.node(n) for n in names]
    results = {n.name: _teardown(n.name, n.region, provider, store, say) for n in nodes}
    return results


def orphans(regions: Sequence[str], provider: Provider, store: Store) -> list[CloudResource]:
    """What no live local node owns: the records of nodes whose `up` crashed, and resources tagged as
    this user's that no live node claims (another machine's lost state, say)."""
    alive = [n for n in store.nodes() if not n.crashed]
    live = {n.name for n in alive}
    regions_in_use = {n.region for n in alive}
    found: list[CloudResource] = []
    for node in store.nodes():
        if node.crashed and node.region in regions:  # the node itself: gc takes it down by its records
            found.append(CloudResource("node", node.name, node.region, node.name, f"its `up` crashed ({node.state})"))
            for r in store.resources(node.name, region=node.region):
                found.append(CloudResource(r.kind, r.cloud_id or f"(token {r.client_token})", r.region, node.name,
                                           "recorded"))
    seen = {r.id for r in found}
    from gpuprov.cloud import images

    for region in regions:
        tagged = provider.tagged(region)
        for res in tagged:
            if res.kind in ("image", "snapshot"):  # images outlive nodes: cloud/images.py says which are orphans
                continue
            owned = res.node in live or (res.node == SHARED and region in regions_in_use)
            if not owned and res.id not in seen:
                found.append(res)
        found += images.orphans(region, tagged, provider, store)
    return found


def gc(found: list[CloudResource], provider: Provider, store: Store, say: Say) -> list[str]:
    """Remove what `orphans` found: crashed nodes by their records (ids and tokens; tags may lag), then the
    rest by id. Returns what could not be removed (each with the reason)."""
    left: list[str] = []
    crashed = {n.name: n for n in store.nodes() if n.crashed}
    for name in sorted({r.id for r in found if r.kind == "node" and r.id in crashed}):
        result = _teardown(name, crashed[name].region, provider, store, say)
        left += [f"{name}: {what}" for what in result.left]
        if result.complete:
            store.update_node(name, state_reason="its `up` crashed; collected by gc")
    order = {"instance": 0, "spot-request": 1, "volume": 2, "security-group": 3, "address": 3, "placement-group": 3,
             "key-pair": 4, "image": 5, "snapshot": 6}
    for res in sorted(found, key=lambda r: order.get(r.kind, 9)):
        if res.kind == "node" or res.node in crashed:
            continue
        try:
            provider.delete(res)
        except NotFound:
            continue
        except GpuprovError as exc:
            left.append(f"{res.kind} {res.id}: {exc}")
            continue
        say(f"deleted {res.kind} {res.id} ({res.region}, node {res.node})")
        if res.kind == "image":
            from gpuprov.cloud.images import collected

            collected(store, res)
    return left


def _run_guard_step(label: str, what: str, script_text: str, target: Target, settings: HostSettings) -> str:
    """Run one rendered guard step on a live machine over SSH (sudo); returns its GPUPROV_RESULT."""
    import shlex

    from gpuprov.hosts.remote import Remote

    path = f"/tmp/gpuprov-{what}-{uuid.uuid4().hex[:12]}.sh"
    remote = Remote(target, settings)
    remote.open()
    try:
        remote.put_bytes(script_text.encode(), path)
        result = remote.run(f"bash {shlex.quote(path)}; rc=$?; rm -f {shlex.quote(path)}; exit $rc", sudo=True)
    finally:
        remote.close()
    lines = result.stdout.strip().splitlines()
    if not result.ok or not lines or not lines[-1].startswith("GPUPROV_RESULT="):
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise GpuprovError(f"{label}: the {what} step failed (exit {result.exited}): {tail}")
    return lines[-1].split("=", 1)[1]


def _live_node(name: str | None, store: Store | None, what: str) -> Node | None:
    if name is None or store is None:
        return None
    node = store.node(name)
    if node.state not in ("ready", "running", "bootstrapping"):
        raise UserInputError("NAME", f"{name} is {node.state}", f"{what} changes a running node"
                             + (f"; `gpuprov start {name}` first" if node.state == "stopped" else ""))
    return node


def set_autostop(name: str | None, seconds: int | None, store: Store | None, target: Target, settings: HostSettings,
                 say: Say) -> str:
    """Change a running node's (or a bootstrapped host's: name None) autostop window (None: off) over SSH,
    then record it for a node.

    Runs the same `autostop` step the bootstrap runs, rendered with the new window: it rewrites
    /etc/gpuprov/autostop.conf and enables or disables gpuprov-autostop.timer. Returns its result.
    """
    from gpuprov.plan.plan import autostop_script
    from gpuprov.plan.spec import format_duration

    node = _live_node(name, store, "autostop")
    label = name or target.label or target.host
    script = autostop_script(seconds, shutdown_action=node.shutdown_action if node else None)
    result = _run_guard_step(label, "autostop", script.text, target, settings)
    if node is not None and store is not None:
        store.update_node(node.name, autostop_seconds=seconds)
        store.event(node.name, "autostop", f"autostop {format_duration(seconds)}")
    say(f"{label}: autostop {'off' if seconds is None else 'after ' + format_duration(seconds) + ' idle'}")
    return result


def set_ttl(name: str | None, seconds: int | None, store: Store | None, target: Target, settings: HostSettings,
            say: Say) -> str:
    """Give a running node (or a bootstrapped host: name None) a new deadline, `seconds` from now, or none
    (None), over SSH: the `ttl` step rendered to start a new deadline. `off` also lifts a --budget cap."""
    from gpuprov.plan.plan import ttl_script
    from gpuprov.plan.spec import format_duration

    node = _live_node(name, store, "ttl")
    label = name or target.label or target.host
    script = ttl_script(seconds, shutdown_action=node.shutdown_action if node else None)
    started = time.time()
    result = _run_guard_step(label, "ttl", script.text, target, settings)
    if node is not None and store is not None:
        fields: dict[str, object] = {"ttl_seconds": seconds,
                                     "ttl_deadline": started + seconds if seconds is not None else None}
        if node.budget_usd is not None:  # the deadline is the user's now, not the budget's
            fields.update(budget_usd=None, budget_deadline=None, budget_price=None)
            say(f"{label}: the ${node.budget_usd:g} budget no longer applies (the deadline is set by hand)")
        store.update_node(node.name, **fields)
        store.event(node.name, "ttl", f"ttl {format_duration(seconds)}")
    if seconds is None:
        say(f"{label}: TTL off (no deadline)")
    else:
        at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started + seconds))
        say(f"{label}: TTL {format_duration(seconds)}: shuts down at about {at}")
    return result


def refresh(store: Store, provider: Provider) -> list[Node]:
    """Update live nodes from the cloud by their recorded instance ids (never by name: a terminated
    namesake stays visible for an hour), one batched call per region."""
    nodes = store.nodes()
    for region in sorted({n.region for n in nodes}):
        here = [n for n in nodes if n.region == region and n.state in ("ready", "running", "bootstrapping", "stopped")]
        rows = {n.name: [r for r in store.resources(n.name, region=region, kind="instance") if r.cloud_id] for n in here}
        ids = [r.cloud_id for rs in rows.values() for r in rs if r.cloud_id]
        if not ids:
            continue
        found = {i.id: i for i in provider.instances(region, ids=ids)}
        for n in here:
            mine = [(r, found.get(r.cloud_id or "")) for r in rows[n.name]]
            states = {i.state for _r, i in mine if i is not None}
            if n.state != "stopped" and states and states <= {"stopping", "stopped"}:  # its guards stopped it
                store.update_node(n.name, state="stopped", stopped_at=time.time(),
                                  state_reason=next((i.state_reason for _r, i in mine if i and i.state_reason), None))
                continue
            if not mine or any(i is not None and i.state != "terminated" for _r, i in mine):
                continue
            if any(i is None and settle(r) > 0 for r, i in mine):
                continue  # launched moments ago: EC2 may not list it yet
            reason = next((i.state_reason for _r, i in mine if i is not None and i.state_reason), None)
            store.update_node(n.name, state="interrupted" if n.market == "spot" else "gone",
                              state_reason=reason or "instance no longer exists")
    return store.nodes()
