"""This user's SSH key for a cloud region: made once on this machine, 0600; its key pair in the cloud,
imported with the region's first node and deleted with its last; and the lock that serialises both
across threads and processes (concurrent `up`s would race to import it)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuprov import paths
from gpuprov.cloud import tags
from gpuprov.cloud.providers.base import SHARED, CloudResource, NotFound, Provider
from gpuprov.cloud.settle import settle
from gpuprov.errors import GpuprovError
from gpuprov.paths import region_key
from gpuprov.state import Store

Say = Callable[[str], None]


@dataclass(frozen=True)
class LocalKey:
    private: Path
    public: str  # the OpenSSH public line


def key_name(owner: str) -> str:
    """The key pair's name in the cloud: one per user (owner) and region."""
    return "gpuprov-" + "".join(c if c.isalnum() or c in "-_." else "-" for c in owner)


@contextmanager
def region_lock(keys_dir: Path, region: str) -> Iterator[None]:
    folder = keys_dir / region
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


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
    """This user's key pair in the region: imported once (serialised across processes), recorded first."""
    me = tags.owner()
    with region_lock(paths.keys_dir(), region):
        key = local_key(paths.keys_dir(), region, me)
        name = key_name(me)
        rows = store.resources(None, region=region, kind="key-pair")
        # a key imported moments ago may not be visible yet: its fresh record is trusted
        if any(r.status == "created" and settle(r) > 0 for r in rows) or provider.key_pair_exists(region, name):
            if rows:
                return key
            provider.delete_key_pair(region, name)  # ours by name, from a lost local state: replace it with ours
        for r in rows:
            store.deleted(r.id)
        rid = store.intend(None, "key-pair", region, name)
        store.created(rid, provider.import_key_pair(region, name, key.public))
        return key


def release_key_if_unused(region: str, provider: Provider, store: Store, say: Say) -> None:
    """The shared key pair goes with the region's last node (a crashed `up` does not count as a user)."""
    if [n for n in store.nodes() if n.region == region and n.state != "terminating" and not n.crashed]:
        return
    for row in store.resources(None, region=region, kind="key-pair"):
        try:
            provider.delete(CloudResource("key-pair", row.client_token or row.cloud_id or "", region, SHARED),
                            settle=settle(row))
        except NotFound:
            pass
        except GpuprovError as exc:
            say(f"  could not delete the key pair {row.client_token}: {exc} (`gpuprov gc` finds it)")
            continue
        store.deleted(row.id)
