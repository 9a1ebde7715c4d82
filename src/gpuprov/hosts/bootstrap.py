"""Run a plan's bundle on hosts over SSH: one runner per host, resume, reboot, verify.

Per host (pyinfra's fact -> diff -> commands), in one SSH exec after the connection:
  it prints the facts (GPUs, NVSwitch, OS) and waits -> plan for that host -> the bundle tar goes to the
  same exec's stdin, which unpacks it and starts the runner (runner.py), which runs each step whose marker
  differs from its script's sha256 (all with --force) and streams one line per step
  -> a step that prints GPUPROV_RESULT=reboot ends the runner, which starts the reboot: wait, reconnect,
     one more runner exec checks the module and goes on from the next step
  -> verify: parse the probe and judge it against the plan.
A host that stops answering (keepalives, --step-silence) is reported `lost`; the next run resumes it.
Hosts run in a bounded thread pool; one host's failure is recorded in its own HostResult and
never stops or hides the others (Fabric's Group semantics, with a bound).

The bundle and its tar are made once per plan (`_Bundles`); a plan the command line already decides (GPU and OS
named, or no stack) is rendered before any host is contacted (`Planner.ahead`). Each host's `Remote` is made in
its own thread. The runner's events become the progress events, the per-host log (hostlog.py), the `--verbose`
echo and `StepResult`s. A host that vanishes without closing the connection (network gone, machine frozen) is
found by keepalives or by `--step-silence` (no output for that long; a DKMS build prints often enough for the
default 20 min) and reported `lost at STEP`; the other hosts finish, and a rerun takes over from the old runner and
resumes there.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import os
import re
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from gpuprov.errors import GpuprovError
from gpuprov.hosts import hostkeys, runner
from gpuprov.hosts.detect import FACTS_COMMAND, HostFacts, parse_facts
from gpuprov.hosts.fanout import run_parallel
from gpuprov.hosts.hostlog import HostLog
from gpuprov.hosts.planner import Planner
from gpuprov.hosts.remote import ConnectionLost, Ended, HostLost, HostSettings, HostUnreachable, Remote, Session
from gpuprov.hosts.runner import BUNDLE_DIR as BUNDLE_DIR  # re-exported: gpubench.py reads it here
from gpuprov.plan.inventory import Target
from gpuprov.plan.plan import Plan
from gpuprov.plan.render import Bundle
from gpuprov.settings import settings
from gpuprov.state import locks

if TYPE_CHECKING:
    from gpuprov.hosts.verify import CheckReport, Expectation
    from gpuprov.plan.offline import Manifest

StepOutcome = Literal["unchanged", "changed", "reboot", "skipped", "failed"]
HostStatus = Literal["ok", "changed", "failed", "unreachable", "lost"]


class Reporter(Protocol):
    """Receives progress events; the CLI draws them, tests record them."""

    def event(self, host: str, step: str, state: str) -> None: ...


class _Silent:
    def event(self, host: str, step: str, state: str) -> None:
        return None


@dataclass(frozen=True)
class Options:
    force: bool = False
    parallel: int = 32
    reboot_timeout: float = 600.0
    step_silence: float | None = 1200.0  # no output for this long: the host is lost (a DKMS build prints)
    echo: Callable[[str], None] | None = None  # --verbose: every remote line, prefixed by host
    takeover: bool = False  # --takeover: stop another gpuprov's run of the same host instead of refusing
    offline: tuple[Path, Manifest] | None = None  # --offline DIR: the bundle sent to each host before its steps


@dataclass
class StepResult:
    name: str
    outcome: StepOutcome
    seconds: float
    message: str = ""


@dataclass
class HostResult:
    target: Target
    status: HostStatus
    steps: list[StepResult] = field(default_factory=list)
    failed_step: str | None = None
    error: str | None = None
    seconds: float = 0.0
    log_path: Path | None = None
    report: CheckReport | None = None

    @property
    def summary(self) -> str:
        if self.status in ("failed", "lost") and self.failed_step:
            return f"{self.status} at {self.failed_step}"
        return self.status


PlanFor = Callable[[Target, HostFacts], Plan]


def _client() -> str:
    """This process as the hosts' runners know it (runner.client_id)."""
    from gpuprov.paths import install_id

    return runner.client_id(install_id(), f"{getpass.getuser()}@{socket.gethostname()}", os.getpid())


