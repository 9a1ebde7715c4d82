"""The user's defaults: `config.toml` in the XDG config dir (~/.config/gpuprov/config.toml, or
$GPUPROV_CONFIG), and where each effective value comes from. The file is read by gpuprov/settings.py, once per
process; here its keys are checked as the commands' defaults.

Precedence, highest first: the flag, its environment variable, the config file, the built-in default.
The region follows the AWS chain with the config file between the environment and the AWS profile:
--region, AWS_REGION, AWS_DEFAULT_REGION, config `region`, the profile's region, us-east-1.

    region = "us-west-2"
    cloud = "aws"
    gpu = "L40S"
    playbook = "llm-finetune"
    ssh_cidr = "203.0.113.0/24"
    key = "~/.ssh/gpu.pem"
    autostop = "30m"
    stopped_for = "14d"
    parallel = 64

and where new nodes go and how they are reached (`make sandbox` writes these for its local endpoint):

    subnet = "subnet-0123456789abcdef0"
    connect = "private"
    ssh_config = "~/.ssh/sandbox_config"
    ssh_user = "root"
    os = "ubuntu-22.04"
    python = "3.11"

and where nodes download from (plan/sources.py; a playbook's `sources:` and `--sources` go over it):

    [sources]
    pypi = "https://mirror.example.org/pypi/simple"

A value that came from here and is refused is blamed on its key and line (`where`), not on a flag.

`default_map()` is what Click reads; `effective()` is `gpuprov config`'s value and source per key (the region
row's fallback, the AWS chain, is handed in by the CLI, so this part reads no cloud) and `check_effective()`
checks every value shown (a bad one is exit 2 naming its variable or `PATH:LINE: key`); `key_for(command,
param)` maps an option to its key. A GPUPROV_CONFIG that names no file is an error. The region is no Click
default: cloud/providers/aws_region.py reads the file between the AWS environment variables and the AWS profile.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuprov.errors import UserInputError
from gpuprov.paths import config_path as path
from gpuprov.plan.sources import Sources
from gpuprov.settings import Sourced, settings

# a login name as useradd's default NAME_REGEX takes one: what `--ssh-user` and the config's ssh_user accept
LOGIN_NAME = r"^[a-z_][a-z0-9_.-]{0,31}$"


class ConfigFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str | None = None
    cloud: Literal["aws", "alibaba"] | None = None  # cloud/providers/__init__.py CLOUDS
    gpu: str | None = None
    playbook: str | None = None
    ssh_cidr: str | None = None
    key: str | None = None
    autostop: str | None = None
    stopped_for: str | None = None
    parallel: Annotated[int, Field(ge=1, le=1024)] | None = None
    # an AWS subnet id, or an Alibaba Cloud vSwitch id: each applies to its own cloud's `up` only (cli/cloud.py)
    subnet: Annotated[str, Field(pattern=r"^(subnet-[0-9a-f]{8,17}|vsw-[0-9a-z-]{8,40})$")] | None = None
    connect: Literal["public", "private"] | None = None
    ssh_user: Annotated[str, Field(pattern=LOGIN_NAME)] | None = None
    os: str | None = None
    python: Annotated[str, Field(pattern=r"^3\.\d+$")] | None = None
    ssh_config: str | None = None
    state: str | None = None  # where the records live: "s3://BUCKET/PREFIX" (team state) or "local"
    lease: Annotated[float, Field(ge=1, le=3600)] | None = None  # seconds a node's lease outlives its last renewal
    sources: Sources | None = None  # [sources]: where nodes download from (plan/sources.py)

    @field_validator("state")
    @classmethod
    def _state(cls, value: str | None) -> str | None:
        from gpuprov.state.url import parse

        if value is not None:
            try:
                parse(value, "state")
            except UserInputError as exc:
                raise ValueError(exc.problem) from None
        return value

    @field_validator("os")
    @classmethod
    def _os(cls, value: str | None) -> str | None:
        from gpuprov.plan.stack import SUPPORTED_OS

        if value is not None and value not in SUPPORTED_OS:
            raise ValueError(f"{value!r} is not an OS gpuprov supports ({', '.join(SUPPORTED_OS)})")
        return value

    @field_validator("autostop", "stopped_for")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        from gpuprov.plan.spec import parse_duration

        if value is not None:
            try:
                parse_duration(value, "duration")
            except UserInputError as exc:
                raise ValueError(f"{exc.problem} ({exc.hint})") from None
        return value


@dataclass(frozen=True)
class Setting:
    """One key: what it sets, its environment variable, its built-in default, and which commands'
    option (by parameter name) it is the default of ("state adopt": a command of a group)."""

    key: str
    what: str
    env: tuple[str, ...]
    builtin: Any
    options: dict[str, str]  # command -> parameter name


_STACK = ("plan", "render", "up")
_PINNED = (*_STACK, "bootstrap")
_REACH = ("bootstrap", "check", "doctor", "bench", "ssh", "exec", "tunnel", "jupyter", "sync", "monitor", "torchrun")
SETTINGS = (
    Setting("region", "AWS region", ("AWS_REGION", "AWS_DEFAULT_REGION"), "us-east-1 (or the AWS profile's)", {}),
    Setting("cloud", "the cloud new machines come from", ("GPUPROV_CLOUD",), "aws",
            {c: "cloud" for c in (*_STACK, "gpus", "gc", "state adopt")}),
    Setting("gpu", "GPU for plan, render and up", ("GPUPROV_GPU",), None, {c: "gpu" for c in _STACK}),
    Setting("playbook", "playbook", ("GPUPROV_PLAYBOOK",), "pytorch",
            {c: "playbook" for c in (*_STACK, "bootstrap")}),
    Setting("ssh_cidr", "who may SSH to new nodes", ("GPUPROV_SSH_CIDR",), "your public address /32", {"up": "ssh_cidr"}),
    Setting("key", "private key for existing hosts (-i)", ("GPUPROV_KEY",), "~/.ssh/config, then ssh's defaults",
            {c: "identity" for c in _REACH}),
    Setting("autostop", "idle autostop", ("GPUPROV_AUTOSTOP",), "off", {c: "autostop" for c in (*_STACK, "bootstrap")}),
    Setting("stopped_for", "how long stopped before gc takes a node", (), "off (status flags 14d)",
            {"gc": "stopped_for"}),
    Setting("parallel", "hosts worked on at once", ("GPUPROV_PARALLEL",), 32,
            {c: "parallel" for c in ("bootstrap", "check", "doctor", "exec", "monitor")}),
    Setting("subnet", "subnet (AWS) or vSwitch (Alibaba Cloud) new nodes launch into", (), "the default VPC's",
            {"up": "subnet"}),
    Setting("connect", "address new nodes are reached at", (), "public", {"up": "connect"}),
    Setting("ssh_user", "login user of new nodes' image", (), "the OS image's (ubuntu, admin, ec2-user, rocky)",
            {"up": "ssh_user"}),
    Setting("os", "OS the scripts are for", (), "ubuntu-24.04 (bootstrap: the host's own)",
            {c: "os_name" for c in _PINNED}),
    Setting("python", "the env's Python", (), "3.12", {c: "python" for c in _PINNED}),
    Setting("ssh_config", "ssh config file for existing hosts", (), "~/.ssh/config",
            {c: "ssh_config" for c in _REACH}),
    Setting("state", "where the records live (team state: s3://BUCKET/PREFIX)", ("GPUPROV_STATE",),
            "the local file", {}),
    Setting("lease", "seconds a node's lease outlives its holder (team state)", ("GPUPROV_LEASE_SECONDS",), 120, {}),
)


def load() -> ConfigFile:
    """The config file's values (none when there is no file); a broken file is a UserInputError, and so is
    a GPUPROV_CONFIG naming a file that is not there (the user meant one: running without it would
    launch with other defaults than theirs). The file was read once, with the process's settings."""
    config = settings().config
    where = config.path
    if config.kind == "other":
        raise UserInputError("config", f"{where} is not a file", "a config file is TOML, e.g. gpu = \"L4\"")
    if config.kind == "missing":
        if config.named:
            raise UserInputError("GPUPROV_CONFIG", f"no such file: {where}",
                                 "create it (TOML, e.g. gpu = \"L4\"), or unset GPUPROV_CONFIG for the default one")
        return ConfigFile()
    hint = f"keys: {', '.join(s.key for s in SETTINGS)}; `gpuprov config` shows what is in effect"
    if config.problem is not None and config.field != "config":  # HOME (or the like) this user cannot read
        raise UserInputError(config.field, config.problem, f"give {config.field} a folder this user can read, or "
                             "point GPUPROV_CONFIG and GPUPROV_HOME at ones it can")
    if config.problem is not None:
        raise UserInputError("config", f"{where}: {config.problem}", hint)
    try:
        return ConfigFile.model_validate(config.data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        if field in ("state", "lease"):  # team state's keys: blamed on their line, as state/url.py blames them
            raise UserInputError(config.where(field), msg, hint) from None
        raise UserInputError("config", f"{where}: {field}: {msg}", hint) from None


def key_for(command: str, param: str) -> str | None:
    """The config key that is `command`'s default for its parameter `param` (None: no key is)."""
    return next((s.key for s in SETTINGS if s.options.get(command) == param), None)


def where(key: str) -> str:
    """Where the config file sets `key`, as an error names it: `PATH:LINE: key` (`PATH: key` when the
    line is not found: a key in an inline table, say)."""
    return settings().config.where(key)


def default_map() -> dict[str, dict[str, Any]]:
    """Click's default_map from the config file: {command: {parameter: value}}. Click then applies
    flag > environment variable > this > the option's own default."""
    values = load()
    out: dict[str, dict[str, Any]] = {}
    for setting in SETTINGS:
        value = getattr(values, setting.key)
        if value is None:
            continue
        if setting.key in ("key", "ssh_config"):  # a path, as a shell would have expanded it on the command line
            value = os.path.expanduser(value)
        for command, param in setting.options.items():  # "state adopt": a group's command, under the group's map
            *groups, name = command.split()
            into: dict[str, Any] = out
            for group in groups:
                into = into.setdefault(group, {})
            into.setdefault(name, {})[param] = value
    return out


def effective(region: Callable[[], tuple[str, str]]) -> list[tuple[str, Any, str, str]]:
    """Each key: (key, value, where it came from, what it sets), without flags (those are per command).
    `region` gives the region and its source when neither the environment nor the file sets it (the AWS
    profile's, or the default: the cloud's own chain, which this pure part does not read)."""
    values = load()
    rows = []
    for setting in SETTINGS:
        env = next((found for v in setting.env if (found := _variable(v)) is not None), None)
        if env:
            rows.append((setting.key, env.text, f"environment ({env.where})", setting.what))
        elif getattr(values, setting.key) is not None:
            rows.append((setting.key, getattr(values, setting.key), f"config file ({path()})", setting.what))
        elif setting.key == "region":
            name, source = region()
            rows.append((setting.key, name, source, setting.what))
        else:
            rows.append((setting.key, setting.builtin, "built-in", setting.what))
    return rows


def _variable(name: str) -> Sourced | None:
    """A setting's variable when set and not empty: gpuprov's own from its settings; the region's (AWS_REGION,
    AWS_DEFAULT_REGION) from the environment, as the AWS chain reads them."""
    if name.startswith("GPUPROV_"):
        return settings().variable(name)
    value = os.environ.get(name)
    return Sourced(value, name) if value else None


def _check_value(key: str, value: str) -> None:
    """Refuse a value `key` cannot take (the same checks its option makes when a command uses it)."""
    import ipaddress

    from gpuprov.plan import catalog
    from gpuprov.plan.spec import load_playbook, parse_duration

    if key == "region":
        catalog.load().check_region(value)
    elif key == "gpu":
        catalog.load().gpu(catalog.parse_gpu_request(value)[0])
    elif key == "playbook":
        load_playbook(value)
    elif key == "ssh_cidr":
        try:
            ipaddress.ip_network(value.strip(), strict=False)
        except ValueError:
            raise UserInputError(key, f"{value!r} is not a CIDR", "e.g. 203.0.113.7/32") from None
    elif key == "key" and not Path(value).expanduser().is_file():
        raise UserInputError(key, f"no such key file: {value}", "the private key's path, e.g. ~/.ssh/id_ed25519")
    elif key == "ssh_config" and not Path(value).expanduser().is_file():
        raise UserInputError(key, f"no such file: {value}", "an OpenSSH client config, e.g. ~/.ssh/config")
    elif key == "autostop":
        parse_duration(value, key)
    elif key == "state":
        from gpuprov.state.url import parse

        parse(value, key)
    elif key == "parallel" and not (value.isdigit() and 1 <= int(value) <= 1024):
        raise UserInputError(key, f"{value!r} is not in the range 1 to 1024", "hosts worked on at once, e.g. 32")


def check_effective(rows: list[tuple[str, Any, str, str]]) -> None:
    """`gpuprov config` shows only values a command would take: the first bad one is a UserInputError
    naming where it came from (the environment variable, or the config file's key and line)."""
    for key, value, source, _what in rows:
        if value is None or source in ("built-in", "default"):
            continue
        env = re.fullmatch(r"environment \((\w+)\)", source)
        try:
            _check_value(key, str(value))
        except UserInputError as exc:
            field = env.group(1) if env else where(key) if source.startswith("config file") else key
            raise UserInputError(field, exc.problem, exc.hint) from None
