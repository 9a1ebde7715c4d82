"""Run a plan's bundle on hosts over SSH: push once, run step by step, resume, reboot, verify.

Per host (pyinfra's fact -> diff -> commands):
  facts (GPUs, NVSwitch, OS) -> plan for that host -> push the bundle -> read step markers
  -> run each step whose marker differs from its script's sha256 (all with --force)
  -> a step that prints GPUPROV_RESULT=reboot: reboot, wait, check the module, go on
  -> verify: parse the probe and judge it against the plan.
Hosts run in a bounded thread pool; one host's failure is recorded in its own HostResult and
never stops or hides the others (Fabric's Group semantics, with a bound).
"""

from __future__ import annotations

import io
import re
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from gpuprov.compat import StackPins
from gpuprov.detect import FACTS_COMMAND, HostFacts, parse_facts
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.fanout import run_parallel
from gpuprov.inventory import Target
from gpuprov.plan import GuardRequest, Plan
from gpuprov.remote import ConnectionLost, HostSettings, Remote, Unreachable
from gpuprov.render import STATE_DIR, Bundle, Script
from gpuprov.verify import CheckReport, Expectation, ProbeError, extract_probe, judge, parse_probe

BUNDLE_DIR = f"{STATE_DIR}/bundle"
MARKER_DIR = f"{STATE_DIR}/markers"
_RESULT = re.compile(r"^GPUPROV_RESULT=(unchanged|changed|reboot)\s*$", re.M)

StepOutcome = Literal["unchanged", "changed", "reboot", "skipped", "failed"]
HostStatus = Literal["ok", "changed", "failed", "unreachable"]


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
    step_timeout: float | None = None
    echo: Callable[[str], None] | None = None  # --verbose: every remote line, prefixed by host


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
        if self.status == "failed" and self.failed_step:
            return f"failed at {self.failed_step}"
        return self.status


PlanFor = Callable[[Target, HostFacts], Plan]


class _Log:
    """A host's log file; with --verbose each line also goes to `echo`, prefixed by the host."""

    def __init__(self, path: Path, host: str, echo: Callable[[str], None] | None) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._host = host
        self._echo = echo
        self._partial = ""

    def write(self, text: str) -> int:
        self._file.write(text)
        self._file.flush()
        if self._echo:
            self._partial += text
            *lines, self._partial = self._partial.split("\n")
            for line in lines:
                self._echo(f"[{self._host}] {line}")
        return len(text)

    def note(self, text: str) -> None:
        self.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def bundle_tar(bundle: Bundle) -> bytes:
    """The bundle as one tar archive: one upload per host, unpacked as root on the host."""
    import json

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = [(s.filename, s.text.encode(), 0o700) for s in bundle.scripts]
        files.append(("manifest.json", json.dumps(bundle.manifest, indent=2).encode(), 0o600))
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def expectation(plan: Plan, gpu_count: int | None = None) -> Expectation:
    stack = plan.stack
    return Expectation(
        gpu=plan.gpu.name if plan.gpu else None,
        gpu_count=gpu_count,
        torch=bool(stack and stack.torch),
        torch_cuda=stack.torch.cuda if stack and stack.torch else None,
    )