def bundle_tar(bundle: Bundle, runner_text: str | None = None) -> bytes:
    """The bundle and its runner (rendered here unless given) as one tar archive, sent on the runner exec's stdin."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = [(s.filename, s.text.encode(), 0o700) for s in bundle.scripts]
        files.append((runner.RUNNER_FILE, (runner_text or runner.render_runner(bundle)).encode(), 0o700))
        files.append(("manifest.json", json.dumps(bundle.manifest, indent=2).encode(), 0o600))
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def expectation(plan: Plan, gpu_count: int | None = None) -> Expectation:
    from gpuprov.hosts.verify import Expectation

    stack = plan.stack
    return Expectation(
        gpu=plan.gpu.name if plan.gpu else None,
        gpu_count=gpu_count,
        torch=bool(stack and stack.torch),
        torch_cuda=stack.torch.cuda if stack and stack.torch else None,
    )


class _Bundles:
    """Each plan's bundle and its tar, made once per run however many hosts share the plan (and read from
    bundle_cache when an earlier run rendered the same plan)."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[Plan, Bundle, bytes]] = {}  # by id(plan); the plan is kept so its id stays its own
        self._lock = threading.Lock()

    def get(self, plan: Plan) -> tuple[Bundle, bytes]:
        with self._lock:
            if id(plan) not in self._made:
                from gpuprov.hosts.bundle_cache import bundle_for

                bundle, runner_text = bundle_for(plan)
                self._made[id(plan)] = (plan, bundle, bundle_tar(bundle, runner_text))
            _, bundle, tar = self._made[id(plan)]
            return bundle, tar


