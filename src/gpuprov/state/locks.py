"""One operation per node at a time: an exclusive OS file lock (flock(2)) per node, region, image and host.

Every command that changes a node (up, down, start, stop, image bake, autostop, ttl, gc, refresh) holds
its node's lock for as long as it works on it. The kernel drops a lock when its process dies however it
dies (SIGKILL too), so a free lock means nobody is working on the node: no pid is guessed. gc and
`status --refresh` try the lock without waiting and leave a node whose lock is held alone; the others
wait for it, saying who holds it. A region's lock guards what the region's nodes share (the key pair:
its users are counted, and it is imported or deleted, under it); an image's guards its bake; a host's
guards one bootstrap of it from this machine at a time.

Locks are re-entrant within a process (a `down` inside an `up`'s take-back holds the node once more);
the lock file names the holder (pid, command, since) for the messages.

The locks (files in STATE/locks/):
  node-NAME      `up` and `up --nodes` (from before the record exists until ready or taken back), `down`, `start`,
                 `stop`, `image bake`, `autostop`, `ttl`, for the whole operation. `up` of a held name refuses;
                 `down`, `start`, `stop`, `autostop`, `ttl` wait, saying for whom; `gc` and `status --refresh`
                 leave the node alone and name the holder.
  region-REGION  keys.ensure_key_pair (import) and keys.release_key_if_unused (count users, delete); others wait.
  image-NAME     `image bake`: its record, CreateImage, the wait; `gc` leaves the image and its intent row alone.
  host-HOST:PORT one bootstrap of a host from this install (each host's thread); refused unless `--takeover`.
Across machines the host's own runner refuses a run of another install (hosts/runner.py, `busy_check`).

`abandoned`: a node whose `up` ended before `ready` (`Node.up_unfinished`) and whose lock is free; only such a
node is an orphan (cloud/gc.py), and the region's key pair's users are the region's live records that are not
abandoned.

With team state the node's and the image's locks are leases (leases.py) behind the same calls (`hold`, `is_free`,
`holder`, `claim`), so commands did not change. An image's must be: a bake's intent row lives in the shared
records, and a teammate's `gc` judges an intent row whose lock is free an interrupted bake. The region's lock stays
a flock, safely: it guards this member's own key pair (named by the install's owner id), which only this
machine's processes import or delete; counting its users over the team's records counts every member's nodes, so
it is kept longer than needed, never deleted under a node. The host's lock stays a flock too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from gpuprov.state.coordinator import Busy, Coordinator, Holder, Overdue, patience

if TYPE_CHECKING:
    from gpuprov.settings import Settings
    from gpuprov.state.leases import Holding
    from gpuprov.state.records import Node
    from gpuprov.state.url import StateUrl

__all__ = ["Busy", "Coordinator", "FileLocks", "Holder", "Overdue", "TeamLeases", "abandoned", "claim", "coordinator",
           "exclusive", "fence", "held", "hold", "holder", "image", "is_free", "node", "nodes", "patience", "region"]


_held: dict[str, tuple[int, int]] = {}  # lock path -> (fd, depth), this process's locks
# with team state these are leases in the bucket: what they guard is the team's (a node's record and resources;
# an image being baked, whose intent row every member's gc reads). A region's lock stays flock: it guards this
# member's own key pair (named by the owner id, so only this install's processes, on this machine, touch it); a
# host's too: the host's runner refuses another install's run by itself (hosts/runner.py)
_LEASED = ("node-", "image-")
_guard = threading.Lock()


def folder(made: bool = True) -> Path:
    """The locks' folder, made (with the state folder) unless `made=False`: where it is, for a look (`is_free`)."""
    from gpuprov.paths import state_dir, state_folder

    if not made:
        return state_folder() / "locks"
    path = state_dir() / "locks"
    path.mkdir(exist_ok=True, mode=0o700)
    return path


def _file(key: str, made: bool = True) -> Path:
    safe = key if re.fullmatch(r"[a-z0-9][a-z0-9.-]{0,80}", key) else \
        re.sub(r"[^a-z0-9-]", "-", key.lower())[:40] + "-" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return folder(made) / f"{safe}.lock"


