"""stop / start / resize: keep a node's disk and stop its bill, and bring it back.

A node its cloud lets stop (`stoppable`: on-demand, a spot request that stops on interruption, or any spot node
on a cloud that declares SPOT_STOP) stops with its disk kept (its instance store, where the type has one, is lost:
`stop` says so, cloud/instance_store.py), its disk priced on its cloud's catalog where a price is known;
`start` resizes first when asked (refused before anything changes when the installed stack cannot
serve the new GPU), waits for it to run, follows a new address in state and ssh config with the
host key still pinned, and re-runs the bootstrap and verify. Each change is recorded before it is
asked of the cloud, so a crash mid-way leaves a node that `start` or `down` completes.

stop checks every node first (one that cannot stop is refused naming its cloud's service, with `down` offered),
then `stopping` -> StopInstances -> `stopped`. start plans on the node's own cloud's catalog and refuses, before
anything changes, a state it cannot start from, a new type for a spot node (EC2 cannot change it; taken for ECS's
rule too), a stack plan/compat.resolve cannot re-solve for the new GPU, a kernel
module that differs, a type not offered in the node's zone; then the resize is recorded (`resize_from`/`resize_to`),
ModifyInstanceAttribute, StartInstances (a refusal puts the old type back), each of the two recorded in the node's
journal first (state/records.py `Journal`, op "resize" or "start": `stop` of a node a killed start left stops its
instance, cloud/journal.py), the address, the pinned host key moved,
and bootstrap + verify again with the node's plan and what is left of a budget. `resizing` and `starting` are not
"crashed": gc leaves them, and `start` or `down` completes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from gpuprov.cloud import reservations
from gpuprov.cloud import timeline as tl
from gpuprov.cloud.contact import bootstrap_node, wait_tcp
from gpuprov.cloud.instance_store import say_what_stop_loses
from gpuprov.cloud.providers import service
from gpuprov.cloud.providers.base import Instance, LaunchError, Provider
from gpuprov.cloud.providers.capabilities import LIVE_OFFERS, SPOT_STOP, STOP_MODES, has, offered, title
from gpuprov.cloud.settle import settle
from gpuprov.errors import GpuprovError, Interrupted, UserInputError
from gpuprov.plan.plan import Plan, catalog_for
from gpuprov.state import Journal, Node, NodeState, Resource, Store, locks
from gpuprov.state.tolerant import TolerantStore

if TYPE_CHECKING:
    from gpuprov.plan.catalog import InstanceType
    from gpuprov.say import Say

RUNNING_STATES = ("ready", "running", "bootstrapping")
# a zone's want of capacity: `start --move` (cloud/move.py) takes the disk to another zone
MOVE_CODES = ("InsufficientInstanceCapacity", "InsufficientCapacity")


def _instance_rows(node: Node, store: Store) -> list[Resource]:
    rows = [r for r in store.resources(node.name, region=node.region, kind="instance") if r.cloud_id]
    if not rows:
        raise GpuprovError(f"{node.name} has no recorded instance (state {node.state}); `gpuprov down {node.name}` "
                           "removes what is left")
    return rows


def own_ttl_end(node: Node, now: float) -> float | None:
    """The node's TTL's own deadline as it starts `now`: the one recorded; one TTL from now once that has passed
    (the node's ttl step gives a machine booted after its deadline a new one so) or for a record that kept none apart
    from the budget's; None without a TTL."""
    if node.ttl_seconds is None:
        return None
    return node.ttl_end if node.ttl_end is not None and node.ttl_end > now else now + node.ttl_seconds


def budget_left(node: Node, at: float | None = None) -> float | None:
    """Dollars left of the node's --budget: the time to its budget deadline at the price it was set with."""
    if node.budget_usd is None or node.budget_deadline is None or not node.budget_price:
        return None
    return max(0.0, (node.budget_deadline - (at or time.time())) / 3600 * node.budget_price)


def stoppable(node: Node, provider: Provider) -> bool:
    """Whether its cloud lets the node stop, its disk kept: what its record says (on-demand, or a spot request that
    stops on interruption), or any spot instance on a cloud that declares SPOT_STOP (ECS's economical mode)."""
    return node.can_stop or has(provider, SPOT_STOP)


def cannot_stop(node: Node, provider: Provider) -> UserInputError:
    persistent = ("; to have spot nodes that can stop, launch them with `gpuprov up --spot --persistent` (a persistent "
                  "request whose interruption behaviour is stop)") if has(provider, STOP_MODES) else ""
    return UserInputError(
        "NAME", f"{node.name} is a one-time spot instance, which {service(node.provider)} cannot stop (only terminate)",
        f"`gpuprov down {node.name}` ends it, disk included{persistent}")


def stop(names: Sequence[str], provider: Provider, store: Store, say: Say, timeout: float = 900) -> list[Node]:
    """Stop nodes (EBS kept, compute billing ends). Every node is checked before any is touched: a one-time
    spot node, or one that is not running, refuses the whole command."""
    for name in names:
        store.node(name)  # an unknown name is refused before any lock is waited for
    with locks.nodes(list(names), "stop", say):  # an `up` or `start` at work on one finishes first
        return _stop(names, provider, store, say, timeout)


def _stop(names: Sequence[str], provider: Provider, store: Store, say: Say, timeout: float) -> list[Node]:
    nodes = [store.node(n) for n in names]
    for node in nodes:
        if not stoppable(node, provider):
            raise cannot_stop(node, provider)
        if node.state not in (*RUNNING_STATES, "stopping", "stopped"):
            raise UserInputError("NAME", f"{node.name} is {node.state}", "only a running node can stop")
        _instance_rows(node, store)
    for node in nodes:
        if node.state == "stopped":
            say(f"{node.name} is already stopped")
            continue
        rows = _instance_rows(node, store)
        ids = [r.cloud_id for r in rows if r.cloud_id]
        say_what_stop_loses(provider, node.name, node.region, node.instance_type, say)
        store.update_node(node.name, state=NodeState.STOPPING)
        store.event(node.name, "stop", f"stopping {', '.join(ids)}")
        say(f"{node.name}: stopping {', '.join(ids)}")
        provider.stop(node.region, ids, settle=max(settle(r) for r in rows))
        provider.wait_stopped(node.region, ids, timeout=timeout)
        now = time.time()
        store.update_node(node.name, state=NodeState.STOPPED, stopped_at=now, state_reason=None, **node.stopped_run(now))
        store.event(node.name, "stopped", ", ".join(ids))
        disk = disk_price_read(node, provider, say)
        if disk is not None:
            store.update_node(node.name, disk_usd_hour=disk)
    return [store.node(n.name) for n in nodes]


def disk_price_read(node: Node, provider: Provider, say: Say) -> float | None:
    """The stopped node's disk priced now ($/h), where its cloud's catalog has no disk price and the cloud answers
    one (its live offers: Alibaba Cloud's DescribePrice); None where it does not, said, the price read at launch
    kept. The stop is done either way."""
    offers = offered(provider, LIVE_OFFERS)
    if offers is None or not node.disk_gb or catalog_for(node.provider).storage is not None:
        return None
    try:
        read = offers.disk_price(node.region, node.disk_gb, zone=node.zone)
    except GpuprovError as exc:
        say(f"  could not read its disk's price ({exc})")
        return None
    if read.usd_hour is None:
        say(f"  its disk's price {read.price:.4f} {read.currency}/h ({read.source}): not in US dollars, not recorded")
        return None
    return read.usd_hour


def storage_month(node: Node) -> tuple[float, str] | None:
    """What the stopped node's disk costs a month on its cloud, and where that price comes from (None: its size or
    its cloud's price is not known: `storage_unknown`)."""
    from gpuprov.cloud import stale

    storage = catalog_for(node.provider).storage
    if storage is None and node.disk_usd_hour is not None:  # its cloud priced the node's own disk
        return node.disk_usd_hour * stale.MONTH_SECONDS / 3600, f"{title(node.provider)}'s price, read at launch or stop"
    if not node.disk_gb or storage is None:
        return None
    source = storage.source + (f" (unverified here: {storage.unverified})"
                               if storage.unverified and node.region != storage.region else "")
    return storage.month(node.disk_gb), source


def storage_unknown(node: Node) -> str | None:
    """Why no price of the node's disk is known on its cloud (None: one is, its catalog's or the node's own)."""
    return None if node.disk_usd_hour is not None else catalog_for(node.provider).storage_unknown


def resize_target(node: Node, gpu: str | None, instance_type: str | None,
                  offered: Callable[[list[str]], dict[str, list[str]]]) -> InstanceType | None:
    """The instance type `start --gpu/--instance-type` asks for (None: keep the type); for --gpu the
    cheapest that carries it and is offered in the node's zone, where its disk is."""
    from gpuprov.plan import catalog
    from gpuprov.plan.plan import choose_instances, refuse_retired

    cat = catalog_for(node.provider)
    if instance_type:
        it = cat.instance_type(instance_type)
        if it.name != node.instance_type:  # the node's own type, however old, is what it has: no resize
            refuse_retired(it, cat)
        return it
    if gpu:
        name, count = catalog.parse_gpu_request(gpu)
        count = count if ":" in gpu else (node.gpu_count or 1)
        fits = choose_instances(cat.gpu(name), count, cat=cat)
        zones = offered([it.name for it in fits])
        return next((it for it in fits if node.zone in zones.get(it.name, [])), fits[0])
    return None


def check_resize(node: Node, target: InstanceType, flag: str = "--instance-type") -> None:
    """Refuse, before anything changes, a type whose GPU the stack installed on the node cannot serve:
    the same driver branch, kernel module, torch wheel and toolkit must resolve for the new GPU. `flag`: the one
    that asked for it (--gpu or --instance-type), which the refusal names."""
    from gpuprov.errors import StackConflict
    from gpuprov.plan import compat
    from gpuprov.plan.stack import StackPins

    stack = node.plan.get("stack")
    was_cpu = bool(node.plan.get("cpu_only"))
    if was_cpu != target.cpu_only:  # its plan, and what its disk holds, is for one kind of machine
        kinds = ("a CPU-only", "a GPU") if was_cpu else ("a GPU", "a CPU-only")
        raise UserInputError(flag, f"{node.name} was launched as {kinds[0]} node and {target.name} is {kinds[1]} "
                             "type: its plan and what its disk holds are for the first kind",
                             "keep a type of the same kind, or launch a new node: `gpuprov up NAME "
                             + ("--gpu G`" if was_cpu else "--cpu N`"))
    if not stack or not target.gpu:
        return
    gpu = catalog_for(node.provider).gpu(target.gpu)
    torch = stack.get("torch") or None
    installed = (f"driver R{stack['driver_branch']} ({stack['kernel_module']} kernel module)"
                 + (f", torch {torch['version']}+{torch['variant']}" if torch else ""))
    pins = StackPins(driver=stack.get("driver_version") or str(stack["driver_branch"]),
                      cuda=stack.get("cuda_toolkit"), torch=torch["version"] if torch else None,
                      torch_cuda=torch["variant"] if torch else None, python=stack.get("python"))
    fix = (f"keep a type with a GPU this stack serves, or launch a new node for {gpu.name}: "
           f"`gpuprov up NAME --gpu {gpu.name}`")
    try:
        new = compat.resolve(gpu, stack["os"], pins, nvswitch=target.nvswitch, want_torch=torch is not None)
    except StackConflict as exc:
        raise StackConflict(flag, f"{node.name} has {installed}, which cannot serve {gpu.name} on "
                            f"{target.name}: {exc.problem}", fix, rule=exc.rule) from None
    if new.kernel_module != stack["kernel_module"]:
        raise StackConflict(flag, f"{node.name} has {installed}; {gpu.name} on {target.name} needs the "
                            f"{new.kernel_module} kernel module", fix, rule="kernel-module-differs")


def _ask_if_dearer(name: str, node: Node, now_type: str, target: InstanceType, confirm: Callable[[str], None]) -> None:
    """A resize that raises the list price asks first, as `up` does: it is a new hourly bill."""

    known = next((t for t in catalog_for(node.provider).instance_types if t.name == now_type), None)
    now = known.price_usd_hour if known is not None and known.price_usd_hour is not None else node.price_usd_hour
    new = target.price_usd_hour
    if new is None or (now is not None and new <= now):
        return
    was = f" (list ${now:.2f}/h)" if now is not None else ""
    confirm(f"Resize {name} from {now_type}{was} to {target.name} (list ${new:.2f}/h) and start it?")


@dataclass
class StartResult:
    node: Node
    address: str
    resized_from: str | None = None
    verified: bool = False
    ssh_alias: str | None = None
    timeline: tl.Timeline | None = None


@dataclass(frozen=True)
class StartOptions:
    gpu: str | None = None
    instance_type: str | None = None
    bootstrap: bool = True
    ssh_timeout: float = 600.0
    reboot_timeout: float = 600.0
    step_silence: float | None = 1200.0  # a step silent this long: the node is lost (bootstrap.Options)
    verbose_echo: Callable[[str], None] | None = None
    # asked before a resize that raises the list price, once it is known to be possible (raises to stop); None: --yes
    confirm: Callable[[str], None] | None = None


def start(name: str, opts: StartOptions, provider: Provider, store: Store, say: Say) -> StartResult:
    """Start a stopped node, resized first when asked. Order: refuse what cannot work (state, stack, zone)
    -> record the resize (from, to) -> ModifyInstanceAttribute -> StartInstances (a refusal puts the type
    back: the node stays stopped, as it was) -> running -> address, ssh config -> bootstrap + verify.
    A `start` killed mid-way leaves the node `resizing`/`starting` with its records; `start` or `down`
    completes it."""
    store.node(name)  # an unknown name is refused before the lock is waited for
    with locks.nodes([name], "start", say):  # a `stop` or another `start` at work on it finishes first
        return _start(name, opts, provider, store, say)


def _start(name: str, opts: StartOptions, provider: Provider, store: Store, say: Say) -> StartResult:

    rec = tl.Recorder("start", name)
    rec.phase(tl.CHECKS)
    node = store.node(name)
    if node.state in RUNNING_STATES:
        raise UserInputError("NAME", f"{name} is already running ({node.state})", f"`gpuprov stop {name}` first")
    if node.state == "interrupted" and node.spot_type == "persistent":
        raise UserInputError("NAME", f"{name} was interrupted by {title(node.provider)} (spot capacity), which "
                             "starts it again itself when capacity returns; nobody else can start it",
                             f"`gpuprov status --refresh` shows when it runs again; `gpuprov down {name}` ends it (its "
                             "disk too)")
    if node.state not in ("stopped", "resizing", "starting"):
        raise UserInputError("NAME", f"{name} is {node.state}", "only a stopped node can start")
    if budget_left(node, at=node.stopped_at) == 0:
        raise UserInputError("NAME", f"{name}'s ${node.budget_usd:g} budget is spent",
                             f"`gpuprov ttl {name} off` lifts the cap, then start it")
    (row, *_more) = _instance_rows(node, store)
    iid = row.cloud_id or ""
    target = resize_target(node, opts.gpu, opts.instance_type, lambda types: provider.offerings(node.region, types))
    if target is None and node.resize_to:  # a resize killed mid-way: finish what was asked
        target = catalog_for(node.provider).instance_type(node.resize_to)
    (current,) = provider.describe(node.region, [iid], settle=settle(row))
    if current.state in ("terminated", "shutting-down"):
        store.update_node(name, state=NodeState.GONE, state_reason=current.state_reason or "instance terminated",
                          journal_json=None)
        raise GpuprovError(f"{name}'s instance {iid} is {current.state}; `gpuprov down {name}` removes what is left")
    # a node launched into a reservation starts only there: refused before a resize or StartInstances is asked
    reservations.startable(node, target.name if target is not None else current.instance_type, iid, provider)
    original = node.resize_from or current.instance_type
    resized_from = None
    flag = "--gpu" if opts.gpu and not opts.instance_type else "--instance-type"  # what the user typed is blamed
    if target is not None and target.name != current.instance_type:
        if current.state not in ("stopped",):
            raise UserInputError(flag, f"{name} is {current.state}; a resize needs it stopped",
                                 f"`gpuprov stop {name}` first")
        if node.market == "spot":  # EC2 guide, "Change the instance type": not for Spot Instances
            raise UserInputError(flag, f"{name} is a spot instance, whose type {service(node.provider)} cannot change",
                                 f"start it as it is (`gpuprov start {name}`), or `gpuprov up` a new node with "
                                 f"--instance-type {target.name}")
        check_resize(node, target, flag)
        zones = provider.offerings(node.region, [target.name]).get(target.name, [])
        if node.zone and node.zone not in zones:
            raise UserInputError(flag, f"{target.name} is not offered in {node.zone}, where {name}'s "
                                 "disk is", f"offered in: {', '.join(zones) or 'no zone of ' + node.region}")
        if opts.confirm is not None and (opts.gpu or opts.instance_type):
            _ask_if_dearer(name, node, current.instance_type, target, opts.confirm)
        journal = Journal(op="resize", node=name, step="resize", region=node.region, zone=node.zone, old_instance=iid,
                          from_type=original, to_type=target.name, began_at=time.time())
        store.update_node(name, state=NodeState.RESIZING, resize_from=original, resize_to=target.name,
                          journal_json=journal.to_json())
        store.event(name, "resize", f"{current.instance_type} -> {target.name}")
        say(f"{name}: {current.instance_type} -> {target.name}")
        rec.phase(tl.RESIZE)
        try:
            provider.set_instance_type(node.region, iid, target.name, settle=settle(row))
        except GpuprovError as exc:  # EC2 refused the type: the node is as it was, stopped, its old type kept
            store.update_node(name, state=NodeState.STOPPED, resize_from=None, resize_to=None, journal_json=None)
            store.event(name, "resize-refused", str(exc)[:300])
            raise GpuprovError(f"{exc}\n  {name} stays stopped as {current.instance_type}; `gpuprov start {name}` "
                               "starts it as it is") from None
        resized_from = current.instance_type
    elif target is not None and node.resize_from and target.name == current.instance_type:
        resized_from = node.resize_from if node.resize_from != target.name else None
    now_type = target.name if target is not None else current.instance_type
    it = catalog_for(node.provider).instance_type(now_type)
    resizing = now_type != original
    journal = Journal(op="resize" if resizing else "start", node=name, step="start", region=node.region, zone=node.zone,
                      old_instance=iid, from_type=original if resizing else None, to_type=now_type if resizing else None,
                      began_at=time.time())
    store.update_node(name, state=NodeState.STARTING, instance_type=now_type, gpu=it.gpu or node.gpu, gpu_count=it.gpus,
                      price_usd_hour=it.price_usd_hour, journal_json=journal.to_json())
    say(f"{name}: starting {iid} ({now_type})")
    rec.phase(tl.RUNNING)
    try:
        return _run(name, node, row, opts, now_type, original, resized_from, provider, store, say, rec)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: the instance stops again (its bill with it)
        stop_again(name, node.region, row, exc, provider, store, say)
        raise


def stop_again(name: str, region: str, row: Resource, exc: KeyboardInterrupt, provider: Provider, store: Store,
               say: Say) -> None:
    """An interrupted `start`'s take-back: the instance it started is stopped again, disk kept, and the node is
    `stopped` as before; a second signal stops this too, and the last line says the instance may run."""
    iid = row.cloud_id or ""
    kept = cast(Store, TolerantStore(store))
    say(f"{type(exc).__name__}: stopping {name} again ({iid}); its disk is kept")
    try:
        provider.stop(region, [iid], settle=settle(row))
        provider.wait_stopped(region, [iid], timeout=900)
    except (KeyboardInterrupt, GpuprovError) as failed:
        say(f"  {iid} may still run: {getattr(failed, 'name', failed)}")
        if isinstance(exc, Interrupted):
            exc.note = f"{name}'s instance {iid} may still run; run: gpuprov stop {name} (or gpuprov down {name})"
        return
    now = time.time()
    kept.update_node(name, state=NodeState.STOPPED, stopped_at=now, resize_from=None, resize_to=None, journal_json=None,
                     state_reason="its start was interrupted", **store.node(name).stopped_run(now))
    kept.event(name, "stopped", f"{iid} (start interrupted)")
    if isinstance(exc, Interrupted):
        exc.note = f"{name} was stopped again (disk kept): nothing of it runs; gpuprov start {name} resumes"


def _run(name: str, node: Node, row: Resource, opts: StartOptions, now_type: str, original: str,
         resized_from: str | None, provider: Provider, store: Store, say: Say, rec: tl.Recorder) -> StartResult:
    """StartInstances (a refusal puts the old type back), running, its address, bootstrap + verify again."""

    iid = row.cloud_id or ""
    try:
        provider.start(node.region, [iid], settle=settle(row))
    except LaunchError as exc:
        back = ""
        if now_type != original:
            provider.set_instance_type(node.region, iid, original, settle=0)
            back = f" as {original} (the resize to {now_type} was undone)"
        orig = catalog_for(node.provider).instance_type(original)
        store.update_node(name, state=NodeState.STOPPED, instance_type=original, gpu=orig.gpu or node.gpu,
                          gpu_count=orig.gpus, price_usd_hour=orig.price_usd_hour, resize_from=None, resize_to=None,
                          journal_json=None)
        store.event(name, "start-refused", f"{exc.code}: {exc.message}")
        fix = f"\n  fix: {exc.fix}" if exc.fix else ""
        move = (f"\n  or move it to a zone with capacity (its disk is copied): gpuprov start {name} --move"
                if exc.code in MOVE_CODES and node.market != "spot" and not node.cluster_size else "")
        raise GpuprovError(f"{title(provider)} refused to start {name}: {exc.code}: {exc.message}{fix}\n  {name} stays "
                           f"stopped{back}; try again later, or another type: gpuprov start {name} --instance-type …"
                           f"{move}") from None
    instance = provider.wait_running(node.region, iid, timeout=opts.ssh_timeout, settle=settle(row))
    return came_up(name, node, instance, opts, now_type, resized_from, store, say, rec)


def came_up(name: str, node: Node, instance: Instance, opts: StartOptions, now_type: str, resized_from: str | None,
            store: Store, say: Say, rec: tl.Recorder, *, new_instance: bool = False) -> StartResult:
    """The node's instance runs (started, or launched elsewhere by `start --move`): its address in state and ssh
    config, bootstrap + verify again, ready. A started instance keeps its pinned host key. A moved node's is a new
    instance from an image of its disk, and cloud-init deletes the image's host keys and makes new ones on an
    instance's first boot (cc_ssh, `ssh_deletekeys`, default true; it runs once per instance id): its key is
    pinned on first contact, as `up` pins a new node's."""
    iid = instance.id
    # a node reached over IPv6 keeps its address across a stop (EC2 user guide, "IPv6 addresses": it "persists
    # when you stop and start"); a public IPv4 one changes
    v6 = node.address is not None and ":" in node.address
    address = instance.private_ip if node.connect == "private" else instance.ipv6 if v6 else instance.public_ip
    if not address:
        raise GpuprovError(f"{iid} runs but has no {node.connect or 'public'} address")
    from gpuprov.hosts import sshconfig
    from gpuprov.paths import keys_dir, region_key

    if new_instance:
        sshconfig.await_new_key(name)
        say(f"{name}: a new instance at {address}: its new host key is pinned on first contact")
    elif address != node.address:
        sshconfig.move_node_key(name, address)
        say(f"{name}: new address {address} (was {node.address}); host key kept pinned")
    listed = store.node(name).price_usd_hour  # the list price of the type it starts as (a resize changes it)
    price = listed if node.market != "spot" else (node.paid_usd_hour or listed)
    store.update_node(name, state=NodeState.RUNNING, address=address, zone=instance.zone, resize_from=None, resize_to=None,
                      journal_json=None, stopped_at=None, state_reason=None, running_since=time.time(), paid_usd_hour=price)
    key_path = str(region_key(keys_dir(), node.region))
    alias = sshconfig.add_node(name, address, node.ssh_user or "ubuntu", key_path)
    store.event(name, "started", f"{now_type} {address}")
    result = StartResult(store.node(name), address, resized_from, ssh_alias=alias)
    if opts.bootstrap:
        result.verified = _rebootstrap(store.node(name), opts, key_path, store, say, rec, new_instance=new_instance,
                                       budget=budget_left(node, at=node.stopped_at))
    elif new_instance:  # no bootstrap, but `ssh NAME` needs the new key pinned
        from gpuprov.cloud.contact import made_up_address, pin_new_host_key
        from gpuprov.cloud.providers import local_endpoint

        local = local_endpoint()
        if local is not None and made_up_address(address):  # never logged in to (contact.check_address)
            say(f"{name}: {address} comes from the local {local[0]} endpoint: its host key is not pinned")
        else:
            try:
                pin_new_host_key(name, node.ssh_user or "ubuntu", key_path, address, opts.ssh_timeout, say)
            except GpuprovError as exc:
                raise GpuprovError(f"{exc}; {name} runs, and `gpuprov check {name}` pins its new host key "
                                   "when SSH answers") from None
    store.update_node(name, state=NodeState.READY, ready_at=time.time())
    result.node = store.node(name)
    result.timeline = rec.finish()
    store.event(name, tl.EVENT_KIND, result.timeline.model_dump_json())
    return result


def node_plan(node: Node) -> Plan:
    """The plan a node was bootstrapped with, for its current instance type: the stack installed on it
    pinned exactly (driver branch, torch, toolkit, Python), the guards it has."""
    from gpuprov.plan.monitoring import Monitoring
    from gpuprov.plan.plan import NodeRequest, make_plan
    from gpuprov.plan.stack import StackPins

    recorded = node.plan
    stack = recorded.get("stack") or {}
    torch = stack.get("torch") or None
    pins = StackPins(driver=(stack.get("driver_version") or str(stack["driver_branch"])) if stack else None,
                     cuda=stack.get("cuda_toolkit"), torch=torch["version"] if torch else None,
                     torch_cuda=torch["variant"] if torch else None, python=stack.get("python"))
    cpu_only = recorded.get("cpu_only") or None  # a CPU-only node (plan/cpu.py): its CPU wheel and Python, pinned
    if cpu_only:
        pins = StackPins(torch=(cpu_only.get("torch") or {}).get("version"), python=cpu_only.get("python"))
    guards = recorded.get("guards") or {}
    playbook = recorded.get("playbook") or "pytorch"
    if recorded.get("playbook_text"):  # a file of the user's: the text it had at `up`, kept beside the node
        from gpuprov.files import write_atomic
        from gpuprov.hosts.sshconfig import node_known_hosts

        kept = node_known_hosts(node.name).with_name("playbook.yml")
        write_atomic(kept, recorded["playbook_text"])
        playbook = str(kept)
    request = NodeRequest(
        gpu=node.gpu or recorded.get("gpu") or "", count=node.gpu_count or (None if cpu_only else 1),
        spot=node.market == "spot", cloud=node.provider,  # planned on its own cloud's catalog, in its region
        region=node.region, playbook=playbook, os=recorded.get("os") or "ubuntu-24.04", jupyter=bool(recorded.get("jupyter")),
        docker=bool(recorded.get("docker")), pins=pins, instance_type=node.instance_type, autostop_seconds=node.autostop_seconds,
        ttl_seconds=node.ttl_seconds, on_interrupt=node.on_interrupt or guards.get("on_interrupt"),
        persistent=node.spot_type == "persistent",
        autostop_action=node.shutdown_action if node.shutdown_action in ("stop", "terminate") else None,  # type: ignore[arg-type]
        monitoring=Monitoring.model_validate(recorded.get("monitoring_request") or {}),
        **_sources_flag(recorded),
    )
    return make_plan(request)


def _sources_flag(recorded: dict[str, Any]) -> dict[str, Any]:
    """The --sources `up` was given, as the plan recorded each step's source: the node keeps downloading from there."""
    from gpuprov.plan.sources import Sources

    flag = {row["key"]: row["url"] for row in recorded.get("sources") or []
            if str(row.get("from", "")).startswith("--sources")}
    return {"sources": Sources(**flag), "sources_from": "--sources (given to up)"} if flag else {}


def _rebootstrap(node: Node, opts: StartOptions, key_path: str, store: Store, say: Say, rec: tl.Recorder, *,
                 new_instance: bool = False, budget: float | None = None) -> bool:
    """Bootstrap + verify again on the started node (markers make finished steps quick), with its pinned
    host key, or a moved node's new one pinned on first contact; False when SSH does not answer in time (the node
    runs; `gpuprov check` later). `budget`: the dollars left of its --budget when it stopped, which the guards'
    deadline is made of again at its price now, and never past its TTL's own deadline."""
    from gpuprov.hosts import bootstrap as engine
    from gpuprov.hosts import sshconfig
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target
    from gpuprov.plan.plan import replace_guards, with_budget

    address = node.address or ""
    rec.phase(tl.SSH)
    try:
        wait_tcp(address, 22, opts.ssh_timeout)
    except GpuprovError as exc:
        pins = ", which pins its new host key" if new_instance else ""
        say(f"  {exc}; not bootstrapped again (`gpuprov check {node.name}` when it answers{pins})")
        rec.failed(str(exc))
        return False
    plan = node_plan(node)
    if node.budget_usd is not None and node.budget_price:  # what is left of the budget, at the new price
        left = budget  # counted to the stop: a stopped node spends none of it
        price = node.price_usd_hour if node.market != "spot" else node.budget_price
        guards = plan.guards
        if left and price:
            now = time.time()
            spent_by = now + left / price * 3600
            own = own_ttl_end(node, now)
            deadline = spent_by if own is None else min(spent_by, own)
            # as the seconds to it from now: the node's ttl step sets it a few seconds later, as at `up`
            guards = guards.model_copy(update={"ttl_seconds": max(1, round(deadline - now))})
            store.update_node(node.name, budget_price=price, budget_deadline=spent_by, ttl_end=own, ttl_deadline=deadline)
        plan = replace_guards(plan, with_budget(guards, left, price))
    target = Target(host=address, user=node.ssh_user or "ubuntu", key=key_path, label=node.name)
    settings = HostSettings(known_hosts=sshconfig.node_known_hosts(node.name), accept_new_host_key=new_instance,
                            connect_timeout=15)
    say("bootstrapping again (finished steps are skipped) and verifying")
    options = engine.Options(reboot_timeout=opts.reboot_timeout, step_silence=opts.step_silence, echo=opts.verbose_echo)
    result = bootstrap_node(plan, target, settings, options, rec, say)
    if result.status not in ("ok", "changed"):
        raise GpuprovError(f"{node.name} runs, but its bootstrap {result.summary}: {result.error} "
                           f"(log: {result.log_path}); `gpuprov check {node.name}` says more")
    if new_instance:  # the key just pinned, shared with the team (nothing to do on local state)
        from gpuprov.cloud import team_keys

        team_keys.after_contact(node.name, target, settings, say)
    return True