class _HostRun:
    """Bootstraps one host. Every failure becomes this host's result, never an exception."""

    def __init__(self, target: Target, settings: HostSettings, plan_for: PlanFor, options: Options,
                 reporter: Reporter, log_dir: Path, bundles: _Bundles, client: str) -> None:
        self.target = target
        self.client = client
        self.bundles = bundles
        self.settings = settings
        self.plan_for = plan_for
        self.options = options
        self.reporter = reporter
        self.result = HostResult(target, "ok", log_path=log_dir / f"{_safe(target.name)}.log")
        self.log = HostLog(self.result.log_path, target.name, options.echo)  # type: ignore[arg-type]
        self.remote: Remote  # made in the host's own thread; replaced by a new connection after each reboot

    def __call__(self) -> HostResult:
        start = time.monotonic()
        try:
            self._run()
        except HostUnreachable as exc:
            self._fail("unreachable", None, str(exc))
        except GpuprovError as exc:
            self._fail("failed", self.result.failed_step, str(exc))
        except Exception as exc:  # a bug or an unforeseen library error must not take the other hosts down
            import traceback

            self.log.write(traceback.format_exc())
            self._fail("failed", self.result.failed_step, f"internal error: {type(exc).__name__}: {exc} (see the log)")
        finally:
            self.result.seconds = time.monotonic() - start
            self.log.note(f"done: {self.result.summary}")
            self.log.close()
        self.reporter.event(self.target.name, self.result.failed_step or "", self.result.summary)
        return self.result

    def _log_err(self, text: str) -> None:
        self.log.write(text)

    def _fail(self, status: HostStatus, step: str | None, error: str) -> None:
        self.result.status = status
        self.result.failed_step = step
        self.result.error = error
        self.log.note(f"{status}: {error}")

    def _run(self) -> None:
        with contextlib.ExitStack() as held:
            if not self.options.takeover:  # one bootstrap of a host from this install at a time
                try:
                    held.enter_context(locks.hold(locks.host(f"{self.target.host}:{self.target.port or 22}"),
                                                  "bootstrap", wait=False, subject=self.target.name))
                except locks.Busy as busy:
                    raise GpuprovError(f"{busy}; wait for it, or pass --takeover to stop it") from None
            self.reporter.event(self.target.name, "connect", "running")
            self.remote = Remote(self.target, self.settings)
            try:
                self.remote.open()
                self._bootstrap()
            finally:
                self.remote.close()

    def _bootstrap(self) -> None:
        """One exec prints the facts, then waits for the bundle on its stdin and runs it: the plan is made
        between the two, so a host costs one round trip more than its connection (plus one per reboot)."""
        self.result.failed_step = "facts"
        nonce = runner.new_nonce()
        first = self.remote.session(runner.first_exec(FACTS_COMMAND, nonce, self.options.force, self.client,
                                                      self.options.takeover, self.remote.is_root))
        try:
            try:
                facts = parse_facts(first.read_until(runner.facts_end(nonce), self._log_err, self.options.step_silence))
            except Ended as ended:
                if ended.code == runner.BUSY:  # another install's run of this host is at work
                    raise GpuprovError(ended.last) from None
                raise
            self.log.note(f"facts: {facts.model_dump_json()}")
            self.result.failed_step = "plan"
            plan = self.plan_for(self.target, facts)  # a UserInputError stops this host before anything is installed
            bundle, tar = self.bundles.get(plan)
            for step, why in plan.skipped:  # left out for want of root (plan/noroot.py): one line each
                self.result.steps.append(StepResult(step, "skipped", 0.0, why))
                self.log.note(f"step {step}: skipped: {why}")
            if self.options.offline is not None:  # the plan was checked against the bundle (cli); now send it
                from gpuprov.hosts.offline import push

                self.result.failed_step = "offline"
                self.reporter.event(self.target.name, "offline", "running")
                push(self.remote, *self.options.offline, self.log.note)
            self.result.failed_step = "upload"
            self.reporter.event(self.target.name, "upload", "running")
            _Runs(self, plan, facts, bundle, tar, nonce).go(first)
        finally:
            first.close()  # without the bundle on its stdin, the exec unpacks nothing and runs nothing
        if self.result.status == "ok":
            changed = any(step.outcome in ("changed", "reboot") for step in self.result.steps)
            self.result.status = "changed" if changed else "ok"

    def verify(self, stdout: str, plan: Plan, facts: HostFacts, name: str, start: float, stderr: str) -> StepResult:
        from gpuprov.hosts.verify import ProbeError, extract_probe, judge, parse_probe  # only a verify step needs them

        try:
            report = parse_probe(self.target.name, extract_probe(stdout))
        except ProbeError as exc:
            return StepResult(name, "failed", time.monotonic() - start, f"{exc}; {_last_line(stderr, 1)}")
        # on a launched node the instance type says how many GPUs; elsewhere, what lspci saw
        count = plan.instance.gpus if plan.instance else (len(facts.gpus) or None)
        self.result.report = judge(report, expectation(plan, count))
        if not self.result.report.ok:
            worst = self.result.report.failures[0]
            return StepResult(name, "failed", time.monotonic() - start, f"{worst.detail} — fix: {worst.fix}")
        self.reporter.event(self.target.name, name, "ok")
        return StepResult(name, "unchanged", time.monotonic() - start)