def _open(path: Path) -> int:
    """The lock file, made if missing; a state folder that cannot take it is said as the state's problem."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        from gpuprov.state.errors import StateUnavailable

        reason = {errno.EROFS: "read-only", errno.EACCES: "read-only", errno.EPERM: "read-only",
                  errno.ENOSPC: "full", errno.EDQUOT: "full"}.get(exc.errno or 0, "io")
        raise StateUnavailable(path, reason, f"cannot open the lock file: {exc.strerror}") from None


def holder_of(path: Path) -> Holder:
    try:
        pid, since, what = path.read_text().split(" ", 2)
        return Holder(int(pid), what.strip(), float(since))
    except (OSError, ValueError):
        return Holder(None, "?", None)


class FileLocks:
    """This machine's locks: a file per key in the state folder, flock(2)ed by the process at work."""

    @contextlib.contextmanager
    def hold(self, key: str, what: str, *, wait: bool = True, subject: str | None = None,
             waiting: Callable[[Holder], None] | None = None, patience: float | None = None) -> Iterator[None]:
        path = _file(key)
        with _guard:
            mine = _held.get(str(path))
            if mine is not None:
                _held[str(path)] = (mine[0], mine[1] + 1)
        if mine is None:
            fd = _take(path, what, wait=wait, subject=subject or key, waiting=waiting, patience=patience)
            with _guard:
                _held[str(path)] = (fd, 1)
        try:
            yield
        finally:
            with _guard:
                fd, depth = _held[str(path)]
                if depth > 1:
                    _held[str(path)] = (fd, depth - 1)
                else:
                    del _held[str(path)]
                    _let_go(fd)

    def is_free(self, key: str) -> bool:
        path = _file(key, made=False)
        with _guard:
            if str(path) in _held or not path.exists():  # a lock never made is nobody's (a look makes none)
                return True
        fd = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        return True

    def holder(self, key: str) -> Holder:
        return holder_of(_file(key))


