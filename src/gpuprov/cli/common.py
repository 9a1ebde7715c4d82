"""What every command shares: the `main` group, option decorators, error handling, targets.

Heavy modules (boto3, fabric, the library itself) are imported inside functions, so that
`gpuprov --help` stays fast and works without them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from gpuprov import __version__
from gpuprov.cli.complete import (
    cluster_names,
    complete_driver,
    complete_gpu,
    complete_node,
    complete_os,
    complete_playbook,
    complete_region,
    complete_torch,
    complete_torch_cuda,
    node_names,
)
from gpuprov.cli.console import line_echo as line_echo  # re-exported: every command's module takes them here
from gpuprov.cli.console import make_console as make_console
from gpuprov.cli.lazy import LazyGroup
from gpuprov.cli.monitoring_options import monitor_options, monitoring_from
from gpuprov.cli.params import Command, Number, Subgroup, usage_field
from gpuprov.errors import GpuprovError, UserInputError

if TYPE_CHECKING:
    from rich.console import Console

    from gpuprov.cli.option_sets import PinOptions, ReachOptions, StackOptions
    from gpuprov.cloud.providers.base import Provider
    from gpuprov.cloud.region import Region
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target
    from gpuprov.plan.plan import Plan
    from gpuprov.plan.sources import Sources
    from gpuprov.plan.stack import StackPins
    from gpuprov.state import Store

F = TypeVar("F", bound=Callable[..., object])


def quiet() -> bool:
    """-q/--quiet on the command line: progress lines are left out; results and errors still print."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get("gpuprov.quiet"))


def _set_quiet(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta["gpuprov.quiet"] = True


QUIET_OPTION = click.Option(["-q", "--quiet"], is_flag=True, expose_value=False, is_eager=True, callback=_set_quiet,
                            help="Only results and errors: no progress lines.")


def team_scope(everyone: bool, *, goes_with: str, given: bool, why: str, alone: str) -> bool:
    """Whether the records are a team's (state in a bucket), `--team` checked on the way: it widens `goes_with`
    from this member's nodes to every member's, so it is refused without it (`why`) and with a local state file
    (`alone`: what the command takes then)."""
    from gpuprov.state.url import configured

    team = configured() is not None
    if everyone and not given:
        raise UserInputError("--team", f"goes with {goes_with}", why)
    if everyone and not team:
        raise UserInputError("--team", "the records are in the local state file, not a team's bucket", alone)
    return team


def confirm(question: str, action: str) -> None:
    """Ask `question` on the terminal; without one, say to pass --yes (exit 2); a "no" stops here (exit 1)."""
    if sys.stdin is None or sys.stdin.closed or not sys.stdin.isatty():  # stdin closed (`<&-`): None to Python
        raise UserInputError("--yes", "no terminal to confirm on", f"pass --yes (or -y) to {action}")
    from gpuprov.cli import signals

    click.echo(f"{question} [y/N]: ", nl=False, err=True)
    try:  # not click.confirm: its blocking read() missed a signal landing just before it (cli/signals.py)
        answer = signals.read_line()
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):  # a terminal gone (SIGHUP)
            click.echo(err=True)  # the last line on a line of its own, not after the question
        raise
    if answer.strip().lower() not in ("y", "yes"):
        if not answer:
            click.echo(err=True)
        say_error("not confirmed; nothing was done", 1)


# --- shared options (pip-tools style) ---------------------------------------------------------


def apply_options(func: F, options: list[Callable[[F], F]]) -> F:
    for option in reversed(options):
        func = option(func)
    return func


REGION_HELP = ("AWS region [default: AWS_REGION, then AWS_DEFAULT_REGION, then the AWS profile's region, "
               "then us-east-1].")


