"""`gpuprov state` (where the records live; push, adopt, unlock) and `gpuprov team` (join, sync): team state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpuprov.cli.common import cloud_option, main, make_console, say_to
from gpuprov.errors import UserInputError

if TYPE_CHECKING:
    from gpuprov.state.url import StateUrl


def _team(field: str = "state") -> StateUrl:
    from gpuprov.state.url import configured

    url = configured()
    if url is None:
        raise UserInputError(field, "the records are in the local state file, not a team's bucket",
                             'set state = "s3://BUCKET/PREFIX" in config.toml (or GPUPROV_STATE), or '
                             "`gpuprov state push s3://BUCKET/PREFIX` to move them there")
    return url


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def state(ctx: click.Context, as_json: bool) -> None:
    """Where the records live: the local file, or a team's S3 bucket (config `state`, GPUPROV_STATE)."""
    if ctx.invoked_subcommand is not None:
        return
    from gpuprov.paths import state_folder
    from gpuprov.state.url import configured, lease_seconds

    url = configured()
    if url is None:
        path = state_folder() / "state.sqlite"
        if as_json:
            click.echo(json.dumps({"backend": "local", "path": str(path)}))
        else:
            click.echo(f"state: local file {path}")
            click.echo('team:  none (state = "s3://BUCKET/PREFIX" in config.toml shares it with a team)')
        return
    from gpuprov.cloud import team
    from gpuprov.state.leases import member

    found = team.info(url)
    if as_json:
        click.echo(json.dumps({"backend": "s3", "url": str(url), "team": url.team, "member": member(),
                               "versioning": found.versioning or "Off", "members": found.members,
                               "nodes": found.nodes, "lease_seconds": lease_seconds(), "warning": found.warning}))
    else:
        click.echo(f"state:      {url} (team {url.team})")
        click.echo(f"you:        {member()}")
        click.echo(f"members:    {', '.join(found.members) or 'none joined yet (`gpuprov team join`)'}")
        click.echo(f"nodes:      {found.nodes} recorded")
        click.echo(f"versioning: {found.versioning or 'Off'}")
        click.echo(f"leases:     {lease_seconds():g} s after the last renewal")
    if found.warning:
        make_console(stderr=True).print(f"warning: {found.warning}", markup=False, highlight=False)


@state.command("push")
@click.argument("url_text", metavar="s3://BUCKET/PREFIX")
def push(url_text: str) -> None:
    """Move the local records into a bucket (a node the bucket already has is refused and left in both places).
    Each node moved is marked so in the local file (kept, with a backup of the file as it was), so local commands
    no longer see it; then set state = "s3://…" in config.toml so every command uses the bucket."""
    from gpuprov.cloud import team
    from gpuprov.paths import state_dir
    from gpuprov.state.s3 import S3Store
    from gpuprov.state.sqlite import SqliteStore
    from gpuprov.state.url import parse

    url = parse(url_text, "URL")
    if url is None:
        raise UserInputError("URL", "expected s3://BUCKET/PREFIX", "the bucket the team shares")
    path = state_dir() / "state.sqlite"
    if not path.exists():
        raise UserInputError("state", f"no local state file at {path}: nothing to push")
    import time

    local = SqliteStore(path)
    backup = path.with_name(f"{path.name}.before-push-{time.strftime('%Y%m%dT%H%M%S')}")
    local.backup(backup)  # the file as it was, before any record is marked moved
    done = team.push(local, S3Store(url))
    for name in done.copied:
        click.echo(f"{name}: moved to {url} (the local file no longer lists it)")
    for line in done.busy:
        click.echo(f"{line}: left in the local file (push again once it is done)", err=True)
    for name in done.unverified:
        click.echo(f"{name}: written to {url} but not read back the same: kept in the local file too; check "
                   "`gpuprov state` and push again", err=True)
    for name in done.clusters:
        click.echo(f"cluster {name}: copied to {url}")
    for name in done.refused:
        click.echo(f"{name}: refused: {url} already has a node of that name (left as it is there)", err=True)
    click.echo(f"{len(done.copied)} node(s) pushed; the local file as it was: {backup}")
    click.echo(f"now set state = \"{url}\" in config.toml (or GPUPROV_STATE)")
    if done.copied:  # their host keys went with them; the teammates' own keys need a connection to each node
        click.echo(f"then, for your teammates' SSH keys on them: gpuprov team sync {' '.join(done.copied)}")
    if done.refused or done.unverified or done.busy:
        raise SystemExit(1)


