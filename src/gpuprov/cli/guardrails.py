"""A running machine's guardrails: `autostop` and `ttl` of a node gpuprov launched or a host it bootstrapped."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpuprov.cli.common import main, make_console, node_target, say_to, store_and_provider
from gpuprov.cli.complete import cluster_names, complete_node, node_names

if TYPE_CHECKING:
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target
    from gpuprov.state import Store

lock_option = click.option(
    "--locked/--unlocked", "lock", default=None,
    help="Lock the node's autostop, TTL and budget to you (only you may change or lift them), or unlock them "
         "[default: as they are]. A node another member locked refuses any change but theirs.")


def _guard_target(name: str, identity: str | None) -> tuple[str | None, Store | None, Target, HostSettings]:
    """A node gpuprov launched (by name), or a host it bootstrapped ([USER@]HOST[:PORT], host key pinned)."""
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.paths import known_hosts_path
    from gpuprov.plan.inventory import parse_target, targets

    settings = HostSettings(known_hosts=known_hosts_path(), connect_timeout=15, key_filename=identity)
    target = node_target(name)
    if target is not None:
        store, _provider = store_and_provider()
        return name, store, target, settings
    from gpuprov.paths import state_folder
    from gpuprov.state import open_store

    if (state_folder() / "state.sqlite").exists():
        node = open_store().find_node(name)
        if node is not None and node.live:
            raise click.UsageError(f"{name} is {node.state} and has no address to reach"
                                   + (f": `gpuprov start {name}` first" if node.state == "stopped" else ""))
    from gpuprov.plan.inventory import check_known_word

    # a bare word that is no node, cluster, ssh config Host or /etc/hosts name is a typo, never sent to DNS
    check_known_word(name, node_names() + cluster_names(), None)
    (host,) = targets([parse_target(name)], None)
    return None, None, host, settings


@main.command()
@click.argument("name", metavar="NODE|[USER@]HOST[:PORT]", shell_complete=complete_node)
@click.argument("duration", metavar="DURATION|off")
@click.option("-i", "--identity", default=None, help="Private key for a host (nodes use their own).")
@lock_option
def autostop(name: str, duration: str, identity: str | None, lock: bool | None) -> None:
    """Change the idle autostop of a running node or a bootstrapped host: `gpuprov autostop NAME 2h`, or `off`.

    Rewrites /etc/gpuprov/autostop.conf over SSH (the machine shuts down after that long with every
    GPU idle and nobody logged in; a node stops or terminates as `status` says) and records it locally.
    """
    from gpuprov.cloud import guards
    from gpuprov.plan.spec import parse_duration

    seconds = parse_duration(duration, "DURATION")
    node, store, target, settings = _guard_target(name, identity)
    guards.set_autostop(node, seconds, store, target, settings, say_to(make_console()), lock)


@main.command()
@click.argument("name", metavar="NODE|[USER@]HOST[:PORT]", shell_complete=complete_node)
@click.argument("duration", metavar="DURATION|off")
@click.option("-i", "--identity", default=None, help="Private key for a host (nodes use their own).")
@lock_option
def ttl(name: str, duration: str, identity: str | None, lock: bool | None) -> None:
    """Give a running node or a host bootstrapped with --ttl a new deadline: `gpuprov ttl NAME 4h` (from
    now), or `off`. Rewrites /var/lib/gpuprov/ttl-deadline over SSH; `off` also lifts a --budget cap."""
    from gpuprov.cloud import guards
    from gpuprov.plan.spec import parse_duration

    seconds = parse_duration(duration, "DURATION")
    node, store, target, settings = _guard_target(name, identity)
    guards.set_ttl(node, seconds, store, target, settings, say_to(make_console()), lock)
