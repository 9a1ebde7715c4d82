"""`up` of one node, and a status refresh of the recorded nodes.

up, in order (validation first, so bad input creates nothing):
  plan -> offerings + network + image (read-only, cloud/launch.py `launchpad`) -> node row -> key pair +
  security group -> launch with failover (type x zone x market, cheapest first, under the price cap, AWS's
  code printed per attempt; cloud/failover.py orders, providers/aws_refusals.py says what each refusal
  means) -> running -> SSH up, host key pinned for this node -> bootstrap + verify (cloud/contact.py) ->
  ready -> ssh config entry.
Every resource is recorded in the state store before the provider is asked to create it. Any failure or
Ctrl-C before `ready` tears down everything the node got (`take_back`), so a failed `up` costs nothing.
A crash (SIGKILL) leaves rows and tags that `down NAME` and `gc` follow.

With `--budget`, the price obtained at launch becomes the TTL when that is sooner. `refresh` updates the live
nodes by their recorded instance ids, one batched call per region (never by name), and notices nodes their guards
stopped.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gpuprov.cloud import destroy, stop_role
from gpuprov.cloud import timeline as tl
from gpuprov.cloud.contact import bootstrap_launched, pin_host_key
from gpuprov.cloud.failover import Order
from gpuprov.cloud.launch import (
    Attempt,
    NoCapacity,
    UpOptions,
    check_name,
    go_on_after,
    kept_timeline,
    launchpad,
    list_price_read,
    note_refusal,
    open_to_all,
    plan_json,
    prepare_access,
    price_obtained,
    shutdown_behavior,
    take_back,
)
from gpuprov.cloud.providers.base import (
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
from gpuprov.cloud.providers.capabilities import service, title
from gpuprov.cloud.reservations import block_guards, recorded, reservation_of, resolved
from gpuprov.cloud.settle import settle, settle_window
from gpuprov.cloud.tags import owner
from gpuprov.errors import GpuprovError
from gpuprov.plan.plan import Plan
from gpuprov.state import Node, NodeState, Resource, Store, locks

if TYPE_CHECKING:
    from gpuprov.say import Say


@dataclass
class UpResult:
    node: Node
    instance: Instance
    address: str
    attempts: list[Attempt] = field(default_factory=list)
    ssh_alias: str | None = None
    bootstrap: object | None = None  # bootstrap.HostResult when the playbook ran
    timeline: tl.Timeline | None = None


def up(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say) -> UpResult:
    """Launch, bootstrap and verify one node, holding its lock from before its record exists until it is
    ready or taken back: nothing else works on it meanwhile, and gc never takes it for an orphan."""
    with locks.claim(check_name(opts.name), "up"):
        return _up(plan, opts, provider, store, say)


def _up(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say) -> UpResult:
    rec = tl.Recorder("up", opts.name)
    rec.phase(tl.CHECKS)
    pad = launchpad(plan, opts, provider, store, say)
    name, region, network, cidr, order, image = pad.name, pad.region, pad.network, pad.cidr, pad.order, pad.image
    rec.image = pad.image_line
    # what the launch asks for: the root volume, SSH's CIDR, the reservation by its own id
    opts = replace(opts, disk_gb=pad.disk_gb, ssh_cidr=cidr, **resolved(opts, pad.held))

    market = "spot" if plan.request.spot else "on-demand"
    store.create_node(name, provider.name, region, gpu=plan.gpu.name if plan.gpu else None, gpu_count=plan.count,
                      market=market, owner=owner(), plan_json=plan_json(plan), ssh_user=opts.ssh_user,
                      pid=os.getpid(), host=socket.gethostname(), autostop_seconds=plan.guards.autostop_seconds,
                      ttl_seconds=plan.request.ttl_seconds, on_interrupt=plan.guards.on_interrupt,
                      spot_type=("persistent" if plan.request.persistent else "one-time") if plan.request.spot else None,
                      shutdown_action=plan.guards.shutdown_action, disk_gb=opts.disk_gb, connect=opts.connect,
                      budget_usd=plan.request.budget_usd, guards_locked_by=owner() if opts.locked else None)
    store.event(name, "up", f"launching {'a CPU-only node' if plan.cpu_only else f'{plan.count}× '}"
                            f"{plan.gpu.name if plan.gpu else ''} in {region}")
    try:
        done = _launch_and_bootstrap(plan, opts, provider, store, say, order, image, network, cidr, rec)
    except BaseException as exc:  # failure or Ctrl-C before `ready`: take back everything, then re-raise
        take_back(exc, name, region, provider, store, say, rec)
        raise
    done.timeline = kept_timeline(name, store, rec)
    return done


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
                spot_duration=plan.request.spot_duration if cand.market == "spot" else None,
                shutdown_behavior=shutdown_behavior(plan, cand.market), instance_profile=opts.instance_profile,
                **reservation_of(opts)), settle=settle_window())
        except LaunchError as exc:
            attempt = note_refusal(exc, cand, rid, asked, "", name, attempts, store, rec, say)
            go_on_after(exc, attempt, opts, closed, provider, region, say)
            continue
        store.created(rid, instance.id)
        if instance.spot_request_id:
            store.add_resource(name, "spot-request", region, instance.spot_request_id)
        rec.attempt(cand.instance_type, cand.zone, cand.market, asked)
        say(f"{instance.id} launched; waiting for it to run")
        rec.phase(tl.RUNNING)
        try:
            instance = provider.wait_running(region, instance.id, timeout=opts.ssh_timeout, settle=settle_window())
        except LaunchError as exc:  # pending -> terminated for want of capacity (a spot instance, mostly): this
            # candidate is refused after all; its request goes (a persistent one would try again), and so does it;
            # the timeline shows the search going on after the launch that did not last
            _gone(name, region, rid, instance, provider, store, say)
            rec.phase(tl.CAPACITY)
            attempt = note_refusal(exc, cand, rid, rec.now(), "", name, attempts, store, rec, say)
            go_on_after(exc, attempt, opts, closed, provider, region, say)
            continue
        store.update_node(name, instance_type=cand.instance_type, zone=cand.zone, market=cand.market,
                          price_usd_hour=cand.price_usd_hour,
                          spot_type=("persistent" if plan.request.persistent else "one-time")
                          if cand.market == "spot" else None,
                          shutdown_action=shutdown_behavior(plan, cand.market), **recorded(opts, provider, region))
        return instance, attempts
    tried = "; ".join(f"{a.candidate.instance_type}/{a.candidate.zone}/{a.candidate.market}: {a.code}" for a in attempts)
    hint = "" if opts.fallback_on_demand or not plan.request.spot else " (add --fallback on-demand to try on-demand too)"
    raise NoCapacity(f"no capacity anywhere it was asked for{hint}: {tried}", attempts)


def _gone(name: str, region: str, rid: int, instance: Instance, provider: Provider, store: Store, say: Say) -> None:
    """A launched instance EC2 terminated on its way up: its spot request cancelled, its rows marked gone."""
    for row in store.resources(name, region=region, kind="spot-request"):
        if row.cloud_id == instance.spot_request_id:
            try:
                with destroy.take_back(name, "up"):  # the request of an instance EC2 ended on its way up
                    destroy.remove(provider, CloudResource("spot-request", row.cloud_id or "", region, name))
            except NotFound:
                pass
            except GpuprovError as exc:
                say(f"  could not cancel {row.cloud_id}: {exc} (`gpuprov down {name}` retries)")
                continue
            store.deleted(row.id)
    store.deleted(rid)


def _launch_and_bootstrap(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say,
                          order: Order, image: str, network: Network, cidr: str, rec: tl.Recorder) -> UpResult:
    name, region = opts.name, plan.request.region
    public_ip = opts.connect == "public" and network.subnet_id is not None and not network.maps_public_ip
    rec.phase(tl.ACCESS)
    if opts.s3_access:  # the node's own role, scoped to those prefixes (recorded, removed at down); its buckets'
        from gpuprov.cloud import data  # KMS keys are read first, so an unusable one is refused before anything

        opts = replace(opts, instance_profile=data.ensure_role(name, region, opts.s3_access, provider, store, say))
    role = stop_role.for_launch(provider, store, say)  # where the guards' stop needs a role of the cloud's
    if role is not None:
        opts = replace(opts, instance_profile=role)
    say(f"key pair and security group (SSH from {cidr}" + (": anywhere on the internet)" if open_to_all(cidr) else " only)"))
    access = prepare_access(name, region, provider, store, network, cidr, public_ip)
    rec.phase(tl.CAPACITY)
    instance, attempts = _launch(plan, opts, provider, store, say, order, image, access, rec)

    for volume in instance.volume_ids:
        store.add_resource(name, "volume", region, volume)
    address = instance.private_ip if opts.connect == "private" else instance.ipv6 if opts.ipv6 else instance.public_ip
    if not address:
        raise GpuprovError(f"{instance.id} has no {opts.connect} address; use --connect private (VPN/bastion) "
                           "or a subnet that assigns public IPs")
    listed = store.node(name).price_usd_hour
    asked = listed is None  # a cloud whose catalog knows no price is asked for it (its live offers); it is recorded
    if asked:
        listed, disk = list_price_read(provider, instance, opts.disk_gb, say)
        if listed is not None:  # the disk's too: what the node costs once stopped
            store.update_node(name, price_usd_hour=listed, disk_usd_hour=disk)
    # what it costs from now: the spot price obtained in its zone (or the list price), for the time it runs
    paid = price_obtained(plan, provider, instance, listed, say)
    if asked and paid is not None and instance.market == "spot":
        say(f"spot price ${paid:.4f}/h in {instance.zone} ({title(provider)}'s spot price history)")
    store.update_node(name, state=NodeState.RUNNING, address=address, zone=instance.zone, paid_usd_hour=paid,
                      running_since=time.time(), billed_seconds=0.0)
    result = UpResult(store.node(name), instance, address, attempts)
    from gpuprov.paths import keys_dir, region_key

    key_path = str(region_key(keys_dir(), region))
    action = store.node(name).shutdown_action
    if action != plan.guards.shutdown_action:  # spot fell back to on-demand: the guards say what it does now
        from gpuprov.plan.plan import replace_guards

        plan = replace_guards(plan, plan.guards.model_copy(update={"shutdown_action": action}))
    plan = block_guards(plan, store.node(name), say)  # a Capacity Block's end: the node's watch knows it
    budget = plan.request.budget_usd
    if budget is not None:
        from gpuprov.plan.plan import replace_guards, with_budget

        price = paid
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
        ttl, own = plan.guards.ttl_seconds, plan.request.ttl_seconds
        now = time.time()
        store.update_node(name, state=NodeState.BOOTSTRAPPING, ttl_deadline=now + ttl if ttl is not None else None,
                          ttl_end=now + own if own is not None else None)
        result.bootstrap = bootstrap_launched(plan, opts, key_path, address, say, rec)
    elif opts.wait:
        rec.phase(tl.SSH)
        pin_host_key(opts, key_path, address, say)
    store.update_node(name, state=NodeState.READY, ready_at=time.time())
    if opts.wait:
        from gpuprov.hosts import sshconfig

        result.ssh_alias = sshconfig.add_node(name, address, opts.ssh_user, key_path)
    else:
        from gpuprov.hosts import sshconfig

        sshconfig.await_new_key(name)  # whichever gpuprov command reaches it first pins its key
        say("not waiting for SSH (--no-wait): `ssh gpuprov-NAME` is not set up; the first gpuprov command to "
            f"reach it (`gpuprov check {name}`) pins its host key")
    result.node = store.node(name)
    store.event(name, "ready", f"{instance.instance_type} {instance.zone} {address}")
    return result


REFRESHED = ("ready", "running", "bootstrapping", "stopped", "interrupted")
SPOT_STOPPED = "Server.SpotInstanceShutdown"
INTERRUPTED = "{service} restarts it when capacity returns"  # the state reason of a node its cloud stopped


def refresh(store: Store, provider: Provider, say: Say | None = None) -> list[Node]:
    """Update live nodes from the cloud by their recorded instance ids (never by name: a terminated
    namesake stays visible for an hour), one batched call per region. A node another gpuprov is working on
    (its lock is held: a `down`, an `up`, a `start`) is left as its record says, and named; every other
    node's record is read again and written under its lock, so a `down` that starts meanwhile waits. A node a
    killed move or start left (its journal) says what EC2 says of its new instance, and the next step
    (cloud/journal.py, `look`). Only the nodes of this provider's cloud: each cloud's are asked of their own."""
    nodes = [n for n in store.nodes() if n.provider == provider.name]
    for region in sorted({n.region for n in nodes}):
        here = [n for n in nodes if n.region == region and n.state in REFRESHED]
        rows = {n.name: [r for r in store.resources(n.name, region=region, kind="instance") if r.cloud_id] for n in here}
        ids = [r.cloud_id for rs in rows.values() for r in rs if r.cloud_id]
        if not ids:
            continue
        found = {i.id: i for i in provider.instances(region, ids=ids)}
        for n in here:
            try:
                with locks.hold(locks.node(n.name), "status --refresh", wait=False, subject=n.name):
                    _refreshed(store.node(n.name), rows[n.name], found, store)
            except locks.Busy as busy:
                if say is not None:
                    say(f"{n.name}: not refreshed, {busy.holder} is working on it")
    from gpuprov.cloud import journal

    journal.look([n for n in store.nodes() if n.provider == provider.name], provider, store,
                 say if say is not None else _quiet)
    return store.nodes()


def _quiet(_line: str) -> None:
    pass


def _refreshed(n: Node, rows: list[Resource], found: dict[str, Instance], store: Store) -> None:
    if n.state not in REFRESHED:
        return  # changed since the list was read (a `down` that finished meanwhile)
    mine = [(r, found.get(r.cloud_id or "")) for r in rows]
    states = {i.state for _r, i in mine if i is not None}
    if states and states <= {"stopping", "stopped"} and any(
            i is not None and i.state_code == SPOT_STOPPED for _r, i in mine):
        # EC2 interrupted a persistent spot node whose interruption behaviour is stop: EC2 alone starts it again
        # when capacity returns ("Only Amazon EC2 can restart an interrupted stopped Spot Instance")
        if n.state != "interrupted":
            now = time.time()
            store.update_node(n.name, state=NodeState.INTERRUPTED, stopped_at=now,
                              state_reason=INTERRUPTED.format(service=service(n.provider)),
                              **n.stopped_run(now))
            store.event(n.name, "interrupted", f"{SPOT_STOPPED}: stopped by {title(n.provider)}")
        return
    if n.state == "interrupted" and states == {"running"}:  # EC2 started it again
        store.update_node(n.name, state=NodeState.READY, stopped_at=None, state_reason=None, running_since=time.time())
        store.event(n.name, "restarted", f"{title(n.provider)} started the interrupted spot instance again")
        return
    if n.state not in ("stopped", "interrupted") and states and states <= {"stopping", "stopped"}:  # guards stopped it
        now = time.time()
        store.update_node(n.name, state=NodeState.STOPPED, stopped_at=now, **n.stopped_run(now),
                          state_reason=next((i.state_reason for _r, i in mine if i and i.state_reason), None))
        return
    if not mine or any(i is not None and i.state != "terminated" for _r, i in mine):
        return
    if any(i is None and settle(r) > 0 for r, i in mine):
        return  # launched moments ago: EC2 may not list it yet
    reason = next((i.state_reason for _r, i in mine if i is not None and i.state_reason), None)
    store.update_node(n.name, state=NodeState.INTERRUPTED if n.market == "spot" else NodeState.GONE,
                      state_reason=reason or "instance no longer exists")
