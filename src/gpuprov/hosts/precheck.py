"""What can be known about a host before connecting to it, refused up front with the field that is wrong.

A jump host that does not resolve would otherwise surface as the *target* being unreachable, blamed on the
wrong machine, after a connect timeout; here it is named where it was written (`hosts.yml: gpu-box.proxy_jump`).
So is a key file that is not there (`hosts.yml: trainer-a.key`). Login names and OS names are checked where
they are read (plan/inventory.py).
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import paramiko

from gpuprov.errors import UserInputError
from gpuprov.plan.inventory import Target


def _hop_host(hop: str) -> str:
    """The host part of one `[user@]host[:port]` hop."""
    host = hop.rsplit("@", 1)[-1]
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def check_targets(targets: list[Target], ssh_config: Path | None) -> None:
    """Before any connection: every key file a target names is there, every jump host resolves."""
    for target in targets:
        if target.key and target.origin and not Path(target.key).expanduser().is_file():
            raise UserInputError(target.field("key", "key"), f"no such key file: {target.key}",
                                 "the private key's path, e.g. ~/.ssh/gpu.pem")
    check_jumps(targets, ssh_config)


def check_jumps(targets: list[Target], ssh_config: Path | None) -> None:
    """Every jump host of every target resolves (after the ssh config's HostName), before any connection."""
    jumps = [t for t in targets if t.proxy_jump]
    if not jumps:
        return
    path = ssh_config or Path.home() / ".ssh" / "config"
    config = paramiko.SSHConfig()  # no readable ssh config: hop names are taken as written
    with contextlib.suppress(OSError, UnicodeDecodeError, paramiko.ssh_exception.ConfigParseError):
        config = paramiko.SSHConfig.from_path(str(path))
    for target in jumps:
        for hop in str(target.proxy_jump).split(","):
            entry = config.lookup(_hop_host(hop))
            if entry.get("proxycommand") or entry.get("proxyjump"):
                continue  # reached through another hop: its name is resolved over there
            name = str(entry.get("hostname") or _hop_host(hop))
            try:
                socket.getaddrinfo(name, None)
            except (socket.gaierror, UnicodeError) as exc:
                raise UserInputError(
                    target.field("proxy_jump", "proxy_jump"),
                    f"the jump host {hop!r} of {target.name} does not resolve ({getattr(exc, 'strerror', None) or exc})",
                    "check its spelling, give its address, or add a Host entry with its HostName to the ssh config",
                ) from None
