"""What gpuprov's options take and where each value came from.

`Number` is the one Click type of every number an option takes: finite (no nan, no inf), in a range the
option's help states, whole where it counts things. `origin` names where a value came from — the flag, the
environment variable, or the config file's key (`~/.config/gpuprov/config.toml:3: gpu`) — from Click's own
record of it (`ctx.get_parameter_source`), so an error about a value the user never typed on the command line
blames the place they did write it. `Command` refuses an option given twice and is every command's class.

`Command` also re-blames a `UserInputError` about a flag on where the value really came from (the environment
variable, or the config file's `PATH:LINE: key` from plan/config.where), as `usage_field` does for Click's
own usage errors; a mistyped command gets Click's suggestion.
"""

from __future__ import annotations

import math
import re
from typing import Any

import click
from click.core import ParameterSource

from gpuprov.errors import UserInputError


class Number(click.ParamType):  # type: ignore[type-arg]  # (generic in some Click versions only)
    """A finite number in [low, high] (`low_open`: low itself excluded); `whole`: an integer."""

    def __init__(self, low: float, high: float, *, whole: bool = False, low_open: bool = False) -> None:
        self.low, self.high, self.whole, self.low_open = low, high, whole, low_open
        self.name = "integer" if whole else "number"

    @property
    def range_text(self) -> str:
        low, high = _plain(self.low), _plain(self.high)
        return f"{low} < x ≤ {high}" if self.low_open else f"{low} to {high}"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        return None

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | float:
        if isinstance(value, bool):  # a TOML `true` is no number
            self.fail(f"{value!r} is not a number; give one in the range {self.range_text}", param, ctx)
        if isinstance(value, (int, float)):
            number: float = value
        else:
            text = str(value).strip()
            try:
                number = float(text)
                if self.whole and re.fullmatch(r"[+-]?\d+", text):
                    number = int(text)  # exact, however many digits
            except ValueError:
                kind = "a whole number" if self.whole else "a number"
                self.fail(f"{value!r} is not {kind}; give one in the range {self.range_text}", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number; give one in the range {self.range_text}", param, ctx)
        if self.whole and number != int(number):
            self.fail(f"{value!r} is not a whole number; give one in the range {self.range_text}", param, ctx)
        if number < self.low or (self.low_open and number == self.low) or number > self.high:
            self.fail(f"{_plain(number)} is not in the range {self.range_text}", param, ctx)
        return int(number) if self.whole else float(number)


class LoginName(click.ParamType):  # type: ignore[type-arg]
    """A login name (plan/config.py LOGIN_NAME): checked before anything is asked of the cloud, since it reaches
    ssh and the node's shell."""

    name = "login name"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from gpuprov.plan.config import LOGIN_NAME

        text = str(value)
        if not re.fullmatch(LOGIN_NAME, text):
            self.fail(f"{text!r} is not a login name (lowercase letters, digits, '.', '_', '-'; at most 32; not "
                      "starting with a digit, '.' or '-')", param, ctx)
        return text


def _plain(number: float) -> str:
    return f"{number:,.0f}".replace(",", "_") if number == int(number) and abs(number) >= 100_000 else f"{number:g}"


# --- where a value came from ---------------------------------------------------------------------------


def origin(ctx: click.Context | None, param: click.Parameter) -> str | None:
    """Where `param`'s value came from, when that is not the command line: the environment variable that
    set it, or the config file's key (with its line); None for the flag itself or the built-in default."""
    if ctx is None or param.name is None:
        return None
    source = ctx.get_parameter_source(param.name)
    if source == ParameterSource.ENVIRONMENT:
        from gpuprov.settings import settings

        names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])
        return next((str(n) for n in names if n and settings().variable(str(n)) is not None), None)
    if source == ParameterSource.DEFAULT_MAP:
        from gpuprov.plan import config

        return config.where(config.key_for(ctx.info_name or "", param.name) or param.name)
    return None


def blamed(exc: UserInputError, ctx: click.Context) -> UserInputError:
    """`exc` about a flag (`--gpu: …`), with its field replaced by where the value really came from when that
    is not the command line (`GPUPROV_GPU: …`, `…/config.toml:2: gpu: …`); else `exc` itself."""
    param = next((p for p in ctx.command.params if exc.field in getattr(p, "opts", ())), None)
    where = origin(ctx, param) if param is not None else None
    if where is None:
        return exc
    out = type(exc).__new__(type(exc))  # a StackConflict stays one, its rule id with it
    out.__dict__.update(vars(exc), field=where)
    Exception.__init__(out, f"{where}: {exc.problem}" + (f"\n  {exc.hint}" if exc.hint else ""))
    return out


def usage_field(exc: click.BadParameter) -> str:
    """The field a Click usage error names: the flag (or ARGUMENT), or where the value came from instead."""
    assert exc.param is not None
    where = origin(exc.ctx, exc.param)
    if where is not None:
        return where
    if isinstance(exc.param_hint, str):
        return exc.param_hint
    field = max(exc.param.opts, key=len) if exc.param.opts else exc.param.name or "argument"
    if exc.param.param_type_name == "argument":
        field = (exc.param.human_readable_name or field).upper()
    return field


class Command(click.Command):
    """Every gpuprov command: an option that takes a value may be given once (a second `--gpu` would
    silently win over the first); errors about values from the environment or the config file name them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        self._refuse_repeats(ctx, args)
        return super().parse_args(ctx, args)

    def _refuse_repeats(self, ctx: click.Context, args: list[str]) -> None:
        words = args[:args.index("--")] if "--" in args else list(args)
        try:
            _opts, _rest, order = self.make_parser(ctx).parse_args(args=words)
        except click.UsageError:
            return  # the real parse says what is wrong
        seen: set[str] = set()
        for param in order:
            if not isinstance(param, click.Option) or param.multiple or param.count or param.is_flag:
                continue
            name = param.name or ""
            if name in seen:
                flag = max(param.opts, key=len)
                raise click.BadParameter(f"given more than once; give {flag} once", ctx=ctx, param=param)
            seen.add(name)

    def invoke(self, ctx: click.Context) -> Any:  # Click's: whatever the callback returns
        try:
            return super().invoke(ctx)
        except UserInputError as exc:
            raise blamed(exc, ctx) from None

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        from gpuprov.cli.examples import write_examples

        write_examples(ctx, formatter)


class Subgroup(click.Group):
    """A group under `gpuprov` (`image`, `state`, …): its subcommands are gpuprov Commands, and its help ends with
    examples as theirs do."""

    command_class = Command

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        from gpuprov.cli.examples import write_examples

        write_examples(ctx, formatter)

