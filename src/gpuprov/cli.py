"""The `gpuprov` command line: parse, call the library, print. Decisions live in the library.

Heavy modules (boto3, fabric, the library itself) are imported inside commands, so that
`gpuprov --help` stays fast and works without them.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gpuprov import __version__
from gpuprov.errors import GpuprovError

if TYPE_CHECKING:
    from gpuprov.compat import StackPins
    from gpuprov.plan import Plan

F = TypeVar("F", bound=Callable[..., Any])


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False)


# --- shared options (pip-tools style) ---------------------------------------------------------


def _apply(func: F, options: list[Callable[[F], F]]) -> F:
    for option in reversed(options):
        func = option(func)
    return func


def pin_options(func: F) -> F:
    """What to install: playbook, OS and stack pins (plan, render, bootstrap, up)."""
    return _apply(func, [
        click.option(
            "-p", "--playbook", default="pytorch", show_default=True,
            help="Shipped playbook name (pytorch, minimal, llm-finetune, cuda-dev, inference) or a path to a .yml.",
        ),
        click.option("--os", "os_name", default=None,
                     help="ubuntu-22.04 or ubuntu-24.04. Default: 24.04 for new nodes, the host's own for bootstrap."),
        click.option("--driver", default=None, help="Pin the NVIDIA driver branch (580) or exact version (580.95.05)."),
        click.option("--cuda", default=None, help="Also install this CUDA toolkit (nvcc), e.g. 12.8. Wheels don't need it."),
        click.option("--torch", "torch_version", default=None, help="Pin the torch release, e.g. 2.9 or 2.9.1."),
        click.option("--torch-cuda", default=None, help="Pin the torch wheel's CUDA variant, e.g. cu128."),
        click.option("--python", default=None, help="Pin the env's Python version, e.g. 3.12."),
    ])


def stack_options(func: F) -> F:
    """What to launch and install (plan, render, up)."""
    return _apply(func, [
        click.option("--gpu", required=True, help="GPU name, optionally with a count: A100, h100, a100:8, l40s."),
        click.option("--count", type=int, default=1, show_default=True, help="Number of GPUs (or use --gpu NAME:N)."),
        click.option("--spot", is_flag=True, help="Ask for spot capacity (cheaper, can be interrupted)."),
        click.option("--region", default="us-east-1", show_default=True, help="AWS region."),
        click.option("--instance-type", default=None, help="Force an instance type instead of the cheapest that fits."),
        pin_options,
        guard_options,
    ])


def guard_options(func: F) -> F:
    """Guardrails installed on the node (plan, render, up): idle autostop, hard TTL, spot hook."""
    return _apply(func, [
        click.option("--autostop", default=None, metavar="DURATION",
                     help="Power off after this long idle (GPUs under 10%, nobody logged in): 30m, 2h, 1h30m."),
        click.option("--ttl", default=None, metavar="DURATION",
                     help="Power off this long after the bootstrap starts, whatever happens: 8h, 1d."),
        click.option("--on-interrupt", default=None, metavar="CMD",
                     help="Command the node runs once on a spot interruption notice (2 minutes ahead); "
                          "overrides the playbook's on_interrupt."),
    ])


def ssh_options(func: F) -> F:
    """How to reach existing hosts (bootstrap, check)."""
    return _apply(func, [
        click.argument("hosts", nargs=-1, metavar="NODE|[USER@]HOST[:PORT]..."),
        click.option("--inventory", default=None, help="YAML inventory of hosts (user, port, key, proxy_jump, gpu, os)."),
        click.option("-i", "--identity", default=None, help="Private key file (else ~/.ssh/config, then ssh's defaults)."),
        click.option("--ssh-config", default=None, type=click.Path(dir_okay=False), help="ssh config file [~/.ssh/config]."),
        click.option("--accept-new-host-key", is_flag=True,
                     help="Trust and pin the key of a host seen for the first time. A changed key is always refused."),
        click.option("--connect-timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for SSH."),
        click.option("--parallel", type=click.IntRange(1, 1024), default=32, show_default=True,
                     help="Hosts worked on at once."),
    ])


def _pins(kw: dict[str, Any]) -> StackPins:
    from gpuprov.compat import StackPins

    return StackPins(
        driver=kw["driver"], cuda=kw["cuda"], torch=kw["torch_version"], torch_cuda=kw["torch_cuda"], python=kw["python"]
    )


def _make_plan(kw: dict[str, Any]) -> Plan:
    from gpuprov.plan import NodeRequest, make_plan
    from gpuprov.spec import parse_duration

    request = NodeRequest(
        gpu=kw["gpu"], count=kw["count"], spot=kw["spot"], region=kw["region"], playbook=kw["playbook"],
        os=kw["os_name"] or "ubuntu-24.04", pins=_pins(kw), instance_type=kw["instance_type"],
        autostop_seconds=parse_duration(kw["autostop"], "--autostop"), ttl_seconds=parse_duration(kw["ttl"], "--ttl"),
        on_interrupt=kw["on_interrupt"] or None,
    )
    return make_plan(request)


def _handle_errors(func: F) -> F:
    """Print a GpuprovError as a short message (no traceback) and exit with its code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except GpuprovError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


