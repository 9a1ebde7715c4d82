"""What every launch shares, one node or a cluster: the checks, the candidates, access, refusals, take-back.

Before anything is recorded (bad input creates nothing): the name, the option combinations, SSH's CIDR
(an IPv6 one only where the subnet can give the node an IPv6 address), the instance profile, the zones that
offer each type, the network, the price cap and the candidates in order, the image and the root volume it
needs (`launchpad`). Then the node's access (`prepare_access`: the region's key pair, the node's security group,
each recorded before it is created). Each AWS refusal of a candidate is noted once (`note_refusal`) and
decides what comes next (`go_on_after`: the next candidate, on-demand after spot, or a stop with the fix).
A failed or interrupted launch takes back everything the node got (`take_back`), so it costs nothing.

SSH's CIDR is the caller's address /32, never the world by default; an IPv6 one only where the subnet (every
default subnet when none is named) has an IPv6 block. A missing instance profile is exit 2. The root volume is
`--disk`, or the image's root snapshot where that is bigger, said so. `note_refusal` records a refused candidate's
intent row, attempt, timeline entry, line and event, once; a stop for a quota prints the increase command. Also
here: `shutdown_behavior`, `list_price_read` (the list price a cloud with no catalog price is asked for at launch),
`price_obtained` (the spot price in the node's zone, else the list price) and
`kept_timeline` (a take-back's timeline keeps the failure, and the rerun is named with what is left).
"""

from __future__ import annotations

import ipaddress
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from gpuprov.cloud import destroy, images, keys, own_network
from gpuprov.cloud import timeline as tl
from gpuprov.cloud.failover import Candidate, Order, candidates, default_cap
from gpuprov.cloud.providers.base import Access, Instance, LaunchError, Market, Network, Provider, Reservation
from gpuprov.cloud.providers.capabilities import LIVE_OFFERS, ROLES, STOP_MODES, need, offered, service, title
from gpuprov.cloud.settle import settle_window
from gpuprov.cloud.tags import owner
from gpuprov.cloud.teardown import take_down
from gpuprov.errors import GpuprovError, Interrupted, UserInputError
from gpuprov.plan.plan import Plan
from gpuprov.state import NodeState, Store, locks
from gpuprov.state.tolerant import TolerantStore

if TYPE_CHECKING:
    from gpuprov.say import Say



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
    instance_profile: str | None = None  # an IAM instance profile: the node's own AWS credentials
    reservation: str | None = None  # --reservation cr-…|open (cloud/reservations.py)
    capacity_block: str | None = None  # --capacity-block cr-…|cb-…: a Capacity Block for ML bought beforehand
    held: Reservation | None = None  # the one those name, as the launchpad read it: the launch and the record reuse it
    patient: bool = False  # `up --wait`: a Capacity Block that has not started yet is waited for, not refused
    s3_access: tuple[str, ...] = ()  # --s3-access s3://bucket/prefix[:ro]: a role of the node's own (cloud/data.py)
    locked: bool = False  # --locked: its autostop, TTL and budget are changed or lifted only by whoever launched it

    @property
    def ipv6(self) -> bool:
        """SSH is open to an IPv6 CIDR: the node gets an IPv6 address and is reached on it."""
        return self.ssh_cidr is not None and ":" in self.ssh_cidr


@dataclass
class Attempt:
    candidate: Candidate
    code: str
    message: str


class QuotaExceeded(GpuprovError):
    pass


class NoCapacity(GpuprovError):
    """Every candidate was refused for a reason that may pass (capacity, a zone's refusal): what `up --wait`
    asks again for (cloud/waiting.py); the launch took back everything before this was raised."""

    def __init__(self, message: str, attempts: list[Attempt]) -> None:
        super().__init__(message)
        self.attempts = attempts

    @property
    def summary(self) -> str:
        """'5 refused: InsufficientInstanceCapacity ×5 (g4dn.xlarge)': one pass of `up --wait` in a few words."""
        codes: dict[str, int] = {}
        for a in self.attempts:
            codes[a.code] = codes.get(a.code, 0) + 1
        types = sorted({a.candidate.instance_type for a in self.attempts})
        return (f"{len(self.attempts)} refused: " + ", ".join(f"{c} ×{n}" for c, n in codes.items())
                + f" ({', '.join(types)})")


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


