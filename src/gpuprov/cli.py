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

    request = NodeRequest(
        gpu=kw["gpu"], count=kw["count"], spot=kw["spot"], region=kw["region"], playbook=kw["playbook"],
        os=kw["os_name"] or "ubuntu-24.04", pins=_pins(kw), instance_type=kw["instance_type"],
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