class _Runs:
    """A host's runner execs (runner.py): the first one carries the bundle, one more follows each reboot.
    Their events become the host's StepResults, progress events and log notes."""

    def __init__(self, host: _HostRun, plan: Plan, facts: HostFacts, bundle: Bundle, tar: bytes, nonce: str) -> None:
        self.host = host
        self.result = host.result
        self.plan = plan
        self.facts = facts
        self.scripts = {s.name: s for s in bundle.scripts}
        self.order = [s.name for s in bundle.scripts]
        self.tar = tar
        self.nonce = nonce
        self.ending = ""  # how the current exec ended: done, reboot, same-boot, or "" (it stopped)
        self.boot = ""  # the boot id before the reboot a step asked for
        self.current: str | None = None  # the step started and not yet ended
        self.replaying = False  # the current step's stdout is coming (its `output` event came); before, its log
        self.started = 0.0
        self.stdout: list[str] = []  # the current step's stdout
        self.stderr = ""  # the tail of the current step's stderr
        self.failed_end: runner.RunnerEvent | None = None  # a failed step's end line, judged once its stderr is in
        self.awaiting: str | None = None  # a step that asked for a reboot, until its post-reboot check

    def go(self, started: Session) -> None:
        """`started`: the exec that printed the facts and waits for the bundle; after a reboot, a new exec
        goes on from the step after the one that asked for it."""
        session: Session | None = started
        first = 1
        while self.result.status == "ok":
            code = self._exec(session, first)
            if self.result.status != "ok" or self.ending == "done":
                return
            if self.ending not in ("reboot", "same-boot") or self.awaiting is None:
                raise GpuprovError(f"the runner stopped (exit {code}) before every step ran: "
                                   f"{_last_line(self.stderr, code)}")
            session, first = None, self.order.index(self.awaiting) + 2
            self._wait_for_reboot(self.awaiting)

    def _exec(self, started: Session | None, first: int) -> int:
        self.ending, self.failed_end = "", None
        lines = runner.Lines(self.nonce, self._event, self._stdout)
        silence = self.host.options.step_silence
        try:
            if started is not None:
                started.send(self.tar)
                code = started.pump(lines.feed, self._stderr, silence)
            else:
                command = runner.command(self.nonce, first, self.host.options.force, self.boot or None, unpack=False,
                                         client=self.host.client,
                                         state=runner.USER_STATE if self.plan.home else runner.STATE_DIR)
                code = self.host.remote.stream(command, sudo=True, on_out=lines.feed, on_err=self._stderr,
                                               silence=silence)
        except ConnectionLost as exc:
            lines.close()
            self._lost(exc)
            return -1
        lines.close()
        if self.result.failed_step == "upload":  # the runner never started
            raise GpuprovError(f"could not unpack the bundle into {BUNDLE_DIR}: {self.stderr.strip()[-300:]}")
        if self.failed_end is not None:
            self._record(self.failed_end.step, "failed", _last_line(self.stderr, self.failed_end.rc))
        return code

    def _event(self, event: runner.RunnerEvent) -> None:
        if self.result.failed_step == "upload":
            self.result.failed_step = None
        host, log, name = self.host.reporter, self.host.log, self.host.target.name
        if event.kind == "skip":
            host.event(name, event.step, "unchanged")
            log.note(f"step {event.step}: marker matches, skipped")
            self.result.steps.append(StepResult(event.step, "skipped", 0.0, "unchanged since the last run"))
        elif event.kind == "start":
            self.current, self.started, self.stdout, self.stderr = event.step, time.monotonic(), [], ""
            self.replaying = False
            host.event(name, event.step, "running")
            log.note(f"step {event.step} ({self.scripts[event.step].sha256[:12]})")
        elif event.kind == "output":
            self.replaying = True
        elif event.kind == "end":
            self.replaying = False
            self._end(event)
        elif event.kind == "reboot":
            host.event(name, event.step, "rebooting")
            log.note("rebooting")
            self.ending, self.boot, self.awaiting = "reboot", event.result, event.step
        elif event.kind == "checked" and event.step == self.awaiting:
            self.awaiting = None
            if event.result == "ok":
                self._record(event.step, "reboot")
            else:
                self._record(event.step, "failed", f"{runner.after_reboot_problem(event.step)}; "
                                                   "the next run resumes at this step")
        elif event.kind in ("same-boot", "done"):
            self.ending = event.kind

    def _end(self, event: runner.RunnerEvent) -> None:
        script = self.scripts[event.step]
        self.current = None
        if script.kind == "verify":
            step = self.host.verify("".join(self.stdout), self.plan, self.facts, event.step, self.started, self.stderr)
            self._append(step)
        elif event.rc != 0:
            self.failed_end = event  # the runner stops here; its last stderr lines may still be on the way
        elif event.result != "reboot":
            self._record(event.step, "changed" if event.result == "none" else event.result)  # type: ignore[arg-type]

    def _stdout(self, text: str) -> None:
        if self.current is not None and not self.replaying:  # the step's log, sent on stdout to keep its order
            self._stderr(text)
            return
        self.host.log.write(text, "out")
        self.stdout.append(text)

    def _stderr(self, text: str) -> None:
        self.host.log.write(text)
        self.stderr = (self.stderr + text)[-8192:]

    def _record(self, step: str, outcome: StepOutcome, message: str = "") -> None:
        if outcome != "failed":
            self.host.reporter.event(self.host.target.name, step, outcome)
        self._append(StepResult(step, outcome, time.monotonic() - self.started, message))

    def _append(self, step: StepResult) -> None:
        self.result.steps.append(step)
        if step.outcome == "failed":
            self.result.status = "failed"
            self.result.failed_step = step.name
            self.result.error = step.message

    def _lost(self, exc: ConnectionLost) -> None:
        """The connection died mid-run: the step that was running (else the next one) is where the next run
        resumes. A host that stopped answering is `lost`; one that closed the connection, `failed`."""
        done = {s.name for s in self.result.steps}
        step = self.current or self.awaiting or next((n for n in self.order if n not in done), self.order[-1])
        if isinstance(exc, HostLost):
            message = f"lost: {exc}; the next run resumes at step {step}"
        else:
            message = f"connection lost while running {step}; the next run resumes at this step"
        self.result.steps.append(StepResult(step, "failed", time.monotonic() - self.started, message))
        self.result.status = "lost" if isinstance(exc, HostLost) else "failed"
        self.result.failed_step = step
        self.result.error = message

    def _wait_for_reboot(self, step: str) -> None:
        """See the host go down (the reboot drops this connection) and come back, on a new connection;
        the next exec checks the boot id and what the step rebooted for."""
        timeout = self.host.options.reboot_timeout
        deadline = time.monotonic() + timeout
        self.host.remote.wait_gone(min(10.0, timeout))
        self.host.remote.close()
        while time.monotonic() < deadline:
            time.sleep(_reboot_poll())
            probe = Remote(self.host.target, self.host.settings)
            try:
                probe.open()
            except (HostUnreachable, ConnectionLost):
                self.host.reporter.event(self.host.target.name, step, "waiting for the host to come back")
                continue
            self.host.remote = probe
            return
        raise HostUnreachable(f"{self.host.target.name}: did not come back within {timeout:.0f}s of the reboot")