def open_to_all(cidr: str | None) -> bool:
    """A CIDR that lets the whole internet try SSH (0.0.0.0/0, ::/0: any prefix of length 0)."""
    try:
        return cidr is not None and ipaddress.ip_network(cidr.strip(), strict=False).prefixlen == 0
    except ValueError:
        return False


def _public_ip() -> str:
    import urllib.request

    with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=5) as reply:
        return str(reply.read().decode().strip())


def check_options(plan: Plan, opts: UpOptions) -> None:
    """Refuse option combinations that cannot mean what the user wants, before anything is asked of AWS."""
    spot = plan.request.spot
    if plan.instance is None and plan.gpu is not None:
        raise UserInputError("--gpu", f"no {title(plan.request.cloud)} instance type carries {plan.gpu.name}",
                             f"bootstrap a {plan.gpu.name} host of your own: gpuprov bootstrap HOST")
    if plan.instance is not None and plan.instance.ultraserver and not opts.capacity_block:
        it, region = plan.instance, plan.request.region
        raise UserInputError("--capacity-block", f"{it.name} is sold only as part of the UltraServer {it.ultraserver}, "
                             "through Capacity Blocks (no on-demand or spot)",
                             f"buy one: aws ec2 describe-capacity-block-offerings --region {region} --ultraserver-type "
                             f"{it.ultraserver} --ultraserver-count 1 --capacity-duration-hours 24, then aws ec2 "
                             f"purchase-capacity-block --region {region} --capacity-block-offering-id cb-… "
                             "--instance-platform Linux/UNIX; then up --capacity-block cr-…")
    images.check_spec(opts.image, plan.request.cloud)
    if opts.ssh_cidr is not None:
        ssh_cidr(opts.ssh_cidr)  # a malformed CIDR is refused before anything else
        if opts.ipv6 and opts.connect == "private":
            raise UserInputError("--ssh-cidr", f"{opts.ssh_cidr} is IPv6, and --connect private reaches the node on its "
                                 "private IPv4 address, which that rule does not open", "an IPv4 CIDR, or --connect public")
    if opts.instance_profile is not None and not re.fullmatch(r"[\w+=,.@-]{1,128}", opts.instance_profile):
        raise UserInputError("--instance-profile", f"{opts.instance_profile!r} is not an instance profile name",
                             "IAM's names: up to 128 letters, digits and + = , . @ _ -")  # IAM API, InstanceProfileName
    if opts.s3_access:
        from gpuprov.cloud import data

        for access in opts.s3_access:
            data.parse(access)
        if opts.instance_profile is not None:
            raise UserInputError("--s3-access", "makes the node an instance profile of its own",
                                 "--s3-access or --instance-profile, not both")
    if opts.locked and plan.guards.autostop_seconds is None and plan.request.ttl_seconds is None \
            and plan.request.budget_usd is None:
        raise UserInputError("--locked", "there is no guardrail to lock", "give --ttl, --budget or --autostop with it")
    if opts.reservation and opts.capacity_block:
        raise UserInputError("--reservation", "a launch goes into one reservation", "--reservation or --capacity-block")
    shapes = {"--reservation": (r"open|cr-[0-9a-f]{8,17}", "cr-… or open"),
              "--capacity-block": (r"(cr|cb)-[0-9a-f]{8,17}", "cr-… or cb-… (`gpuprov capacity list`)")}
    for flag, given in (("--reservation", opts.reservation), ("--capacity-block", opts.capacity_block)):
        if given is not None and not re.fullmatch(shapes[flag][0], given):
            raise UserInputError(flag, f"{given!r} is not a Capacity Reservation id", shapes[flag][1])
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


