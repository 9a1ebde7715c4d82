"""Leases, not locks: who works on a node when the records are a team's (state in S3).

A flock is dropped by the kernel when its holder dies, but only on one machine. With team state the node's lock
(locks.py's `node-NAME`) is an object in the bucket, `leases/node-NAME.json` (holder, host, pid, what, since,
expiry), made with `If-None-Match: *` (one holder at a time: a lost race is S3's 412) and renewed by a thread
every third of its expiry while the operation runs. A holder that dies (kill -9, a lost laptop, a closed lid)
stops renewing; once the bucket's clock says the lease is older than its expiry (Last-Modified against the
answer's Date: no two members' clocks are compared), anyone may take it over, with `If-Match` on the stale one so
two takers cannot both win. `gpuprov state unlock NAME` breaks one explicitly, saying whose it was.

Terraform's S3 backend (1.10+) locks with the same conditional writes but never expires a lock: its classic pain
is a stale lock after Ctrl-C. Here a Ctrl-C releases at once (the context's exit), and a death expires.

Each renewal writes a new body (S3's ETag is the body's MD5). Release is DeleteObject with If-Match on the last
ETag this holder wrote: S3 itself refuses (412) to delete a lease a teammate took over after it expired, however
the two interleave; `state unlock` deletes with If-Match on the ETag it read, so the holder it names is the one it
broke. Re-entrant within a process, as a flock is.

Only a lease another holder really took is lost. S3 answers 409 ConditionalRequestConflict while another
conditional write to the key is in flight (a teammate's takeover attempt, or this holder's own write whose answer
was lost): nothing was decided, so a renewal sends it again, with backoff. A 412 may be this holder's own write
landing behind a lost answer (botocore sent it again, and the repeat's If-Match named the ETag the first one
replaced): the lease is read back and, when it still names this holder, pid and start, its ETag is adopted and
the renewals go on. The same read-back decides a creation (`If-None-Match`) or a takeover that got a 412: the
lease found may be the one just written.

A lost lease fences its holder: `check()` raises LeaseLost, naming the node and whoever holds it now, for any
lease this process holds that was lost, or that went unrenewed past its expiry (the bucket did not answer, the
laptop slept: a teammate may have taken it over meanwhile, and its next renewal would only then tell). Every cloud
call of a command goes through the provider's one call path (cloud/providers/aws_base.py, `AwsBase._call`), which
calls its `fence` first; the CLI gives the provider `locks.fence`, which calls `check()`. So a holder whose lease a
teammate broke or took over stops before its next cloud call and says so, instead of working on a node a
teammate's `down` or `gc` now owns.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gpuprov.errors import GpuprovError
from gpuprov.state.s3 import Bucket, Conflict
from gpuprov.state.url import StateUrl

_held: dict[str, tuple[Lease, int]] = {}  # lease key -> (lease, depth): re-entrant within a process, as flock is
_guard = threading.Lock()


def member() -> str:
    """Who this is, as leases, tags and the team's keys name a member: the install's owner id, `user@host/ID`
    (cloud/tags.py): two clones of one machine, or two CI runners, are two members."""
    from gpuprov.paths import install_id

    return f"{getpass.getuser()}@{socket.gethostname()}/{install_id()}"


@dataclass(frozen=True)
class Holding:
    """Whose a lease is, as the messages say it."""

    holder: str
    host: str
    pid: int | None
    what: str
    since: float | None
    expiry: float
    age: float | None  # seconds since its last renewal (the bucket's clock)

    @property
    def expired(self) -> bool:
        return self.age is not None and self.age > self.expiry

    def __str__(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since)) if self.since else "?"
        return f"gpuprov {self.what} of {self.holder} (pid {self.pid or '?'} on {self.host}, since {when})"


def _name(key: str) -> str:
    return f"leases/{key}.json"


def read(bucket: Bucket, key: str) -> tuple[Holding, str] | None:
    """Who holds `key` now, and the lease's ETag; None when nobody does."""
    got = bucket.read(_name(key))
    if got is None:
        return None
    d = got.doc
    return Holding(str(d.get("holder", "?")), str(d.get("host", "?")), d.get("pid"), str(d.get("what", "?")),
                   d.get("since"), float(d.get("expiry", 120)), got.age), got.etag