# --- commands ---------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gpuprov")
def main() -> None:
    """GPU machines with a working, verified PyTorch, and back to zero spend.

    \b
    Offline:        gpuprov gpus | plan | render
    Existing hosts: gpuprov bootstrap | check
    Typical:   gpuprov plan --gpu A100 --spot                 # what it would launch and install
               gpuprov render --gpu L4 -o ./bundle            # the scripts, to read or run yourself
               gpuprov bootstrap ubuntu@10.1.2.3 -p pytorch   # install + verify on a machine you have
               gpuprov check ubuntu@10.1.2.3                  # nvidia-smi + torch.cuda, judged
    """


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--live", is_flag=True, help="Add current spot prices per zone (asks AWS; needs credentials).")
@click.option("--region", default="us-east-1", show_default=True, help="Region for --live.")
@_handle_errors
def gpus(as_json: bool, live: bool, region: str) -> None:
    """List the GPUs gpuprov knows, with the AWS instance types that carry them and their prices."""
    from gpuprov import catalog
    from gpuprov.report import gpus_table

    cat = catalog.load()
    if live:
        _live_prices(cat, cat.check_region(region), as_json)
        return
    if as_json:
        rows = [
            {**gpu.model_dump(), "instance_types": [it.model_dump() for it in cat.instance_types_for(gpu)]}
            for gpu in cat.gpus
        ]
        click.echo(json.dumps({"prices_as_of": cat.prices_as_of, "price_region": cat.price_region, "gpus": rows}, indent=2))
        return
    _console().print(gpus_table(cat))


@main.command()
@stack_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--show-scripts", is_flag=True, help="Also print every rendered script.")
@_handle_errors
def plan(as_json: bool, show_scripts: bool, **kw: Any) -> None:
    """Show what `up` would launch and install, without touching the network.

    Picks the cheapest instance type that carries the GPUs, resolves one consistent
    driver / CUDA / torch / Python stack (or explains why the pins cannot work), and lists
    the bootstrap steps in order.
    """
    from gpuprov.report import plan_view

    the_plan = _make_plan(kw)
    if as_json:
        data = the_plan.summary()
        if show_scripts:
            data["scripts"] = {s.filename: s.text for s in the_plan.bundle().scripts}
        click.echo(json.dumps(data, indent=2))
        return
    console = _console()
    console.print(plan_view(the_plan))
    if show_scripts:
        from rich.syntax import Syntax

        for script in the_plan.bundle().scripts:
            console.rule(script.filename)
            console.print(Syntax(script.text, "bash", line_numbers=False))


@main.command()
@stack_options
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write the scripts and manifest.json into.")
@_handle_errors
def render(out: Path, **kw: Any) -> None:
    """Write the bootstrap bundle: one script per step plus manifest.json (sha256 + resolved stack).

    Each script is self-contained bash; run them in order as root on the GPU host.
    """
    the_plan = _make_plan(kw)
    written = the_plan.bundle().write(out)
    click.echo(f"wrote {len(written) - 1} scripts and manifest.json to {out}")
    for path in written:
        click.echo(f"  {path.name}")


# --- existing hosts ---------------------------------------------------------------------------


def _node_target(name: str) -> Any:
    """A node gpuprov launched, by name: its address, login, key and pinned host key."""
    import re

    from gpuprov.paths import state_dir

    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) or not (state_dir() / "state.sqlite").exists():
        return None
    from gpuprov.inventory import Target
    from gpuprov.sshconfig import node_known_hosts
    from gpuprov.state import open_store

    node = open_store().find_node(name)
    if node is None or not node.live or not node.address:
        return None
    key = state_dir() / "keys" / node.region / "id_ed25519"
    return Target(host=node.address, user=node.ssh_user, key=str(key), label=node.name,
                  known_hosts=str(node_known_hosts(node.name)))