def check_reachable(opts: UpOptions) -> None:
    """With a local endpoint (moto, `make sandbox`) the public addresses it gives instances are made up, and may
    be real machines on the internet: an `up` that would connect to one is refused before anything is created
    (the last of the input checks, so a bad value elsewhere is named first)."""
    from gpuprov.cloud.providers import local_endpoint

    local = local_endpoint()
    if local and opts.connect == "public" and opts.wait:
        cloud, endpoint = local
        raise UserInputError("--connect", f"the {cloud} endpoint is a local one ({endpoint}): the public addresses it "
                             "gives instances are made up, and may be real machines on the internet",
                             "pass --connect private and --subnet (a subnet of the endpoint's); `make sandbox` sets "
                             "both in its config, or add --no-bootstrap --no-wait to reach nothing")


def quota_error(attempt: Attempt, provider: Provider, region: str, also: str = "", count: int = 1,
                fix: str = "") -> QuotaExceeded:
    """The quota a launch of `count` instances of the candidate's type was refused on, what it needs in vCPUs
    (all of them: a cluster's is count times a node's) and the increase to ask for: AWS's from its quota table;
    another cloud's as its refusal table's `fix` says."""
    from gpuprov.cloud.quotas import increase_command, quota_for
    from gpuprov.plan.plan import catalog_for

    name = attempt.candidate.instance_type
    # a type the cloud named (plan --live, up) may be missing from the catalog: its vCPUs are then not known here
    it = next((t for t in catalog_for(provider.name).instance_types if t.name == name), None)
    q = quota_for(name, attempt.candidate.market)
    head = f"{attempt.code}: {attempt.message}"
    if it is None:
        needs = f"{count} × {name}'s vCPUs count" if count > 1 else f"{name}'s vCPUs count"
    else:
        needs = f"{count} × {name} need {count * it.vcpu}" if count > 1 else f"{name} needs {it.vcpu}"
    if q is None:
        how = f"\n  fix: {fix}" if fix else ""
        return QuotaExceeded(f"{head}\n  {title(provider)} counts its quotas in vCPUs: {needs}{how}{also}")
    current = provider.quota(region, q.code)
    now = f"; its current value is {current:g} vCPUs" if current is not None else ""
    unverified = f"\n  (unverified: {q.unverified})" if q.unverified else ""
    raise_it = f":\n  {increase_command(q, region, current, count * it.vcpu)}" if it else ""
    return QuotaExceeded(
        f"{head}\n  {title(provider)} counts its quotas in vCPUs: {needs}. Raise '{q.name}' ({q.code}) in "
        f"{region}{now}{raise_it}{unverified}{also}")


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
    disk_gb: int  # the root volume: --disk, or the image's root snapshot where that is bigger
    held: Reservation | None = None  # the Capacity Reservation or Block launched into (cloud/reservations.py)


def precheck(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say, *, ask: bool = False) -> str:
    """The checks that cost nothing, the name taken among them: what `up` runs before it asks to launch (and
    launchpad again, under the name's lock). Before the question (`ask`) EC2 is read once too, so that what the
    user must fix in their own setup (no credentials, a profile or endpoint that is wrong) is said before anyone is
    asked to confirm a launch that cannot happen; anything else EC2 says there, launchpad meets and says again.
    The checked name."""
    name = check_name(opts.name)
    check_options(plan, opts)
    if plan.request.persistent:  # a spot request that stops on interruption, not one that ends
        need(provider, STOP_MODES, what="--persistent")
    check_name_free(name, store)
    check_reachable(opts)
    if ask:
        try:
            provider.offerings(plan.request.region, [c.name for c in plan.candidates])
        except UserInputError:
            raise
        except GpuprovError:  # EC2 did not answer, or refused: the launch says so with its own context
            pass
    if opts.instance_profile is not None:
        _check_instance_profile(provider, plan.request.region, opts.instance_profile, say)
    return name