def pin_options(func: F) -> F:
    """What to install: playbook, OS and stack pins (plan, render, bootstrap, up)."""
    return apply_options(func, [
        click.option(
            "-p", "--playbook", default="pytorch", show_default=True, envvar="GPUPROV_PLAYBOOK", show_envvar=True,
            shell_complete=complete_playbook,
            help="Shipped playbook name (pytorch, minimal, llm-finetune, cuda-dev, inference, jupyter, containers) or a "
                 "path to a .yml.",
        ),
        click.option("--jupyter", is_flag=True,
                     help="Add JupyterLab to the playbook's env: a service on the node's 127.0.0.1:8888 with a token; "
                          "open it with `gpuprov jupyter NODE`."),
        click.option("--docker", is_flag=True,
                     help="Add Docker with NVIDIA's Container Toolkit (the nvidia runtime, CDI for Podman); verify runs "
                          "nvidia-smi -L in a container."),
        click.option("--sources", default=None, metavar="FILE|PRESET", envvar="GPUPROV_SOURCES", show_envvar=True,
                     help="Where the node downloads from: a preset (cn-aliyun, cn-aliyun-vpc, cn-aliyun-classic, "
                          "cn-tuna, cn-ustc), `origins` (no mirror) or a YAML file of sources (docs/mirrors.md); over "
                          "the playbook's `sources:` and config.toml's [sources]. Default on Alibaba Cloud: "
                          "cn-aliyun-vpc."),
        click.option("--os", "os_name", default=None, shell_complete=complete_os,
                     help="ubuntu-22.04, ubuntu-24.04, ubuntu-26.04, debian-12, debian-13, rocky-9, rhel-9 or amzn-2023. "
                          "Default: ubuntu-24.04 for new nodes, the host's own for bootstrap."),
        click.option("--driver", default=None, shell_complete=complete_driver,
                     help="Pin the NVIDIA driver branch (R570 or newer, e.g. 580) or an exact release NVIDIA "
                          "ships a pinning package for (e.g. 580.126.09)."),
        click.option("--cuda", default=None, help="Also install this CUDA toolkit (nvcc), e.g. 12.8. Wheels don't need it."),
        click.option("--torch", "torch_version", default=None, shell_complete=complete_torch,
                     help="Pin the torch release, e.g. 2.9 or 2.9.1."),
        click.option("--torch-cuda", default=None, shell_complete=complete_torch_cuda,
                     help="Pin the torch wheel's CUDA variant, e.g. cu128."),
        click.option("--python", default=None, help="Pin the env's Python version, e.g. 3.12."),
    ])


def stack_options(func: F) -> F:
    """What to launch and install (plan, render, up)."""
    return apply_options(func, [
        click.option("--gpu", default=None, envvar="GPUPROV_GPU", show_envvar=True, shell_complete=complete_gpu,
                     help="GPU name, optionally with a count: A100, h100, a100:8, l40s (or --cpu for a CPU-only node)."),
        click.option("--count", type=Number(1, 64, whole=True), default=None,
                     help="Number of GPUs, 1 to 64 [default: 1] (or use --gpu NAME:N)."),
        click.option("--cpu", type=CPUS, default=None, metavar="N",
                     help="A CPU-only node instead of a GPU one (preparing data, say): the cheapest CPU-only type with "
                          "at least N vCPUs (1 to 896), and --memory GiB; no driver, toolkit or Fabric Manager, "
                          "torch's CPU wheel, the same guards. Or name one: --instance-type c7i.8xlarge."),
        click.option("--memory", "memory_gib", type=MEMORY_GIB, default=None, metavar="GIB",
                     help="With --cpu (or alone, for a CPU-only node): at least this much memory, in GiB."),
        click.option("--spot", is_flag=True, help="Ask for spot capacity (cheaper, can be interrupted)."),
        click.option("--persistent", is_flag=True,
                     help="With --spot: a persistent spot request whose interruption behaviour is stop, so the "
                          "node can stop (`gpuprov stop`, autostop) and keep its disk."),
        click.option("--spot-duration", type=click.Choice(["0", "1"]), default=None, metavar="0|1",
                     help="With --spot on Alibaba Cloud: the protection period in hours, during which ECS does not "
                          "reclaim the node (1), or none (0, which ECS prices lower) [default: ECS's, 1]."),
        click.option("--region", default=None, metavar="REGION", shell_complete=complete_region, help=REGION_HELP),
        click.option("--instance-type", default=None, help="Force an instance type instead of the cheapest that fits."),
        click.option("--arch", type=click.Choice(["x86_64", "aarch64"]), default=None,
                     help="The hosts' CPU (`uname -m`) [default: the instance type's; x86_64 for a GPU AWS does not "
                          "sell]: NVIDIA's repositories (sbsa for aarch64) and the torch wheels follow it."),
        cloud_option,
        pin_options,
        guard_options,
        node_guard_options,
        monitor_options,
    ])



def guard_options(func: F) -> F:
    """Guardrails installed on the node (plan, render, up): idle autostop, hard TTL, spot hook."""
    return apply_options(func, [
        click.option("--autostop", default=None, metavar="DURATION", envvar="GPUPROV_AUTOSTOP", show_envvar=True,
                     help="Power off after this long idle (GPUs under 10%, nobody logged in): 30m, 2h, 1h30m."),
        click.option("--ttl", default=None, metavar="DURATION",
                     help="Power off this long after the bootstrap starts, whatever happens: 8h, 1d."),
        click.option("--on-interrupt", default=None, metavar="CMD",
                     help="Command the node runs once on a spot interruption notice (2 minutes ahead); "
                          "overrides the playbook's on_interrupt."),
    ])


