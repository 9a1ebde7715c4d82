"""The user's defaults: `config.toml` in the XDG config dir (~/.config/gpuprov/config.toml, or
$GPUPROV_CONFIG), and where each effective value comes from.

Precedence, highest first: the flag, its environment variable, the config file, the built-in default.
The region follows the AWS chain with the config file between the environment and the AWS profile:
--region, AWS_REGION, AWS_DEFAULT_REGION, config `region`, the profile's region, us-east-1.

    region = "us-west-2"
    gpu = "L40S"
    playbook = "llm-finetune"
    ssh_cidr = "203.0.113.0/24"
    key = "~/.ssh/gpu.pem"
    autostop = "30m"
    parallel = 64
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuprov.errors import UserInputError
from gpuprov.paths import config_path as path


class ConfigFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str | None = None
    gpu: str | None = None
    playbook: str | None = None
    ssh_cidr: str | None = None
    key: str | None = None
    autostop: str | None = None
    parallel: Annotated[int, Field(ge=1, le=1024)] | None = None

    @field_validator("autostop")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        from gpuprov.plan.spec import parse_duration

        if value is not None:
            try:
                parse_duration(value, "autostop")
            except UserInputError as exc:
                raise ValueError(f"{exc.problem} ({exc.hint})") from None
        return value


@dataclass(frozen=True)
class Setting:
    """One key: what it sets, its environment variable, its built-in default, and which commands'
    option (by parameter name) it is the default of."""

    key: str
    what: str
    env: tuple[str, ...]
    builtin: Any
    options: dict[str, str]  # command -> parameter name


_STACK = ("plan", "render", "up")
_REACH = ("bootstrap", "check", "doctor", "ssh", "exec", "tunnel", "jupyter", "sync", "monitor")
SETTINGS = (
    Setting("region", "AWS region", ("AWS_REGION", "AWS_DEFAULT_REGION"), "us-east-1 (or the AWS profile's)", {}),
    Setting("gpu", "GPU for plan, render and up", ("GPUPROV_GPU",), None, {c: "gpu" for c in _STACK}),
    Setting("playbook", "playbook", ("GPUPROV_PLAYBOOK",), "pytorch",
            {c: "playbook" for c in (*_STACK, "bootstrap")}),
    Setting("ssh_cidr", "who may SSH to new nodes", ("GPUPROV_SSH_CIDR",), "your public address /32", {"up": "ssh_cidr"}),
    Setting("key", "private key for existing hosts (-i)", ("GPUPROV_KEY",), "~/.ssh/config, then ssh's defaults",
            {c: "identity" for c in _REACH}),
    Setting("autostop", "idle autostop", ("GPUPROV_AUTOSTOP",), "off", {c: "autostop" for c in (*_STACK, "bootstrap")}),
    Setting("parallel", "hosts worked on at once", ("GPUPROV_PARALLEL",), 32,
            {c: "parallel" for c in ("bootstrap", "check", "doctor", "exec", "monitor")}),
)


@cache
def _load(where: Path, stamp: float) -> ConfigFile:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]

    hint = f"keys: {', '.join(s.key for s in SETTINGS)}; `gpuprov config` shows what is in effect"
    try:
        data = tomllib.loads(where.read_text())
    except OSError as exc:
        raise UserInputError("config", f"{where}: cannot read it ({exc.strerror or exc})", hint) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError("config", f"{where}: not valid TOML ({exc})", hint) from None
    try:
        return ConfigFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise UserInputError("config", f"{where}: {field}: {msg}", hint) from None


def load() -> ConfigFile:
    """The config file's values (none when there is no file); a broken file is a UserInputError."""
    where = path()
    if where.is_dir() or (where.exists() and not where.is_file()):
        raise UserInputError("config", f"{where} is not a file", "a config file is TOML, e.g. gpu = \"L4\"")
    if not where.exists():
        return ConfigFile()
    return _load(where, where.stat().st_mtime)


def default_map() -> dict[str, dict[str, Any]]:
    """Click's default_map from the config file: {command: {parameter: value}}. Click then applies
    flag > environment variable > this > the option's own default."""
    values = load()
    out: dict[str, dict[str, Any]] = {}
    for setting in SETTINGS:
        value = getattr(values, setting.key)
        if value is None:
            continue
        for command, param in setting.options.items():
            out.setdefault(command, {})[param] = value
    return out


def effective(region: Callable[[], tuple[str, str]]) -> list[tuple[str, Any, str, str]]:
    """Each key: (key, value, where it came from, what it sets), without flags (those are per command).
    `region` gives the region and its source when neither the environment nor the file sets it (the AWS
    profile's, or the default: the cloud's own chain, which this pure part does not read)."""
    values = load()
    rows = []
    for setting in SETTINGS:
        env = next((v for v in setting.env if os.environ.get(v)), None)
        if env:
            rows.append((setting.key, os.environ[env], f"environment ({env})", setting.what))
        elif getattr(values, setting.key) is not None:
            rows.append((setting.key, getattr(values, setting.key), f"config file ({path()})", setting.what))
        elif setting.key == "region":
            name, source = region()
            rows.append((setting.key, name, source, setting.what))
        else:
            rows.append((setting.key, setting.builtin, "built-in", setting.what))
    return rows