def _reboot_poll() -> float:
    """Seconds between looks for a rebooting host: 1, or GPUPROV_TEST_REBOOT_POLL_SECONDS (the tests' hosts
    reboot in about a second, not a minute)."""
    given = settings().test_reboot_poll_seconds
    return given.seconds() if given is not None else 1.0


def _last_line(stderr: str, code: int) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"exit {code}: {lines[-1][:300]}" if lines else f"exit {code}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def bootstrap(
    targets: Sequence[Target],
    settings: HostSettings,
    plan_for: PlanFor,
    options: Options,
    reporter: Reporter | None = None,
    log_dir: Path | None = None,
) -> list[HostResult]:
    """Bootstrap every target, at most options.parallel at once; results in the targets' order."""
    from gpuprov.paths import logs_dir

    where = log_dir or logs_dir()
    rep = reporter or _Silent()
    if settings.known_hosts.exists():  # a malformed file is one error before any host, not one per host
        hostkeys.pinned_keys(settings.known_hosts)
    bundles = _Bundles()
    if isinstance(plan_for, Planner):  # render what can be known now, before the hosts' connections compete for it
        for plan in {id(p): p for p in map(plan_for.ahead, targets) if p is not None}.values():
            bundles.get(plan)
    client = _client()
    runs = [_HostRun(t, settings, plan_for, options, rep, where, bundles, client) for t in targets]
    return run_parallel(runs, lambda run: run(), options.parallel)