def cache_options(func: F) -> F:
    """The site's caching proxy for a bootstrap (bootstrap, and up for the nodes it launches): plan/site_cache.py."""
    return apply_options(func, [
        click.option("--cache-host", default=None, metavar="HOST",
                     help="Run a caching proxy (apt-cacher-ng) on HOST, a host of the site the others reach, for this "
                          "bootstrap: apt, dnf and the wheels come from upstream once (docs/mirrors.md). Removed "
                          "after, unless --keep-cache."),
        click.option("--cache-port", type=Number(1, 65535, whole=True), default=3142, show_default=True,
                     help="With --cache-host: the proxy's port on HOST."),
        click.option("--keep-cache", is_flag=True,
                     help="With --cache-host: leave the proxy and its cache running on HOST."),
    ])


def node_guard_options(func: F) -> F:
    """Guard choices only a node gpuprov launches has (plan, render, up)."""
    return apply_options(func, [
        click.option("--autostop-action", type=click.Choice(["stop", "terminate"]), default=None,
                     help="What autostop and the TTL do: stop (the disk is kept; `gpuprov start` resumes) or "
                          "terminate [default: stop for nodes that can stop, terminate for one-time spot]."),
        click.option("--budget", type=Number(0, 10_000_000, low_open=True), default=None, metavar="USD",
                     help="A dollar cap (0 < USD ≤ 10_000_000): shut down once the node has cost this much at the price obtained "
                          "(spot price at launch, or the on-demand list price); enforced on the node like --ttl."),
    ])


def ssh_options(func: F) -> F:
    """How to reach existing hosts (bootstrap, check)."""
    return apply_options(func, [
        click.argument("hosts", nargs=-1, metavar="NODE|[USER@]HOST[:PORT]...", shell_complete=complete_node),
        click.option("--inventory", default=None, help="YAML inventory of hosts (user, port, key, proxy_jump, gpu, os)."),
        click.option("-i", "--identity", default=None, envvar="GPUPROV_KEY", show_envvar=True,
                     help="Private key file (else ~/.ssh/config, then ssh's defaults)."),
        click.option("--ssh-config", default=None, type=click.Path(exists=True, dir_okay=False),
                     help="ssh config file [~/.ssh/config]."),
        click.option("--accept-new-host-key", is_flag=True,
                     help="Trust and pin the key of a host seen for the first time. A changed key is always refused."),
        click.option("--connect-timeout", type=CONNECT_TIMEOUT, default=10.0, show_default=True,
                     help="Seconds to wait for SSH (0 < s ≤ 3600)."),
        click.option("--parallel", type=PARALLEL, default=32, show_default=True, envvar="GPUPROV_PARALLEL",
                     show_envvar=True, help="Hosts worked on at once (1 to 1024)."),
    ])


CONNECT_TIMEOUT = Number(0, 3600, low_open=True)
CPUS = Number(1, 896, whole=True)  # EC2's largest CPU-only types have 896 vCPUs (u7in)
MEMORY_GIB = Number(0, 32768, low_open=True)  # and 32 TiB of memory
PARALLEL = Number(1, 1024, whole=True)
NODES = Number(1, 64, whole=True)  # cloud/cluster_up.py's MAX_NODES: a cluster placement group's sensible size
step_silence_option = click.option(
    "--step-silence", type=Number(0, 604_800), default=1200.0, show_default=True, metavar="SECONDS",
    help="A step that prints nothing for this long means its host is lost (gone, or frozen): it is reported "
         "so, the other hosts go on, and the next run resumes it; 0: wait forever (at most 604_800, a week).")


def pins_from(kw: PinOptions) -> StackPins:
    from gpuprov.plan.stack import StackPins

    return StackPins(
        driver=kw["driver"], cuda=kw["cuda"], torch=kw["torch_version"], torch_cuda=kw["torch_cuda"], python=kw["python"]
    )


def region_from(given: str | None, *, quiet: bool = False, cloud: str | None = None) -> Region:
    """The region a command works in, in `cloud` (else the chosen one): AWS's chain, or another cloud's own
    (`_region_of`). Where it did not come from --region it is said, on stderr so piped output stays clean (`quiet`:
    the caller says it once its other input is valid)."""
    from gpuprov.cloud.providers.aws_region import resolve
    from gpuprov.plan import catalog

    if (cloud or chosen_cloud()) != "aws":
        region = _region_of(cloud or chosen_cloud(), given)
        if not quiet:
            say_region(region)
        return region
    region = resolve(given)
    cat = catalog.load()  # its own errors (a facts file that does not read) name their file, not the region
    try:
        cat.check_region(region.name)
    except UserInputError as exc:  # blamed on where the name came from: AWS_REGION, the config file, a profile
        if region.source == "--region":
            raise
        raise UserInputError(region_field(region.source), exc.problem, exc.hint) from None
    if not quiet:
        say_region(region)
    return region


