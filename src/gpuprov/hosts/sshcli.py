"""The system `ssh` and `rsync`: their command lines, with the host key checked against a pinned file
(`StrictHostKeyChecking=yes` with the node's own known_hosts or gpuprov's, never trust-on-first-use behind
the user's back) and a bound on a server that stops answering (the handshake included). Library only:
nothing here prints or runs the connection itself.

ssh's ConnectTimeout covers the connect and the banner only (a server that sent its banner and stalled held `ssh`
and `sync` forever), so ServerAliveInterval x ServerAliveCountMax (OpenSSH's bound on each wait for the server
from the handshake on) is set to about `--connect-timeout` (ceil(t/3) x 3), unless the user's ssh config sets an
interval for the host (read with `ssh -G`); the same bound ends a session whose server stops answering. A node
whose first key is awaited gets `accept-new`. `-F` names the ssh config gpuprov read, so a HOME other than the
passwd home changes nothing. Also here: whether a host is pinned and the hint to pin it, rsync's `HOST:PATH`
shape, `sync`'s one rule, `as_copy` (DST becomes a copy of SRC whatever the slashes, folders above DST made), and
`split_s3_sync`: a `sync` with an `s3://` side runs `aws s3 sync` on the node (a cluster by name: every node);
between this machine and S3 it is refused with the `aws s3 sync` line to run instead.
"""

from __future__ import annotations

import contextlib
import math
import re
import shlex
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.plan.inventory import Target, parse_target

if TYPE_CHECKING:
    from gpuprov.hosts.remote import HostSettings


def known_hosts_for(target: Target, settings: HostSettings) -> Path:
    """The pinned keys `target` is checked against: a launched node's own file, else gpuprov's."""
    return Path(target.known_hosts) if target.known_hosts else settings.known_hosts


def ssh_options(target: Target, settings: HostSettings) -> list[str]:
    """OpenSSH client options for `target` (no host, no command): pinned host key, key, user, port."""
    from gpuprov.hosts.hostkeys import awaits_first_key

    known = known_hosts_for(target, settings)
    files = [known, *([] if target.known_hosts else settings.trusted)]  # a launched node: its own file only
    # a node gpuprov has just launched whose key nobody has seen: ssh pins the first one (ssh_config(5)
    # accept-new: a new key is added, a changed one refused), as gpuprov's own first contact would
    checking = "accept-new" if target.known_hosts and awaits_first_key(known) else "yes"
    opts = [
        "-o", "UserKnownHostsFile=" + " ".join(f'"{f}"' if " " in str(f) else str(f) for f in files),
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"StrictHostKeyChecking={checking}",
        "-o", "UpdateHostKeys=no",
        "-o", f"ConnectTimeout={max(1, math.ceil(settings.connect_timeout))}",
    ]
    config = settings.ssh_config or Path.home() / ".ssh" / "config"
    if config.is_file():  # the config gpuprov read, even where ssh's own home (passwd) is another (sudo -E, CI)
        opts += ["-F", str(config)]
    opts += _alive_options(target, opts, settings)
    key = target.key or settings.key_filename
    if key:
        opts += ["-i", str(Path(key).expanduser()), "-o", "IdentitiesOnly=yes"]
    if target.port:
        opts += ["-p", str(target.port)]
    if target.user:
        opts += ["-l", target.user]
    if target.proxy_jump:
        opts += _jump_options(target.proxy_jump, settings, known)
    return opts


ALIVE_COUNT = 3  # ServerAliveCountMax when gpuprov sets it