class _HostRun:
    """Bootstraps one host. Every failure becomes this host's result, never an exception."""

    def __init__(self, target: Target, settings: HostSettings, plan_for: PlanFor, options: Options,
                 reporter: Reporter, log_dir: Path) -> None:
        self.target = target
        self.settings = settings
        self.plan_for = plan_for
        self.options = options
        self.reporter = reporter
        self.result = HostResult(target, "ok", log_path=log_dir / f"{_safe(target.name)}.log")
        self.log = _Log(self.result.log_path, target.name, options.echo)  # type: ignore[arg-type]

    def __call__(self) -> HostResult:
        start = time.monotonic()
        try:
            self._run()
        except Unreachable as exc:
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

    def _fail(self, status: HostStatus, step: str | None, error: str) -> None:
        self.result.status = status
        self.result.failed_step = step
        self.result.error = error
        self.log.note(f"{status}: {error}")

    def _run(self) -> None:
        self.reporter.event(self.target.name, "connect", "running")
        remote = Remote(self.target, self.settings)
        remote.open()
        try:
            self._bootstrap(remote)
        finally:
            remote.close()

    def _bootstrap(self, remote: Remote) -> None:
        self.result.failed_step = "facts"
        facts = parse_facts(remote.run(FACTS_COMMAND, sudo=True).stdout)
        self.log.note(f"facts: {facts.model_dump_json()}")
        self.result.failed_step = "plan"
        plan = self.plan_for(self.target, facts)  # a UserInputError here stops this host before anything is installed
        bundle = plan.bundle()
        self.result.failed_step = "upload"
        self.reporter.event(self.target.name, "upload", "running")
        self._push(remote, bundle)
        markers = self._markers(remote)
        self.result.failed_step = None
        changed = False
        for script in bundle.scripts:
            step = self._step(remote, script, markers, plan, facts)
            self.result.steps.append(step)
            if step.outcome == "failed":
                self.result.status = "failed"
                self.result.failed_step = script.name
                self.result.error = step.message
                return
            changed |= step.outcome in ("changed", "reboot")
        self.result.status = "changed" if changed else "ok"

    def _push(self, remote: Remote, bundle: Bundle) -> None:
        upload = f"/tmp/gpuprov-bundle-{threading.get_ident()}-{time.monotonic_ns()}.tar"
        remote.put_bytes(bundle_tar(bundle), upload)
        unpack = (
            f"set -e; umask 077; mkdir -p {STATE_DIR} {MARKER_DIR}; chmod 0700 {STATE_DIR}; "
            f"rm -rf {BUNDLE_DIR}.new; mkdir {BUNDLE_DIR}.new; tar -xf {upload} -C {BUNDLE_DIR}.new --no-same-owner; "
            f"rm -rf {BUNDLE_DIR}; mv {BUNDLE_DIR}.new {BUNDLE_DIR}; rm -f {upload}"
        )
        result = remote.run(unpack, sudo=True, out=self.log)
        if not result.ok:
            raise GpuprovError(f"could not unpack the bundle into {BUNDLE_DIR}: {result.stderr.strip()[-300:]}")

    def _markers(self, remote: Remote) -> dict[str, str]:
        out = remote.run(
            f"for f in {MARKER_DIR}/*.sha256; do [ -e \"$f\" ] && printf '%s %s\\n' \"$(basename \"$f\" .sha256)\" "
            "\"$(cat \"$f\")\"; done; true",
            sudo=True,
        ).stdout
        return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)

    def _step(self, remote: Remote, script: Script, markers: dict[str, str], plan: Plan, facts: HostFacts) -> StepResult:
        name = script.name
        start = time.monotonic()
        if script.kind != "verify" and not self.options.force and markers.get(name, "").strip() == script.sha256:
            self.reporter.event(self.target.name, name, "unchanged")
            self.log.note(f"step {name}: marker matches, skipped")
            return StepResult(name, "skipped", 0.0, "unchanged since the last run")
        self.reporter.event(self.target.name, name, "running")
        self.log.note(f"step {name} ({script.sha256[:12]})")
        command = f"bash {BUNDLE_DIR}/{script.filename}"
        if script.kind != "verify":
            command = _with_marker(command, name, script.sha256)
        try:
            result = remote.run(command, sudo=True, out=self.log, timeout=self.options.step_timeout)
        except ConnectionLost as exc:
            return StepResult(name, "failed", time.monotonic() - start,
                              f"{exc}; the next run resumes at this step")
        if script.kind == "verify":
            return self._verify(result.stdout, plan, facts, name, start, result.stderr)
        if not result.ok:
            return StepResult(name, "failed", time.monotonic() - start, _last_line(result.stderr, result.exited))
        found = _RESULT.findall(result.stdout)
        outcome: StepOutcome = found[-1] if found else "changed"  # type: ignore[assignment]
        if outcome == "reboot":
            self.reporter.event(self.target.name, name, "rebooting")
            self.log.note("rebooting")
            remote.reboot_and_wait(self.options.reboot_timeout,
                                   on_wait=lambda msg: self.reporter.event(self.target.name, name, msg))
            check, problem = _AFTER_REBOOT.get(name, _AFTER_REBOOT["nvidia-driver"])
            pending, marker = f"{MARKER_DIR}/{name}{_PENDING}", f"{MARKER_DIR}/{name}.sha256"
            # the marker of a reboot step is written only once the reboot did what the step asked for
            loaded = remote.run(f"if {check}; then mv -f {pending} {marker}; else rm -f {pending}; false; fi", sudo=True)
            if not loaded.ok:
                return StepResult(name, "failed", time.monotonic() - start,
                                  f"{problem}; the next run resumes at this step")
        self.reporter.event(self.target.name, name, outcome)
        return StepResult(name, outcome, time.monotonic() - start)

    def _verify(self, stdout: str, plan: Plan, facts: HostFacts, name: str, start: float, stderr: str) -> StepResult:
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