def region_field(source: str) -> str:
    """The field an error about a region names: its variable, the config file's key, or the AWS profile."""
    if source.startswith("config file "):
        from gpuprov.plan import config

        return config.where("region")
    return f"AWS {source}" if source.startswith("profile ") else source


def sources_flag(kw: PinOptions) -> tuple[Sources, str] | None:
    """--sources as one layer of the map, with how it was named (a bad name or file is refused here)."""
    from gpuprov.plan.spec import load_sources

    return load_sources(kw["sources"]) if kw["sources"] else None


def sources_from(kw: PinOptions) -> dict[str, Any]:
    """--sources as NodeRequest's fields."""
    flag = sources_flag(kw)
    return {"sources": flag[0], "sources_from": flag[1]} if flag else {}


def say_region(region: Region) -> None:
    if region.source != "--region" and not quiet():
        click.echo(f"region {region}", err=True)


def _gpu_asked(kw: StackOptions) -> str | None:
    """--gpu; one from GPUPROV_GPU or the config file gives way to a CPU-only node asked for on the command line
    (--cpu, --memory, or a CPU-only --instance-type), which a --gpu typed beside them is refused with."""
    from click.core import ParameterSource

    from gpuprov.plan import catalog

    ctx = click.get_current_context(silent=True)
    typed = ctx is None or ctx.get_parameter_source("gpu") in (ParameterSource.COMMANDLINE, None)
    if not kw["gpu"] or typed:
        return kw["gpu"] or None
    if kw["cpu"] is not None or kw["memory_gib"] is not None:
        return None
    cpu_type = kw["instance_type"] and any(it.name == kw["instance_type"] and it.cpu_only
                                           for it in catalog.load().instance_types)
    return None if cpu_type else kw["gpu"]


def plan_from(kw: StackOptions, live: bool = False, check: Callable[[Plan], None] | None = None, *,
              planning: bool = False, sources: tuple[Sources, str] | None = None) -> Plan:
    """The plan the flags ask for; `live`: with EC2's own facts of the region's GPU instance types (cached a day),
    asked only once the flags are known to be good (an instance type, or a GPU of plan/gpu_names.py, only EC2 may
    know aside): the plan on the shipped catalog first, and `check` (the command's own option checks) on it, so bad
    input asks EC2 nothing. `planning`: the command only plans (plan, render), which a cloud gpuprov plans on but
    does not launch on lets through, on its own catalog and regions, without --live. `sources`: the map's layer in
    --sources' place (`up --cache-host`'s proxy), for a plan made again once its region was said."""
    from gpuprov.cloud.providers import unlaunched
    from gpuprov.errors import UserInputError
    from gpuprov.plan import cpu, gpu_names
    from gpuprov.plan.catalog import parse_gpu_request
    from gpuprov.plan.plan import NodeRequest, make_plan
    from gpuprov.plan.spec import parse_duration

    cloud = chosen_cloud()
    unlaunched(cloud, cloud_field(), planning=planning and not live)  # never planned on another cloud's catalog
    own = cloud != "aws"  # planned on the cloud's own catalog (live facts are EC2's instance types: AWS's alone)
    if own and live:
        ctx = click.get_current_context(silent=True)
        if ctx is not None and ctx.params.get("live"):  # typed: refused; a launch's own live look is AWS's alone
            raise UserInputError("--live", f"--live reads EC2's instance types; {_cloud_title(cloud)} is planned "
                                 "on its shipped catalog",
                                 f"`gpuprov gpus --cloud {cloud} --live` shows its stock and prices")
        live = False
    region = region_from(kw["region"], quiet=True)
    request = NodeRequest(
        gpu=_gpu_asked(kw), count=kw["count"], spot=kw["spot"], region=region.name, playbook=kw["playbook"],
        cloud=cloud if own else "aws",
        cpu=kw["cpu"], memory_gib=kw["memory_gib"],
        os=kw["os_name"] or "ubuntu-24.04", pins=pins_from(kw), instance_type=kw["instance_type"],
        autostop_seconds=parse_duration(kw["autostop"], "--autostop"), ttl_seconds=parse_duration(kw["ttl"], "--ttl"),
        on_interrupt=kw["on_interrupt"] or None, persistent=kw["persistent"],
        spot_duration=None if kw["spot_duration"] is None else int(kw["spot_duration"]),  # type: ignore[arg-type]
        autostop_action=kw["autostop_action"],
        budget_usd=kw["budget"], jupyter=kw["jupyter"], monitoring=monitoring_from(kw), docker=kw["docker"],
        **(sources_from(kw) if sources is None else {"sources": sources[0], "sources_from": sources[1]}),
        arch=kw["arch"],
    )
    try:
        plan = make_plan(request)
    except UserInputError as exc:
        # a type, a GPU of the table of NVIDIA names, or a CPU-only size, that only EC2 may describe: asked for live
        # (a typo is not)
        if not (live and (exc.field == "--instance-type" or (exc.field == "--gpu" and gpu_names.named(
                parse_gpu_request(request.gpu or "")[0])) or exc.problem.startswith(cpu.NO_FIT))):
            raise
    else:
        if check is not None:
            check(plan)
    if live:
        from gpuprov.cloud.instance_facts import live_catalog
        from gpuprov.plan import catalog

        cat = live_catalog(catalog.load(), store_and_provider()[1], region.name, lambda line: warn(line))
        plan = make_plan(request, cat)
    if sources is None:
        say_region(region)
    return plan


