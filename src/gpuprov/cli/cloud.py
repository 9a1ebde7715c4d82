"""The cloud lifecycle: up, status, down, gc, autostop."""

from __future__ import annotations

import json
from typing import Any

import click

from gpuprov.cli.common import (
    complete_node,
    confirm,
    main,
    make_console,
    node_target,
    plan_from,
    region_from,
    say_to,
    stack_options,
    store_and_provider,
)
from gpuprov.errors import GpuprovError, UserInputError


@main.command()
@click.argument("name", required=False)
@stack_options
@click.option("--fallback", type=click.Choice(["none", "on-demand"]), default="none", show_default=True,
              help="With --spot: when spot is refused everywhere (or closed to the account), try on-demand too.")
@click.option("--max-price", type=float, default=None,
              help="With --spot: the most to pay per hour (AWS advises leaving it unset).")
@click.option("--max-hourly", type=float, default=None, metavar="USD",
              help="Failover never picks an instance type whose on-demand list price is above this "
                   "[default: twice the cheapest type that fits].")
@click.option("--disk", "disk_gb", type=click.IntRange(20, 16384), default=100, show_default=True,
              help="Root volume, GB (gp3, encrypted).")
@click.option("--image", default=None, help="AMI id instead of Canonical's Ubuntu from SSM.")
@click.option("--ssh-cidr", default=None, envvar="GPUPROV_SSH_CIDR", show_envvar=True,
              help="Open SSH to this CIDR (IPv4 or IPv6) instead of your public address /32 "
                   "(with --connect private: instead of the VPC's CIDR).")
@click.option("--connect", type=click.Choice(["public", "private"]), default="public", show_default=True,
              help="Reach the node on its public or private address (VPN / bastion).")
@click.option("--subnet", default=None, help="Launch into this subnet (its zone only) instead of the default VPC.")
@click.option("--ssh-user", default="ubuntu", show_default=True, help="Login user of the image.")
@click.option("--no-bootstrap", is_flag=True,
              help="Launch, wait for SSH and pin the host key; install nothing (`ssh gpuprov-NAME` works after).")
@click.option("--no-wait", is_flag=True,
              help="With --no-bootstrap: return as soon as the instance runs (no SSH wait, host key not pinned).")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop (the same plan `gpuprov plan` prints).")
@click.option("-y", "--yes", is_flag=True, help="Do not ask before launching (needed without a terminal).")
@click.option("-v", "--verbose", is_flag=True, help="Stream the node's bootstrap output.")
def up(name: str | None, fallback: str, max_price: float | None, max_hourly: float | None, disk_gb: int,
       image: str | None, ssh_cidr: str | None, connect: str, subnet: str | None, ssh_user: str, no_bootstrap: bool,
       no_wait: bool, dry_run: bool, yes: bool, verbose: bool, **kw: Any) -> None:
    """Launch a GPU node on AWS, bootstrap and verify it, and print how to connect.

    Tries every instance type that carries the GPUs in every zone that offers it, cheapest
    first and under --max-hourly, printing AWS's own error for each refusal: capacity moves to
    the next zone or type, a closed spot market to on-demand (with --fallback on-demand), a
    quota or permission error stops with the fix. Everything it creates is tagged and recorded
    before it is requested; if the launch or bootstrap fails (or you press Ctrl-C), it all
    comes down again.
    """
    from gpuprov import lifecycle
    from gpuprov.report import plan_view

    the_plan = plan_from(kw)
    console = make_console()
    node_name = lifecycle.check_name(name) if name else lifecycle.new_name()
    opts = lifecycle.UpOptions(
        name=node_name, fallback_on_demand=fallback == "on-demand", max_price=max_price, max_hourly=max_hourly,
        disk_gb=disk_gb, image=image, ssh_cidr=ssh_cidr, connect=connect, subnet=subnet, ssh_user=ssh_user,
        bootstrap=not no_bootstrap, wait=not no_wait,
        verbose_echo=(lambda line: console.print(line, markup=False)) if verbose else None,
    )
    lifecycle.check_options(the_plan, opts)
    if opts.ssh_cidr is not None:
        lifecycle.ssh_cidr(opts.ssh_cidr)  # a malformed CIDR is refused before anything else
    if dry_run:
        console.print(plan_view(the_plan))
        return
    if not yes:
        price = the_plan.price_usd_hour
        confirm(f"Launch {node_name}: {the_plan.instance.name if the_plan.instance else '?'}"
                f" ({'spot' if kw['spot'] else 'on-demand'}, list ${price or 0:.2f}/h)?", "launch")
    store, provider = store_and_provider()
    result = lifecycle.up(the_plan, opts, provider, store, say_to(console))
    node = result.node
    console.print(f"\n[bold green]{node.name} is ready[/]: {node.instance_type} in {node.zone} ({node.market}), "
                  f"{node.address}, list price ${node.price_usd_hour or 0:.2f}/h on-demand")
    if result.ssh_alias:
        console.print(f"  ssh {result.ssh_alias}        # or: gpuprov check / gpuprov down {node.name}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--refresh", is_flag=True, help="Ask the cloud first (one batched call per region).")
