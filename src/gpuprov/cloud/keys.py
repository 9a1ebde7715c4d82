"""This user's SSH key for a cloud region: made once on this machine, 0600, and the lock that
serialises its import across threads and processes (concurrent `up`s would race to import it)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuprov.paths import region_key


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