# a cloud's own variable for its default region, as its CLI reads it (Alibaba Cloud CLI, "Environment variables")
_REGION_VARIABLE = {"alibaba": "ALIBABA_CLOUD_REGION_ID"}


def _region_of(cloud: str, given: str | None) -> Region:
    """The region of a cloud other than AWS: --region, else its CLI's region variable, else the first of its
    catalog's regions, checked against them (AWS's chain, the config's `region` included, is AWS's own)."""
    from gpuprov.cloud.region import Region
    from gpuprov.plan.plan import catalog_for

    cat = catalog_for(cloud)
    variable = _REGION_VARIABLE.get(cloud)
    if given is not None:
        return Region(cat.check_region(given), "--region")
    if variable and os.environ.get(variable):
        try:
            return Region(cat.check_region(os.environ[variable]), variable)
        except UserInputError as exc:
            raise UserInputError(variable, exc.problem, exc.hint) from None
    return Region(cat.default_region, f"{cat.cloud_title}'s default")


def _cloud_title(cloud: str) -> str:
    from gpuprov.cloud.providers import title

    return title(cloud)


def warn(text: str, colour: str = "yellow") -> None:
    """A line on stderr, coloured on a terminal unless NO_COLOR is set (https://no-color.org)."""
    click.echo(text if os.environ.get("NO_COLOR") else click.style(text, fg=colour), err=True)


def say_error(text: str, exit_code: int) -> NoReturn:
    """`error: <text>` on stderr (red on a terminal unless NO_COLOR is set), then exit; with the exit code alone
    where stderr cannot be written (a terminal gone, a closed stream)."""
    with contextlib.suppress(OSError):
        warn(f"error: {text}", "red")
    sys.exit(exit_code)


def usage_error_text(exc: click.UsageError) -> str:
    """Click's usage errors in gpuprov's one-line shape: `--flag: problem`, then where to look."""
    command = exc.ctx.command_path if exc.ctx else "gpuprov"
    if isinstance(exc, click.BadParameter) and exc.param is not None:
        field = usage_field(exc)
        problem = "is required" if isinstance(exc, click.MissingParameter) else exc.message
        return f"{field}: {problem}\n  see `{command} --help`"
    if isinstance(exc, click.exceptions.NoSuchCommand):
        close = f" (did you mean {' or '.join(exc.possibilities)}?)" if exc.possibilities else ""
        return f"{exc.command_name}: no such command{close}\n  see `{command} --help`"
    if isinstance(exc, click.NoSuchOption):
        close = f" (did you mean {' or '.join(sorted(exc.possibilities))}?)" if exc.possibilities else ""
        return f"{exc.option_name}: no such option{close}\n  see `{command} --help`"
    message = exc.message
    return f"{message}\n  see `{command} --help`"


def environment_error(exc: BaseException) -> UserInputError | None:
    """An OSError that is the user's machine, not gpuprov's mistake, said by what to fix: standard output on a
    full disk (`> file`, `> /dev/full`), a file under HOME or GPUPROV_HOME this user may not read. None for
    anything else (a bug)."""
    if not isinstance(exc, OSError):
        return None
    if exc.filename is None and exc.errno == errno.ENOSPC and _stdout_full():
        return UserInputError("stdout", exc.strerror or str(exc), "write the output where there is room")
    if isinstance(exc, PermissionError) and exc.filename:
        from gpuprov.settings import settings

        path = Path(os.path.abspath(os.fsdecode(exc.filename)))
        for name, folder in (("GPUPROV_HOME", settings().home), ("HOME", Path.home())):
            if folder is not None and path.is_relative_to(Path(os.path.abspath(folder))):
                return UserInputError(name, f"{folder} cannot be read ({exc.strerror}: {path})",
                                      f"give {name} a folder this user can read and write")
    return None


