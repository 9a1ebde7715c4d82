"""The runner on the host: one SSH exec runs every pending step of a bundle and streams one line per event.

The client sends the bundle tar on the exec's stdin; `templates/runner.sh.j2`, rendered per bundle and
shipped inside it, unpacks nothing itself (the exec's first words do) but runs the steps in order,
skips those whose marker matches, writes each marker once its step succeeded (a reboot step's under a
pending name), and prints `@gpuprov:NONCE EVENT ...` lines on stdout. This module renders the runner,
builds the exec command and turns the stream back into events; bootstrap.py decides what they mean.

The first exec (`first_exec`) runs as root directly, else through `sudo -n`; a login that `sudo -n true` refuses
runs it as itself (plan/noroot.py). It prints the facts, then `@gpuprov:NONCE facts-end`, and waits; the tar on
its stdin (`command`) is unpacked into /var/lib/gpuprov/bundle/ (beside the old one, swapped in by a rename) and
runner.sh is exec'ed. The runner is bash only (it runs before anything is installed; shellcheck-clean). Its events,
tagged with a per-run nonce so no step output passes for one: `skip|start STEP`, `end STEP RC RESULT MS`,
`reboot STEP BOOT_ID`, `checked STEP ok|failed`, `same-boot`, `done`. A step's log comes on the runner's stdout
between its `start` and `output` events, its stdout between `output` and `end` (the result is read from it, never
from stderr): one stream keeps a step's lines in its own log section, which sshd's two did not.

Markers: /var/lib/gpuprov/markers/<step>.sha256 holds the hash of the script that last succeeded, written right
after the step's `end` line and only when it exited 0; the old marker is emptied before the step starts, so a step
that fails (under `--force` too) has none and the next run retries it. A rerun skips matching steps, reruns
changed ones, `--force` reruns all; `verify` never gets a marker.

Reboot: a step that prints GPUPROV_RESULT=reboot gets its marker under a pending name (`.after-reboot`); the runner
prints `reboot STEP BOOT_ID`, starts `reboot` a second later and exits. The client sees SSH go, waits (bounded by
`--reboot-timeout`) for a new connection and starts the runner again with the old boot id and the next step's
index: on the same boot it says `same-boot` and the client waits again; otherwise it checks what the step rebooted
for (`AFTER_REBOOT`: the nvidia module loaded after `nvidia-driver`, nouveau gone after `nouveau-off`) and only then
renames the pending marker; a failed check fails the step and the next run runs it again. So a host costs one exec
for its facts and the run, and one per reboot (tests/test_runner_ssh.py counts them in sshd's logs).

One runner per host: it holds flock on /var/lib/gpuprov/runner.lock and keeps its client's id
(`INSTALL:user@host`) in runner.lock.pid. A run of another install holding it is refused (`busy_check`, before any
fact is read or bundle unpacked, and again under the lock); one of this install is taken over (its client is
gone, e.g. a host lost mid-step). Only the runner holds that lock (its steps get the descriptor closed), so the
busy check asks flock only while the recorded runner pid lives. A runner whose client is gone dies at its next
protocol line (SIGPIPE), before the next marker write.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from gpuprov.plan.noroot import USER_STATE_REL
from gpuprov.plan.render import STATE_DIR as STATE_DIR  # re-exported: the root state folder beside USER_STATE
from gpuprov.plan.render import Bundle, environment

BUNDLE_DIR = f"{STATE_DIR}/bundle"
MARKER_DIR = f"{STATE_DIR}/markers"
RUNNER_FILE = "runner.sh"
# A login without root (uid != 0 and `sudo -n true` fails: a rented box's user account) keeps the runner's state in
# its own home; the first exec, which runs before any fact is read, names it by $HOME (plan/noroot.py the same)
USER_STATE = '"$HOME"/' + USER_STATE_REL

# What a reboot step asked the reboot to do, checked by the runner after the reboot before the step's
# marker is written: (check, problem). A reboot step not named here gets the NVIDIA-module check.
AFTER_REBOOT = {
    "nvidia-driver": ("{ lsmod | grep -q '^nvidia ' || nvidia-smi -L >/dev/null 2>&1; }",
                      "the NVIDIA kernel module is not loaded after the reboot: check `dkms status`, "
                      "headers for `uname -r` and Secure Boot"),
    "nouveau-off": ("! lsmod | grep -q '^nouveau '",
                    "nouveau is still loaded after the reboot: check /etc/modprobe.d and `update-initramfs -u`"),
}
DEFAULT_AFTER_REBOOT = "nvidia-driver"


def after_reboot_problem(step: str) -> str:
    return AFTER_REBOOT.get(step, AFTER_REBOOT[DEFAULT_AFTER_REBOOT])[1]


def render_runner(bundle: Bundle, state_dir: str = STATE_DIR) -> str:
    """:param state_dir: where the runner keeps the bundle, markers and lock (a home's, on a login without root)."""
    checks = [(name, check) for name, (check, _) in AFTER_REBOOT.items()]
    return environment().get_template("runner.sh.j2").render(
        steps=bundle.scripts, checks=checks, default_check=AFTER_REBOOT[DEFAULT_AFTER_REBOOT][0],
        state_dir=state_dir)


def new_nonce() -> str:
    return secrets.token_hex(8)


def facts_end(nonce: str) -> str:
    """The line that ends the facts on the first exec, after which it waits for the bundle tar."""
    return f"@gpuprov:{nonce} facts-end"


BUSY = 75  # the exit status of a first exec that found another client's run at work (EX_TEMPFAIL)


def client_id(install: str, who: str, pid: int) -> str:
    """One word naming the client to the host's runner: INSTALL:user@host:pid. Two runs of one install are
    told apart by the client's own lock (gpuprov.state.locks.host), two installs' runs by this."""
    return re.sub(r"[^A-Za-z0-9@._-]", "-", install) + ":" + re.sub(r"[^A-Za-z0-9@._-]", "-", who) + f":{pid}"


def busy_check(client: str, takeover: bool, state: str = STATE_DIR) -> str:
    """Shell that comes first in a host's first exec: a run of another install still holding the runner's lock
    ends this exec (exit BUSY, a line on stderr) before any fact is read or bundle unpacked, unless `takeover`.
    The runner checks the same again under the lock (runner.sh.j2), for two runs that pass here together.

    Only the runner holds its lock (its steps get the descriptor closed), so a lock whose recorded runner pid is
    gone is free: `flock` is asked only while that process lives, and a rerun after a finished run starts no
    process here."""
    lock = f"{state}/runner.lock"
    mine = client.rpartition(":")[0]
    return (
        f"o=; if [ -e {lock}.pid ] && [ {int(takeover)} != 1 ]; then read -r o _ c t < {lock}.pid || o=; fi; "
        f"if [ -n \"$o\" ] && [ -d \"/proc/$o\" ] && ! flock -n {lock} true 2>/dev/null; then "
        f"if [ \"${{c:--}}\" != - ] && [ \"$c\" != {shlex.quote(mine)} ]; then "
        f"echo \"another gpuprov ($c, its runner pid $o, since $(date -d \"@${{t:-0}}\" '+%F %T' 2>/dev/null)) is "
        f"bootstrapping this host; wait for it, or pass --takeover to stop it\" >&2; exit {BUSY}; fi; fi; "
    )


def command(nonce: str, first: int, force: bool, boot_before: str | None, unpack: bool, client: str = "-",
            takeover: bool = False, state: str = STATE_DIR) -> str:
    """The exec's command line (run as root; as the login on a host without root, `state` USER_STATE): unpack the tar
    on stdin when `unpack`, then the runner."""
    bundle, markers = f"{state}/bundle", f"{state}/markers"
    run = (f"exec bash {bundle}/{RUNNER_FILE} {nonce} {first} {int(force)} {boot_before or '-'} "
           f"{shlex.quote(client)} {int(takeover)}")
    if not unpack:
        return run
    # few processes: `install -d` makes (or fixes to 0700) the three folders at once; the new bundle is unpacked
    # beside the old one and swapped in by a rename, so a half-unpacked bundle never runs; `rm` only where there
    # is an old one (a first install has none)
    # a home's state folder may be new, and its parents with it (mkdir -p: `install -d` would make them 0755)
    made = f"mkdir -p {state}; " if state != STATE_DIR else ""
    return (
        f"set -e; umask 077; {made}[ ! -e {bundle}.new ] || rm -rf {bundle}.new; "
        f"install -d -m 0700 {state} {markers} {bundle}.new; "
        f"tar -xf - -C {bundle}.new --no-same-owner; [ ! -e {bundle} ] || rm -rf {bundle}; "
        f"mv {bundle}.new {bundle}; {run}"
    )


def first_exec(facts: str, nonce: str, force: bool, client: str, takeover: bool, login_is_root: bool) -> str:
    """The host's first exec: the busy check, the facts, the line that ends them, then the bundle's unpack and the
    runner. Run as root: directly for root's login, else through `sudo -n`; a login `sudo -n true` refuses (a
    user account only) runs it as itself, with the runner's state in its home, and says so in the facts (`## login`:
    `root`, or `user HOME`), so the plan leaves out what needs root."""
    def part(state: str, login: str) -> str:
        return (busy_check(client, takeover, state) + f"{facts}; echo '## login'; echo {login}; "
                f"echo {facts_end(nonce)}; " + command(nonce, 1, force, None, unpack=True, client=client,
                                                     takeover=takeover, state=state))

    as_root = part(STATE_DIR, "root")
    if login_is_root:
        return as_root
    as_user = part(USER_STATE, 'user "$HOME"')
    return (f"if sudo -n true 2>/dev/null; then exec sudo -n -- bash -c {shlex.quote(as_root)}; fi; "
            f"exec bash -c {shlex.quote(as_user)}")



@dataclass(frozen=True)
class RunnerEvent:
    """One protocol line: `kind` (skip, start, output, end, reboot, checked, same-boot, done) and its fields.
    Between `start` and `output` the lines are the step's log (its stderr); between `output` and `end`, its
    stdout (the result line, a probe's report)."""

    kind: str
    step: str = ""
    rc: int = 0
    result: str = ""  # end: unchanged|changed|reboot|none; checked: ok|failed; reboot: the boot id before it
    seconds: float = 0.0


def parse(line: str, nonce: str) -> RunnerEvent | None:
    """The event a line of the runner's stdout carries, or None for a line of step output."""
    prefix = f"@gpuprov:{nonce} "
    if not line.startswith(prefix):
        return None
    words = line[len(prefix):].split()
    if not words:
        return None
    kind, rest = words[0], words[1:]
    if kind == "end" and len(rest) == 4:
        return RunnerEvent("end", rest[0], int(rest[1]), rest[2], int(rest[3]) / 1000)
    if kind in ("reboot", "checked") and len(rest) == 2:
        return RunnerEvent(kind, rest[0], result=rest[1])
    if kind in ("skip", "start", "output") and len(rest) == 1:
        return RunnerEvent(kind, rest[0])
    if kind in ("same-boot", "done") and not rest:
        return RunnerEvent(kind)
    return None


class Lines:
    """Cuts streamed text into lines: protocol events to `on_event`, everything else to `on_output`
    (whole lines, newline included), so step output never reaches the event parser half-way."""

    def __init__(self, nonce: str, on_event: Callable[[RunnerEvent], None], on_output: Callable[[str], None]) -> None:
        self.nonce = nonce
        self.on_event = on_event
        self.on_output = on_output
        self._partial: list[str] = []  # the line so far, in pieces (appending to one string is quadratic)

    def feed(self, text: str) -> None:
        """A step's output goes on in runs of whole lines, one call a run (a chatty step's log comes here line on
        line, and a call per line made a long build log a real load on the controller's CPU)."""
        if "\n" not in text:
            self._partial.append(text)
            return
        head, _, last = text.rpartition("\n")
        block = "".join(self._partial) + head
        self._partial = [last] if last else []
        if f"@gpuprov:{self.nonce} " not in block:  # no event in these lines: all output
            self.on_output(block + "\n")
            return
        run: list[str] = []
        for line in block.split("\n"):
            event = parse(line, self.nonce)
            if event is None:
                run.append(line)
                continue
            if run:
                self.on_output("\n".join(run) + "\n")
                run = []
            self.on_event(event)
        if run:
            self.on_output("\n".join(run) + "\n")

    def close(self) -> None:
        if self._partial:
            self.on_output("".join(self._partial))
            self._partial = []