# What a reboot step asked the reboot to do, checked before its marker is written: (check, problem).
_AFTER_REBOOT = {
    "nvidia-driver": ("{ lsmod | grep -q '^nvidia ' || nvidia-smi -L >/dev/null 2>&1; }",
                      "the NVIDIA kernel module is not loaded after the reboot: check `dkms status`, "
                      "headers for `uname -r` and Secure Boot"),
    "nouveau-off": ("! lsmod | grep -q '^nouveau '",
                    "nouveau is still loaded after the reboot: check /etc/modprobe.d and `update-initramfs -u`"),
}
_PENDING = ".sha256.after-reboot"


def _with_marker(command: str, name: str, sha256: str) -> str:
    """`command`, then its step's marker, in the same round trip: only when it exited 0, and for a step that
    asks for a reboot under a pending name that the engine renames once the post-reboot check passes.

    An old marker goes first, so a step that fails (even under --force) has none and the next run retries it."""
    marker = f"{MARKER_DIR}/{name}.sha256"
    return (
        f"rm -f {marker} {MARKER_DIR}/{name}{_PENDING}; out=\"$({command})\" || {{ rc=$?; printf '%s\\n' \"$out\"; "
        f"exit $rc; }}; printf '%s\\n' \"$out\"; "
        f"case \"$(printf '%s\\n' \"$out\" | grep -E '^GPUPROV_RESULT=' | tail -n 1)\" in "
        f"GPUPROV_RESULT=reboot*) printf '%s\\n' {sha256} > {MARKER_DIR}/{name}{_PENDING} ;; "
        f"*) printf '%s\\n' {sha256} > {marker} ;; esac"
    )


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
    runs = [_HostRun(t, settings, plan_for, options, rep, where) for t in targets]
    return run_parallel(runs, lambda run: run(), options.parallel)




def planner(gpu: str | None, playbook: str, os_name: str | None, pins: StackPins,
            guard: GuardRequest | None = None, jupyter: bool = False) -> Callable[[Target, HostFacts], Plan]:
    """How each existing host gets its plan: its GPU (given, or detected) and OS (given, or its own)."""
    from gpuprov.compat import SUPPORTED_OS
    from gpuprov.plan import make_host_plan

    def plan_for(target: Target, facts: HostFacts) -> Plan:
        wanted = target.gpu or gpu
        if wanted and facts.gpus:
            from gpuprov import catalog

            name = catalog.load().gpu(catalog.parse_gpu_request(wanted)[0]).name
            if set(facts.gpus) != {name} and set(facts.gpus) != {"unknown"}:
                raise UserInputError("--gpu", f"{target.name} has {', '.join(sorted(set(facts.gpus)))} "
                                     f"(from {facts.source}), not {name}; nothing was installed",
                                     "drop --gpu to use what the host has, or pick the right host")
        detected = facts.gpu if facts.gpu and facts.gpu != "unknown" else None
        if not wanted and facts.unknown_gpu_text:
            raise UserInputError("--gpu", f"{target.name} has {facts.unknown_gpu_text}: pass --gpu",
                                 "name the GPU model (`gpuprov gpus` lists them); nothing was installed")
        os_used = target.os or os_name or facts.os
        if os_used not in SUPPORTED_OS:
            raise UserInputError("--os", f"{target.name} runs {facts.os or 'an unknown OS'}; gpuprov's scripts support "
                                 f"{', '.join(SUPPORTED_OS)}", "pass --os to run them anyway, at your own risk")
        return make_host_plan(wanted or detected, playbook, os_used, pins, nvswitch=True if facts.nvswitch else None,
                              guard=guard, jupyter=jupyter)

    return plan_for
