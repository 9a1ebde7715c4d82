"""`gpuprov gc`: resources tagged as yours that no local node owns, listed, and deleted with --yes."""

from __future__ import annotations

import json
from typing import Any

import click

from gpuprov.cli.common import main, make_console, region_from, say_to, store_and_provider
from gpuprov.cli.complete import complete_region
from gpuprov.errors import GpuprovError


@main.command()
@click.option("--region", "regions", multiple=True, shell_complete=complete_region,
              help="Region(s) to sweep [default: those of your nodes, and the AWS chain's region (AWS_REGION, profile, "
                   "us-east-1)].")
@click.option("--all-regions", is_flag=True, help="Every region in the catalog.")
@click.option("-y", "--yes", is_flag=True, help="Delete what is found (default: list only).")
@click.option("--all-installs", is_flag=True,
              help="Also take what other gpuprov installs with your user and host name tagged (a lost state "
                   "folder, an older gpuprov, a cloned machine, another CI runner): they may be another "
                   "machine's live nodes, so they are only listed otherwise.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: what was found (and, with --yes, what is left).")
def gc(regions: tuple[str, ...], all_regions: bool, yes: bool, all_installs: bool, as_json: bool) -> None:
    """Find resources tagged as yours that no local node owns (left by a crash or another machine's
    lost state); list them, and delete them with --yes.

    An orphan is a node whose `up` ended before it was ready, or a resource tagged with your owner id
    that no node of yours claims. A node another gpuprov is working on (an `up`, `down`, `start`,
    `image bake`: its lock is held) is left alone and named; a stopped node is never an orphan.
    """
    from gpuprov.cloud import gc as sweep
    from gpuprov.cloud.tags import owner
    from gpuprov.plan import catalog

    store, provider = store_and_provider()
    cat = catalog.load()
    console = make_console(stderr=as_json)
    say = say_to(console)
    if all_regions:  # the regions the account has enabled: an opt-in region it has not enabled answers AuthFailure
        where = list(cat.regions)
        try:
            enabled = set(provider.enabled_regions(region_from(None).name))
        except GpuprovError as exc:
            say(f"could not list the account's regions ({exc}); sweeping every region gpuprov knows")
        else:
            off = [r for r in where if r not in enabled]
            where = [r for r in where if r in enabled]
            if off:
                say(f"not enabled for this account, not swept: {', '.join(off)}")
    else:
        where = [cat.check_region(r) for r in regions] or \
            sorted({n.region for n in store.nodes(include_terminated=True)} | {region_from(None).name})
    found = sweep.orphans(where, provider, store, all_installs=all_installs)
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
                          f"(owner {owner()})", markup=False)
            _region_errors(found.errors)
            return
        console.print(f"owner {owner()}:", markup=False)
        for res in found.found:
            mark = f" (owner {res.owner})" if res.owner and res.owner != owner() else ""
            console.print(f"{res.region}  {res.kind:<15} {res.id:<24} node={res.node} {res.state}{mark}", markup=False)
    left = sweep.gc(found.found, provider, store, say) if yes and found.found else []
    if as_json:
        def row(r: Any) -> dict[str, Any]:
            return {"region": r.region, "kind": r.kind, "id": r.id, "node": r.node, "state": r.state, "owner": r.owner}

        click.echo(json.dumps({"regions": where, "owner": owner(), "deleted": yes, "left": left,
                               "found": [row(r) for r in found.found], "busy": found.busy,
                               "other_installs": [row(r) for r in found.others], "errors": found.errors}, indent=2))
    if left:
        raise GpuprovError("could not remove everything; still there:\n" + "\n".join(f"  {w}" for w in left)
                           + "\n  rerun: gpuprov gc --yes")
    if found.found and not yes and not as_json:
        console.print(f"{len(found.found)} orphaned resource(s); rerun with --yes to delete them")
    _region_errors(found.errors)


def _failed(region: str, errors: list[str]) -> bool:
    return any(e.startswith(f"{region}: ") for e in errors)


def _region_errors(errors: list[str]) -> None:
    """The regions a sweep could not read: named, exit 1, after everything else was swept."""
    if errors:
        raise GpuprovError("could not sweep every region:\n" + "\n".join(f"  {e}" for e in errors))
