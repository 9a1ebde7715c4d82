"""Existing hosts: `[USER@]HOST[:PORT]` arguments and inventory files, as Targets to connect to.

An inventory is YAML, validated like playbooks:

    defaults: {user: ubuntu, key: ~/.ssh/gpu.pem}
    hosts:
      - host: 10.1.2.3
        name: trainer-a
        gpu: A100-80GB          # checked against what the host reports
      - host: gpu-box           # an alias from ~/.ssh/config works too
        proxy_jump: bastion

Host names are unique and `gpu:` is a known GPU. `check_known_word`: a bare word that is no node, no `Host` of
the ssh config (Includes followed) and no /etc/hosts name is refused with a did-you-mean instead of going to DNS.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field, PrivateAttr, field_validator

from gpuprov.errors import UserInputError
from gpuprov.plan.spec import StepName, _Model, load_model, read_text_file


@dataclass(frozen=True)
class Target:
    """One host as the user named it; unset fields come from ~/.ssh/config, then defaults."""

    host: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    proxy_jump: str | None = None
    label: str = ""
    gpu: str | None = None
    os: str | None = None
    known_hosts: str | None = None  # a launched node's own pinned keys, instead of gpuprov's shared file
    origin: str = ""  # the inventory file this host was read from ("" for the command line or a node)

    @property
    def name(self) -> str:
        return self.label or (f"{self.host}:{self.port}" if self.port and self.port != 22 else self.host)

    def field(self, name: str, flag: str) -> str:
        """Where this host's `name` (gpu, os, key, proxy_jump) was given, as an error names it: the
        inventory's `hosts.yml: trainer-b.gpu`, else the flag."""
        return f"{self.origin}: {self.name}.{name}" if self.origin else flag


Port = Annotated[int, Field(ge=1, le=65535)]
# a login name as useradd takes one: no spaces, no leading '-' that ssh would read as an option
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
# a jump host as ssh -J takes it: [user@]host[:port], comma-separated hops, nothing ssh reads as an option
Jump = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._@:\[\]%-]*(,[A-Za-z0-9_][A-Za-z0-9._@:\[\]%-]*)*$")]


class HostDefaults(_Model):
    user: str | None = None
    port: Port | None = None
    key: str | None = None
    proxy_jump: Jump | None = None

    @field_validator("user")
    @classmethod
    def _login(cls, value: str | None) -> str | None:
        if value is not None and not _USER.fullmatch(value):
            raise ValueError(f"{value!r} is not a login name (letters, digits, '.', '_', '-'; no spaces, "
                             "not starting with '-')")
        return value


class HostEntry(HostDefaults):
    """One existing host. `host` is an address or a Host alias from ~/.ssh/config."""

    host: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:\[\]%-]+$")]
    name: StepName | None = None
    gpu: str | None = None  # checked against what the host reports
    os: str | None = None  # overrides the host's /etc/os-release

    @field_validator("os")
    @classmethod
    def _supported_os(cls, value: str | None) -> str | None:
        from gpuprov.plan.stack import SUPPORTED_OS

        if value is not None and value not in SUPPORTED_OS:
            raise ValueError(f"{value!r} is not an OS gpuprov supports; one of {', '.join(SUPPORTED_OS)}")
        return value

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        if value is not None:
            from gpuprov.plan import catalog

            try:
                catalog.load().gpu(catalog.parse_gpu_request(value)[0])
            except UserInputError as exc:
                raise ValueError(f"{exc.problem}; {exc.hint}") from None
        return value


class Inventory(_Model):
    defaults: HostDefaults = HostDefaults()
    hosts: Annotated[tuple[HostEntry, ...], Field(min_length=1)]
    _source: str = PrivateAttr("")  # the file it was read from

    def targets(self) -> list[Target]:
        return targets(list(self.hosts), self.defaults, origin=self._source)

    @field_validator("hosts")
    @classmethod
    def _unique_names(cls, hosts: tuple[HostEntry, ...]) -> tuple[HostEntry, ...]:
        """Results, logs and markers are keyed by a host's name, so two hosts may not share one."""
        twice = _named_twice(targets(list(hosts)))
        if twice:
            raise ValueError(f"two hosts are called {twice!r}; give each a different `name:`")
        return hosts


