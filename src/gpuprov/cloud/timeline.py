"""Where an `up` (or `start`) spent its time: phases in order, the launch attempts inside the capacity
search (AWS's code for each refusal), and each bootstrap step with its outcome.

`Recorder` is fed by cloud/node.py, cluster_up.py and stopstart.py as they go (one call where a phase begins); `Timeline` is what
it produces: printed at the end of the command, put in its `--json`, and stored as the node's last
`timeline` event in state, so `gpuprov status NODE --timeline` shows it later (a failed `up` too).

Offsets are seconds since the command began, from a monotonic clock, so they only grow. Step start
times come from the bootstrap's progress events (each step announces itself when it starts or is
skipped); their durations from its `StepResult`s.

The phases: `up` checks -> key pair + security group -> capacity search -> instance running -> SSH reachable ->
bootstrap -> verify; `start` checks -> resize -> instance running -> SSH reachable -> bootstrap -> verify. A failed
`up` closes the open phase as failed, then teardown. Step rows begin with the engine's `connect` and `upload`; the
verify step becomes the `verify` phase. `up`'s timeline also names the image it launched (`baked NAME ami-…`,
`ubuntu ami-…`, `dlami …`, `given ami-…`); cli/report.timeline_table prints it (not with `-q`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from gpuprov.hosts.bootstrap import Reporter, StepResult

EVENT_KIND = "timeline"  # the state event that holds a node's last timeline (JSON)

Outcome = Literal["ok", "failed"]
AttemptOutcome = Literal["launched", "refused"]


class LaunchAttempt(BaseModel):
    """One RunInstances call of the capacity search."""

    instance_type: str
    zone: str
    market: str
    start_s: float
    end_s: float
    outcome: AttemptOutcome
    code: str | None = None  # AWS's error code when refused
    message: str = ""


class StepTime(BaseModel):
    """One bootstrap step (or the engine's own `connect` / `upload` before the steps)."""

    name: str
    start_s: float
    end_s: float
    outcome: str  # bootstrap's StepOutcome: unchanged, changed, reboot, skipped, failed; "ok" for connect/upload
    message: str = ""


class Phase(BaseModel):
    name: str
    start_s: float
    end_s: float
    outcome: Outcome = "ok"
    detail: str = ""
    attempts: list[LaunchAttempt] = Field(default_factory=list)
    steps: list[StepTime] = Field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


class Timeline(BaseModel):
    command: str  # "up" or "start"
    node: str
    started_at: float  # epoch seconds
    total_s: float
    outcome: Outcome
    phases: list[Phase]
    image: str = ""  # which image `up` launched (a baked one, Ubuntu, a DLAMI), as `up` said it

    def phase(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)


# Phase names, in the order `up` goes through them (start uses a subset, plus RESIZE; start --move adds IMAGE).
CHECKS = "checks"
IMAGE = "disk image"  # start --move: the image of its disk made (and copied to another region)
ACCESS = "key pair + security group"
CAPACITY = "capacity search"
RESIZE = "resize"
RUNNING = "instance running"
SSH = "SSH reachable"
BOOTSTRAP = "bootstrap"
VERIFY = "verify"
WIRE = "cluster wiring"  # up --nodes: cluster.env and hostfile on every node
TEARDOWN = "teardown"


class Recorder:
    """Builds a Timeline as the command goes. `phase(name)` ends the phase in progress and begins the next."""

    def __init__(self, command: str, node: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.command = command
        self.node = node
        self._clock = clock
        self._t0 = clock()
        self.started_at = time.time()
        self.phases: list[Phase] = []
        self.image = ""
        self._open: Phase | None = None
        self._seen: dict[str, float] = {}  # step name -> offset of its first progress event
        self._lock = threading.Lock()  # progress events arrive from the bootstrap's worker thread

    def now(self) -> float:
        return self._clock() - self._t0

    def phase(self, name: str) -> None:
        self._close(self.now())
        self._open = Phase(name=name, start_s=self.now(), end_s=self.now())

    def _close(self, at: float, outcome: Outcome = "ok", detail: str = "") -> None:
        if self._open is not None:
            self._open.end_s, self._open.outcome, self._open.detail = max(at, self._open.start_s), outcome, detail
            self.phases.append(self._open)
            self._open = None

    def attempt(self, instance_type: str, zone: str, market: str, start_s: float, code: str | None = None,
                message: str = "") -> None:
        """A launch attempt that began at `start_s` and was just answered: refused with `code`, or launched."""
        if self._open is not None:
            self._open.attempts.append(LaunchAttempt(
                instance_type=instance_type, zone=zone, market=market, start_s=start_s, end_s=self.now(),
                outcome="refused" if code else "launched", code=code, message=message))

    def row(self, name: str, start_s: float, outcome: str, message: str = "") -> None:
        """A row of the phase in progress that ends now (a cluster's node, bootstrapped beside the others)."""
        with self._lock:
            if self._open is not None:
                self._open.steps.append(StepTime(name=name, start_s=start_s, end_s=self.now(), outcome=outcome,
                                                 message=message))

    def reporter(self, inner: Reporter) -> Reporter:
        """A bootstrap Reporter that notes when each step first shows up, then passes the event on."""
        return _Timed(self, inner)

    def _saw(self, step: str) -> None:
        with self._lock:
            self._seen.setdefault(step, self.now())

    def bootstrap_done(self, steps: Sequence[StepResult], verify: set[str], error: str | None = None) -> None:
        """Turn the bootstrap's results into step rows of the open (bootstrap) phase; a step in `verify` becomes
        the VERIFY phase of its own. Call it as soon as the bootstrap returns, whatever its status; `error`: the
        host's error when it failed (before any step, too: unreachable, facts, upload)."""
        boot = self._open
        if boot is None:
            return
        end = self.now()
        cursor = boot.start_s
        rows: list[StepTime] = []
        for engine_step, after in (("connect", "upload"), ("upload", steps[0].name if steps else "")):
            if engine_step in self._seen:  # it lasted until the next one began (or the bootstrap ended: it failed)
                start = max(cursor, self._seen[engine_step])
                cursor = min(end, max(start, self._seen.get(after, end)))
                last = after not in self._seen
                rows.append(StepTime(name=engine_step, start_s=start, end_s=cursor,
                                     outcome="failed" if last and error else "ok", message=(error or "") if last else ""))
        checks: StepTime | None = None
        for step in steps:
            start = min(end, max(cursor, self._seen.get(step.name, cursor)))
            cursor = min(end, start + step.seconds)
            row = StepTime(name=step.name, start_s=start, end_s=cursor, outcome=step.outcome, message=step.message)
            if step.name in verify:
                checks = row
            else:
                rows.append(row)
        boot.steps = rows
        failed = next((r for r in rows if r.outcome == "failed"), None)
        outcome: Outcome = "failed" if failed or (error and checks is None) else "ok"
        detail = failed.message if failed else (error or "") if outcome == "failed" else ""
        if checks is None:
            self._close(end, outcome, detail)
            return
        self._close(checks.start_s, outcome, detail)
        self.phases.append(Phase(name=VERIFY, start_s=checks.start_s, end_s=checks.end_s,
                                 outcome="failed" if checks.outcome == "failed" else "ok", detail=checks.message,
                                 steps=[checks]))

    def failed(self, error: str) -> None:
        """The phase in progress failed with `error` (the command goes on to clean up, or stops)."""
        self._close(self.now(), "failed", error[:500])

    def finish(self, outcome: Outcome = "ok") -> Timeline:
        end = self.now()
        self._close(end)
        return Timeline(command=self.command, node=self.node, started_at=self.started_at, total_s=end,
                        outcome=outcome, phases=list(self.phases), image=self.image)


class _Timed:
    def __init__(self, recorder: Recorder, inner: Reporter) -> None:
        self.recorder = recorder
        self.inner = inner

    def event(self, host: str, step: str, state: str) -> None:
        if step:
            self.recorder._saw(step)
        self.inner.event(host, step, state)


def from_events(messages: Sequence[str]) -> Timeline | None:
    """The last timeline among a node's `timeline` events (their messages, oldest first)."""
    return Timeline.model_validate_json(messages[-1]) if messages else None
