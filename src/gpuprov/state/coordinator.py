"""Who may work on what: the one interface of both kinds of lock gpuprov holds, and what a held one says.

Two kinds implement it (locks.py): this machine's file locks (flock), and, when the records are a team's (state
in S3), leases in the bucket for what the team shares. Which one a process uses is chosen once, with the store
(`open_store()`, `store.coordinator`; `locks.coordinator()` for a lock held before any store is opened).

A wait for a lock is unbounded by default: its holder is another gpuprov at work, and it ends. A caller that must
end whatever the holder does (a `down` releasing the region's key pair, a write of the ssh config file, whose holder
may be a process stopped mid-call: a request held, a suspended shell) gives `patience` in seconds; when it runs out
the wait raises `Overdue`, a `Busy` that names what was waited for, its holder and for how long.
GPUPROV_TEST_PATIENCE_SECONDS shortens every such patience (`patience()`), for the tests that hold a lock on purpose.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from gpuprov.errors import GpuprovError


@dataclass(frozen=True)
class Holder:
    pid: int | None
    what: str
    since: float | None
    by: str | None = None  # team state: the member and host whose lease it is

    def __str__(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since)) if self.since else "?"
        if self.by:
            return f"gpuprov {self.what} of {self.by} (pid {self.pid or '?'}, since {when})"
        return f"gpuprov {self.what} (pid {self.pid or '?'}, since {when})"


class Busy(GpuprovError):
    """The lock is held by another process, and the caller would not wait."""

    def __init__(self, subject: str, holder: Holder) -> None:
        self.subject = subject
        self.holder = holder
        super().__init__(f"{subject} is being worked on by {holder}")


class Overdue(Busy):
    """The lock was still held by another process when the caller's patience ran out."""

    def __init__(self, subject: str, holder: Holder, waited: float) -> None:
        super().__init__(subject, holder)
        self.waited = waited
        self.args = (f"{subject} is still being worked on by {holder} after {waited:g} s of waiting",)


def patience(seconds: float) -> float:
    """How long a bounded wait for a lock lasts: `seconds`, or GPUPROV_TEST_PATIENCE_SECONDS where it is set (the
    tests' holders are held on purpose, for as long as the test needs); a value that is not seconds is bad input
    naming it."""
    from gpuprov.settings import settings

    given = settings().test_patience_seconds
    return given.seconds() if given is not None else seconds


class Coordinator(Protocol):
    """One lock per key ("node-train", "region-us-east-1", "image-…", "host-…"), re-entrant within a process."""

    def hold(self, key: str, what: str, *, wait: bool = True, subject: str | None = None,
             waiting: Callable[[Holder], None] | None = None,
             patience: float | None = None) -> AbstractContextManager[None]:
        """Hold `key` while `what` ("up", "down") runs. Held by another process: raise Busy when `wait` is False,
        else call `waiting(holder)` once and wait: for as long as it takes when `patience` is None, else at most
        `patience` seconds, then raise Overdue."""
        ...

    def is_free(self, key: str) -> bool:
        """Nobody holds `key` right now (this process counts as nobody)."""
        ...

    def holder(self, key: str) -> Holder:
        """Who holds `key`, for the messages."""
        ...
