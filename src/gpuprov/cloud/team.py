"""A team's bucket beyond the node records: what `gpuprov state` shows, `state push` (the local records into the
bucket), the members' public keys (`team join`) and the nodes' pinned host keys, kept where every member reads
them so each verifies the same key. No private key is ever written here: only `*.pub` lines and known_hosts.

`state push`: each live local node is written whole with If-None-Match (a name the bucket has is refused and stays
local), read back and compared, with its resource rows (new ids) and events; only then does the local row get
`moved_to`. The local store then leaves moved rows out of `nodes()`/`find_node` and refuses their name in
`node()`/`create_node`, saying where it went, so exactly one store owns each node (`Store.moved()` names them). The
CLI first copies the file with SQLite's online backup (`state.sqlite.before-push-TIME`).

A member is the install's owner id (`user@host/ID`, cloud/tags.py); `team join` uploads `*.pub` lines only.
Resources get `gpuprov:team` and `gpuprov:member` (tags.team_tags); the provider lists by the team tag, and `gc`
treats every listed resource as the team's (no "other installs" apart). A node's member is its record's owner:
`down --all` and `gc --stopped-for` take only this member's unless given `--team` (`by_member`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpuprov.errors import UserInputError
from gpuprov.state import locks
from gpuprov.state.leases import member
from gpuprov.state.s3 import Bucket, S3Store
from gpuprov.state.store import Store
from gpuprov.state.url import StateUrl

if TYPE_CHECKING:
    from gpuprov.state.records import Node

_PUBLIC = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh.com) [A-Za-z0-9+/=]+"
                     r"( [^\n]*)?")


@dataclass(frozen=True)
class Info:
    url: StateUrl
    versioning: str  # "Enabled", "Suspended", "" (never enabled)
    members: list[str]
    nodes: int

    @property
    def warning(self) -> str | None:
        if self.versioning == "Enabled":
            return None
        return (f"the bucket {self.url.bucket} has versioning {'suspended' if self.versioning else 'off'}: an "
                f"overwritten or deleted record cannot be recovered (aws s3api put-bucket-versioning --bucket "
                f"{self.url.bucket} --versioning-configuration Status=Enabled)")


def info(url: StateUrl) -> Info:
    bucket = Bucket(url)
    members = sorted(n.removeprefix("members/").removesuffix(".pub") for n in bucket.names("members/"))
    nodes = len([n for n in bucket.names("nodes/") if n.endswith(".json")])
    return Info(url, bucket.versioning(), members, nodes)


@dataclass
class Pushed:
    copied: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # a node of that name is already in the bucket
    unverified: list[str] = field(default_factory=list)  # written, but not read back the same: kept local too
    busy: list[str] = field(default_factory=list)  # "NAME: gpuprov up (pid …) is working on it": left local
    clusters: list[str] = field(default_factory=list)


def push(local: Store, target: S3Store) -> Pushed:
    """Move every live local node (its rows and events) into the bucket, and copy the unowned rows and the recorded
    clusters; a node the bucket already has is refused and left as it is, in both places.

    Each node is moved under the local file's lock (this machine's flock, even with team state configured, as
    the README's order has it: set `state`, then push), so a local command at work on it leaves it local.

    A moved node is one store's: once its object reads back as written, the local record is marked `moved_to`, so
    local commands no longer see it (a local `down` racing the team's is then impossible), while a local `gc`
    still counts its resources as owned. The unowned rows (images) and clusters stay in the local file too: both
    stores knowing an image or a host list races nothing."""
    out = Pushed()
    for listed in local.nodes():
        try:  # a command at work on it would go on writing the local record after the copy. The local file's own
            # lock whatever state is configured: a local command holds that one, and with team state configured
            # `locks.hold` is a lease in the bucket, which no command on the local file ever holds
            with locks.FILE_LOCKS.hold(locks.node(listed.name), "state push", wait=False, subject=listed.name):
                _move(listed.name, local, target, out)
        except locks.Busy as busy:
            out.busy.append(str(busy))
    for row in local.resources(None, live_only=True):
        if row.node is None and row.cloud_id is not None:  # images: they outlive nodes
            target.add_resource(None, row.kind, row.region, row.cloud_id, row.client_token)  # type: ignore[arg-type]
    for name in local.cluster_names():
        spec = local.cluster_json(name)
        if spec is not None and target.cluster_json(name) is None:
            target.save_cluster(name, spec)
            out.clusters.append(name)
    return out


def _move(name: str, local: Store, target: S3Store, out: Pushed) -> None:
    node = local.find_node(name)  # read again under its lock
    if node is None or not node.live:
        return
    rows = local.resources(name, live_only=False)
    if not target.put_whole(node, rows, local.events(name)):
        out.refused.append(name)
        return
    back = target.find_node(name)
    if back is None or asdict(back) != asdict(node) or len(target.resources(name, live_only=False)) != len(rows):
        out.unverified.append(name)
        return
    local.update_node(name, moved_to=str(target.url))
    out.copied.append(name)
    from gpuprov.hosts import sshconfig

    # its pinned host key too, or a teammate's SSH to it refuses an unknown key (`team sync` adds their keys)
    share_host_keys(target.url, name, sshconfig.node_known_hosts(name))


# --- whose nodes -----------------------------------------------------------------------------------


def by_member(nodes: Iterable[Node]) -> tuple[list[Node], list[Node]]:
    """This member's nodes (the record's owner is this install's member id) and everyone else's: with team state,
    `down --all` and `gc --stopped-for` take only the first unless given `--team`, so a CI job's clean-up never
    takes a teammate's node. A record with no owner is nobody's here, so it is left with the others."""
    me = member()
    mine: list[Node] = []
    others: list[Node] = []
    for node in nodes:
        (mine if node.owner == me else others).append(node)
    return mine, others


def member_name(node: Node) -> str:
    """Who of the team launched the node, as the messages say it (`user@host`, the owner id less its install id)."""
    return node.owner.split("/")[0] if node.owner else "an unknown member"


# --- members' keys -------------------------------------------------------------------------------


def public_keys(paths: list[Path]) -> list[str]:
    """The public key lines of `paths` (each must be one: a private key given by mistake is refused unread)."""
    lines: list[str] = []
    for path in paths:
        if not path.name.endswith(".pub"):
            raise UserInputError("--key", f"{path} is not a public key file (*.pub)",
                                 "only public keys go to the bucket, e.g. ~/.ssh/id_ed25519.pub")
        try:
            text = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserInputError("--key", f"cannot read {path}: {exc}") from None
        for line in text.splitlines():
            if not _PUBLIC.fullmatch(line.strip()):
                raise UserInputError("--key", f"{path}: not an OpenSSH public key line",
                                     "e.g. ssh-ed25519 AAAA... you@laptop")
            lines.append(line.strip())
    return lines


def join(url: StateUrl, keys: list[str]) -> str:
    """Put this member's public keys under the team prefix (replacing their earlier ones); returns the member."""
    who = member()
    Bucket(url).put(f"members/{who}.pub", "\n".join(dict.fromkeys(keys)) + "\n")
    return who


def member_keys(url: StateUrl) -> dict[str, list[str]]:
    """Every member's public key lines, by member."""
    bucket = Bucket(url)
    out: dict[str, list[str]] = {}
    for name in bucket.names("members/"):
        got = bucket.read_text(name)
        if got is not None:
            out[name.removeprefix("members/").removesuffix(".pub")] = [
                line for line in got.splitlines() if _PUBLIC.fullmatch(line.strip())]
    return out


# --- pinned host keys ----------------------------------------------------------------------------


def share_host_keys(url: StateUrl, node: str, known_hosts: Path) -> None:
    """The node's pinned host keys, for every member (written by whoever pinned them at launch)."""
    if known_hosts.exists():
        Bucket(url).put(f"known_hosts/{node}", known_hosts.read_text())


def shared_host_keys(url: StateUrl, node: str) -> str | None:
    return Bucket(url).read_text(f"known_hosts/{node}")