def _targets(kw: dict[str, Any]) -> list[Any]:
    from gpuprov.inventory import load_inventory, parse_target, targets

    nodes = [t for t in (_node_target(h) for h in kw["hosts"]) if t is not None]
    named = {t.label for t in nodes}
    entries = [parse_target(h) for h in kw["hosts"] if h not in named]
    defaults = None
    if kw["inventory"]:
        inventory = load_inventory(kw["inventory"])
        entries += list(inventory.hosts)
        defaults = inventory.defaults
    if not entries and not nodes:
        raise click.UsageError("name at least one host ([USER@]HOST[:PORT]), node, or an --inventory file")
    return nodes + targets(entries, defaults)


def _settings(kw: dict[str, Any]) -> Any:
    from gpuprov.paths import known_hosts_path
    from gpuprov.remote import HostSettings

    return HostSettings(
        known_hosts=known_hosts_path(), accept_new_host_key=kw["accept_new_host_key"],
        connect_timeout=kw["connect_timeout"], ssh_config=Path(kw["ssh_config"]) if kw["ssh_config"] else None,
        key_filename=kw["identity"],
    )


@main.command()
@ssh_options
@pin_options
@click.option("--gpu", default=None, help="The GPU the hosts carry; default: what each host reports. A mismatch stops that host.")
@click.option("--force", is_flag=True, help="Rerun every step, even those whose marker says they are done.")
@click.option("--reboot-timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for a host to come back.")
@click.option("-v", "--verbose", is_flag=True, help="Stream every host's remote output (it always goes to the log).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@_handle_errors
def bootstrap(force: bool, reboot_timeout: float, verbose: bool, as_json: bool, gpu: str | None, **kw: Any) -> None:
    """Install the playbook's stack on existing hosts over SSH, then verify it.

    Runs on all hosts at once (bounded by --parallel). Each step leaves a marker with its
    script's sha256 on the host, so a rerun skips what is done and resumes where a failure
    or a dropped connection stopped it. A fresh driver install reboots the host and waits.
    Exit code 0 only when every host ended ok.
    """
    from gpuprov import bootstrap as engine
    from gpuprov.compat import check_pins
    from gpuprov.plan import make_host_plan
    from gpuprov.report import LiveHosts, bootstrap_summary
    from gpuprov.spec import load_playbook

    pins = _pins(kw)
    check_pins(pins)
    load_playbook(kw["playbook"])
    if gpu:  # an impossible stack is refused before any host is touched
        make_host_plan(gpu, kw["playbook"], kw["os_name"] or "ubuntu-24.04", pins)
    targets = _targets(kw)
    console = _console()
    options = engine.Options(force=force, parallel=kw["parallel"], reboot_timeout=reboot_timeout,
                             echo=(lambda line: console.print(line, markup=False)) if verbose else None)
    plan_for = engine.planner(gpu, kw["playbook"], kw["os_name"], pins)
    with LiveHosts(console, [t.name for t in targets], enabled=not as_json and not verbose) as live:
        results = engine.bootstrap(targets, _settings(kw), plan_for, options, reporter=live)
    if as_json:
        click.echo(json.dumps([_host_json(r) for r in results], indent=2))
    else:
        console.print(bootstrap_summary(results))
    sys.exit(0 if all(r.status in ("ok", "changed") for r in results) else 1)


def _host_json(r: Any) -> dict[str, Any]:
    return {
        "host": r.target.name, "result": r.summary, "status": r.status, "failed_step": r.failed_step, "error": r.error,
        "seconds": round(r.seconds, 2), "log": str(r.log_path),
        "steps": [{"name": s.name, "outcome": s.outcome, "seconds": round(s.seconds, 2), "message": s.message}
                  for s in r.steps],
        "report": r.report.model_dump(mode="json") if r.report else None,
    }


@main.command()
@ssh_options
@click.option("--gpu", default=None, help="The GPU model the hosts should show.")
@click.option("--env", "env_path", default="/opt/gpuprov/env", show_default=True, help="Python env whose torch to check.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
@_handle_errors
def check(gpu: str | None, env_path: str, as_json: bool, **kw: Any) -> None:
    """Verify hosts: nvidia-smi, /dev/nvidia*, torch.cuda and a matmul on every GPU, judged.

    The expected stack comes from what gpuprov installed there (its manifest), else from --gpu
    and the GPUs on the PCI bus. Each failed check names the reason and the fix.
    Exit code 0 only when every host passes.
    """
    from gpuprov.check import check as run_check
    from gpuprov.report import check_tables

    results = run_check(_targets(kw), _settings(kw), gpu=gpu, env_path=env_path, parallel=kw["parallel"])
    if as_json:
        click.echo(json.dumps([
            {"host": r.target.name, "ok": r.ok, "error": r.error,
             "report": r.report.model_dump(mode="json") if r.report else None} for r in results
        ], indent=2))
    else:
        console = _console()
        for renderable in check_tables(results):
            console.print(renderable)
    sys.exit(0 if all(r.ok for r in results) else 1)


# --- cloud lifecycle --------------------------------------------------------------------------


def _store_and_provider(region: str | None = None) -> tuple[Any, Any]:
    import os

    from gpuprov.lifecycle import owner
    from gpuprov.paths import state_dir
    from gpuprov.providers.aws import AwsProvider
    from gpuprov.state import open_store

    store = open_store()
    poll = float(os.environ.get("GPUPROV_POLL_SECONDS", "2"))
    return store, AwsProvider(store, owner(), state_dir() / "keys", poll=poll)


def _say(console: Any) -> Callable[[str], None]:
    return lambda text: console.print(text, markup=False, highlight=False)


@main.command()
@click.argument("name", required=False)
@stack_options
@click.option("--fallback", type=click.Choice(["none", "on-demand"]), default="none", show_default=True,
              help="With --spot: after every spot offer is refused, try on-demand too.")
@click.option("--max-price", type=float, default=None, help="Spot: the most to pay per hour (AWS advises leaving it unset).")
@click.option("--disk", "disk_gb", type=click.IntRange(20, 16384), default=100, show_default=True,
              help="Root volume, GB (gp3, encrypted).")
@click.option("--image", default=None, help="AMI id instead of Canonical's Ubuntu from SSM.")
@click.option("--ssh-cidr", default=None, help="Open SSH to this CIDR instead of your public address /32.")
@click.option("--connect", type=click.Choice(["public", "private"]), default="public", show_default=True,
              help="Reach the node on its public or private address (VPN / bastion).")
@click.option("--subnet", default=None, help="Launch into this subnet (its zone only) instead of the default VPC.")
@click.option("--ssh-user", default="ubuntu", show_default=True, help="Login user of the image.")
@click.option("--no-bootstrap", is_flag=True, help="Launch and wait for SSH only; install nothing.")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop (the same plan `gpuprov plan` prints).")
@click.option("--yes", is_flag=True, help="Do not ask before launching.")
@click.option("-v", "--verbose", is_flag=True, help="Stream the node's bootstrap output.")
@_handle_errors
def up(name: str | None, fallback: str, max_price: float | None, disk_gb: int, image: str | None, ssh_cidr: str | None,
       connect: str, subnet: str | None, ssh_user: str, no_bootstrap: bool, dry_run: bool, yes: bool, verbose: bool,
       **kw: Any) -> None:
    """Launch a GPU node on AWS, bootstrap and verify it, and print how to connect.

    Tries every instance type that carries the GPUs in every zone that offers it, cheapest
    first, printing AWS's own error for each refusal. Everything it creates is tagged and
    recorded before it is requested; if the launch or bootstrap fails (or you press Ctrl-C),
    it all comes down again.
    """
    from gpuprov import lifecycle
    from gpuprov.report import plan_view

    the_plan = _make_plan(kw)
    console = _console()
    if dry_run:
        console.print(plan_view(the_plan))
        return
    node_name = lifecycle.check_name(name) if name else lifecycle.new_name()
    if not yes:
        price = the_plan.price_usd_hour
        click.confirm(f"Launch {node_name}: {the_plan.instance.name if the_plan.instance else '?'}"
                      f" ({'spot' if kw['spot'] else 'on-demand'}, list ${price or 0:.2f}/h)?", abort=True, err=True)
    store, provider = _store_and_provider()
    opts = lifecycle.UpOptions(
        name=node_name, fallback_on_demand=fallback == "on-demand", max_price=max_price, disk_gb=disk_gb, image=image,
        ssh_cidr=ssh_cidr, connect=connect, subnet=subnet, ssh_user=ssh_user, bootstrap=not no_bootstrap,
        verbose_echo=(lambda line: console.print(line, markup=False)) if verbose else None,
    )
    result = lifecycle.up(the_plan, opts, provider, store, _say(console))
    node = result.node
    console.print(f"\n[bold green]{node.name} is ready[/]: {node.instance_type} in {node.zone} ({node.market}), "
                  f"{node.address}, list price ${node.price_usd_hour or 0:.2f}/h on-demand")
    console.print(f"  ssh {result.ssh_alias}        # or: gpuprov check / gpuprov down {node.name}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--refresh", is_flag=True, help="Ask the cloud first (one batched call per region).")
@_handle_errors
def status(as_json: bool, refresh: bool) -> None:
    """Nodes gpuprov manages: state, address, $/h, $ so far, age."""
    from gpuprov import lifecycle
    from gpuprov.report import status_rows, status_table

    store, provider = _store_and_provider()
    nodes = lifecycle.refresh(store, provider) if refresh else store.nodes()
    if as_json:
        click.echo(json.dumps(status_rows(nodes), indent=2))
    else:
        _console().print(status_table(nodes))


@main.command()
@click.argument("names", nargs=-1)
@click.option("--all", "all_nodes", is_flag=True, help="Every node gpuprov manages.")
@click.option("--yes", is_flag=True, help="Do not ask.")
@_handle_errors
def down(names: tuple[str, ...], all_nodes: bool, yes: bool) -> None:
    """Terminate nodes and remove everything they own: instance, spot request, security group,
    volumes, ssh config entry (and the key pair with the region's last node). Safe to repeat."""
    from gpuprov import lifecycle

    store, provider = _store_and_provider()
    targets = [n.name for n in store.nodes()] if all_nodes else list(names)
    if not targets:
        raise click.UsageError("name the nodes to take down, or pass --all")
    for n in targets:
        store.node(n)  # unknown names fail before anything is touched
    if not yes:
        click.confirm(f"Terminate {', '.join(targets)} and delete their resources?", abort=True, err=True)
    console = _console()
    for name, removed in lifecycle.down(targets, provider, store, _say(console)).items():
        console.print(f"{name}: down ({len(removed)} resources removed)")


@main.command()
@click.option("--region", "regions", multiple=True, help="Region(s) to sweep [default: those of your nodes, or us-east-1].")
@click.option("--all-regions", is_flag=True, help="Every region in the catalog.")
@click.option("--yes", is_flag=True, help="Delete what is found (default: list only).")
@_handle_errors
def gc(regions: tuple[str, ...], all_regions: bool, yes: bool) -> None:
    """Find resources tagged as yours that no local node owns (left by a crash or another machine's
    lost state); list them, and delete them with --yes."""
    from gpuprov import catalog, lifecycle

    store, provider = _store_and_provider()
    cat = catalog.load()
    where = list(cat.regions) if all_regions else [cat.check_region(r) for r in regions] or \
        sorted({n.region for n in store.nodes(include_terminated=True)} | {"us-east-1"})
    found = lifecycle.orphans(where, provider, store)
    console = _console()
    if not found:
        console.print(f"nothing to collect in {', '.join(where)}")
        return
    for res in found:
        console.print(f"{res.region}  {res.kind:<15} {res.id:<24} node={res.node} {res.state}")
    if yes:
        lifecycle.gc(found, provider, store, _say(console))
    else:
        console.print(f"{len(found)} orphaned resource(s); rerun with --yes to delete them")


def _live_prices(cat: Any, region: str, as_json: bool) -> None:
    from gpuprov.report import live_prices_table

    _store, provider = _store_and_provider()
    on_demand = {it.name: it.price_usd_hour for it in cat.instance_types}
    offered = provider.offerings(region, list(on_demand))
    prices = provider.prices(region, sorted(offered))
    rows = [(p, on_demand.get(p.instance_type)) for p in prices]
    if as_json:
        click.echo(json.dumps([
            {"instance_type": p.instance_type, "zone": p.zone, "spot_usd_hour": p.price, "on_demand_usd_hour": od,
             "saving_pct": round((1 - p.price / od) * 100, 1) if od else None} for p, od in rows], indent=2))
        return
    _console().print(live_prices_table(rows, region))


# --- guardrails -------------------------------------------------------------------------------


@main.command()
@click.argument("name")
@click.argument("duration", metavar="DURATION|off")
@_handle_errors
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
    store, _provider = _store_and_provider()
    store.node(name)  # an unknown name fails here, naming the known ones
    target = _node_target(name)
    if target is None:
        raise click.UsageError(f"{name} has no address to reach (is it running? `gpuprov status --refresh`)")
    lifecycle.set_autostop(name, seconds, store, target, HostSettings(known_hosts=known_hosts_path(), connect_timeout=15),
                           _say(_console()))


# --- access: ssh, exec, tunnel, jupyter, sync, monitor ----------------------------------------


class _DashDashCommand(click.Command):
    """A command whose words after `--` are a remote command, kept out of click's parsing
    (in ctx.meta["gpuprov.argv"])."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["gpuprov.argv"] = list(args[cut + 1:])
            args = args[:cut]
        else:
            ctx.meta["gpuprov.argv"] = []
        return super().parse_args(ctx, args)


def _reach_options(accept_new: bool) -> Callable[[F], F]:
    """How to reach one or more hosts (the access commands)."""
    opts: list[Callable[[F], F]] = [
        click.option("-i", "--identity", default=None, help="Private key file (else the node's, ~/.ssh/config, ssh's defaults)."),
        click.option("--ssh-config", default=None, type=click.Path(dir_okay=False), help="ssh config file [~/.ssh/config]."),
        click.option("--connect-timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for SSH."),
    ]
    if accept_new:
        opts.append(click.option("--accept-new-host-key", is_flag=True,
                                 help="Trust and pin the key of a host seen for the first time; a changed key is refused."))
    return lambda func: _apply(func, opts)


def _reach(hosts: tuple[str, ...], inventory: str | None, kw: dict[str, Any]) -> tuple[list[Any], Any]:
    targets = _targets({"hosts": hosts, "inventory": inventory})
    settings = _settings({"accept_new_host_key": kw.get("accept_new_host_key", False), **kw})
    return targets, settings


def _one(host: str, kw: dict[str, Any]) -> tuple[Any, Any]:
    targets, settings = _reach((host,), None, kw)
    return targets[0], settings


def _warn_unpinned(target: Any, settings: Any) -> None:
    from gpuprov import access

    if access.is_pinned(target, settings) is False:
        click.secho(access.pin_hint(target, access.known_hosts_for(target, settings)), fg="yellow", err=True)


def _need_tool(name: str, package: str) -> None:
    import shutil

    if shutil.which(name) is None:
        raise GpuprovError(f"no `{name}` on PATH; install {package}")


@main.command("ssh", cls=_DashDashCommand)
@click.argument("host", metavar="NODE|[USER@]HOST[:PORT] [-- CMD...]")
@_reach_options(accept_new=False)
@_handle_errors
def ssh_cmd(host: str, **kw: Any) -> None:
    """A shell on a node or host through the system ssh, its host key pinned (`-- CMD` runs CMD).

    \b
    gpuprov ssh my-node                 # interactive shell
    gpuprov ssh my-node -- nvidia-smi   # run a command; exits with its exit code
    Keys are checked against the node's (or gpuprov's) known_hosts with StrictHostKeyChecking=yes;
    pin a new host once with `gpuprov exec --accept-new-host-key HOST -- true`.
    """
    import os

    from gpuprov import access

    _need_tool("ssh", "the OpenSSH client (openssh-client)")
    target, settings = _one(host, kw)
    _warn_unpinned(target, settings)
    argv = access.ssh_argv(target, settings, click.get_current_context().meta["gpuprov.argv"])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)


@main.command("exec", cls=_DashDashCommand)
@click.argument("hosts", nargs=-1, metavar="NODE|[USER@]HOST[:PORT]... -- CMD...")
@click.option("--inventory", default=None, help="YAML inventory of hosts (user, port, key, proxy_jump).")
@_reach_options(accept_new=True)
@click.option("--parallel", type=click.IntRange(1, 1024), default=32, show_default=True, help="Hosts worked on at once.")
@click.option("--sudo", is_flag=True, help="Run the command as root (sudo -n) where the login user is not root.")
@click.option("--timeout", type=float, default=None, help="Seconds before the command is given up on each host.")
@click.option("--no-prefix", is_flag=True, help="Print the hosts' lines as they are, without `HOST | `.")
@_handle_errors
def exec_cmd(hosts: tuple[str, ...], inventory: str | None, parallel: int, sudo: bool, timeout: float | None,
             no_prefix: bool, **kw: Any) -> None:
    """Run a command on one or many hosts at once, streaming each line prefixed by its host.

    \b
    gpuprov exec node-a node-b -- nvidia-smi -L
    Like ssh, the words after -- are joined by spaces for the remote shell. Exit code: the host's
    own for one host; for several, 0 when all succeeded, else the first failure's; 255 when a
    host cannot be reached (or its key is not pinned).
    """
    import threading

    from gpuprov import access

    words = click.get_current_context().meta["gpuprov.argv"]
    if not words:
        raise click.UsageError("give the command after --, e.g. gpuprov exec node-a node-b -- nvidia-smi -L")
    targets, settings = _reach(hosts, inventory, kw)
    width = max(len(t.name) for t in targets)
    lock = threading.Lock()

    def emit(target: Any, stream: str, line: str) -> None:
        text = line if no_prefix else f"{target.name:<{width}} | {line}"
        with lock:
            click.echo(text, err=stream == "err")

    results = access.exec_many(targets, settings, " ".join(words), emit, parallel=parallel, sudo=sudo, timeout=timeout)
    for r in results:
        if r.error:
            click.secho(f"{r.target.name:<{width}} | error: {r.error}", fg="red", err=True)
    if len(results) > 1:
        failed = [r for r in results if r.exit_code != 0]
        codes = ", ".join(f"{r.target.name}: exit {r.exit_code}" for r in failed)
        click.echo(f"{len(results) - len(failed)}/{len(results)} hosts ok" + (f"; {codes}" if codes else ""), err=True)
    sys.exit(access.combined_exit_code(results))


def _forward_until_stopped(remote: Any, spec: Any, announce: Callable[[int], str]) -> None:
    """Forward until Ctrl-C or SIGTERM (exit 0), or until the SSH connection drops (exit 255)."""
    import signal
    import time

    from gpuprov import access

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    forward = access.LocalForward(remote, spec, on_error=lambda text: click.secho(f"warning: {text}", fg="yellow", err=True))
    port = forward.start()
    click.echo(announce(port))
    click.echo(f"forwarding 127.0.0.1:{port} -> {spec.remote_host}:{spec.remote_port} on {remote.target.name}; "
               "Ctrl-C to stop", err=True)
    try:
        while forward.alive:
            time.sleep(0.5)
        click.secho(f"error: the SSH connection to {remote.target.name} was lost", fg="red", err=True)
        code = 255
    except KeyboardInterrupt:
        code = 0
    finally:
        forward.stop()
        remote.close()
    sys.exit(code)


def _open(target: Any, settings: Any) -> Any:
    from gpuprov.remote import Remote

    remote = Remote(target, settings)
    remote.open()
    return remote


@main.command()
@click.argument("host", metavar="NODE|[USER@]HOST[:PORT]")
@click.argument("ports", metavar="LOCAL[:REMOTE]")
@_reach_options(accept_new=True)
@_handle_errors
def tunnel(host: str, ports: str, **kw: Any) -> None:
    """Forward a local port to a port on the host (SSH local forwarding) until Ctrl-C.

    \b
    gpuprov tunnel my-node 8000          # 127.0.0.1:8000 -> the node's 127.0.0.1:8000
    gpuprov tunnel my-node 9000:8000     # a different local port
    gpuprov tunnel my-node 0:6006        # any free local port (printed)
    Listens on 127.0.0.1 only; prints the local URL.
    """
    from gpuprov import access

    spec = access.parse_forward(ports)
    target, settings = _one(host, kw)
    _forward_until_stopped(_open(target, settings), spec, lambda port: f"http://127.0.0.1:{port}/")


@main.command()
@click.argument("host", metavar="NODE|[USER@]HOST[:PORT]")
@click.option("--port", type=click.IntRange(0, 65535), default=8888, show_default=True,
              help="Local port (0: any free one).")
@click.option("--remote-port", type=click.IntRange(1, 65535), default=8888, show_default=True,
              help="JupyterLab's port on the host.")
@_reach_options(accept_new=True)
@_handle_errors
def jupyter(host: str, port: int, remote_port: int, **kw: Any) -> None:
    """Open a node's JupyterLab through an SSH tunnel and print its URL with the token.

    For hosts set up with a `jupyter: true` playbook (e.g. bootstrap -p jupyter): reads the token
    over SSH, forwards 127.0.0.1:PORT to it, prints http://127.0.0.1:PORT/lab?token=... and keeps
    the tunnel open until Ctrl-C."""
    from gpuprov import access

    target, settings = _one(host, kw)
    remote = _open(target, settings)
    try:
        token = access.read_jupyter_token(remote)
    except BaseException:
        remote.close()
        raise
    spec = access.ForwardSpec(port, "127.0.0.1", remote_port)
    _forward_until_stopped(remote, spec, lambda local: access.jupyter_url(local, token))


@main.command()
@click.argument("host", metavar="NODE|[USER@]HOST[:PORT]")
@click.argument("src")
@click.argument("dst")
@_reach_options(accept_new=False)
@click.option("--delete", is_flag=True, help="Delete files on the receiving side that the sending side lacks.")
@click.option("--progress/--no-progress", default=None, help="Show transfer progress [default: on a terminal].")
@_handle_errors
def sync(host: str, src: str, dst: str, delete: bool, progress: bool | None, **kw: Any) -> None:
    """Copy files to or from a host with rsync over the same pinned SSH settings.

    \b
    gpuprov sync my-node ./data my-node:data      # upload (rsync -a; a trailing / copies contents)
    gpuprov sync my-node my-node:runs/ ./runs/    # download
    `HOST:PATH` (or just `:PATH`) marks the remote side; relative paths are in the login's home.
    """
    import subprocess

    from gpuprov import access

    _need_tool("rsync", "rsync (here and on the host)")
    plan = access.split_sync(host, src, dst)
    target, settings = _one(host, kw)
    _warn_unpinned(target, settings)
    show = sys.stdout.isatty() if progress is None else progress
    code = subprocess.call(access.rsync_argv(target, settings, plan, progress=show, delete=delete))
    if code != 0:
        click.secho(f"error: rsync exited {code}", fg="red", err=True)
    sys.exit(code)


@main.command()
@click.argument("hosts", nargs=-1, metavar="NODE|[USER@]HOST[:PORT]...")
@click.option("--inventory", default=None, help="YAML inventory of hosts (user, port, key, proxy_jump).")
@_reach_options(accept_new=True)
@click.option("--parallel", type=click.IntRange(1, 1024), default=32, show_default=True, help="Hosts sampled at once.")
@click.option("--interval", type=click.FloatRange(0.2), default=2.0, show_default=True, help="Seconds between samples.")
@click.option("--once", is_flag=True, help="One sample, then exit (exit 1 when a host could not be sampled).")
@click.option("--json", "as_json", is_flag=True, help="JSON: one array per sample (with --once, one document).")
@_handle_errors
def monitor(hosts: tuple[str, ...], inventory: str | None, parallel: int, interval: float, once: bool, as_json: bool,
            **kw: Any) -> None:
    """Live GPU utilisation, memory, temperature and power of several hosts (like `watch nvidia-smi`)."""
    import time

    from gpuprov import access
    from gpuprov.report import monitor_table

    targets, settings = _reach(hosts, inventory, kw)
    mon = access.Monitor(targets, settings, parallel=parallel)

    def as_data(samples: list[Any]) -> list[dict[str, Any]]:
        return [{"host": s.target.name, "ok": s.ok, "error": s.error, "time": round(s.at, 3),
                 "gpus": [g.model_dump(mode="json") for g in s.gpus]} for s in samples]

    try:
        if once:
            samples = mon.sample()
            if as_json:
                click.echo(json.dumps(as_data(samples), indent=2))
            else:
                _console().print(monitor_table(samples))
            sys.exit(0 if all(s.ok for s in samples) else 1)
        if as_json:
            while True:
                start = time.monotonic()
                click.echo(json.dumps(as_data(mon.sample())))
                time.sleep(max(0.0, interval - (time.monotonic() - start)))
        from rich.live import Live

        console = _console()
        with Live(monitor_table(mon.sample(), interval), console=console, auto_refresh=False) as live:
            while True:
                start = time.monotonic()
                time.sleep(max(0.0, interval - (time.monotonic() - start)))
                live.update(monitor_table(mon.sample(), interval), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        mon.close()


# --- diagnosis --------------------------------------------------------------------------------


@main.command()
@ssh_options
@click.option("--env", "env_path", default="/opt/gpuprov/env", show_default=True, help="Python env whose torch to check.")
@click.option("--min-free-gb", type=float, default=10.0, show_default=True,
              help="Warn when / or the env's filesystem has less free space than this.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings (and the facts behind them) as JSON.")
@_handle_errors
def doctor(env_path: str, min_free_gb: float, as_json: bool, **kw: Any) -> None:
    """Find why a host's GPU stack is broken: each finding names the cause and the fix.

    One command per host (as root) gathers the facts: OS, GPUs on the PCI bus, nouveau, kernel
    headers, the apt lock, the driver package and its hold, Secure Boot, the kernel module,
    nvidia-smi, Fabric Manager on NVSwitch hosts, nvidia-persistenced, /dev/nvidia*, torch's CUDA
    build against the driver, free disk. Findings run from root cause to symptom; passes show as ok.
    Exit code 0 when no host has a failure (warnings allowed).
    """
    from gpuprov.doctor import doctor as run_doctor
    from gpuprov.report import doctor_tables

    results = run_doctor(_targets(kw), _settings(kw), env_path=env_path, min_free_gb=min_free_gb, parallel=kw["parallel"])
    if as_json:
        click.echo(json.dumps([
            {"host": r.target.name, "ok": r.ok, "unreachable": r.unreachable, "error": r.error,
             "seconds": round(r.seconds, 2),
             "findings": [c.model_dump(mode="json") for c in r.report.findings] if r.report else None,
             "facts": r.report.facts.model_dump(mode="json") if r.report else None} for r in results
        ], indent=2))
    else:
        console = _console()
        for renderable in doctor_tables(results):
            console.print(renderable)
    sys.exit(0 if all(r.ok for r in results) else 1)
