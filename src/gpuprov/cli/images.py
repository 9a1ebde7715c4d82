"""`gpuprov image bake|list|rm`: baked images (cloud/images.py decides; this parses and prints)."""

from __future__ import annotations

import json

import click

from gpuprov.cli.common import (
    chosen_cloud,
    cloud_option,
    confirm,
    main,
    make_console,
    node_target,
    region_from,
    say_to,
    store_and_provider,
)
from gpuprov.cli.complete import complete_node, complete_region
from gpuprov.errors import UserInputError


@main.group()
def image() -> None:
    """Baked images: a node's installed stack as an AMI, so the next `up` skips those steps.

    `up` picks a baked image by itself when one of yours in the region has the plan's stack hash
    (`--image fresh` opts out). Images outlive nodes: `down` leaves them; `image rm` removes one,
    `gc` finds those no local record names.
    """


@image.command()
@click.argument("node", shell_complete=complete_node)
@click.option("--name", default=None, help="The image's name (unique in the region) [default: gpuprov-NODE-<UTC time>].")
@click.option("-y", "--yes", is_flag=True, help="Do not ask (needed without a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the image as JSON once it is available.")
def bake(node: str, name: str | None, yes: bool, as_json: bool) -> None:
    """Make an AMI of a ready node: its install steps, markers included, for the next `up`.

    First, over SSH, the node loses what is its own: SSH host keys, gpuprov's key in authorized_keys,
    the guards (TTL deadline, autostop, spot watch), gpuprov's logs and cloud-init's instance data
    (`cloud-init clean --logs`), moved aside to a tmpfs that no snapshot holds. Then CreateImage reboots
    it (a consistent disk; NoReboot could copy a half-written file) and the image is tagged with the stack
    hash. The node comes back with new host keys, pinned when gpuprov reaches it again once the image is
    available, and gets its guards back as its record shows them (the same TTL or budget deadline). If EC2
    refuses the image, the node is put back as it was. A node whose guards another member locked is refused.
    A bake killed mid-way leaves the node `baking` (`status --refresh` says how far); `gpuprov start NODE`
    settles it: its image recorded if EC2 made it, then a stop and a start (new host keys, its guards back).
    """
    from gpuprov.cloud import bake as baking
    from gpuprov.cloud import images
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.paths import known_hosts_path

    if name is not None:
        images.check_image_name(name)
    target = node_target(node)
    store, provider = store_and_provider(nodes=(node,))
    if target is None:
        store.node(node)  # an unknown name says so
        raise UserInputError("NODE", f"{node} has no address to reach", "bake a node that is ready (`gpuprov status`)")
    if not yes:
        confirm(f"Make an image of {node}? It loses its host keys and gpuprov's SSH key, and reboots", "bake it")
    console = make_console(stderr=as_json)
    settings = HostSettings(known_hosts=known_hosts_path(), connect_timeout=15)
    made = baking.bake(node, store, provider, target, settings, say_to(console), name=name)
    if as_json:
        click.echo(json.dumps(_row(made, True), indent=2))
        return
    console.print(f"\n[bold green]{made.name}[/] ({made.id}) is available in {made.region}: "
                  f"`gpuprov up` with the same stack uses it", highlight=False)
    console.print(f"  {node} rebooted with new host keys (pinned again): `gpuprov down {node}` when you are done "
                  "with it", markup=False)


@image.command(name="list")
@click.option("--region", "regions", multiple=True, shell_complete=complete_region,
              help="Region(s) to list [default: the cloud's region and "
                   "those of your records].")
@cloud_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(regions: tuple[str, ...], as_json: bool) -> None:
    """Your baked images: name, id, stack hash, region, created, size, snapshots."""
    from gpuprov.cli.report import images_table
    from gpuprov.cloud import images

    store, provider = store_and_provider()
    where = _regions(regions, store)
    rows = images.listing(where, provider, store)
    if as_json:
        click.echo(json.dumps([_row(r.image, r.recorded) for r in rows], indent=2))
        return
    make_console().print(images_table(rows, where))


@image.command()
@click.argument("spec", metavar="NAME|ID")
@click.option("--region", "regions", multiple=True, shell_complete=complete_region,
              help="Region(s) to look in [default: as for `image list`].")
@click.option("-y", "--yes", is_flag=True, help="Do not ask (needed without a terminal).")
@cloud_option
def rm(spec: str, regions: tuple[str, ...], yes: bool) -> None:
    """Deregister an image and delete its snapshots (nodes launched from it keep running)."""
    from gpuprov.cloud import images

    store, provider = store_and_provider()
    found = images.find(spec, _regions(regions, store), provider)
    if not yes:
        confirm(f"Deregister {found.name} ({found.id}) and delete its {len(found.snapshot_ids)} snapshot(s)?",
                "remove it")
    console = make_console()
    images.remove(found, provider, store, say_to(console))
    console.print(f"{found.name} ({found.id}): removed", markup=False, highlight=False)


def _regions(given: tuple[str, ...], store: object) -> list[str]:
    """--region, checked on the chosen cloud's catalog; else its region and those of the images recorded."""
    from gpuprov.plan.plan import catalog_for

    if given:
        return [catalog_for(chosen_cloud()).check_region(r) for r in given]
    recorded = {r.region for r in store.resources(None, kind="image")}  # type: ignore[attr-defined]
    return sorted(recorded | {region_from(None).name})


def _row(image: object, recorded: bool) -> dict[str, object]:
    from dataclasses import asdict

    return {**asdict(image), "recorded": recorded}  # type: ignore[call-overload]