def check_name_free(name: str, store: Store) -> None:
    """Nodes and clusters of existing hosts share one namespace: `exec/ssh/check NAME` go to a cluster of that name,
    `down NAME` to the node, so a name taken by either is refused, naming the other."""
    if store.find_node(name) and store.node(name).live:
        with locks.claim(name, "up"):  # another command at work on it (its launch) is said by who, not "exists"
            pass
        raise UserInputError("NAME", f"a node called {name!r} already exists", f"pick another name, or `gpuprov down {name}`")
    from gpuprov import cluster

    found = cluster.load(name)
    if found is not None and found.node is None:
        raise UserInputError("NAME", f"{name!r} is already a cluster of existing hosts (bootstrap --cluster)",
                             f"pick another name, or forget that one: gpuprov cluster rm {name}")


def launchpad(plan: Plan, opts: UpOptions, provider: Provider, store: Store, say: Say) -> Launchpad:
    """Checks and look-ups shared by `up` and `up --nodes`; nothing is created or recorded here."""
    region = plan.request.region
    name = precheck(plan, opts, provider, store, say)
    # AWS first: its credentials missing are the error to fix, not the public address a machine offline lacks
    offerings = provider.offerings(region, [c.name for c in plan.candidates])
    cidr = None if opts.ssh_cidr is None and opts.connect == "private" else ssh_cidr(opts.ssh_cidr)
    network = provider.network(region, opts.subnet)
    if cidr is not None and ":" in cidr and not network.ipv6:
        where = f"subnet {network.subnet_id} has" if network.subnet_id else f"the default VPC's subnets in {region} have"
        raise UserInputError("--ssh-cidr", f"{cidr} is IPv6, and {where} no IPv6 CIDR block: the node would get no IPv6 "
                             "address, and SSH would never answer", "an IPv4 CIDR, or --subnet with an IPv6 CIDR block "
                             "(gpuprov then asks for an IPv6 address at launch and connects over IPv6)")
    cap = opts.max_hourly if opts.max_hourly is not None else default_cap(plan)
    order = candidates(plan, offerings, plan.request.spot, opts.fallback_on_demand, network.zone, cap)
    network = own_network.for_zones(network, [c.zone for c in order.candidates], region, say)
    if opts.reservation or opts.capacity_block:  # only what the reservation holds, or open ones first
        from gpuprov.cloud import reservations

        order, held = reservations.narrow(order, plan, opts, provider, region, say)
    else:
        held = None
    if order.skipped:  # one line: the user may never have given --max-hourly
        cap_from = "--max-hourly" if opts.max_hourly is not None else \
            "the price cap (twice the cheapest type that fits; --max-hourly to change it)"
        say(f"skipping {len(order.skipped)} instance type{'s' if len(order.skipped) > 1 else ''} over {cap_from} "
            f"${cap:.2f}/h: {', '.join(s.instance_type for s in order.skipped)}")
    if not order.candidates:
        where = f"zone {network.zone}" if network.zone else region
        fits = "CPU-only type that fits" if plan.cpu_only else \
            f"type with {plan.count}× {plan.gpu.name if plan.gpu else '?'}"
        if order.skipped:
            raise UserInputError("--max-hourly", f"every instance {fits} offered in {where} is over the price cap",
                                 f"raise --max-hourly (now ${cap:.2f}/h)")
        raise UserInputError("--region", f"no instance {fits} is offered in {where}",
                             "try us-east-1 or us-west-2, or another " + ("--cpu" if plan.cpu_only else "--gpu"))
    if cidr is None:
        cidr = network.vpc_cidr
        say(f"SSH will be open to the VPC's CIDR {cidr} (--connect private without --ssh-cidr)")
    chosen = images.choose(plan, opts.image, provider)  # a baked image of this stack, else Ubuntu (or --image)
    say(chosen.line())
    image = chosen.image_id or provider.image(region, plan.request.os, images.ec2_arch(plan))
    line = " ".join(w for w in (chosen.source, chosen.name, image) if w)
    root = provider.image_root(region, image)
    images.check_architecture(plan, image, root.architecture)
    disk = max(opts.disk_gb, root.size_gb or 0)
    if disk > opts.disk_gb:  # EC2 refuses a smaller one (InvalidBlockDeviceMapping "... is smaller than snapshot")
        say(f"root volume: {disk} GB, not --disk {opts.disk_gb}: the image's root snapshot is {root.size_gb} GB")
    return Launchpad(name, region, network, cidr, order, image, line, disk, held)


