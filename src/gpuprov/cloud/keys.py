"""This user's SSH key for a cloud region: made once on this machine, 0600; its key pair in the cloud,
imported with the region's first node and deleted with its last; and the lock that serialises both
across threads and processes (gpuprov.state.locks: the region's lock)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuprov import paths
from gpuprov.cloud import destroy, tags
from gpuprov.cloud.providers.base import CloudResource, NotFound, Provider
from gpuprov.cloud.settle import settle
from gpuprov.errors import GpuprovError
from gpuprov.paths import region_key
from gpuprov.state import Store, locks

if TYPE_CHECKING:
    from gpuprov.say import Say

# how long a release waits for the region's lock: its holder imports or counts the key pair (a few calls), unless
# its process is stopped mid-call (a request held, a suspended shell); a `down` or `gc` must end all the same, and a
# key pair kept past its last node costs nothing (the next `down` or `gc` of the region deletes it)
RELEASE_PATIENCE = 20.0


@dataclass(frozen=True)
class LocalKey:
    private: Path
    public: str  # the OpenSSH public line


def key_name(owner: str) -> str:
    """The key pair's name in the cloud: one per user (owner) and region."""
    return "gpuprov-" + "".join(c if c.isalnum() or c in "-_." else "-" for c in owner)


def local_key(keys_dir: Path, region: str, owner: str) -> LocalKey:
    """The region's private key (created once, 0600) and its public line."""
    private = region_key(keys_dir, region)
    public = private.with_suffix(".pub")
    if not private.exists():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        private.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        public.write_text(line.decode() + f" gpuprov {owner}\n")
    private.chmod(0o600)
    return LocalKey(private, public.read_text().strip())


def ensure_key_pair(provider: Provider, store: Store, region: str) -> LocalKey:
    """This user's key pair in the region: imported once, recorded first, under the region's lock, which
    `release_key_if_unused` takes too, so a key pair is never deleted under an `up` that is about to use it."""
    me = tags.owner()
    with locks.hold(locks.region(region), "key pair"):
        key = local_key(paths.keys_dir(), region, me)
        name = key_name(me)
        rows = [r for r in store.resources(None, region=region, kind="key-pair") if r.client_token == name]
        # a key imported moments ago may not be visible yet: its fresh record is trusted
        if any(r.status == "created" and settle(r) > 0 for r in rows) or provider.key_pair_exists(region, name):
            if rows:
                return key
            destroy.key_pair(provider, region, name, replace=True)  # ours by name, from a lost local state: replaced
        for r in rows:
            store.deleted(r.id)
        rid = store.intend(None, "key-pair", region, name)
        store.created(rid, provider.import_key_pair(region, name, key.public))
        return key


def key_users(region: str, store: Store) -> list[str]:
    """The nodes that need the region's key pair, by name: every live record of the region but one being taken
    down and one whose `up` died (locks.abandoned: its record says it never got ready, and nobody holds its lock),
    and every node the store names but does not list (`store.moved()`: an object this gpuprov cannot read, a record
    `state push` moved to a bucket), whatever its region: it may be a live node of this one, and a key pair kept
    too long costs nothing where one deleted under a live node fails its next launch from the disk (a move)."""
    live = [n.name for n in store.nodes() if n.region == region and n.state != "terminating"
            and not locks.abandoned(n)]
    return live + sorted(set(store.moved()) - set(live))


def release_lock(region: str, purpose: str, subject: str, what: str, say: Say) -> contextlib.ExitStack | None:
    """The lock of `region` (a pseudo-region for what is global) for the release of something its nodes share,
    waited for a bounded time: a release that never came is harmless (the next `down` or `gc` makes it), a `down`
    that hangs behind a live `up` is not. None, said naming `what` and the holder, when the wait ran out."""
    held = contextlib.ExitStack()
    try:
        held.enter_context(locks.hold(locks.region(region), purpose, subject=subject,
                                      patience=locks.patience(RELEASE_PATIENCE)))
    except locks.Overdue as overdue:
        say(f"  left {what}: {overdue.holder} held the region's lock for all of {overdue.waited:g} s "
            "(the next `gpuprov down` or `gpuprov gc` deletes it once no node needs it)")
        return None
    return held


def release_key_if_unused(region: str, provider: Provider, store: Store, say: Say,
                          unrecorded: Sequence[str] = (), networks: Sequence[CloudResource] = ()) -> list[str]:
    """The shared key pair goes with the region's last node; counted and deleted under the region's lock, and
    gpuprov's own network of the region with it (cloud/own_network.py).
    `unrecorded`: key pairs of this owner that gc found by tag with no record (a lost state); they go too, and so
    do the `networks` parts gc found. Returns what was deleted."""
    gone: list[str] = []
    held = release_lock(region, "key pair", f"{region}'s key pair", f"the key pair of {region}", say)
    if held is None:
        return gone
    with held:
        if key_users(region, store):
            return gone
        for row in store.resources(None, region=region, kind="key-pair"):
            name = row.client_token or row.cloud_id or ""
            try:
                destroy.key_pair(provider, region, name, settle=settle(row))
            except NotFound:
                pass
            except GpuprovError as exc:
                say(f"  could not delete the key pair {name}: {exc} (`gpuprov gc` finds it)")
                continue
            store.deleted(row.id)
            gone.append(name)
        for name in unrecorded:
            if name in gone:
                continue
            try:
                destroy.key_pair(provider, region, name)
            except NotFound:
                continue
            gone.append(name)
        from gpuprov.cloud import own_network

        gone += own_network.release(region, provider, store, say, networks)
    return gone