class Lease:
    """One held lease and the thread that renews it."""

    def __init__(self, bucket: Bucket, key: str, what: str, expiry: float) -> None:
        self.bucket = bucket
        self.key = key
        self.expiry = expiry
        self.doc: dict[str, Any] = {"holder": member(), "host": socket.gethostname(), "pid": os.getpid(),
                                    "what": what, "since": time.time(), "expiry": expiry}
        self.etag = ""
        # when the last write the bucket took (or the first, until one is) was sent: the wall clock, which counts a
        # suspended laptop's sleep as the bucket's clock does (a monotonic clock stops while the lid is closed)
        self.written_at = time.time()
        self.lost = False  # someone broke it (`state unlock`) or took it over while it was held
        self.taken_by: Holding | None = None  # ... and who holds it now, if anyone
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, over: str | None = None) -> None:
        """Write it: a new lease (If-None-Match), or over the stale one whose ETag is `over` (If-Match)."""
        self.written_at = time.time()
        self.adopt(self.bucket.put(_name(self.key), self.doc, etag=over, create=over is None))

    def adopt(self, etag: str) -> None:
        """It is ours as the bucket holds it (ETag `etag`): renew it from there."""
        self.etag = etag
        self._thread = threading.Thread(target=self._renew, name=f"lease-{self.key}", daemon=True)
        self._thread.start()

    def owns(self, holding: Holding) -> bool:
        """`holding` is this lease: the same holder, process and start (written by this holder, whatever its ETag)."""
        return (holding.holder, holding.pid, holding.since) == (self.doc["holder"], self.doc["pid"], self.doc["since"])

    def _renew(self) -> None:
        while not self._stop.wait(self.expiry / 3):
            self.doc["renewed"] = time.time()  # a new body: a new ETag per renewal (S3's ETag is the body's MD5)
            if not self._renew_once():
                return

    def _renew_once(self) -> bool:
        """One renewal; False when the lease is lost (someone else holds it, or nobody: broken by `state unlock`)."""
        deadline = time.monotonic() + self.expiry / 3
        sent = time.time()
        attempt = 0
        while True:
            try:
                self.etag = self.bucket.put(_name(self.key), self.doc, etag=self.etag)
                self.written_at = sent
                return True
            except Conflict as conflict:
                if not conflict.in_flight:
                    return self._read_back(sent)
                # 409: another conditional write to the lease is in flight; nothing was decided, so again (until the
                # next renewal's time: a lease is renewed three times per expiry, so one slow round is no loss)
                attempt += 1
                pause = random.uniform(0, min(1.0, 0.05 * 2 ** min(attempt, 5)))
                if time.monotonic() + pause > deadline or self._stop.wait(pause):
                    return True
            except Exception:  # a bucket that does not answer this once: the next renewal tries again
                return True  # (a thread's exception would end the renewals silently and let the lease expire mid-work)

    def _read_back(self, sent: float) -> bool:
        """After a 412 (or the lease gone): still ours when the bucket's lease names this holder, process and start
        (this holder's own write landed behind a lost answer): adopt its ETag. Anyone else's, or none, is lost."""
        try:
            found = read(self.bucket, self.key)
        except Exception:  # cannot tell now: the next renewal's write fails the same way and reads again
            return True
        if found is not None and self.owns(found[0]):
            self.etag, self.written_at = found[1], sent
            return True
        self.lost, self.taken_by = True, found[0] if found else None
        return False

    @property
    def unsure(self) -> bool:
        """Not renewed for longer than its expiry (a bucket that did not answer, a laptop asleep): the bucket may have
        let a teammate take it over, whatever this holder saw."""
        return time.time() - self.written_at > self.expiry

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        # only if still ours, decided by S3 in the delete itself (If-Match on the last ETag written): a lease someone
        # took over after it expired is theirs to end, even when they took it between any read of ours and the
        # delete (Conflict: left as it is). A bucket that does not answer now leaves it to expire (the command's
        # own result must not be lost to its clean-up)
        with contextlib.suppress(Exception):
            self.bucket.delete(_name(self.key), etag=self.etag)