@state.command("unlock")
@click.argument("name")
def unlock(name: str) -> None:
    """Break a node's lease (a holder that will not come back), saying whose it was."""
    from gpuprov.state import leases, locks

    url = _team()
    holding = leases.unlock(url, locks.node(name))
    if holding is None:
        click.echo(f"{name}: no lease held")
        return
    age = f", last renewed {holding.age:.0f} s ago" if holding.age is not None else ""
    click.echo(f"{name}: broke the lease of {holding}{age}")


@state.command("adopt")
@click.option("--region", help="The region to rebuild records from (default: the configured one).")
@click.option("--all-regions", is_flag=True, help="Every region the account has enabled.")
@click.option("--all-installs", is_flag=True,
              help="Also what other gpuprov installs with your user and host name tagged (this machine's own lost "
                   "state folder, an older gpuprov): they may be another install's live nodes, so they are only "
                   "named otherwise.")
@cloud_option
def adopt(region: str | None, all_regions: bool, all_installs: bool) -> None:
    """Rebuild records from the tags gpuprov puts on every resource (a lost state file or laptop) in the chosen
    cloud (--cloud): adopted nodes can be `status`ed, `stop`ped and `down`ed. Only this install's (and, with team
    state, the team's) unless --all-installs."""
    from gpuprov.cli.common import region_from, store_and_provider
    from gpuprov.cloud import adopt as adopting
    from gpuprov.cloud.providers import make
    from gpuprov.cloud.tags import legacy_owner, owner, team_tags
    from gpuprov.plan.plan import catalog_for

    if region and all_regions:
        raise UserInputError("--all-regions", "give --region or --all-regions, not both")
    store, provider = store_and_provider()
    cat = catalog_for(provider.name)
    if all_regions:
        enabled = set(provider.enabled_regions(region_from(None).name))
        regions = [r for r in cat.regions if r in enabled]
    else:
        regions = [cat.check_region(region) if region else region_from(None).name]
    said = say_to(make_console())
    # the team's resources, and this member's own from before the team (tagged with the owner alone)
    own = make(provider.name, owner(), poll=getattr(provider, "poll", 2.0), legacy=legacy_owner()) \
        if team_tags() is not None else None
    found = adopting.adopt(regions, [provider, *([own] if own else [])], store, said, all_installs=all_installs)
    click.echo(f"{len(found)} node(s) adopted" + (f": {', '.join(found)}" if found else ""))


@main.group()
def team() -> None:
    """Working as a team: your public key for everyone's nodes, and the keys pushed to a node again."""


@team.command("join")
@click.option("--key", "keys", multiple=True, type=click.Path(path_type=Path),
              help="Public key file(s) to upload (default: your gpuprov region keys' *.pub).")
def join(keys: tuple[Path, ...]) -> None:
    """Upload your public key(s) under the team prefix: nodes launched with team state authorize every member."""
    from gpuprov.cloud import team as teams
    from gpuprov.paths import keys_dir

    url = _team()
    paths = list(keys) or sorted(keys_dir().glob("*/id_ed25519.pub"))
    if not paths:
        raise UserInputError("--key", "no public key found in gpuprov's keys folder",
                             "pass --key ~/.ssh/id_ed25519.pub (or `gpuprov up` once makes a region key)")
    lines = teams.public_keys(paths)
    who = teams.join(url, lines)
    click.echo(f"{who}: {len(lines)} public key(s) in {url}members/ (no private key leaves this machine)")


@team.command("sync")
@click.argument("node")
def sync(node: str) -> None:
    """Push every member's public key to NODE's authorized_keys again (after someone joined)."""
    from gpuprov.cloud import team_keys
    from gpuprov.paths import keys_dir, region_key
    from gpuprov.state import open_store

    url = _team()
    found = open_store().node(node)
    team_keys.sync(url, found, str(region_key(keys_dir(), found.region)), say_to(make_console()))