def _alive_options(target: Target, opts: list[str], settings: HostSettings) -> list[str]:
    """A bound on a server that stops answering, the handshake included: ssh's ConnectTimeout covers the TCP
    connect and the banner only, so a server that sent its banner and then stalled held `gpuprov ssh` and
    `sync` forever, while the other commands give up after --connect-timeout. OpenSSH applies
    ServerAliveInterval x ServerAliveCountMax to every wait for the server from the handshake on (ssh.c sets
    it as the packet timeout right after the connect), so gpuprov sets them to about --connect-timeout, unless
    the user's ssh config sets an interval of its own for the host (`ssh -G`, as ssh would read it): then
    theirs applies. The same bound then finds a dead connection during the session."""
    import subprocess

    try:
        shown = subprocess.run(["ssh", "-G", *opts, "--", target.host], capture_output=True, text=True, timeout=10,
                               stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        shown = ""
    interval = next((line.split()[1] for line in shown.splitlines() if line.startswith("serveraliveinterval ")), "0")
    if interval != "0":
        return []
    every = max(1, math.ceil(settings.connect_timeout / ALIVE_COUNT))
    return ["-o", f"ServerAliveInterval={every}", "-o", f"ServerAliveCountMax={ALIVE_COUNT}"]


def _jump_options(jump: str, settings: HostSettings, known: Path) -> list[str]:
    """A single-hop jump host is checked against the same pinned file (a ProxyCommand running our
    own ssh); a chain goes to ssh's -J, which checks each hop with the user's ssh settings."""
    if "," in jump:
        return ["-J", jump]
    try:
        entry = parse_target(jump)
        hop = Target(host=entry.host, user=entry.user, port=entry.port, known_hosts=str(known))
    except UserInputError:
        hop = Target(host=jump, known_hosts=str(known))
    inner = ["ssh", *ssh_options(hop, settings), "-W", "[%h]:%p", "--", hop.host]
    return ["-o", "ProxyCommand=" + shlex.join(inner)]


def ssh_argv(target: Target, settings: HostSettings, command: Sequence[str] = (), *, tty: bool = False) -> list[str]:
    """`ssh … -- HOST [COMMAND…]`. Like ssh, the command words are joined by spaces for the remote shell."""
    argv = ["ssh", *ssh_options(target, settings)]
    if tty:
        argv.append("-t")
    return [*argv, "--", target.host, *command]


def is_pinned(target: Target, settings: HostSettings) -> bool | None:
    """Whether the pinned file holds a key for the host; None when the name ssh will use is unknown
    (an alias from ~/.ssh/config), where ssh alone decides."""
    from gpuprov.hosts.hostkeys import known_host_name, known_hosts_file

    files = [f for f in (known_hosts_for(target, settings), *([] if target.known_hosts else settings.trusted))
             if f.exists()]
    if not files:
        return False
    if "." not in target.host and ":" not in target.host:
        return None  # probably an ssh config alias: its HostName is not ours to guess
    name = known_host_name(target.host, target.port or 22)
    for known in files:  # read as ssh reads them (markers and all); an unreadable one pins nothing
        with contextlib.suppress(OSError, UnicodeDecodeError, ValueError, GpuprovError):
            if known_hosts_file(known, strict=False).pinned.lookup(name) is not None:
                return True
    return False


def answers(target: Target, settings: HostSettings) -> bool:
    """Whether the host's SSH port accepts a TCP connection (through a ProxyJump: assumed yes)."""
    if target.proxy_jump:
        return True
    try:
        socket.create_connection((target.host, target.port or 22), timeout=settings.connect_timeout).close()
    except OSError:
        return False
    return True


def pin_hint(target: Target, known: Path) -> str:
    """What to tell a user whose host is not pinned yet."""
    spec = target.label if target.label and target.label != target.host else _spec(target)
    return (f"{target.name}: its host key is not pinned in {known}, so ssh refuses it. Check the key's fingerprint out "
            f"of band, then pin it once with: gpuprov exec --accept-new-host-key {spec} -- true")


def _spec(target: Target) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{target.user + '@' if target.user else ''}{host}{':' + str(target.port) if target.port else ''}"


@dataclass(frozen=True)
class SyncPlan:
    """Which side of a `sync` is remote."""

    upload: bool  # local -> remote
    local: str
    remote_path: str


_REMOTE_SIDE = re.compile(r"^((?:[A-Za-z0-9._-]+@)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)):")


def sync_host(src: str, dst: str) -> str:
    """rsync's shape: the host of whichever side is `HOST:PATH` (`NODE:PATH`, `USER@HOST:PATH`). A colon
    after a slash is part of a local path, as for rsync; `./a:b` is local."""
    hosts = [m.group(1) for m in (_REMOTE_SIDE.match(arg) for arg in (src, dst)) if m]
    if len(hosts) != 1:
        raise UserInputError("SRC DST", "exactly one of SRC and DST must be NODE:PATH (or [USER@]HOST:PATH)",
                             "e.g. gpuprov sync ./code exp1:/work/code, or back: gpuprov sync exp1:/work/out ./out")
    return hosts[0]


def split_sync(host: str, src: str, dst: str) -> SyncPlan:
    """`HOST:path` (or `:path`) marks the remote side; exactly one side must be remote."""

    def remote_part(arg: str) -> str | None:
        for prefix in (f"{host}:", ":"):
            if arg.startswith(prefix):
                return arg[len(prefix):] or "."
        return None

    r_src, r_dst = remote_part(src), remote_part(dst)
    if (r_src is None) == (r_dst is None):
        raise UserInputError(
            "SRC DST", "exactly one of SRC and DST must be on the host",
            f"mark the remote side as {host}:PATH (or :PATH), e.g. gpuprov sync {host} ./data {host}:data",
        )
    if r_dst is not None:
        return SyncPlan(upload=True, local=src, remote_path=r_dst)
    assert r_src is not None
    return SyncPlan(upload=False, local=dst, remote_path=r_src)


def as_copy(plan: SyncPlan, source_is_dir: bool) -> SyncPlan:
    """`sync`'s one rule for slashes: DST becomes a copy of SRC. A folder's contents land in DST whatever
    slashes either side has (rsync's `SRC/ DST/`, so `sync ./code node:code` makes ~/code, never
    ~/code/code); a file lands at DST, or inside DST when DST ends in `/`."""
    if not source_is_dir:
        return plan
    return SyncPlan(plan.upload, plan.local.rstrip("/") + "/", plan.remote_path.rstrip("/") + "/")


def remote_is_dir(target: Target, settings: HostSettings, path: str) -> bool:
    """Whether `path` on the host is a folder (relative paths: in the login's home, `~/` expanded there)."""
    from gpuprov.hosts.remote import Remote

    word = "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)
    remote = Remote(target, settings)
    try:
        remote.open()
        return remote.run(f"test -d {word}").ok
    finally:
        remote.close()


def rsync_argv(target: Target, settings: HostSettings, plan: SyncPlan, *, progress: bool = False,
               delete: bool = False, extra: Sequence[str] = ()) -> list[str]:
    """rsync -a over the same pinned ssh settings (`-e "ssh -o UserKnownHostsFile=… …"`)."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    remote = f"{host}:{plan.remote_path}"
    argv = ["rsync", "-a", "-e", shlex.join(["ssh", *ssh_options(target, settings)])]
    if progress:
        argv += ["--info=progress2", "--human-readable"]
    if delete:
        argv.append("--delete")
    argv += list(extra)
    parent = plan.remote_path.rstrip("/").rpartition("/")[0]
    if plan.upload and parent not in ("", ".", "~"):  # rsync makes DST's last folder only: its parents first
        word = "~/" + shlex.quote(parent[2:]) if parent.startswith("~/") else shlex.quote(parent)
        argv.append(f"--rsync-path=mkdir -p {word} && rsync")
    return [*argv, plan.local, remote] if plan.upload else [*argv, remote, plan.local]


@dataclass(frozen=True)
class S3Sync:
    """`gpuprov sync` with an s3:// side: the AWS CLI on the host copies between its path and S3."""

    host: str
    src: str
    dst: str

    def command(self, delete: bool) -> str:
        # `aws s3 sync` copies what is missing, of another size or newer (AWS CLI reference, s3 sync)
        words = ["aws", "s3", "sync", "--no-progress", *(["--delete"] if delete else []), self.src, self.dst]
        return " ".join(shlex.quote(w) for w in words)


def split_s3_sync(args: tuple[str, ...]) -> S3Sync:
    """SRC DST (or HOST SRC DST) with one side s3://: the other must be on a host, where the copy runs; between this
    machine and S3 (or two buckets) it is the AWS CLI's own job, here (UserInputError)."""
    s3 = [a for a in args if a.startswith("s3://")]
    paths = args[1:] if len(args) == 3 else args
    if len(s3) != 1 or len(paths) != 2:
        raise UserInputError("SRC DST", "both sides are in S3" if len(s3) > 1 else f"{len(args)} paths",
                             "S3 to S3 is the AWS CLI's job: aws s3 sync s3://A s3://B")
    other = next(p for p in paths if not p.startswith("s3://"))
    match = _REMOTE_SIDE.match(other)
    host = args[0] if len(args) == 3 and other.startswith(":") else match.group(1) if match else None
    if host is None or (len(args) == 3 and host != args[0]):
        aws = "aws s3 sync " + " ".join(shlex.quote(p) for p in paths)
        raise UserInputError("SRC DST", f"{other!r} is on this machine: between here and S3 copying is the AWS CLI's "
                             f"job (`{aws}`)", "gpuprov sync copies S3 to or from a node's path: NODE:PATH")
    path = other[len(host) + 1:] if other.startswith(f"{host}:") else other[1:]
    node_side = path or "."
    src, dst = (paths[0], node_side) if paths[0].startswith("s3://") else (node_side, paths[1])
    return S3Sync(host, src, dst)
