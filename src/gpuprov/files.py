"""Files gpuprov writes, written whole or not at all, and locks that serialise their writers.

A file rewritten in place is cut short when the disk fills or the process dies mid-write, and two
processes that read, change and write it at once lose each other's change. So every file gpuprov
owns is written to a temporary file in the same folder and renamed over the old one (rename is
atomic within a file system: a reader sees the old file or the new, never half of one), and a
read-modify-write of a shared file holds an exclusive flock(2) on a lock file beside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, mode: int | None = 0o600, *, follow: bool = True) -> None:
    """Replace `path` with `data` in one rename. `mode` None keeps an existing file's mode (the user's own
    ~/.ssh/config), else 0600 for a new one; a symlink at `path` is followed to the file it names, so a
    linked ~/.ssh/config stays a link, unless `follow` is False: then the link itself is replaced (a folder
    someone else could plant links in, as `render -o` writes)."""
    target = path.resolve() if follow and path.is_symlink() else path
    if mode is None:
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o600
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (created if missing) for the block: writers of one shared file, one
    at a time, across threads (each call opens its own file description) and processes."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def lock_beside(path: Path) -> Path:
    """The lock file of `path`'s writers, a hidden file beside it (`.known_hosts.lock`)."""
    return path.with_name(f".{path.name}.lock")
