"""`gpuprov facts` (each family of facts: where it came from, how old it is, what is unverified) and
`gpuprov facts refresh` (read them again from their sources)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import click

from gpuprov.cli.common import main, make_console, quiet, region_from, store_and_provider, warn
from gpuprov.errors import UserInputError

if TYPE_CHECKING:
    from gpuprov.cli.report_facts import DriverBranch
    from gpuprov.sources.refresh import Result


@main.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def facts(ctx: click.Context, as_json: bool) -> None:
    """The facts gpuprov plans with: each family, where it came from, how old it is, what is unverified.

    The shipped snapshot (data/*.yaml) is the offline fallback; `gpuprov facts refresh` reads torch releases,
    NVIDIA's repository and EC2's instance types again and keeps them in your data folder.
    """
    if ctx.invoked_subcommand is not None:
        return
    from gpuprov.plan import facts as families
    from gpuprov.plan.stack import facts as stack_facts

    states = families.states()
    today = families.today()
    f = stack_facts()
    branches: list[DriverBranch] = [{"branch": b, "type": life.type if (life := f.driver_lifecycle.get(b)) else None,
                                    "end_of_life": life.end_of_life if life else None, "ended": f.branch_ended(b) is not None,
                                    "installable": b in f.installable_branches(),
                                    "pinning_package_seen": b in f.driver_pinning.branches} for b in f.driver_branches]
    if as_json:
        click.echo(json.dumps({
            "today": today.isoformat(), "stale_after_days": families.STALE_DAYS,
            "folder": str(families.overlay_path(states[0].family.name).parent),
            "families": [{"name": s.family.name, "what": s.family.what, "origin": s.origin, "read": s.read.isoformat(),
                          "age_days": s.age_days(today), "source": s.source,
                          "refreshed_from": s.family.refreshed_from or None, "unverified": list(s.unverified)}
                         for s in states],
            "driver_branches": branches, "warning": families.stale_note(on=today)}, indent=2))
        return
    from gpuprov.cli.report_facts import facts_view

    make_console().print(facts_view(states, branches, today))


@facts.command()
@click.option("--only", "only", multiple=True, type=click.Choice(["torch", "drivers", "instance-types", "wheels", "installers"]),
              help="Refresh only this family (repeat for more) [default: all but installers].")
@click.option("--region", "regions", multiple=True, metavar="REGION",
              help="Read EC2's instance types and offerings in this region (repeat for more) [default: the AWS chain's].")
@click.option("--python", "pythons", multiple=True, metavar="X.Y",
              help="Lock the wheels for this Python (repeat for more) [default: 3.12].")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def refresh(only: tuple[str, ...], regions: tuple[str, ...], pythons: tuple[str, ...], as_json: bool) -> None:
    """Read the facts again from their sources and keep them as an overlay on the shipped snapshot.

    torch: PyPI's JSON API and the PyTorch wheel index (GPUPROV_PYPI_URL, GPUPROV_PYTORCH_INDEX_URL to use
    mirrors); drivers: NVIDIA's CUDA repository's Packages index per OS (GPUPROV_NVIDIA_REPOS_URL);
    instance-types: EC2 DescribeInstanceTypes (your AWS credentials); wheels: the newest torch release's wheels
    and their dependencies, each with the sha256 the PyTorch wheel index lists (pip's installation report), for
    x86_64 and aarch64: a plan whose torch they fit installs them with --require-hashes from any mirror;
    installers (only when named): uv's and Miniforge's newest GitHub releases and their .sha256 files, the pins the
    env step checks its download against (GPUPROV_GITHUB_URL, GPUPROV_GITHUB_API_URL). A source that does not
    answer leaves its family as it was; exit status 1 then.
    """
    from gpuprov.sources import refresh as sources

    names = only or (*sources.REFRESHABLE, *sources.USER_ONLY)
    picked = [region_from(r, quiet=True).name for r in regions] if regions else (
        [region_from(None).name] if "instance-types" in names else [])
    for py in pythons:
        if not re.fullmatch(r"3\.[0-9]{1,2}", py):
            raise UserInputError("--python", f"{py!r} is not a Python version", "e.g. --python 3.12")
    results = sources.read_all(names, (lambda: store_and_provider()[1]) if "instance-types" in names else None, picked,
                               pythons=pythons or ("3.12",))
    sources.write(results)
    if as_json:
        click.echo(json.dumps([_result_json(r) for r in results], indent=2))
    else:
        console = make_console()
        for r in results:
            if not r.ok:
                warn(f"{r.family}: not refreshed: {r.error}")
                continue
            assert r.overlay is not None
            head = f"{r.family}: " + (f"read from {', '.join(r.overlay.sources)}" if r.overlay.sources else "nothing read")
            console.print(head if not quiet() else r.family, markup=False, highlight=False)
            for line in r.changes or ["no change"]:
                console.print(f"  {line}", markup=False, highlight=False)
            for note in r.overlay.unverified:
                console.print(f"  unverified: {note}", markup=False, highlight=False)
    if not all(r.ok for r in results):
        raise SystemExit(1)


def _result_json(r: Result) -> dict[str, object]:
    return {"family": r.family, "refreshed": r.ok, "error": r.error, "changes": r.changes,
            "sources": list(r.overlay.sources) if r.overlay else [],
            "unverified": list(r.overlay.unverified) if r.overlay else []}