def _take(path: Path, what: str, *, wait: bool, subject: str, waiting: Callable[[Holder], None] | None,
          patience: float | None) -> int:
    """The flock of `path`, taken by a descriptor of its own, the holder's words written in it. Held by another:
    Busy when not `wait`; else `waiting(holder)` once, then the wait: unbounded, or `patience` seconds (looking
    again every moment, as flock(2) has no timeout) and then Overdue."""
    fd = _open(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise Busy(subject, holder_of(path)) from None
            if waiting is not None:
                waiting(holder_of(path))
            if patience is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                _wait_bounded(fd, path, subject, patience)
        with contextlib.suppress(OSError):  # who holds it is for the messages only: a full disk may refuse it
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {time.time():.3f} {what}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _wait_bounded(fd: int, path: Path, subject: str, patience: float) -> None:
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Overdue(subject, holder_of(path), patience) from None
            time.sleep(min(0.2, left))


def _let_go(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    os.close(fd)  # closing the last descriptor releases the flock


@contextlib.contextmanager
def exclusive(path: Path, what: str, *, subject: str, patience: float | None = None) -> Iterator[None]:
    """A lock file outside the locks folder (the ssh config file's), one holder at a time across threads too: each
    call takes it by its own descriptor, so it is not re-entrant. The wait as `hold`'s, the holder named the same
    way."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = _take(path, what, wait=True, subject=subject, waiting=None, patience=patience)
    try:
        yield
    finally:
        _let_go(fd)


class TeamLeases:
    """A team's (records in S3): a node's or an image's lock is a lease in the bucket (leases.py), so a teammate's
    command waits too; a region's and a host's stay this machine's file locks."""

    def __init__(self, url: StateUrl) -> None:
        self.url = url

    def hold(self, key: str, what: str, *, wait: bool = True, subject: str | None = None,
             waiting: Callable[[Holder], None] | None = None,
             patience: float | None = None) -> AbstractContextManager[None]:
        if not key.startswith(_LEASED):
            return FILE_LOCKS.hold(key, what, wait=wait, subject=subject, waiting=waiting, patience=patience)
        return self._leased(key, what, wait=wait, subject=subject, waiting=waiting, patience=patience)

    @contextlib.contextmanager
    def _leased(self, key: str, what: str, *, wait: bool, subject: str | None,
                waiting: Callable[[Holder], None] | None, patience: float | None) -> Iterator[None]:
        from gpuprov.state import leases
        from gpuprov.state.url import lease_seconds

        try:
            with leases.hold(self.url, key, what, wait=wait, expiry=lease_seconds(), patience=patience,
                             waiting=(lambda h: waiting(_holder(h))) if waiting is not None else None):
                yield
        except leases.Taken as taken:
            if taken.waited is not None:
                raise Overdue(subject or key, _holder(taken.holding), taken.waited) from None
            raise Busy(subject or key, _holder(taken.holding)) from None

    def is_free(self, key: str) -> bool:
        if not key.startswith(_LEASED):
            return FILE_LOCKS.is_free(key)
        from gpuprov.state import leases

        return leases.is_free(self.url, key)

    def holder(self, key: str) -> Holder:
        if not key.startswith(_LEASED):
            return FILE_LOCKS.holder(key)
        from gpuprov.state import leases
        from gpuprov.state.s3 import Bucket

        found = leases.read(Bucket(self.url), key)
        return _holder(found[0]) if found else Holder(None, "?", None)


def _holder(holding: Holding) -> Holder:
    return Holder(holding.pid, holding.what, holding.since, by=f"{holding.holder} on {holding.host}")


FILE_LOCKS = FileLocks()
_chosen: tuple[Settings, Coordinator] | None = None  # the settings it was chosen by, and the choice


def coordinator() -> Coordinator:
    """This process's coordinator, chosen once from where its records live: a team's leases with state in S3,
    else this machine's file locks. `open_store()` gives its store this one; `hold`, `is_free`, `holder`, `claim`
    and `nodes` below ask it (not where the records live, at every lock)."""
    global _chosen
    from gpuprov.settings import settings
    from gpuprov.state.url import configured

    current = settings()
    chosen = _chosen
    if chosen is None or chosen[0] is not current:
        url = configured()
        chosen = current, (TeamLeases(url) if url is not None else FILE_LOCKS)
        _chosen = chosen
    return chosen[1]


def _for(key: str) -> Coordinator:
    """A region's or a host's lock is this machine's whatever the state: only a node's or an image's asks where the
    records live (a command that holds neither is not refused for a bad `state`)."""
    return coordinator() if key.startswith(_LEASED) else FILE_LOCKS


def hold(key: str, what: str, *, wait: bool = True, subject: str | None = None,
         waiting: Callable[[Holder], None] | None = None, patience: float | None = None) -> AbstractContextManager[None]:
    """Hold the lock `key` ("node-train", "region-us-east-1") while `what` ("up", "down") runs. Held by
    another process: raise Busy when `wait` is False, else call `waiting(holder)` once and wait (at most `patience`
    seconds when given, then raise Overdue). With team state (records in S3) a node's or an image's lock is a lease in
    the bucket (leases.py), so a teammate's command waits too."""
    return _for(key).hold(key, what, wait=wait, subject=subject, waiting=waiting, patience=patience)


def holder(key: str) -> Holder:
    """Who holds `key` (for the messages): the lock file's words, or the lease's with team state."""
    return _for(key).holder(key)


def is_free(key: str) -> bool:
    """Nobody holds `key` right now (this process counts as nobody: its own locks are re-entrant)."""
    return _for(key).is_free(key)


def held(key: str) -> bool:
    """This process holds `key` now: its flock, or with team state a node's or an image's lease (whether that lease
    is still whole is `fence`'s to say). The destroy gate (cloud/destroy.py) asks it: a destroy without it is a path
    that forgot to lock."""
    coordinator = _for(key)
    if isinstance(coordinator, TeamLeases):
        from gpuprov.state import leases

        return leases.holds(key)
    with _guard:
        return str(_file(key)) in _held


def fence() -> None:
    """Stop here if a lease this process holds was lost (leases.py, `check`: LeaseLost names the node and who took
    it); the provider calls it before every cloud call. A flock cannot be lost: with local state no lease is held
    and this passes."""
    from gpuprov.state import leases

    leases.check()


def abandoned(record: Node) -> bool:
    """An `up` that died before `ready`: its record says it never got there and nobody holds its lock. Only
    such a node is an orphan (`gc` takes it down by its records; it uses no shared key pair)."""
    return record.up_unfinished and is_free(node(record.name))


def node(name: str) -> str:
    return f"node-{name}"


def region(name: str) -> str:
    return f"region-{name}"


def image(name: str) -> str:
    return f"image-{name}"


def host(label: str) -> str:
    return f"host-{label}"


@contextlib.contextmanager
def nodes(names: list[str] | tuple[str, ...], what: str, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Every named node's lock, waiting for each (in name order, so two commands never wait on each other),
    saying once per node whom it waits for."""
    with contextlib.ExitStack() as held:
        for name in sorted(set(names)):
            def waiting(holder: Holder, name: str = name) -> None:
                if say is not None:
                    say(f"{name}: waiting for {holder} to finish with it (Ctrl-C to stop waiting)")
            held.enter_context(hold(node(name), what, subject=name, waiting=waiting))
        yield


@contextlib.contextmanager
def claim(name: str, what: str) -> Iterator[None]:
    """This process works on the node alone; another gpuprov at work on it refuses the command (an `up` of a
    name that is taken), naming the holder."""
    held = contextlib.ExitStack()
    try:
        held.enter_context(hold(node(name), what, wait=False, subject=name))
    except Busy as busy:
        from gpuprov.errors import UserInputError

        if busy.holder.by:  # team state: a teammate's `up` (or any operation) holds the name's lease
            raise UserInputError("NAME", f"the name {name!r} is taken by {busy.holder}",
                                 "pick another name, or wait for it to finish") from None
        raise UserInputError("NAME", str(busy), "wait for it to finish, or stop it: Ctrl-C where it runs, or "
                             f"`kill {busy.holder.pid}` (it takes back what it made)") from None
    with held:
        yield