def load_inventory(path: str) -> Inventory:
    file = Path(path)
    if not file.exists():
        raise UserInputError("--inventory", f"no such file: {path}", "an inventory is YAML with a `hosts:` list")
    inventory = load_model(read_text_file(file, "--inventory", "inventory"), Inventory, path, "--inventory")
    inventory._source = path
    return inventory


_TARGET = re.compile(r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]*)@)"
                     r"?(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+)(?::(?P<port>\d{1,5}))?$")


def parse_target(text: str) -> HostEntry:
    """`[USER@]HOST[:PORT]` (IPv6 in brackets) as a HostEntry."""
    match = _TARGET.match(text)
    if not match or (match.group("port") and not 0 < int(match.group("port")) < 65536):
        raise UserInputError("HOST", f"{text!r} is not [USER@]HOST[:PORT]", "e.g. ubuntu@10.1.2.3 or gpu-box:2222")
    host = match.group("host").strip("[]")
    return HostEntry(host=host, user=match.group("user"), port=int(match.group("port")) if match.group("port") else None)


def _named_twice(found: list[Target]) -> str | None:
    names = [t.name for t in found]
    return next((n for n in names if names.count(n) > 1), None)


def check_unique(found: list[Target]) -> list[Target]:
    """`found`, unless two share a name (results, logs and markers are keyed by it): UserInputError."""
    twice = _named_twice(found)
    if twice:
        raise UserInputError("HOST", f"{twice!r} is named twice", "name each host once (an inventory's `name:` tells two apart)")
    return found


def targets(entries: list[HostEntry], defaults: HostDefaults | None = None, origin: str = "") -> list[Target]:
    d = defaults or HostDefaults()
    return [
        Target(host=e.host, user=e.user or d.user, port=e.port or d.port, key=e.key or d.key,
               proxy_jump=e.proxy_jump or d.proxy_jump, label=e.name or "", gpu=e.gpu, os=e.os, origin=origin)
        for e in entries
    ]


def _etc_hosts_names(path: Path = Path("/etc/hosts")) -> set[str]:
    names: set[str] = set()
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            names.update(line.split("#", 1)[0].split()[1:])
    return names


_SSH_CONFIG_LINE = re.compile(r"^\s*(\w+)(?:\s*=\s*|\s+)(.+?)\s*$")


def ssh_config_hosts(ssh_config: Path | None, _depth: int = 0) -> list[str]:
    """The `Host` patterns of the user's ssh config (~/.ssh/config unless given), wildcards and all,
    following `Include` (as ssh does: relative paths under ~/.ssh, globs) — gpuprov's own node entries
    are Included that way."""
    import glob
    import shlex

    try:
        text = (ssh_config or Path.home() / ".ssh" / "config").read_text(errors="replace")
    except OSError:
        return []
    found: list[str] = []
    for line in text.splitlines():
        match = _SSH_CONFIG_LINE.match(line.split("#", 1)[0])
        if not match:
            continue
        try:
            values = shlex.split(match.group(2))
        except ValueError:
            continue
        keyword = match.group(1).lower()
        if keyword == "host":
            found += values
        elif keyword == "include" and _depth < 8:
            for pattern in values:
                full = Path(pattern).expanduser()
                full = full if full.is_absolute() else Path.home() / ".ssh" / full
                for included in sorted(glob.glob(str(full))):
                    found += ssh_config_hosts(Path(included), _depth + 1)
    return found


def check_known_word(text: str, nodes: list[str], ssh_config: Path | None) -> None:
    """A bare word (no user@, :port or dot, not an address) names a node, a Host of the ssh config or an
    /etc/hosts entry; anything else is a typo, refused here rather than sent to DNS (UserInputError).
    Full DNS names (gpu-box.example.com) and USER@HOST are taken as written."""
    import difflib
    import fnmatch
    import ipaddress

    if not re.fullmatch(r"[A-Za-z0-9_-]+", text) or text == "localhost":
        return
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(text)
        return
    patterns = ssh_config_hosts(ssh_config)
    if any(p != "*" and fnmatch.fnmatch(text, p) for p in patterns) or text in _etc_hosts_names():
        return
    choices = nodes + [p for p in patterns if not any(c in p for c in "*?!")]
    close = difflib.get_close_matches(text, choices, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    known = f"nodes: {', '.join(nodes)}; " if nodes else "no nodes yet; "
    raise UserInputError("HOST", f"no node called {text!r} ({hint.strip() or 'and no Host of that name in the ssh config'})",
                         f"{known}a host by DNS is its full name (gpu-box.example.com) or USER@HOST")
