"""`gpuprov gc`: resources tagged as yours that no local node owns, listed, and deleted with --yes.

The listing says who of a team made each resource (its `gpuprov:member` tag); `--all-regions` sweeps every
region of the chosen cloud's catalog that the cloud says is enabled (DescribeRegions) and names the regions it
could not read. One cloud at a time (--cloud): its regions, its catalog, its provider; the rules are cloud/gc.py's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from gpuprov.cli.common import (
    chosen_cloud,
    cloud_option,
    main,
    make_console,
    region_from,
    say_to,
    store_and_provider,
    team_scope,
)
from gpuprov.cli.complete import complete_region
from gpuprov.errors import GpuprovError, UserInputError

if TYPE_CHECKING:
    from rich.console import Console

    from gpuprov.cloud.providers.base import CloudResource, Provider
    from gpuprov.state import Store


@main.command()
@click.option("--region", "regions", multiple=True, shell_complete=complete_region,
              help="Region(s) to sweep [default: those of your nodes on the cloud, and its default region: AWS's chain "
                   "(AWS_REGION, profile, us-east-1), Alibaba Cloud's ALIBABA_CLOUD_REGION_ID or cn-hangzhou].")
@click.option("--all-regions", is_flag=True, help="Every region in the cloud's catalog that the account has enabled.")
@click.option("-y", "--yes", is_flag=True, help="Delete what is found (default: list only).")
@click.option("--all-installs", is_flag=True,
              help="Also take what other gpuprov installs with your user and host name tagged (a lost state "
                   "folder, an older gpuprov, a cloned machine, another CI runner): they may be another "
                   "machine's live nodes, so they are only listed otherwise.")
@click.option("--stopped-for", "stopped_for", default=None, metavar="DURATION",
              help="Also nodes stopped longer than this, e.g. 14d (their disks bill every month): listed with what "
                   "each has cost while stopped, taken down with --yes [config: stopped_for; default: off].")
@click.option("--team", "everyone", is_flag=True,
              help="With team state: --stopped-for takes every member's stopped nodes, not only yours (those your "
                   "install launched).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: what was found (and, with --yes, what is left).")
@cloud_option
def gc(regions: tuple[str, ...], all_regions: bool, yes: bool, all_installs: bool, stopped_for: str | None,
       everyone: bool, as_json: bool) -> None:
    """Find resources tagged as yours that no local node owns (left by a crash or another machine's
    lost state); list them, and delete them with --yes.

    An orphan is a node whose `up` ended before it was ready, or a resource tagged with your owner id
    that no node of yours claims. A node another gpuprov is working on (an `up`, `down`, `start`,
    `image bake`: its lock is held) is left alone and named; a stopped node is never an orphan.
    With team state, --stopped-for takes your own stopped nodes and names the teammates' it leaves;
    --team takes everyone's. A stopped node whose playbook saves data on `down` is left and named: it
    cannot save while stopped (`gpuprov start` it first, or `gpuprov down NAME --no-save`).
    """
    from gpuprov.cloud import gc as sweep
    from gpuprov.cloud.tags import owner
    from gpuprov.plan.plan import catalog_for
    from gpuprov.plan.spec import parse_duration

    # checked before anything is read (a value from the config file is blamed on its line: params.Command)
    stopped_seconds = parse_duration(stopped_for, "--stopped-for", allow_off=True)
    team = team_scope(everyone, goes_with="--stopped-for", given=stopped_seconds is not None,
                      why="the orphans gc finds are the team's already, whoever made them",
                      alone="--stopped-for alone takes every stopped node gpuprov manages here")
    if all_regions and regions:
        raise UserInputError("--region", "cannot be given with --all-regions, which sweeps every enabled region",
                             "drop one of them")
    cat = catalog_for(chosen_cloud())  # the swept cloud's regions, never another cloud's
    for region in regions:
        cat.check_region(region)
    reading = _reading(yes)
    note = None
    if reading is None:
        store, provider = store_and_provider()
        me = owner()
    else:  # no state to read: none is made for a look, nor an install id
        store, provider, me, note = reading
    console = make_console(stderr=as_json)
    say = say_to(console)
    if all_regions:  # the regions the account has enabled: an opt-in region it has not enabled answers AuthFailure
        where = list(cat.regions)
        try:
            enabled = set(provider.enabled_regions(region_from(None).name))
        except UserInputError:  # no credentials, no such profile: no region could be swept either
            raise
        except GpuprovError as exc:
            say(f"could not list the account's regions ({exc}); sweeping every region gpuprov knows")
        else:
            off = [r for r in where if r not in enabled]
            where = [r for r in where if r in enabled]
            if off:
                say(f"not enabled for this account, not swept: {', '.join(off)}")
    else:
        where = [cat.check_region(r) for r in regions] or \
            sorted({n.region for n in store.nodes(include_terminated=True) if n.provider == provider.name}
                   | {region_from(None).name})  # the regions of this cloud's nodes: gc sweeps one cloud (--cloud)
    scope = "yours" if team and not everyone else ("team" if team else None)
    from gpuprov.cloud import journal

    journal.settle_all(provider, store, say, act=yes)  # a move a killed command left: finished or undone first
    stopped_rows, stale_left = _stopped(stopped_seconds, where, yes, as_json, provider, store, console, say, scope)
    found = sweep.orphans(where, provider, store, all_installs=all_installs, owner=me)
    if note and not found.errors:  # said once the environment proved good: an error stays the one line it is
        click.echo(note, err=True)
    for line in found.busy:
        say(line)
    if not as_json:
        if found.others:
            console.print(f"{len(found.others)} resource(s) of other gpuprov installs with your user and host name: "
                          "not collected (another machine may own them); `gpuprov gc --all-installs` takes them:",
                          markup=False)
            for res in found.others:
                console.print(f"  {res.region}  {res.kind:<15} {res.id:<24} node={res.node} owner={res.owner}",
                              markup=False)
        if not found.found:
            console.print(f"nothing to collect in {', '.join(r for r in where if not _failed(r, found.errors))} "
                          f"(owner {me})", markup=False)
            if stale_left:
                raise GpuprovError("could not remove everything; still there:\n"
                                   + "\n".join(f"  {w}" for w in stale_left) + "\n  rerun: gpuprov gc --yes")
            _region_errors(found.errors)
            return
        console.print(f"owner {me}:", markup=False)
        for res in found.found:
            mark = f" (owner {res.owner})" if res.owner and res.owner != me and not res.member else ""
            made = f" by {res.member.split('/')[0]}" if res.member else ""  # team state: who of the team made it
            console.print(f"{res.region}  {res.kind:<15} {res.id:<24} node={res.node} {res.state}{made}{mark}",
                          markup=False)
    left = sweep.gc(found.found, provider, store, say) if yes and found.found else []
    if as_json:
        def row(r: CloudResource) -> dict[str, object]:
            return {"region": r.region, "kind": r.kind, "id": r.id, "node": r.node, "state": r.state, "owner": r.owner,
                    "member": r.member}  # gpuprov:member: who of the team made it (None: no team tag)

        click.echo(json.dumps({"regions": where, "owner": me, "deleted": yes, "left": left + stale_left,
                               "stopped": stopped_rows,
                               "found": [row(r) for r in found.found], "busy": found.busy,
                               "other_installs": [row(r) for r in found.others], "errors": found.errors}, indent=2))
    left += stale_left
    if left:
        raise GpuprovError("could not remove everything; still there:\n" + "\n".join(f"  {w}" for w in left)
                           + "\n  rerun: gpuprov gc --yes")
    if found.found and not yes and not as_json:
        console.print(f"{len(found.found)} orphaned resource(s); rerun with --yes to delete them")
    _region_errors(found.errors)


def _reading(yes: bool) -> tuple[Store, Provider, str, str | None] | None:
    """A listing with no state file makes none, nor an install id (a typo in GPUPROV_HOME must not become a fresh
    state there): it reads the install id if one was made (its records lost: what it tagged is an orphan), and
    sweeps against an empty store of its own. With no install id nothing of this install can exist, which is
    said; other installs' resources with the same user and host are listed as ever. None when there is a state
    to open, or --yes deletes (and records what it does)."""
    from gpuprov.state import unrecorded

    missing = unrecorded()
    if missing is None or yes:
        return None
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    from gpuprov.cli.cloud import _no_state_hint
    from gpuprov.cli.common import provider_owned_by
    from gpuprov.cloud.tags import legacy_owner
    from gpuprov.paths import made_install_id
    from gpuprov.state.locks import coordinator
    from gpuprov.state.sqlite import SqliteStore

    made = made_install_id()
    note = None if made is not None else \
        f"nothing of this install to find: there is no state at {missing.parent} ({_no_state_hint()})"
    empty = Path(tempfile.mkdtemp(prefix="gpuprov-gc-"))
    atexit.register(shutil.rmtree, empty, True)
    store = SqliteStore(empty / "state.sqlite")
    store.coordinator = coordinator()
    me = f"{legacy_owner()}/{made or '(no install id)'}"
    return store, provider_owned_by(me), me, note


def _stopped(seconds_given: int | None, where: list[str], yes: bool, as_json: bool, provider: Provider, store: Store,
             console: Console, say: Callable[[str], None],
             scope: str | None) -> tuple[list[dict[str, object]], list[str]]:
    """--stopped-for: the nodes stopped longer than that in the swept regions, each with what it has cost while
    stopped; with --yes taken down. Returns them (--json's rows) and what could not be removed. `scope` with team
    state: "yours" (a teammate's stopped node is named and left) or "team" (everyone's); None without."""
    if seconds_given is None:
        return [], []
    import time

    from gpuprov.cloud import stale
    from gpuprov.cloud.team import by_member, member_name
    from gpuprov.plan.spec import format_duration

    seconds = float(seconds_given)
    now = time.time()
    nodes = [n for n in store.nodes() if n.region in where and n.provider == provider.name]
    if scope == "yours":
        nodes, others = by_member(nodes)
        for s in stale.stopped_longer(others, seconds, now):
            say(f"left {s.node.name} ({member_name(s.node)}), stopped {format_duration(s.stopped_seconds)}: a "
                "teammate's node (`gc --stopped-for … --team` takes every member's)")
    found = stale.stopped_longer(nodes, seconds, now)
    rows: list[dict[str, object]] = [{"name": s.node.name, "region": s.node.region, "stopped_at": s.node.stopped_at,
                         "stopped_seconds": round(s.stopped_seconds), "disk_gb": s.node.disk_gb,
                         "disk_usd_while_stopped": round(s.disk_usd, 2) if s.disk_usd is not None else None,
                         "disk_usd_month": round(s.month_usd, 2) if s.month_usd is not None else None,
                         # team state: who of the team launched it (its record's owner)
                         **({"member": s.node.owner} if scope else {})} for s in found]
    if not as_json:
        if not found:
            console.print(f"no node{' of yours' if scope == 'yours' else ''} stopped longer than "
                          f"{format_duration(seconds)}", markup=False)
        for s in found:
            cost = (f"its {s.node.disk_gb} GB disk cost ${s.disk_usd:.2f} while stopped (${s.month_usd:.2f}/month)"
                    if s.disk_usd is not None and s.month_usd is not None else
                    f"its {s.node.disk_gb} GB disk's price is not known" if s.node.disk_gb else
                    "its disk's size is not recorded")
            whose = f" by {member_name(s.node)}" if scope else ""
            console.print(f"{s.node.name} ({s.node.region}){whose}: stopped {format_duration(s.stopped_seconds)}; "
                          f"{cost}", markup=False)
        if found and not yes:
            console.print(f"{len(found)} node(s) stopped longer than {format_duration(seconds)}; rerun with --yes to "
                          "take them down (their disks too)", markup=False)
    if not (yes and found):
        return rows, []
    done = stale.take_stale(found, seconds, now, provider, store, say, anyone=scope != "yours")
    by_name = {s.node.name: s.node for s in found}
    for name, result in done.items():
        if result.complete and not as_json:
            whose = f" ({member_name(by_name[name])})" if scope else ""
            console.print(f"{name}{whose}: down (stopped {format_duration(seconds)}+)", markup=False)
    return rows, [f"{name}: {what}" for name, result in done.items() for what in result.left]


def _failed(region: str, errors: list[str]) -> bool:
    return any(e.startswith(f"{region}: ") for e in errors)


def _region_errors(errors: list[str]) -> None:
    """The regions a sweep could not read: named, exit 1, after everything else was swept."""
    if errors:
        raise GpuprovError("could not sweep every region:\n" + "\n".join(f"  {e}" for e in errors))
