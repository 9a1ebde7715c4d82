"""Who may work on what: the one interface of both kinds of lock gpuprov holds, and what a held one says.

Two kinds implement it (locks.py): this machine's file locks (flock), and, when the records are a team's (state
in S3), leases in the bucket for what the team shares. Which one a process uses is chosen once, with the store
(`open_store()`, `store.coordinator`; `locks.coordinator()` for a lock held before any store is opened).
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


class Coordinator(Protocol):
    """One lock per key ("node-train", "region-us-east-1", "image-…", "host-…"), re-entrant within a process."""

    def hold(self, key: str, what: str, *, wait: bool = True, subject: str | None = None,
             waiting: Callable[[Holder], None] | None = None) -> AbstractContextManager[None]:
        """Hold `key` while `what` ("up", "down") runs. Held by another process: raise Busy when `wait` is False,
        else call `waiting(holder)` once and wait."""
        ...

    def is_free(self, key: str) -> bool:
        """Nobody holds `key` right now (this process counts as nobody)."""
        ...

    def holder(self, key: str) -> Holder:
        """Who holds `key`, for the messages."""
        ...