def _check_instance_profile(provider: Provider, region: str, name: str, say: Say) -> None:
    """The profile must exist before anything is made (EC2 would refuse the launch: InvalidParameterValue)."""
    exists = need(provider, ROLES, what="--instance-profile").instance_profile_exists(region, name)
    if exists is None:
        say(f"could not ask IAM about instance profile {name} (no iam:GetInstanceProfile): {service(provider)} will say "
            "at launch")
    elif not exists:
        raise UserInputError("--instance-profile", f"no instance profile {name!r} in this account (IAM GetInstanceProfile: "
                             "NoSuchEntity)", f"create it and give it a role: aws iam create-instance-profile "
                             f"--instance-profile-name {name}; aws iam add-role-to-instance-profile --instance-profile-name "
                             f"{name} --role-name ROLE")


def prepare_access(node: str, region: str, provider: Provider, store: Store, network: Network, cidr: str,
             public_ip: bool) -> Access:
    keys.ensure_key_pair(provider, store, region)
    network = own_network.ensure(provider, store, region, network)  # where there is no default network: gpuprov's
    group_name = f"gpuprov-{node}-{int(time.time())}"
    rid = store.intend(node, "security-group", region, group_name)
    group = provider.create_security_group(region, node, network.vpc_id, group_name, f"gpuprov node {node}: SSH from {cidr}")
    store.created(rid, group)
    provider.authorize_ssh(region, group, cidr, settle=settle_window())
    return Access(key_name=keys.key_name(owner()), security_group_id=group, subnet_id=network.subnet_id,
                  public_ip=public_ip, ipv6=":" in cidr)


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
    say(f"  {exc.code}: {exc.message}" + (f"\n  why: {exc.fix}" if exc.fix and exc.then == "next-candidate" else ""))
    store.event(name, "launch-refused", f"{what}{cand.instance_type} {cand.zone} {cand.market}: {exc.code}")
    return attempt