def _stdout_full() -> bool:
    """Whether standard output is on a disk with no room left (or is /dev/full)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no stdout, or none with a file (CliRunner)
        fd = sys.stdout.fileno()
        found = os.fstat(fd)
        if stat.S_ISCHR(found.st_mode):
            return found.st_rdev == os.stat("/dev/full").st_rdev
        return os.fstatvfs(fd).f_bavail == 0
    return False


def _flush_stdout() -> None:
    """What is still buffered for stdout, written while an error can still be said (the exit's flush is silent)."""
    if sys.stdout is not None:
        sys.stdout.flush()


def _save_traceback() -> str:
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="gpuprov-traceback-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(traceback.format_exc())
    return path


class Group(LazyGroup):
    """gpuprov's top-level group: every error, wherever it is raised (option parsing included), is one
    `error: ...` line on stderr with its exit code, never a traceback or Click's usage block. Every
    command gets -q/--quiet. Each command's module is imported when the command is asked for (cli/lazy.py)."""

    command_class = Command
    group_class = Subgroup

    # make_context and main keep Click's own signatures: `extra` is any of Context's settings, passed on, and
    # main returns whatever the command's callback did (without standalone_mode)
    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        """Defaults from the user's config file (flag > environment > config file > built-in), read only
        when there is one, and not for `gpuprov --help` alone, which runs no command and so takes no default."""
        _cloud[0] = None  # each command reads its own --cloud (the fork server and the tests run many in one process)
        if set(args) <= {"--help", "-h", "--version"}:
            return super().make_context(info_name, args, parent, **extra)
        from gpuprov.settings import settings

        found = settings().config
        if "default_map" not in extra and (found.kind != "missing" or found.named):
            from gpuprov.plan import config

            try:
                extra["default_map"] = config.default_map()
            except GpuprovError:
                if not {"--help", "-h"} & set(args):  # help still reads with a broken config file
                    raise
        return super().make_context(info_name, args, parent, **extra)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.params.append(QUIET_OPTION)
        if isinstance(cmd, click.Group):  # `image bake`, `cluster rm`: the same checks as every command
            cmd.command_class = Command
        super().add_command(cmd, name)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        from gpuprov.cli import signals

        try:
            with signals.handled():
                code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
                _flush_stdout()
        except GpuprovError as exc:
            say_error(str(exc), exc.exit_code)
        except click.UsageError as exc:
            say_error(usage_error_text(exc), exc.exit_code)
        except click.ClickException as exc:
            say_error(exc.format_message(), exc.exit_code)
        except (click.Abort, KeyboardInterrupt) as exc:  # Ctrl-C, SIGTERM, SIGHUP (cli/signals.py)
            cause = signals.behind(exc)  # Click's Abort, from a prompt: the interrupt is its context
            how = getattr(cause, "name", "SIGINT (Ctrl-C)")
            note = getattr(cause, "note", None)  # what a take-back left (cloud/launch.take_back)
            say_error(f"interrupted by {how}" + (f": {note}" if note else ""), signals.exit_code(cause))
        except BrokenPipeError:  # `gpuprov gpus | head`: the reader left; not an error worth a word
            with contextlib.suppress(OSError):
                sys.stdout = None  # type: ignore[assignment]
            os._exit(0)
        except Exception as exc:  # a bug: one line for the user, the traceback in a file (GPUPROV_DEBUG=1 raises)
            said = environment_error(exc)
            if said is not None:
                say_error(str(said), said.exit_code)
            from gpuprov.settings import settings

            if settings().debug:
                raise
            say_error(f"gpuprov hit a bug: {type(exc).__name__}: {exc}\n  the traceback is in {_save_traceback()}; "
                      "please report it (GPUPROV_DEBUG=1 prints it here)", 1)
        sys.exit(code if isinstance(code, int) else 0)


# --- commands ---------------------------------------------------------------------------------


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80})
@click.version_option(__version__, prog_name="gpuprov")
def main() -> None:
    """GPU machines with a working, verified PyTorch, and back to zero spend.

    \b
    Plan (offline):  gpus  plan  render  bundle  facts
    Cloud nodes:     up  status  stop  start  down  gc  autostop  ttl
                     image  capacity
    Any SSH host:    bootstrap  check  doctor  bench
    On a node:       ssh  exec  tunnel  jupyter  sync  monitor  torchrun
    Clusters:        cluster  (up --nodes, bootstrap --cluster)
    Watching:        metrics  monitor
    Settings:        config  completion
    Team:            state  team

    \b
    A day:
      gpuprov plan --gpu A100 --spot      # what it would launch and install
      gpuprov up exp1 --gpu A100 --spot --jupyter --autostop 30m
      gpuprov jupyter exp1 ; gpuprov sync ./code exp1:code
      gpuprov down exp1
    Hosts you already have:
      gpuprov bootstrap ubuntu@10.1.2.3 -p pytorch
      gpuprov check ubuntu@10.1.2.3
    """


