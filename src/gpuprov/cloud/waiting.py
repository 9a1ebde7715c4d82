"""`up --wait DURATION`: the whole failover pass again, with backoff, until capacity appears.

A pass is one `up` (one node or a cluster): every candidate in order, under the same price cap and budget. A
pass that finds no capacity anywhere has already taken back everything it made (`launch.take_back`: the
security group, the key pair if no other node uses it, the instance row), so nothing is left, and nothing is
billed, between passes. The node's lock is held for the whole wait (gc leaves it alone, a second `up` of the
name is refused) and its record says `waiting`, with the next pass's time, for `status`. Only a pass refused
for capacity (`launch.NoCapacity`) is repeated: a quota, a permission, bad input stop the wait at once.

Backoff: 30 s, doubling, at most 5 minutes, each delay jittered (x 0.5 to 1.0, "full jitter" kept from going to
zero) so many waiting `up`s do not ask in step. GPUPROV_TEST_WAIT_BACKOFF_SECONDS sets the first delay (the cap stays
ten times it): the suite's passes come in a fraction of a second. A signal (Ctrl-C, SIGTERM: errors.Interrupted)
during the wait ends it with the record closed; during a pass, the pass's own take-back runs first.

The `waiting` record is in `UP_STATES`, so gc collects an abandoned one; it is closed before the next pass records
the node again. A later pass's progress lines are kept back until one of its asks is granted; one line per refused
pass.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from gpuprov.cloud.launch import NoCapacity
from gpuprov.errors import GpuprovError, Interrupted
from gpuprov.settings import settings
from gpuprov.state import NodeState, NodeUpdate, Store, locks

if TYPE_CHECKING:
    from gpuprov.say import Say

T = TypeVar("T")
FIRST_SECONDS = 30.0
CAP_FACTOR = 10.0  # 30 s growing to 5 min


@dataclass(frozen=True)
class Wait:
    seconds: float  # how long to keep asking, from the first pass
    first: float = FIRST_SECONDS

    @property
    def cap(self) -> float:
        return self.first * CAP_FACTOR


def first_delay() -> float:
    """GPUPROV_TEST_WAIT_BACKOFF_SECONDS (seconds > 0, finite: the tests' fake capacity returns in moments), else
    30 s; anything else is bad input naming it."""
    given = settings().test_wait_backoff_seconds
    return given.seconds(positive=True) if given is not None else FIRST_SECONDS


def delays(wait: Wait, rng: Callable[[], float] = random.random) -> Iterator[float]:
    """The pauses between passes: first, 2 x first, … up to the cap, each times a jitter in [0.5, 1.0)."""
    base = wait.first
    while True:
        yield base * (0.5 + rng() / 2)
        base = min(base * 2, wait.cap)


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _span(seconds: float) -> str:
    if seconds < 10:
        return f"{max(0.0, seconds):.1f}s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, rest = divmod(seconds, 60)
    return f"{minutes}m{rest:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def until_capacity(attempt: Callable[[Say], T], name: str, store: Store, say: Say, wait: Wait, *,
                   sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
                   rng: Callable[[], float] = random.random) -> T:
    """Run `attempt` (one whole `up` pass) until it succeeds, raises anything but NoCapacity, or `wait` is over.
    The first pass speaks as a plain `up` does; later ones keep their lines unless the pass ends otherwise
    than refused, and each refused pass prints one line: what was refused and when the next pass is."""
    with locks.claim(name, "up --wait"):
        deadline = clock() + wait.seconds
        pauses = delays(wait, rng)
        passes = 0
        while True:
            passes += 1
            told = _Pass(say, live=passes == 1)
            try:
                got = attempt(told)
            except NoCapacity as refused:
                last = refused
            except BaseException:
                told.flush()  # the pass's own account of what failed, or what its take-back left
                raise
            else:
                told.flush()
                return got
            kept = told.kept
            left = [line for line in kept if "still there" in line]
            node = store.find_node(name)
            if left or (node is not None and node.live):  # the take-back could not remove everything: stop here
                for line in kept:
                    say(line)
                raise last
            pause = next(pauses)
            now = clock()
            if now + pause > deadline:
                raise NoCapacity(f"no capacity after waiting {_span(now - deadline + wait.seconds)} "
                                 f"({passes} pass{'es' if passes > 1 else ''}); the last: {last}", last.attempts)
            nxt = now + pause
            reason = f"no capacity in pass {passes}; next pass at {_clock(nxt)}, until {_clock(deadline)}"
            store.update_node(name, state=NodeState.WAITING, state_reason=reason, pid=os.getpid(), ended_at=None)
            store.event(name, "waiting", f"pass {passes}: {last.summary}")
            say(f"pass {passes}: {last.summary}; next pass in {_span(pause)} at {_clock(nxt)}, until {_clock(deadline)}")
            try:
                sleep(pause)
            except KeyboardInterrupt as stopped:
                _close(store, name, "stopped waiting for capacity")
                if isinstance(stopped, Interrupted):
                    stopped.note = f"stopped waiting for capacity: nothing of {name} is left"
                raise
            _close(store, name, None)  # the next pass records the node afresh under the same name


class _Pass:
    """A pass's progress lines: the first pass's go out as they come; a later pass's are kept while it asks and is
    refused, and go out (all of them) once an ask was granted (the line after an `asking for` is not a refusal's
    indented code), when the pass ends otherwise than refused, or never, when it is refused everywhere."""

    def __init__(self, say: Say, live: bool) -> None:
        self.say, self.live = say, live
        self.kept: list[str] = []
        self._asked = False

    def __call__(self, line: str) -> None:
        if self.live:
            self.say(line)
            return
        self.kept.append(line)
        if self._asked and not line.startswith("  "):
            self.flush()
        self._asked = line.startswith("asking for ")

    def flush(self) -> None:
        for line in self.kept:
            self.say(line)
        self.kept, self.live = [], True


def _close(store: Store, name: str, reason: str | None) -> None:
    """The waiting record, ended: it owns nothing (the refused pass took everything back)."""
    # a state file that cannot be written: the record says `waiting`, and gc closes it (nothing to remove)
    ended: NodeUpdate = {"state": NodeState.TERMINATED, "ended_at": time.time()}
    if reason:
        ended["state_reason"] = reason
    with contextlib.suppress(GpuprovError):
        store.update_node(name, **ended)