class LeaseLost(GpuprovError):
    """A lease this process held was broken or taken over while it worked: it stops before its next cloud call."""

    def __init__(self, lease: Lease) -> None:
        self.key = lease.key
        self.taken_by = lease.taken_by
        subject = lease.key.split("-", 1)[1] if "-" in lease.key else lease.key
        if lease.lost:
            whose = f"{lease.taken_by} holds it now" if lease.taken_by else "it was broken (`gpuprov state unlock`)"
            what = f"lost its lease on it: {whose}"
        else:
            what = (f"could not renew its lease on it for {time.time() - lease.written_at:.0f} s, past its "
                    f"{lease.expiry:g} s: a teammate may hold it now")
        super().__init__(f"{subject}: this gpuprov {lease.doc['what']} {what}; stopped before its next cloud call\n"
                         "  fix: `gpuprov status` says what became of it; run the command again if it is still wanted")


def check() -> None:
    """Raise LeaseLost for a lease this process holds that someone broke or took over, or that went unrenewed past
    its expiry (it may have been); nothing when all are whole."""
    with _guard:
        lost = [lease for lease, _ in _held.values() if lease.lost or lease.unsure]
    if lost:
        raise LeaseLost(lost[0])


def holds(key: str) -> bool:
    """This process holds the lease `key` (whole or not: `check` says that); the destroy gate (cloud/destroy.py)
    asks before anything of a node goes."""
    with _guard:
        return key in _held


class Taken(Exception):
    """The lease is held by someone else and the caller would not wait, or (`waited`: its patience, in seconds)
    would not wait any longer."""

    def __init__(self, holding: Holding, waited: float | None = None) -> None:
        super().__init__(str(holding))
        self.holding = holding
        self.waited = waited


@contextlib.contextmanager
def hold(url: StateUrl, key: str, what: str, *, wait: bool = True, expiry: float,
         waiting: Callable[[Holding], None] | None = None, took_over: Callable[[Holding], None] | None = None,
         bucket: Bucket | None = None, patience: float | None = None) -> Iterator[Lease]:
    """Hold the lease `key` while `what` runs. Held by someone else: raise Taken when `wait` is False, else call
    `waiting(holding)` once and wait until it is released or expires (then take it over, calling `took_over`), or,
    with `patience`, at most that many seconds (then raise Taken, its `waited` set)."""
    with _guard:
        mine = _held.get(key)
        if mine is not None:
            _held[key] = (mine[0], mine[1] + 1)
    if mine is None:
        lease = Lease(bucket or Bucket(url), key, what, expiry)
        told = False
        deadline = None if patience is None else time.monotonic() + patience
        while True:
            try:
                lease.take()
                break
            except Conflict as conflict:
                if conflict.in_flight:  # another write to it in flight (a teammate's): decided in a moment
                    time.sleep(random.uniform(0.01, 0.1))
            found = read(lease.bucket, key)
            if found is None:
                continue  # released meanwhile
            holding, etag = found
            if lease.owns(holding):  # our own write landed behind a lost answer (its repeat got the 412)
                lease.adopt(etag)
                break
            if holding.expired:
                try:
                    lease.take(over=etag)
                except Conflict:
                    continue  # another taker won, or the holder renewed at the last moment
                if took_over is not None:
                    took_over(holding)
                break
            if not wait:
                raise Taken(holding)
            if deadline is not None and time.monotonic() >= deadline:
                raise Taken(holding, waited=patience)
            if not told and waiting is not None:
                waiting(holding)
            told = True
            pause = min(1.0, expiry / 4)
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
        with _guard:
            _held[key] = (lease, 1)
    else:
        lease = mine[0]
    try:
        yield lease
    finally:
        with _guard:
            held, depth = _held[key]
            if depth > 1:
                _held[key] = (held, depth - 1)
            else:
                del _held[key]
        if depth == 1:
            held.release()


def is_free(url: StateUrl, key: str) -> bool:
    """Nobody holds `key`, or its lease expired (this process counts as nobody)."""
    with _guard:
        if key in _held:
            return True
    found = read(Bucket(url), key)
    return found is None or found[0].expired


def unlock(url: StateUrl, key: str) -> Holding | None:
    """Break the lease `key` (whoever holds it); returns whose it was, None when there was none."""
    bucket = Bucket(url)
    while True:
        found = read(bucket, key)
        if found is None:
            return None
        try:  # the lease read, not one renewed or taken over since: whose it was is then said truly
            bucket.delete(_name(key), etag=found[1])
        except Conflict:
            continue
        return found[0]