# --- existing hosts ---------------------------------------------------------------------------


def node_target(name: str) -> Target | None:
    """A node gpuprov launched, by name: its address, login, key and pinned host key."""
    import re

    from gpuprov.paths import keys_dir, region_key, state_folder
    from gpuprov.state.url import configured

    team = configured()
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) or (team is None and not (state_folder() / "state.sqlite").exists()):
        return None
    from gpuprov.hosts.sshconfig import node_known_hosts
    from gpuprov.plan.inventory import Target
    from gpuprov.state import open_store

    node = open_store().find_node(name)
    if node is None or not node.live or not node.address:
        return None
    from gpuprov.cloud.contact import check_address

    check_address(node.address)  # a public address a local endpoint made up is nobody's to log in to
    if team is not None:  # a teammate's node: the host key its launcher pinned, from the bucket
        from gpuprov.cloud.team_keys import shared_known_hosts

        shared_known_hosts(team, node)
    key = region_key(keys_dir(), node.region)
    return Target(host=node.address, user=node.ssh_user, key=str(key), label=node.name,
                  known_hosts=str(node_known_hosts(node.name)))


def targets_from(hosts: tuple[str, ...], inventory: str | None, ssh_config: str | None) -> list[Target]:
    """The hosts the words name (nodes, clusters, NAME:K, [USER@]HOST[:PORT]) and the inventory file lists."""
    import re

    from gpuprov.plan.inventory import check_known_word, check_unique, load_inventory, parse_target, targets

    # Only a word of this shape can be a cluster (NAME, NAME:K), a node or a bare host name: USER@HOST and
    # addresses skip the records and the cluster module (a fleet's bootstrap pays no import for them)
    words = [h for h in hosts if re.fullmatch(r"[A-Za-z0-9_-]+(:[0-9]+)?", h)]
    clustered: dict[str, list[Target]] = {}
    if words:
        from gpuprov.cluster import resolve

        clustered = {h: found.targets() for h in words if (found := resolve(h)) is not None}
    ranked = [h for h in words if ":" in h and h not in clustered]
    if ranked:  # NAME:K of a single node would go to DNS as a host `NAME`, port K: a node's name never does
        singles = set(node_names())
        for h in ranked:
            base = h.partition(":")[0]
            if base in singles:
                raise UserInputError("HOST", f"{h}: {base} is a single node, not a cluster; NAME:K names node K of a "
                                     "cluster", f"`{base}` alone reaches it")
    nodes = [t for t in (node_target(h) for h in words if h not in clustered) if t is not None]
    nodes += [t for h in hosts if h in clustered for t in clustered[h]]
    named = {t.label for t in nodes} | set(clustered)
    entries = [parse_target(h) for h in hosts if h not in named]
    known = node_names() + cluster_names() if any(h not in named for h in words) else []
    for h in hosts:
        if h not in named:
            check_known_word(h, known, Path(ssh_config) if ssh_config else None)
    listed = load_inventory(inventory).targets() if inventory else []
    if not entries and not nodes and not listed:
        raise UserInputError("HOST", "no host named", "name at least one node, [USER@]HOST[:PORT], or an --inventory file")
    chosen = check_unique(nodes + targets(entries) + listed)
    from gpuprov.hosts.precheck import check_targets

    check_targets(chosen, Path(ssh_config) if ssh_config else None)
    return chosen


def host_settings(kw: ReachOptions) -> HostSettings:
    """How to reach the hosts; a first host key is pinned only where the command has --accept-new-host-key."""
    from gpuprov.hosts.hostkeys import user_known_hosts
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.paths import known_hosts_path

    return HostSettings(
        known_hosts=known_hosts_path(), accept_new_host_key=kw.get("accept_new_host_key", False), trusted=user_known_hosts(),
        connect_timeout=kw["connect_timeout"], ssh_config=Path(kw["ssh_config"]) if kw["ssh_config"] else None,
        key_filename=kw["identity"],
    )