def go_on_after(exc: LaunchError, attempt: Attempt, opts: UpOptions, closed: set[Market], provider: Provider,
                region: str, say: Say, count: int = 1) -> None:
    """After AWS refused a candidate (one node, or a cluster of `count`): return to go on with the next one (spot
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
        raise quota_error(attempt, provider, region, fallback, count, exc.fix) from None
    fix = f"\n  fix: {exc.fix}" if exc.fix else ""
    raise GpuprovError(f"{title(provider)} refused the launch: {exc.code}: {exc.message}{fix}{fallback}") from None


def shutdown_behavior(plan: Plan, market: Market) -> str:
    """The instance's InstanceInitiatedShutdownBehavior, i.e. what the guards' `shutdown` does: a one-time
    spot instance cannot stop; anything else follows --autostop-action, by default stop (disk kept). ECS sets none:
    its instances stop, spot ones too (the plan's shutdown action)."""
    if plan.request.cloud != "aws":
        return plan.guards.shutdown_action or "stop"
    if market == "spot" and not plan.request.persistent:
        return "terminate"
    return plan.request.autostop_action or "stop"


def list_price_read(provider: Provider, instance: Instance, disk_gb: int, say: Say) -> tuple[float | None, float | None]:
    """The on-demand price of the launched type and of its disk, read from a cloud whose shipped catalog has none (its
    live offers: Alibaba Cloud's DescribePrice), said with its source; (None, None) where the cloud offers none,
    answers no dollar price, or does not answer (the node then shows no $/h, as before)."""
    offers = offered(provider, LIVE_OFFERS)
    if offers is None:
        return None, None
    try:
        read = offers.list_price(instance.region, instance.instance_type, zone=instance.zone, disk_gb=disk_gb)
    except GpuprovError as exc:
        say(f"  could not read the pay-as-you-go price ({exc}); no $/h is recorded")
        return None, None
    if read.usd_hour is None:
        say(f"  pay-as-you-go price {read.price:.4f} {read.currency}/h ({read.source}): not in US dollars, so no $/h "
            "is recorded")
        return None, None
    disk = f"; its {disk_gb} GB disk ${read.disk_usd_hour:.4f}/h" if read.disk_usd_hour is not None else ""
    say(f"pay-as-you-go price ${read.usd_hour:.4f}/h{disk} ({read.source}, read "
        f"{read.at.strftime('%Y-%m-%d %H:%M UTC')})")
    return read.usd_hour, read.disk_usd_hour


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


def take_back(exc: BaseException, name: str, region: str, provider: Provider, store: Store, say: Say,
              rec: tl.Recorder, what: str = "") -> None:
    """After a failed or interrupted `up` (a node's, or a cluster's: `what` says so): everything recorded comes
    down, the timeline keeps the failure and the teardown, and what could not be removed is named with the rerun.

    It depends on the cloud alone: a state file that cannot be written (the full disk or the lock the `up`
    failed on) is told nothing more, and the resources still come down (state.TolerantStore). A second signal
    stops it; then the resources still recorded are named. For a signal, the last line (`exc.note`) says what
    is left, or that nothing is."""
    tolerant = TolerantStore(store)
    kept = cast(Store, tolerant)
    say(f"{type(exc).__name__ if isinstance(exc, KeyboardInterrupt) else 'failed'}: removing what {name} got{what}")
    kept.update_node(name, state=NodeState.FAILED, state_reason=str(exc)[:500])
    rec.failed(str(exc) or type(exc).__name__)
    rec.phase(tl.TEARDOWN)
    try:
        with destroy.take_back(name, "up"):
            left = take_down(name, region, provider, kept, say).left
    except KeyboardInterrupt as again:  # a second signal: stop here and say what the records still hold
        left = [f"{r.kind} {r.cloud_id or '(asked for, token ' + str(r.client_token) + ')'}"
                for r in store.resources(name, region=region)] or [f"the record of {name}"]
        say(f"{getattr(again, 'name', 'interrupted')} again: the take-back stopped")
    else:
        kept_timeline(name, kept, rec, "failed")
    if tolerant.failure is not None:
        say(f"  {tolerant.failure}")
        say(f"  the state file still lists {name} as it was; `gpuprov down {name}` once it can be written "
            "again finds what is gone")
    for line in left:
        say(f"  still there: {line}")
    if left:
        say(f"  {name} stays listed; rerun: gpuprov down {name}")
    if isinstance(exc, Interrupted):
        exc.note = (f"{name} was taken back: nothing of it is left" if not left and tolerant.failure is None else
                    f"{name} was taken back" if not left else
                    f"still there: {'; '.join(left)}; run: gpuprov down {name}")


def kept_timeline(name: str, store: Store, rec: tl.Recorder, outcome: tl.Outcome = "ok") -> tl.Timeline:
    """The finished timeline, stored as the node's last (`status NAME --timeline`)."""
    timeline = rec.finish(outcome)
    store.event(name, tl.EVENT_KIND, timeline.model_dump_json())
    return timeline


def plan_json(plan: Plan) -> str:
    """The node's recorded plan: its summary, the monitoring asked for whole (the summary shows the webhook without
    its path; `start` renders the health step again from this), and the playbook it was made from, by name when
    shipped, else its text (a file of the user's may be gone or changed by the time `start` bootstraps the node
    again)."""
    import json

    from gpuprov.plan.spec import playbook_file

    summary = {**plan.summary(), "monitoring_request": plan.request.monitoring.model_dump(mode="json")}
    given = playbook_file(plan.request.playbook)
    if given is not None:
        summary["playbook_text"] = given.read_text(encoding="utf-8-sig")
    summary["jupyter"] = plan.request.jupyter
    summary["docker"] = plan.request.docker
    return json.dumps(summary)

