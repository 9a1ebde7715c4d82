"""The cloud lifecycle: up, status, stop, start, down (autostop, ttl: cli/guardrails.py; gc: cli/gc.py).

`up --nodes N` goes to cloud/cluster_up.py. `up --json` (a cluster's too) and `start --json` print the node, its ssh
alias and the timeline, with the progress on stderr; `status NODE` shows one node, `--timeline` its last up/start
timeline.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import click

from gpuprov.cli.common import (
    NODES,
    cache_options,
    chosen_cloud,
    confirm,
    line_echo,
    main,
    make_console,
    node_target,
    plan_from,
    provider_for,
    quiet,
    recorded_clouds,
    say_to,
    stack_options,
    step_silence_option,
    store_and_provider,
    team_scope,
    warn,
)
from gpuprov.cli.complete import complete_node
from gpuprov.cli.help import SectionedCommand
from gpuprov.cli.params import LoginName, Number
from gpuprov.errors import Interrupted, UserInputError

if TYPE_CHECKING:
    from rich.console import Console
    from typing_extensions import Unpack

    from gpuprov.cli.option_sets import ReachOptions, StackOptions
    from gpuprov.cloud.launch import UpOptions
    from gpuprov.cloud.timeline import Timeline
    from gpuprov.cloud.waiting import Wait
    from gpuprov.plan.plan import Plan
    from gpuprov.state import Node, Store

T = TypeVar("T")  # what an `up` pass returns: one node's result or a cluster's


@main.command(cls=SectionedCommand)
@click.argument("name", required=False)
@stack_options
@click.option("--fallback", type=click.Choice(["none", "on-demand"]), default="none", show_default=True,
              help="With --spot: when spot is refused everywhere (or closed to the account), try on-demand too.")
@click.option("--max-price", type=Number(0, 10_000, low_open=True), default=None, metavar="USD",
              help="With --spot: the most to pay per hour, 0 < USD ≤ 10_000 (AWS advises leaving it unset).")
@click.option("--max-hourly", type=Number(0, 10_000, low_open=True), default=None, metavar="USD",
              help="Failover never picks an instance type whose on-demand list price is above this "
                   "(0 < USD ≤ 10_000); the prices compared are the catalog's us-east-1 list prices, whatever "
                   "the region [default: twice the cheapest type that fits].")
@click.option("--disk", "disk_gb", type=Number(20, 16384, whole=True), default=100, show_default=True,
              help="Root volume, GB (gp3, encrypted), 20 to 16384.")
@click.option("--image", default=None, metavar="fresh|dlami|ID|NAME",
              help="The image [default: your baked image of this plan's stack in the region, else Canonical's "
                   "Ubuntu]: fresh (Ubuntu, every step runs), dlami (AWS's Deep Learning Base OSS NVIDIA Driver "
                   "GPU AMI), an AMI id, or a baked image's name.")
@click.option("--ssh-cidr", default=None, envvar="GPUPROV_SSH_CIDR", show_envvar=True,
              help="Open SSH to this CIDR (IPv4 or IPv6) instead of your public address /32 "
                   "(with --connect private: instead of the VPC's CIDR).")
@click.option("--connect", type=click.Choice(["public", "private"]), default="public", show_default=True,
              help="Reach the node on its public or private address (VPN / bastion).")
@click.option("--subnet", default=None,
              help="Launch into this subnet (its zone only) instead of the default VPC: a subnet-… id on AWS, a "
                   "vSwitch id (vsw-…) on Alibaba Cloud.")
@click.option("--instance-profile", default=None, metavar="NAME",
              help="The node's own AWS credentials: this IAM instance profile (e.g. for an S3 sync in --on-interrupt); "
                   "checked before anything is launched.")
@click.option("--s3-access", multiple=True, metavar="s3://BUCKET/PREFIX[:ro]",
              help="Give the node a role of its own for exactly these S3 prefixes (repeatable; :ro read-only): made "
                   "at up, removed at down; nothing on the node holds your keys.")
@click.option("--reservation", default=None, metavar="cr-…|open",
              help="Launch into this On-Demand Capacity Reservation (its type and zone), or `open`: any open one "
                   "that matches first (`gpuprov capacity list` shows them).")
@click.option("--capacity-block", default=None, metavar="cr-…|cb-…",
              help="Launch into this Capacity Block for ML (`gpuprov capacity buy`); with --wait, waits for its start.")
@click.option("--ssh-user", type=LoginName(), default=None,
              help="Login user of the image [default: the --os image's: ubuntu, admin (Debian), ec2-user (Amazon "
                   "Linux, RHEL), rocky].")
@cache_options
@click.option("--no-bootstrap", is_flag=True,
              help="Launch, wait for SSH and pin the host key; install nothing (`ssh gpuprov-NAME` works after).")
@click.option("--no-wait", is_flag=True,
              help="With --no-bootstrap: return as soon as the instance runs (no SSH wait, host key not pinned).")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop (the same plan `gpuprov plan` prints).")
@click.option("--wait", "wait_for", default=None, metavar="DURATION",
              help="No capacity anywhere: ask again (every candidate, 30 s growing to 5 min between passes) for up "
                   "to this long, e.g. 2h; nothing is left or billed between passes.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask before launching (needed without a terminal).")
@step_silence_option
@click.option("-v", "--verbose", is_flag=True, help="Stream the node's bootstrap output.")
@click.option("--nodes", type=NODES, default=1, show_default=True,
              help="A cluster: this many nodes (1 to 64; 1: one node) of one type in one zone (cluster placement group, EFA "
                   "where the type has it); all of them or none.")
@click.option("--min-nodes", type=NODES, default=None,
              help="With --nodes: keep the cluster with at least this many healthy nodes [default: all].")
@click.option("--locked", is_flag=True,
              help="Only you may change or lift this node's --ttl, --budget and --autostop afterwards (with team "
                   "state, another member's `gpuprov ttl NAME off` is refused).")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable result on stdout (the node, its ssh alias, the timeline); progress on stderr.")
def up(name: str | None, fallback: str, max_price: float | None, max_hourly: float | None, disk_gb: int,
       image: str | None, ssh_cidr: str | None, connect: str, subnet: str | None, instance_profile: str | None,
       s3_access: tuple[str, ...], reservation: str | None, capacity_block: str | None, ssh_user: str | None,
       no_bootstrap: bool, no_wait: bool,
       dry_run: bool, wait_for: str | None, yes: bool, step_silence: float, verbose: bool, nodes: int,
       min_nodes: int | None, locked: bool, as_json: bool, cache_host: str | None, cache_port: int, keep_cache: bool,
       **kw: Unpack[StackOptions]) -> None:
    """Launch a GPU node on AWS, bootstrap and verify it, and print how to connect.

    Tries every instance type that carries the GPUs in every zone that offers it, cheapest
    first and under --max-hourly, printing AWS's own error for each refusal: capacity moves to
    the next zone or type, a closed spot market to on-demand (with --fallback on-demand), a
    quota or permission error stops with the fix. Everything it creates is tagged and recorded
    before it is requested; if the launch or bootstrap fails (or you press Ctrl-C), it all
    comes down again. At the end it prints where the time went (phases, launch attempts, steps);
    `gpuprov status NAME --timeline` shows it again later.

    A CPU-only node for the work around the GPU (preparing data): --cpu N --memory GIB (the
    cheapest CPU-only type that fits, the others its fallbacks) or --instance-type c7i.8xlarge.
    It gets the same guards, env, data and steps, torch's CPU wheel and a check on the CPU, and
    no driver, toolkit or Fabric Manager.
    """
    from gpuprov.cli.report import plan_view
    from gpuprov.cloud import launch
    from gpuprov.cloud import node as one_node

    node_name = launch.check_name(name) if name else launch.new_name()
    wait = _wait_of(wait_for)
    cache = _CacheRequest(cache_host, cache_port, keep_cache, node_name, no_bootstrap) if cache_host or keep_cache else None
    if cache is not None:
        cache.check()
    console = make_console(stderr=as_json)
    subnet = _own_subnet(subnet)
    opts = launch.UpOptions(
        name=node_name, fallback_on_demand=fallback == "on-demand", max_price=max_price, max_hourly=max_hourly,
        disk_gb=disk_gb, image=image, ssh_cidr=ssh_cidr, connect=connect, subnet=subnet, ssh_user=ssh_user or "ubuntu",
        bootstrap=not no_bootstrap, wait=not no_wait, step_silence=step_silence or None,
        verbose_echo=line_echo(console) if verbose else None,
        instance_profile=instance_profile, reservation=reservation, capacity_block=capacity_block,
        patient=wait is not None, s3_access=s3_access, locked=locked,
    )

    one = nodes == 1 and min_nodes is None
    # the state first (a node of that name is said before EC2 is asked anything, its credentials included)
    store, provider = store_and_provider() if one and not dry_run else (None, None)

    def check(plan: Plan) -> None:  # every option, before EC2 is asked anything (its instance-type facts)
        launch.check_options(plan, opts)
        if store is not None:
            launch.check_name_free(node_name, store)
        if not one:
            from gpuprov.cloud import cluster_up

            cluster_up.check_cluster_options(plan, opts, cluster_up.ClusterOptions(nodes=nodes, min_nodes=min_nodes))

    the_plan = plan_from(kw, live=not dry_run, check=check)  # a launch plans with EC2's own instance-type facts
    if ssh_user is None:  # the login user of the image `up` looks up for the plan's OS (data/os.yaml)
        import dataclasses

        from gpuprov.plan.oses import login_user

        opts = dataclasses.replace(opts, ssh_user=login_user(the_plan.request.os))
    if not dry_run:  # the dry run prints the plan, warnings and all
        for note in the_plan.warnings:
            warn(f"warning: {note}")
    launch.check_options(the_plan, opts)
    if launch.open_to_all(ssh_cidr):
        warn(f"warning: --ssh-cidr {ssh_cidr} opens SSH on {node_name} to the whole internet (every scanner will try "
             "it); leave --ssh-cidr out for your address /32" + ("" if yes else ", or confirm below"))
    if not one:
        _up_cluster(the_plan, opts, nodes, min_nodes, dry_run, yes, console, as_json, wait,
                    lambda: _through_cache(the_plan, kw, cache))
        return
    if store is None or provider is None:  # the dry run
        console.print(plan_view(the_plan))
        return
    if not yes:
        launch.precheck(the_plan, opts, provider, store, say_to(console), ask=True)  # said before the question
        price = the_plan.price_usd_hour
        world = ", SSH open to the whole internet" if launch.open_to_all(ssh_cidr) else ""
        confirm(f"Launch {node_name}: {the_plan.instance.name if the_plan.instance else '?'}"
                f" ({'spot' if kw['spot'] else 'on-demand'}, list ${price or 0:.2f}/h{world})?", "launch")
    with _through_cache(the_plan, kw, cache) as plan:
        result = _waiting(lambda say: one_node.up(plan, opts, provider, store, say), wait, node_name, store,
                          say_to(console))
    node = result.node
    if as_json:
        _print_result_json(node, result.ssh_alias, result.timeline)
        return
    if result.timeline and not quiet():
        from gpuprov.cli.report import timeline_table

        console.print()
        console.print(timeline_table(result.timeline))
    console.print(f"\n[bold green]{node.name} is ready[/]: {node.instance_type} in {node.zone} ({node.market}), "
                  f"{node.address}, list price ${node.price_usd_hour or 0:.2f}/h on-demand")
    if result.ssh_alias:
        console.print(f"  ssh {result.ssh_alias}        # or: gpuprov check / gpuprov down {node.name}")


def _own_subnet(subnet: str | None) -> str | None:
    """--subnet (or the config's `subnet`) in the chosen cloud's words: an AWS subnet id (subnet-…) or an Alibaba Cloud
    vSwitch id (vsw-…). The config's value for another cloud is not this launch's (it stays the other cloud's
    default); a flag naming another cloud's kind of id is refused in one line."""
    from click.core import ParameterSource

    if subnet is None:
        return None
    cloud = chosen_cloud()
    own = subnet.startswith("vsw-") if cloud == "alibaba" else not subnet.startswith("vsw-")
    if own:
        return subnet
    ctx = click.get_current_context()
    if ctx.get_parameter_source("subnet") is ParameterSource.DEFAULT_MAP:
        return None
    kind, wants = ("an AWS subnet id", "a vSwitch id (vsw-…) of one of your VPCs") if cloud == "alibaba" else \
        ("an Alibaba Cloud vSwitch id", "a subnet id (subnet-…)")
    raise UserInputError("--subnet", f"{subnet} is {kind}, and this node is launched on {cloud}", wants)


def _left_by_down(names: list[str], store: Store) -> str:
    """What an interrupted `down` leaves of `names`, as its records hold it."""
    from gpuprov.state.machine import NodeState

    unfinished = [n for n in names if (found := store.find_node(n)) is not None and found.state != NodeState.TERMINATED]
    if not unfinished:
        return "every node is down"
    held = {n: [f"{r.kind} {r.cloud_id or r.client_token}" for r in store.resources(n)] for n in unfinished}
    return ("still there: " + "; ".join(f"{n}: {', '.join(what) or 'its record only'}" for n, what in held.items())
            + f"; run: gpuprov down {' '.join(unfinished)}")


def _wait_of(text: str | None) -> Wait | None:
    """--wait DURATION as cloud/waiting.Wait (None: one pass), checked before anything is asked of AWS."""
    if text is None:
        return None
    from gpuprov.cloud import waiting
    from gpuprov.plan.spec import parse_duration

    seconds = parse_duration(text, "--wait", allow_off=False)
    return waiting.Wait(float(seconds or 0), waiting.first_delay())


def _waiting(attempt: Callable[[Callable[[str], None]], T], wait: Wait | None, name: str, store: Store,
             say: Callable[[str], None]) -> T:
    if wait is None:
        return attempt(say)
    from gpuprov.cloud import waiting

    return waiting.until_capacity(attempt, name, store, say, wait)


@dataclass(frozen=True)
class _CacheRequest:
    """up --cache-host: the site's proxy the launched nodes bootstrap through, as `bootstrap --cache-host` runs it."""

    host: str | None
    port: int
    keep: bool
    node: str  # the node (or cluster) this `up` launches: never the cache's host
    no_bootstrap: bool

    def check(self) -> None:
        """Refused before anything is asked of the cloud: what bootstrap refuses, and a cache nothing would read."""
        if self.host is None:
            raise click.UsageError("--keep-cache needs --cache-host HOST")
        if self.no_bootstrap:
            raise click.UsageError("--cache-host with --no-bootstrap: the nodes download nothing")
        word = self.host.rpartition("@")[2].partition(":")[0]
        if word == self.node:  # the node itself, or one of its cluster's (NAME:K)
            raise UserInputError("--cache-host", f"{self.host} is a node this `up` launches: it does not run before "
                                 "the launch, and its driver install reboots it, taking the cache away from the other "
                                 "nodes; nothing was done", "run the cache on a host of the site outside this launch")


@contextlib.contextmanager
def _through_cache(the_plan: Plan, kw: StackOptions, cache: _CacheRequest | None) -> Iterator[Plan]:
    """The plan the nodes are launched and bootstrapped with: with --cache-host, the proxy started on its host (as
    `bootstrap --cache-host` starts it) and the plan made again on its map, then the proxy stopped when `up` ends."""
    if cache is None:
        yield the_plan
        return
    from gpuprov.cli.common import sources_flag
    from gpuprov.cli.hosts import start_cache, stop_cache

    reach: ReachOptions = {"identity": None, "ssh_config": None, "connect_timeout": 10.0}
    running = start_cache(cache.host, cache.port, cache.keep, reach, kw["playbook"], sources_flag(kw),
                          lambda _target: None)
    try:
        assert running is not None  # a host was named (_CacheRequest.check)
        yield plan_from(kw, live=True, sources=running.layer)  # the same plan, on the proxy's map
    finally:
        stop_cache(running, cache.keep)


def _up_cluster(the_plan: Plan, opts: UpOptions, nodes: int, min_nodes: int | None, dry_run: bool, yes: bool,
                console: Console, as_json: bool, wait: Wait | None = None,
                through: Callable[[], AbstractContextManager[Plan]] | None = None) -> None:
    from gpuprov.cli.report import plan_view
    from gpuprov.cloud import cluster_network as net
    from gpuprov.cloud import cluster_up

    copts = cluster_up.ClusterOptions(nodes=nodes, min_nodes=min_nodes)
    cluster_up.check_cluster_options(the_plan, opts, copts)
    instance = the_plan.instance.name if the_plan.instance else "?"
    if dry_run:
        assert the_plan.instance is not None  # a launched node's plan always has one (plan.make_plan)
        layout = net.network_for(the_plan.instance, the_plan.request.cloud)
        console.print(plan_view(net.with_efa_step(the_plan, layout)))
        for line in net.describe(layout, nodes):
            console.print(f"  {line}", markup=False)
        return
    store, provider = store_and_provider()
    if not yes:
        price = (the_plan.price_usd_hour or 0) * nodes
        from gpuprov.cloud.launch import open_to_all, precheck

        precheck(the_plan, opts, provider, store, say_to(console), ask=True)  # said before the question
        world = ", SSH open to the whole internet" if open_to_all(opts.ssh_cidr) else ""
        confirm(f"Launch {opts.name}: {nodes} × {instance} ({'spot' if the_plan.request.spot else 'on-demand'}, "
                f"list ${price:.2f}/h for all{world})?", "launch")
    with through() if through else contextlib.nullcontext(the_plan) as plan:
        result = _waiting(lambda say: cluster_up.up(plan, opts, copts, provider, store, say), wait, opts.name, store,
                          say_to(console))
    node = result.node
    if as_json:  # the node row (its members included), the ssh alias of node 0, nodes dropped, the timeline
        _print_result_json(node, result.ssh_alias, result.timeline, dropped=result.dropped)
        return
    if result.timeline and not quiet():
        from gpuprov.cli.report import timeline_table

        console.print()
        console.print(timeline_table(result.timeline))
    console.print(f"\n[bold green]{node.name} is ready[/]: {len(result.members)} × {node.instance_type} in {node.zone} "
                  f"({node.market}, {result.network.transport.upper()}), list price "
                  f"${(node.price_usd_hour or 0) * len(result.members):.2f}/h for all", highlight=False)
    for m in result.members:
        console.print(f"  node {m.rank}: {m.instance_id} {m.address} (private {m.private_ip})", markup=False,
                      highlight=False)
    for why in result.dropped:
        console.print(f"  dropped {why}", markup=False)
    if result.ssh_alias:
        console.print(f"  ssh {result.ssh_alias}        # node 0; gpuprov down {node.name} takes all of them down",
                      markup=False)


def _print_result_json(node: Node, ssh_alias: str | None, timeline: Timeline | None, **more: object) -> None:
    """`up`/`start --json`: the node as `status --json` shows it, its ssh alias and the timeline."""
    from gpuprov.cli.report import status_rows

    click.echo(json.dumps({"node": status_rows([node])[0], "ssh_alias": ssh_alias, **more,
                           "timeline": timeline.model_dump(mode="json") if timeline else None}, indent=2))


@main.command()
@click.argument("name", required=False, shell_complete=complete_node)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--refresh", is_flag=True, help="Ask the cloud first (one batched call per region).")
@click.option("--timeline", is_flag=True, help="With NAME: where its last `up` or `start` spent its time.")
def status(name: str | None, as_json: bool, refresh: bool, timeline: bool) -> None:
    """Nodes gpuprov manages: state, address, $/h, $ so far, age. NAME: that node only."""
    from gpuprov.cli.report import status_rows, status_table
    from gpuprov.cloud import node as one_node

    if timeline and not name:
        raise UserInputError("--timeline", "shows one node's timeline", "name it: gpuprov status NAME --timeline")
    from gpuprov.state import unrecorded

    missing = unrecorded()
    if missing is not None:  # nothing to read, and a look makes no state there
        if refresh:  # nothing to ask the cloud about, but a bad AWS setting is still said
            from gpuprov.cloud.providers.aws_base import check_environment

            check_environment()
        if name:
            raise UserInputError("NAME", f"no node called {name!r}: there is no state file at {missing}",
                                 _no_state_hint())
        click.echo("[]" if as_json else f"no nodes: there is no state file at {missing} ({_no_state_hint()}); "
                   "`gpuprov up --gpu L4 --spot` launches one")
        return
    store, _provider = store_and_provider()
    if timeline:
        _print_timeline(store, str(name), as_json)
        return
    nodes = store.nodes()
    for cloud in recorded_clouds(store) if refresh else ():  # each node asked of its own cloud
        # a refresh also says what the cloud says of a move's new instance (cloud/journal.py)
        asked = _provider if cloud == _provider.name else provider_for(store, cloud=cloud)
        nodes = one_node.refresh(store, asked, say_to(make_console(stderr=True)))
    if name:
        nodes = [n for n in nodes if n.name == name] or [store.node(name)]
    if as_json:
        click.echo(json.dumps(status_rows(nodes), indent=2))
    else:
        from gpuprov.cli.report import guard_lines, health_lines

        console = make_console()
        if not nodes:
            from gpuprov.state import described, elsewhere

            also = elsewhere(store)
            console.print(f"no nodes in {described()}" + (f"; {also}" if also else "")
                          + "; `gpuprov up --gpu L4 --spot` launches one", markup=False, highlight=False)
        else:
            console.print(status_table(nodes))
        for line in health_lines(nodes):  # the watch's last finding per node (`gpuprov doctor NODE` for all of them)
            console.print(line, markup=False, highlight=False, style="yellow")
        for line in guard_lines(nodes):  # what a guard's stop bills where it is not economical (Alibaba Cloud)
            console.print(line, markup=False, highlight=False)
        from gpuprov.cli.capacity import block_lines
        from gpuprov.cloud.capacity import bought

        for line in block_lines(bought()):  # Capacity Blocks bought here: their window and cost
            console.print(line, markup=False, highlight=False)
        _host_clusters(console)


def _no_state_hint() -> str:
    """Where the state folder came from, for a user whose nodes may be recorded in another."""
    from gpuprov.settings import settings

    if settings().home:
        return "GPUPROV_HOME names that folder: is it the one your nodes were launched with?"
    return "the default state folder, under your HOME: is HOME the one your nodes were launched with?"


def _host_clusters(console: Console) -> None:
    """Clusters of existing hosts beneath the nodes (a launched cluster is already a node row)."""
    from gpuprov import cluster
    from gpuprov.cli.cluster_report import clusters_table

    hosts = [c for c in (cluster.load(n) for n in cluster.names()) if c is not None and c.node is None]
    if hosts:
        console.print(clusters_table(hosts))
        console.print("(`gpuprov cluster list --json`; forget one: `gpuprov cluster rm NAME`)", markup=False)


def _print_timeline(store: Store, name: str, as_json: bool) -> None:
    from gpuprov.cli.report import timeline_table
    from gpuprov.cloud import timeline as tl

    store.node(name)  # an unknown name is bad input
    found = tl.from_events([e.message for e in store.events(name) if e.kind == tl.EVENT_KIND])
    if found is None:
        raise UserInputError("NAME", f"{name} has no recorded timeline",
                             "timelines are recorded by `gpuprov up` and `gpuprov start`")
    if as_json:
        click.echo(json.dumps(found.model_dump(mode="json"), indent=2))
    else:
        make_console().print(timeline_table(found))


@main.command()
@click.argument("names", nargs=-1, shell_complete=complete_node)
@click.option("--all", "all_nodes", is_flag=True, help="Every node gpuprov manages.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask (needed without a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result: what was removed and what is left.")
@click.option("--no-save", is_flag=True, help="Do not run the playbook's `data:` uploads for `down` first.")
@click.option("--team", "everyone", is_flag=True,
              help="With team state: --all takes every member's nodes, not only yours (those your install launched).")
def down(names: tuple[str, ...], all_nodes: bool, yes: bool, as_json: bool, no_save: bool, everyone: bool) -> None:
    """Terminate nodes and remove everything they own: instance, spot request, security group,
    volumes, ssh config entry (and the key pair with the region's last node). Safe to repeat.
    A node whose playbook saves data on `down` saves it first (and nothing goes when that fails).
    With team state, --all takes your own nodes and names the teammates' it leaves; --all --team takes everyone's."""
    from gpuprov.cloud import data_save, teardown

    team = team_scope(everyone, goes_with="--all", given=all_nodes, why="a named node is taken down whoever launched it",
                      alone="--all alone takes every node gpuprov manages here")
    store, provider = store_and_provider(nodes=names)
    listed = store.nodes() if all_nodes else []
    console = make_console(stderr=as_json)
    if team and not everyone:
        from gpuprov.cloud.team import by_member

        listed, others = by_member(listed)
        for node in others:
            console.print(f"left {node.name} ({_whose(node)}): a teammate's node (`down --all --team` takes every "
                          "member's)", markup=False)
    targets = [n.name for n in listed] if all_nodes else list(names)
    if all_nodes and not targets:
        click.echo(json.dumps({}) if as_json else "nothing to do: gpuprov manages no nodes"
                   + (" of yours" if team and not everyone else ""))
        return
    if not targets:
        raise UserInputError("NAME", "no node named", "name the nodes to take down, or pass --all")
    for n in targets:
        store.node(n)  # unknown names fail before anything is touched
    if all_nodes:
        provider = provider_for(store, nodes=targets)
    # with team state each node is named with its member, here and in what follows
    label = {n: f"{n} ({_whose(store.node(n))})" if team else n for n in targets}
    saving = {} if no_save else {n: s for n in targets if (s := data_save.down_saves(store.node(n)))}
    if not yes:
        confirm(f"Terminate {', '.join(label.values())} and delete their resources?{data_save.question(saving)}",
                "take them down")
    members = {n: store.node(n).owner for n in targets} if team else {}
    from gpuprov.cloud import journal
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.paths import known_hosts_path

    for n in targets:  # a move a killed command left is finished or undone first: its disk's data is in one place
        journal.resume(n, provider, store, say_to(console))
    # the gate saves each node's data (every node of a cluster) before any is taken down; a named node is taken
    # down whoever launched it, --all's are this member's unless --team
    try:
        results = teardown.down(targets, provider, store, say_to(console), anyone=everyone or not all_nodes,
                                no_save=no_save, reach=node_target,
                                settings=HostSettings(known_hosts=known_hosts_path(), connect_timeout=15))
    except Interrupted as exc:  # the last line: what each node still has, and the command that finishes it
        exc.note = _left_by_down(targets, store)
        raise
    if as_json:
        click.echo(json.dumps({name: {"complete": r.complete, "removed": r.removed, "left": r.left,
                                      **({"member": members.get(name)} if team else {})}
                               for name, r in results.items()}, indent=2))
    from gpuprov.cli.fittable import plural  # rich: not at import time (`gpuprov --help`)

    for name, result in results.items():
        if result.complete and not as_json:
            console.print(f"{label.get(name, name)}: down ({plural(len(result.removed), 'resource')} removed)",
                          markup=False)
    incomplete = [r for r in results.values() if not r.complete]
    if incomplete:
        raise teardown.TeardownIncomplete(incomplete)


def _whose(node: Node) -> str:
    from gpuprov.cloud.team import member_name

    return member_name(node)


# --- guardrails -------------------------------------------------------------------------------


# --- stop / start ---------------------------------------------------------------------------------


def _no_clusters(store: Store, names: tuple[str, ...], what: str) -> None:
    """stop/start follow one instance; a cluster's nodes, placement group and Elastic IPs are not theirs to move."""
    for name in names:
        node = store.find_node(name)
        if node is not None and node.cluster_size:
            raise UserInputError("NAME", f"{name} is a cluster of {node.cluster_size} nodes; `{what}` takes one node",
                                 f"`gpuprov down {name}` takes the whole cluster down")


@main.command()
@click.argument("names", nargs=-1, required=True)
def stop(names: tuple[str, ...]) -> None:
    """Stop nodes: compute billing ends, the disk is kept; `gpuprov start NAME` resumes.

    On AWS the disk is EBS, and one-time spot nodes cannot stop (EC2 only terminates them): use
    `gpuprov down`, or launch spot nodes with `up --spot --persistent`. On Alibaba Cloud every node,
    spot too, stops in ECS's economical mode (its public address is released; a start may find no
    stock in its zone).
    """
    from gpuprov.cloud import journal, stopstart

    store, provider = store_and_provider(nodes=names)
    _no_clusters(store, names, "stop")
    console = make_console()
    for name in names:
        store.node(name)  # an unknown name is refused before anything is touched
    moving = [n for n in names if store.node(n).journal is not None]
    for name in moving:  # a move a killed command left: whichever of its instances runs is stopped
        baking = store.node(name).state == "baking"
        node = journal.stop(name, provider, store, say_to(console))
        if baking:  # an interrupted bake, settled
            console.print(f"{name}: stopped (its interrupted bake settled)", markup=False)
            console.print(f"  gpuprov start {name}   # new host keys, its guards back", markup=False)
        elif node.journal is not None:
            console.print(f"{name}: its new instance is stopped; the move is not finished", markup=False)
            console.print(f"  gpuprov start {name}   # finishes the move and starts it", markup=False)
        else:
            console.print(f"{name}: stopped in {node.zone}, as it was (its interrupted move was taken back)",
                          markup=False)
    rest = [n for n in names if n not in moving]
    for node in stopstart.stop(rest, provider, store, say_to(console)) if rest else []:
        month = stopstart.storage_month(node)
        unknown = stopstart.storage_unknown(node)
        own = node.disk_usd_hour  # its cloud priced its disk (no catalog price): by the hour, as ECS bills it
        cost = (f"; its compute is not billed, its {node.disk_gb} GB disk is: ${own:.4f}/h (${month[0]:.2f}/month)"
                if month and own is not None
                else f"; its {node.disk_gb} GB disk costs ${month[0]:.2f}/month while stopped" if month
                else f"; its compute is not billed, its {node.disk_gb} GB disk still is (no price known: {unknown})"
                if unknown and node.disk_gb else "")
        console.print(f"{node.name}: stopped{cost}", markup=False)
        console.print(f"  gpuprov start {node.name}   # or: gpuprov down {node.name}", markup=False)


@main.command()
@click.argument("name")
@click.option("--gpu", default=None, help="Resize first: the cheapest type with this GPU (the node's GPU count).")
@click.option("--instance-type", default=None, help="Resize first: this instance type.")
@click.option("--move", is_flag=True,
              help="Its zone has no capacity: copy its disk (an image of it) to another zone that has, launch there, "
                   "and only then retire the old instance; on failure the node stays as it was.")
@click.option("--zone", default=None, help="With --move: this zone [default: each other zone offering the type].")
@click.option("--region", default=None, help="With --move: to this region (its image, key pair and group made there).")
@click.option("--subnet", default=None,
              help="With --move: launch into this subnet, whose zone is where the node goes: one of the node's VPC "
                   "[default: its VPC's subnet in each zone tried]; with --region, one of that region "
                   "(needed for a node reached on its private address).")
@click.option("--no-bootstrap", is_flag=True, help="Do not bootstrap and verify again after it runs.")
@click.option("-y", "--yes", is_flag=True,
              help="Do not ask before a resize that raises the price (needed for one without a terminal).")
@click.option("-v", "--verbose", is_flag=True, help="Stream the node's bootstrap output.")
@step_silence_option
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable result on stdout (the node, its ssh alias, the timeline); progress on stderr.")
def start(name: str, gpu: str | None, instance_type: str | None, move: bool, zone: str | None, region: str | None,
          subnet: str | None, no_bootstrap: bool, yes: bool, verbose: bool, step_silence: float, as_json: bool) -> None:
    """Start a stopped node (resized first with --gpu/--instance-type), wait for it, bootstrap and verify
    again, and print its new address and $/h. A resize the installed stack cannot serve is refused before
    anything changes; if AWS refuses the start, the node stays stopped, as it was."""
    from gpuprov.cloud import stopstart

    if gpu and instance_type:
        raise click.UsageError("pass --gpu or --instance-type, not both")
    if move and (gpu or instance_type):
        raise UserInputError("--move", "moves the node as it is", "move it first, then resize: stop, start --gpu …")
    if zone is not None and not move:
        raise UserInputError("--zone", "applies to --move", f"gpuprov start {name} --move --zone {zone}")
    if region is not None and not move:
        raise UserInputError("--region", "applies to --move", f"gpuprov start {name} --move --region {region}")
    if subnet is not None and not move:
        raise UserInputError("--subnet", "applies to --move", f"gpuprov start {name} --move --subnet {subnet}")
    store, provider = store_and_provider(nodes=(name,))
    _no_clusters(store, (name,), "start")
    console = make_console(stderr=as_json)
    opts = stopstart.StartOptions(gpu=gpu, instance_type=instance_type, bootstrap=not no_bootstrap,
                                  step_silence=step_silence or None,
                                  verbose_echo=line_echo(console) if verbose else None,
                                  confirm=None if yes else lambda question: confirm(question, "resize it"))
    from gpuprov.cloud import journal

    # a move a killed command left is finished (its new instance kept), or undone before anything else
    found = store.find_node(name)  # an unknown name is refused below, as before
    resumed = journal.start(name, opts, provider, store, say_to(console)) if found and found.journal else None
    if resumed is not None:
        result = resumed
    elif move:
        from gpuprov.cloud import move as moving
        from gpuprov.cloud import move_region
        mover = move_region.move if region is not None else moving.move  # another region, or a zone of its own
        result = mover(name, moving.MoveOptions(zone=zone, region=region, subnet=subnet), opts, provider, store, say_to(console))
    else:
        result = stopstart.start(name, opts, provider, store, say_to(console))
    node = result.node
    if as_json:
        _print_result_json(node, result.ssh_alias, result.timeline, resized_from=result.resized_from,
                           verified=result.verified)
        return
    if result.timeline and not quiet():
        from gpuprov.cli.report import timeline_table

        console.print()
        console.print(timeline_table(result.timeline))
    resized = f" (was {result.resized_from})" if result.resized_from else ""
    console.print(f"\n[bold green]{node.name} is ready[/]: {node.instance_type}{resized} in {node.zone}, "
                  f"{node.address}, ${node.price_usd_hour or 0:.2f}/h on-demand list price")
    if result.ssh_alias:
        console.print(f"  ssh {result.ssh_alias}", markup=False)