# --- cloud lifecycle --------------------------------------------------------------------------


_cloud: list[str | None] = [None]  # --cloud as this command gave it (None: the default, or the nodes' own)


def _set_cloud(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    _cloud[0] = value


def cloud_option(func: F) -> F:
    """--cloud (GPUPROV_CLOUD, config `cloud`): where new machines come from; store_and_provider reads it."""
    from gpuprov.cloud.providers import CLOUDS, DEFAULT

    return click.option("--cloud", type=click.Choice(tuple(CLOUDS)), default=None, envvar="GPUPROV_CLOUD",
                        show_envvar=True, expose_value=False, callback=_set_cloud,
                        help=f"The cloud new machines come from [default: {DEFAULT}]; a node's own commands follow "
                             "the cloud it records.")(func)


def chosen_cloud() -> str:
    """The cloud this command makes machines in: --cloud, GPUPROV_CLOUD or the config's `cloud`, else the default."""
    from gpuprov.cloud.providers import DEFAULT

    return _cloud[0] or DEFAULT


def cloud_field() -> str:
    """Where the cloud's name came from, as an error names it: the flag, its variable, or the config's line."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source("cloud") if ctx is not None else None
    if source is ParameterSource.ENVIRONMENT:
        return "GPUPROV_CLOUD"
    if source is ParameterSource.DEFAULT_MAP:
        from gpuprov.plan import config

        return config.where("cloud")
    return "--cloud"


def store_and_provider(*, nodes: Sequence[str] = (), cloud: str | None = None) -> tuple[Store, Provider]:
    """The store, and the provider of the cloud the command works in (`provider_for`)."""
    from gpuprov.cloud.settle import window_from_env
    from gpuprov.state import open_store

    window_from_env()  # refused here, by name, before any cloud call
    store = open_store()  # first: a state it cannot use is said before anything else (the install id is in it)
    return store, provider_for(store, nodes=nodes, cloud=cloud)


def provider_for(store: Store, *, nodes: Sequence[str] = (), cloud: str | None = None) -> Provider:
    """The provider of `cloud`, else of the cloud the named `nodes` record (nodes of several clouds are refused:
    one cloud at a time), else of --cloud, else of the default cloud."""
    from gpuprov.cloud.tags import owner

    field = "--cloud" if cloud else cloud_field()
    if cloud is None and nodes:
        # each named record read alone (a listing would warn of every other record it cannot read)
        recorded = {n.name: n.provider for n in map(store.find_node, dict.fromkeys(nodes)) if n is not None}
        clouds = sorted(set(recorded.values()))
        if len(clouds) > 1:
            raise UserInputError("NAME", f"{', '.join(sorted(recorded))} are nodes of {' and '.join(clouds)}",
                                 "name the nodes of one cloud at a time")
        if clouds:
            cloud, field = clouds[0], f"{sorted(recorded)[0]}'s record"
    return _provider(cloud or chosen_cloud(), owner(), field)


def _provider(cloud: str, owner: str, field: str) -> Provider:
    """The provider of `cloud` (its module imported now) tagging as `owner`; `field` is named if it is refused."""
    from gpuprov.cloud.providers import make
    from gpuprov.cloud.tags import legacy_owner, team_tags
    from gpuprov.settings import settings
    from gpuprov.state.locks import fence

    found = settings()
    poll = found.test_poll_seconds.seconds() if found.test_poll_seconds else 2.0
    provider = make(cloud, owner, field=field, poll=poll, legacy=legacy_owner(), team=team_tags())
    # a command whose node lease a teammate took stops before its next cloud call (no core attribute: a provider
    # calls it before each of its cloud calls where it has one)
    setattr(provider, "fence", fence)  # noqa: B010
    return provider


def recorded_clouds(store: Store) -> list[str]:
    """The clouds the records' nodes are on (the default one when there are none): `status --refresh` and `gc`
    look at each."""
    return sorted({n.provider for n in store.nodes()} | {chosen_cloud()})


def say_to(console: Console) -> Callable[[str], None]:
    """Progress lines (what is being created or removed); none with -q."""
    if quiet():
        return lambda text: None
    return lambda text: console.print(text, markup=False, highlight=False)


def provider_owned_by(owner: str) -> Provider:
    """`store_and_provider`'s provider, for a command that only reads and has no state to open: its owner tag is
    `owner` (what the install id that was made says, or none), so a look makes no state folder and no install id."""
    from gpuprov.cloud.settle import window_from_env

    window_from_env()
    return _provider(chosen_cloud(), owner, cloud_field())