def status(as_json: bool, refresh: bool) -> None:
    """Nodes gpuprov manages: state, address, $/h, $ so far, age."""
    from gpuprov import lifecycle
    from gpuprov.report import status_rows, status_table

    store, provider = store_and_provider()
    nodes = lifecycle.refresh(store, provider) if refresh else store.nodes()
    if as_json:
        click.echo(json.dumps(status_rows(nodes), indent=2))
    else:
        make_console().print(status_table(nodes))


@main.command()
@click.argument("names", nargs=-1, shell_complete=complete_node)
@click.option("--all", "all_nodes", is_flag=True, help="Every node gpuprov manages.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask (needed without a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result: what was removed and what is left.")
def down(names: tuple[str, ...], all_nodes: bool, yes: bool, as_json: bool) -> None:
    """Terminate nodes and remove everything they own: instance, spot request, security group,
    volumes, ssh config entry (and the key pair with the region's last node). Safe to repeat."""
    from gpuprov import lifecycle

    store, provider = store_and_provider()
    targets = [n.name for n in store.nodes()] if all_nodes else list(names)
    if all_nodes and not targets:
        click.echo(json.dumps({}) if as_json else "nothing to do: gpuprov manages no nodes")
        return
    if not targets:
        raise UserInputError("NAME", "no node named", "name the nodes to take down, or pass --all")
    for n in targets:
        store.node(n)  # unknown names fail before anything is touched
    if not yes:
        confirm(f"Terminate {', '.join(targets)} and delete their resources?", "take them down")
    console = make_console(stderr=as_json)
    results = lifecycle.down(targets, provider, store, say_to(console))
    if as_json:
        click.echo(json.dumps({name: {"complete": r.complete, "removed": r.removed, "left": r.left}
                               for name, r in results.items()}, indent=2))
    for name, result in results.items():
        if result.complete and not as_json:
            console.print(f"{name}: down ({len(result.removed)} resources removed)")
    incomplete = [r for r in results.values() if not r.complete]
    if incomplete:
        raise lifecycle.TeardownIncomplete(incomplete)


@main.command()
@click.option("--region", "regions", multiple=True,
              help="Region(s) to sweep [default: those of your nodes, and the AWS chain's region (AWS_REGION, profile, "
                   "us-east-1)].")
@click.option("--all-regions", is_flag=True, help="Every region in the catalog.")
@click.option("-y", "--yes", is_flag=True, help="Delete what is found (default: list only).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: what was found (and, with --yes, what is left).")
def gc(regions: tuple[str, ...], all_regions: bool, yes: bool, as_json: bool) -> None:
    """Find resources tagged as yours that no local node owns (left by a crash or another machine's
    lost state); list them, and delete them with --yes."""
    from gpuprov import catalog, lifecycle

    store, provider = store_and_provider()
    cat = catalog.load()
    where = list(cat.regions) if all_regions else [cat.check_region(r) for r in regions] or \
        sorted({n.region for n in store.nodes(include_terminated=True)} | {region_from(None).name})
    found = lifecycle.orphans(where, provider, store)
    console = make_console(stderr=as_json)
    if not as_json:
        if not found:
            console.print(f"nothing to collect in {', '.join(where)}")
            return
        for res in found:
            console.print(f"{res.region}  {res.kind:<15} {res.id:<24} node={res.node} {res.state}")
    left = lifecycle.gc(found, provider, store, say_to(console)) if yes and found else []
    if as_json:
        click.echo(json.dumps({"regions": where, "deleted": yes, "left": left, "found": [
            {"region": r.region, "kind": r.kind, "id": r.id, "node": r.node, "state": r.state} for r in found]}, indent=2))
    if left:
        raise GpuprovError("could not remove everything; still there:\n" + "\n".join(f"  {w}" for w in left)
                           + "\n  rerun: gpuprov gc --yes")
    if found and not yes and not as_json:
        console.print(f"{len(found)} orphaned resource(s); rerun with --yes to delete them")


# --- guardrails -------------------------------------------------------------------------------


@main.command()
@click.argument("name", shell_complete=complete_node)
@click.argument("duration", metavar="DURATION|off")
def autostop(name: str, duration: str) -> None:
    """Change a running node's idle autostop: `gpuprov autostop NAME 2h`, or `off`.

    Rewrites /etc/gpuprov/autostop.conf on the node over SSH (the node powers itself off after
    that long with every GPU idle and nobody logged in) and records the setting locally.
    """
    from gpuprov import lifecycle
    from gpuprov.paths import known_hosts_path
    from gpuprov.remote import HostSettings
    from gpuprov.spec import parse_duration

    seconds = parse_duration(duration, "DURATION")
    store, _provider = store_and_provider()
    store.node(name)  # an unknown name fails here, naming the known ones
    target = node_target(name)
    if target is None:
        raise click.UsageError(f"{name} has no address to reach (is it running? `gpuprov status --refresh`)")
    lifecycle.set_autostop(name, seconds, store, target, HostSettings(known_hosts=known_hosts_path(), connect_timeout=15),
                           say_to(make_console()))
