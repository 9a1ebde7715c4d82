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


def stack_options(func: F) -> F:
    """The flags that shape a plan, shared by plan, render (and later up and bootstrap)."""
    options = [
        click.option("--gpu", required=True, help="GPU name, optionally with a count: A100, h100, a100:8, l40s."),
        click.option("--count", type=int, default=1, show_default=True, help="Number of GPUs (or use --gpu NAME:N)."),
        click.option("--spot", is_flag=True, help="Ask for spot capacity (cheaper, can be interrupted)."),
        click.option("--region", default="us-east-1", show_default=True, help="AWS region."),
        click.option("--instance-type", default=None, help="Force an instance type instead of the cheapest that fits."),
        click.option(
            "-p", "--playbook", default="pytorch", show_default=True,
            help="Shipped playbook name (pytorch, minimal, llm-finetune, cuda-dev, inference) or a path to a .yml.",
        ),
        click.option("--os", "os_name", default="ubuntu-24.04", show_default=True, help="ubuntu-22.04 or ubuntu-24.04."),
        click.option("--driver", default=None, help="Pin the NVIDIA driver branch (580) or exact version (580.95.05)."),
        click.option("--cuda", default=None, help="Also install this CUDA toolkit (nvcc), e.g. 12.8. Wheels don't need it."),
        click.option("--torch", "torch_version", default=None, help="Pin the torch release, e.g. 2.9 or 2.9.1."),
        click.option("--torch-cuda", default=None, help="Pin the torch wheel's CUDA variant, e.g. cu128."),
        click.option("--python", default=None, help="Pin the env's Python version, e.g. 3.12."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _pins(kw: dict[str, Any]) -> StackPins:
    from gpuprov.compat import StackPins

    return StackPins(
        driver=kw["driver"], cuda=kw["cuda"], torch=kw["torch_version"], torch_cuda=kw["torch_cuda"], python=kw["python"]
    )


def _make_plan(kw: dict[str, Any]) -> Plan:
    from gpuprov.plan import NodeRequest, make_plan

    request = NodeRequest(
        gpu=kw["gpu"], count=kw["count"], spot=kw["spot"], region=kw["region"], playbook=kw["playbook"],
        os=kw["os_name"], pins=_pins(kw), instance_type=kw["instance_type"],
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
    Offline:   gpuprov gpus | plan | render
    Typical:   gpuprov plan --gpu A100 --spot            # what it would launch and install
               gpuprov render --gpu L4 -o ./bundle       # the scripts, to read or run yourself
    """


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_handle_errors
def gpus(as_json: bool) -> None:
    """List the GPUs gpuprov knows, with the AWS instance types that carry them and their prices."""
    from gpuprov import catalog
    from gpuprov.report import gpus_table

    cat = catalog.load()
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
