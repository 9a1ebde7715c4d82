"""The runner (issue 12): one SSH exec per host reads its facts and runs the whole bundle; a vanished host does not hang the run.

Real CLI, real sshd: exec channels are counted from the hosts' own sshd logs (LogLevel VERBOSE logs
"Starting session: command for ..." once per exec), and hosts are cut off by taking their network
link down while the others go on.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests import forkcli
from tests.test_bootstrap_ssh import addrs, bootstrap, by_step, gpuprov, reset


def sessions(pool, i) -> list[str]:
    """The session lines sshd logged on host i so far: one per exec (or subsystem) channel."""
    log = Path(pool[i].base) / "sshd.log"
    return [line for line in log.read_text(errors="replace").splitlines() if "Starting session:" in line]


def execs_during(pool, i, run) -> tuple[object, list[str]]:
    before = len(sessions(pool, i))
    result = run()
    time.sleep(0.3)  # sshd writes its log line as the session starts; nothing is still on its way after the run
    return result, sessions(pool, i)[before:]


def test_one_exec_for_facts_and_the_run_and_one_per_reboot(host_pool, gp_home):
    pool = host_pool
    if pool.mode != "netns":
        pytest.skip("counts reboots: needs the netns test hosts")
    reset(pool, [0])
    (code, hosts), execs = execs_during(pool, 0, lambda: bootstrap(pool, [0], "-p", "minimal"))
    assert code == 0, hosts
    assert by_step(hosts[0])["nvidia-driver"] == "reboot"
    # the facts then the runner with the bundle on the same exec's stdin, the runner again after the driver's
    # reboot; no sftp
    assert len(execs) == 2, execs
    assert all("Starting session: command for root" in line for line in execs), execs

    (code, hosts), execs = execs_during(pool, 0, lambda: bootstrap(pool, [0], "-p", "minimal"))
    assert code == 0 and hosts[0]["status"] == "ok"
    assert len(execs) == 1, execs  # nothing to reboot for: facts and the run (which still verifies) on one exec

    reset(pool, [1], GPUPROV_SHIM_NOUVEAU="loaded")
    (code, hosts), execs = execs_during(pool, 1, lambda: bootstrap(pool, [1], "-p", "minimal"))
    assert code == 0, hosts
    assert [s for s, o in by_step(hosts[0]).items() if o == "reboot"] == ["nouveau-off", "nvidia-driver"]
    assert len(execs) == 3, execs  # two reboots: one more exec each


def slow_playbook(tmp_path: Path, tick: bool) -> Path:
    """Three steps; `wait` runs two minutes (with `tick`, printing a line a second) on a host that has the
    flag file /var/lib/gpuprov/slow-here, which it removes, so its next run is quick."""
    playbook = tmp_path / "slow.yml"
    wait = "echo tick >&2; sleep 1" if tick else "sleep 1"
    playbook.write_text(
        "name: slow\nstack: none\nenv: null\nsteps:\n"
        "  - name: first\n    run: echo first >> /var/lib/gpuprov/ran\n"
        "  - name: wait\n    run: |\n"
        "      echo wait >> /var/lib/gpuprov/ran\n"
        "      if [ -e /var/lib/gpuprov/slow-here ]; then\n"
        "        rm /var/lib/gpuprov/slow-here; touch /tmp/gp-started\n"
        f"        for i in $(seq 120); do {wait}; done\n"
        "      fi\n"
        "  - name: last\n    run: echo last >> /var/lib/gpuprov/ran\n"
    )
    return playbook


def when_started(pool, i, action) -> threading.Thread:
    def watch() -> None:
        for _ in range(600):
            if pool.exec_in(i, "test -e /tmp/gp-started").returncode == 0:
                action()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def runners_left(pool, i) -> list[int]:
    return pool.pids_in(i, r"runner[.]sh")


def test_a_connection_killed_mid_runner_resumes_at_the_step_it_was_running(host_pool, gp_home, tmp_path):
    pool = host_pool
    reset(pool, [2])
    pool.exec_in(2, "touch /var/lib/gpuprov/slow-here", check=True)
    playbook = slow_playbook(tmp_path, tick=False)  # silent: nothing tells the old runner its client is gone
    cutter = when_started(pool, 2, lambda: pool.kill_in(2, r"^sshd: root@"))  # every session, not the listener
    code, hosts = bootstrap(pool, [2], "-p", str(playbook))
    cutter.join()
    assert code == 1
    assert hosts[0]["result"] == "failed at wait"
    assert "connection lost" in hosts[0]["error"] and "resumes at this step" in hosts[0]["error"]
    assert by_step(hosts[0]) == {"first": "changed", "wait": "failed"}
    assert runners_left(pool, 2)  # the host never heard of the client going: its runner still waits in the step

    code, hosts = bootstrap(pool, [2], "-p", str(playbook))
    assert code == 0, hosts
    assert by_step(hosts[0]) == {"first": "skipped", "wait": "changed", "last": "changed"}
    assert pool.exec_in(2, "cat /var/lib/gpuprov/ran").stdout.split() == ["first", "wait", "wait", "last"]
    assert runners_left(pool, 2) == []  # the new run stopped the old one instead of racing it
    markers = pool.exec_in(2, "ls /var/lib/gpuprov/markers").stdout.split()
    assert sorted(markers) == ["first.sha256", "last.sha256", "wait.sha256"]


def link(pool, i, state: str) -> None:
    subprocess.run(["ip", "link", "set", f"v{pool[i].name}", state], check=True)


def slow_host(pool, i: int, tmp_path: Path, why: str) -> Path:
    """Host i, reset and flagged so its `wait` step runs two minutes printing a line a second; the playbook.
    Netns hosts only (`why`: what the test does to the host)."""
    if pool.mode != "netns":
        pytest.skip(f"{why}: needs the netns test hosts")
    reset(pool, [i])
    pool.exec_in(i, "touch /var/lib/gpuprov/slow-here", check=True)
    return slow_playbook(tmp_path, tick=True)


def test_a_host_that_vanishes_mid_step_is_lost_the_others_finish_and_a_rerun_resumes_it(host_pool, gp_home, tmp_path):
    pool = host_pool
    playbook = slow_host(pool, 4, tmp_path, "cuts a host's network link")
    hosts_used = [3, 4, 5]
    reset(pool, [3, 5])
    forkcli.warm()  # the fork server's start is not the command's time
    cutter = when_started(pool, 4, lambda: link(pool, 4, "down"))
    try:
        start = time.monotonic()
        code, hosts = bootstrap(pool, hosts_used, "-p", str(playbook), "--step-silence", "3")
        elapsed = time.monotonic() - start
        cutter.join()
    finally:
        link(pool, 4, "up")
    assert code == 1
    assert [h["status"] for h in hosts] == ["changed", "lost", "changed"], hosts
    lost = hosts[1]
    assert lost["result"] == "lost at wait"
    assert "no output for 3s" in lost["error"] and "the next run resumes at step wait" in lost["error"]
    assert by_step(lost) == {"first": "changed", "wait": "failed"}
    assert elapsed < 60  # bounded by --step-silence, not by the step's two minutes or TCP's retries

    pool.wait_up(4)
    code, hosts = bootstrap(pool, [4], "-p", str(playbook))
    assert code == 0, hosts
    assert by_step(hosts[0]) == {"first": "skipped", "wait": "changed", "last": "changed"}
    assert pool.exec_in(4, "cat /var/lib/gpuprov/ran").stdout.split() == ["first", "wait", "wait", "last"]
    assert runners_left(pool, 4) == []


def test_a_frozen_host_is_lost_after_the_silence_bound_and_a_rerun_resumes_it(host_pool, gp_home, tmp_path):
    """A machine that hangs with its network up: its kernel still acknowledges TCP, so neither TCP's timeout nor
    paramiko's keepalives (sent without asking for a reply) notice. Its sshd is stopped (SIGSTOP) mid-step: the
    step's output stops, and --step-silence ends the wait."""
    pool = host_pool
    playbook = slow_host(pool, 7, tmp_path, "freezes a host's own processes")
    frozen: list[int] = []
    freezer = when_started(pool, 7, lambda: frozen.extend(pool.kill_in(7, r"^sshd: root@", signal.SIGSTOP)))
    try:
        start = time.monotonic()
        code, hosts = bootstrap(pool, [7], "-p", str(playbook), "--step-silence", "3")
        elapsed = time.monotonic() - start
        freezer.join()
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert frozen, "nothing was frozen"
    assert code == 1
    assert hosts[0]["result"] == "lost at wait", hosts[0]["error"]
    assert "no output for 3s" in hosts[0]["error"] and "the next run resumes at step wait" in hosts[0]["error"]
    assert elapsed < 60  # bounded by --step-silence, not by the step's two minutes

    code, hosts = bootstrap(pool, [7], "-p", str(playbook))
    assert code == 0, hosts
    assert by_step(hosts[0]) == {"first": "skipped", "wait": "changed", "last": "changed"}
    assert runners_left(pool, 7) == []


def test_keepalives_from_the_ssh_config_find_a_vanished_host_without_a_silence_bound(host_pool, gp_home, tmp_path):
    pool = host_pool
    playbook = slow_host(pool, 6, tmp_path, "cuts a host's network link")
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  ServerAliveInterval 1\n  ServerAliveCountMax 3\n")
    cutter = when_started(pool, 6, lambda: link(pool, 6, "down"))
    try:
        start = time.monotonic()
        result = gpuprov("bootstrap", *addrs(pool, [6]), "-i", str(pool.key_path), "--accept-new-host-key",
                         "--os", "ubuntu-22.04", "--json", "-p", str(playbook), "--step-silence", "0",
                         "--ssh-config", str(config))
        elapsed = time.monotonic() - start
        cutter.join()
    finally:
        link(pool, 6, "up")
    host = json.loads(result.stdout)[0]
    assert result.returncode == 1
    # the step the client last heard of: `wait` once its start line arrived; on a loaded machine the cut can
    # beat that line, and the client honestly names `first` (whose done-marker the host has, so a rerun skips it)
    step = host["result"].removeprefix("lost at ")
    assert step in ("wait", "first"), host["error"]
    assert "keepalive every 1s, given up after 3s" in host["error"], host["error"]
    assert f"the next run resumes at step {step}" in host["error"]
    assert elapsed < 30  # 1 s x 3 unanswered, not TCP's ~15 minutes of retries


def test_output_that_comes_after_the_exit_status_is_not_lost(host_pool, gp_home, tmp_path):
    """sshd reports a command's exit as it happens; what a process it left behind still writes follows the
    status. A stream ends at the status *and* the end of the output, or the last lines (a verify probe, the
    runner's final events) go missing."""
    from gpuprov.hosts.remote import HostSettings, Remote
    from gpuprov.plan.inventory import Target

    pool = host_pool
    remote = Remote(Target(host=pool[0].address, user="root", port=pool[0].port, key=str(pool.key_path)),
                    HostSettings(known_hosts=tmp_path / "known_hosts", accept_new_host_key=True))
    remote.open()
    try:
        out: list[str] = []
        code = remote.stream("(sleep 0.5; echo late; exit 0) & echo early; exit 3", on_out=out.append,
                             on_err=lambda _text: None)
    finally:
        remote.close()
    assert code == 3
    assert "".join(out).split() == ["early", "late"]


# ---- the runner itself, in-process -------------------------------------------------------------------

def test_the_rendered_runner_is_bash_and_shellcheck_clean(tmp_path):
    from gpuprov.hosts import runner
    from gpuprov.plan.plan import GuardRequest, make_host_plan
    from gpuprov.plan.stack import StackPins
    from tests.test_guardrails import assert_bash_and_shellcheck_pass

    paths = []
    cpu = slow_playbook(tmp_path, tick=True)  # stack: none, playbook steps only
    for gpu, playbook, guard in (("H100", "minimal", None), ("T4", "pytorch", GuardRequest(autostop_seconds=600)),
                                 (None, str(cpu), None)):
        bundle = make_host_plan(gpu, playbook, "ubuntu-22.04", StackPins(python="3.11"), guard=guard).bundle()
        path = tmp_path / f"runner-{len(paths)}.sh"
        path.write_text(runner.render_runner(bundle))
        names = next(line for line in path.read_text().splitlines() if line.startswith("names=("))
        assert names == "names=(" + "".join(f"{s.name} " for s in bundle.scripts) + ")"
        paths.append(path)
    assert_bash_and_shellcheck_pass(paths)


def test_only_lines_with_the_runs_nonce_are_events_and_output_passes_through_whole():
    from gpuprov.hosts.runner import Lines, RunnerEvent, parse

    assert parse("@gpuprov:abc end driver 0 reboot 1500", "abc") == RunnerEvent("end", "driver", 0, "reboot", 1.5)
    assert parse("@gpuprov:abc checked driver failed", "abc") == RunnerEvent("checked", "driver", result="failed")
    assert parse("@gpuprov:abc done", "abc") == RunnerEvent("done")
    assert parse("@gpuprov:xyz done", "abc") is None  # another run's nonce: a step printed it
    assert parse("@gpuprov:abc end driver 0", "abc") is None  # malformed: output, not an event
    assert parse("GPUPROV_RESULT=changed", "abc") is None

    events: list[RunnerEvent] = []
    output: list[str] = []
    lines = Lines("abc", events.append, output.append)
    for chunk in ("@gpuprov:abc sta", "rt one\nhello ", "world\n@gpuprov:abc end one 0 changed 7\n", "tail"):
        lines.feed(chunk)
    lines.close()
    assert events == [RunnerEvent("start", "one"), RunnerEvent("end", "one", 0, "changed", 0.007)]
    assert output == ["hello world\n", "tail"]


def test_a_second_bootstrap_of_a_host_is_refused_while_the_first_runs_and_takeover_stops_it(host_pool, gp_home,
                                                                                            tmp_path):
    import sys

    pool = host_pool
    reset(pool, [1])
    pool.exec_in(1, "touch /var/lib/gpuprov/slow-here", check=True)
    playbook = slow_playbook(tmp_path, tick=True)
    args = ["bootstrap", *addrs(pool, [1]), "-i", str(pool.key_path), "--accept-new-host-key", "--os", "ubuntu-22.04",
            "--python", "3.11", "--json", "-p", str(playbook)]
    first = forkcli.Popen([sys.executable, "-m", "gpuprov", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    try:
        for _ in range(600):  # until the first run is in its long step
            if pool.exec_in(1, "test -e /tmp/gp-started").returncode == 0:
                break
            time.sleep(0.05)
        same = gpuprov(*args)  # this install again: its own lock says a run of it is alive
        assert same.returncode == 1
        (host,) = json.loads(same.stdout)
        assert f"is being worked on by gpuprov bootstrap (pid {first.pid}" in host["error"], host["error"]
        assert "--takeover" in host["error"]
        other = {**os.environ, "GPUPROV_HOME": str(tmp_path / "other-machine"), "COLUMNS": "200"}
        elsewhere = forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True,
                                env=other, timeout=120)  # another install: the host's runner lock says so
        assert elsewhere.returncode == 1
        (host,) = json.loads(elsewhere.stdout)
        assert "another gpuprov (" in host["error"] and "is bootstrapping this host" in host["error"], host["error"]
        assert first.poll() is None and len(runners_left(pool, 1)) == 1  # neither refusal touched the first run
        taken = forkcli.run([sys.executable, "-m", "gpuprov", *args, "--takeover"], capture_output=True, text=True,
                            env=other, timeout=180)
        assert taken.returncode == 0, taken.stdout + taken.stderr
        (host,) = json.loads(taken.stdout)
        assert by_step(host) == {"first": "skipped", "wait": "changed", "last": "changed"}
        first.communicate(timeout=60)
        assert first.returncode == 1  # its runner was stopped
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert runners_left(pool, 1) == []


def test_a_steps_log_travels_on_stdout_between_its_start_and_its_output(tmp_path):
    """sshd forwards stdout and stderr apart, so the client cannot order lines of one against the other: a step's
    first log line reached it before the step's `start` (into the last step's log section) under load. The runner
    sends a step's log on its stdout, ordered with the events; run here without SSH, the two streams are seen
    apart, as sshd sees them."""
    import subprocess

    from gpuprov.hosts import runner
    from gpuprov.plan.plan import make_host_plan
    from gpuprov.plan.stack import StackPins

    playbook = tmp_path / "two.yml"
    playbook.write_text("name: two\nstack: none\nenv: null\nsteps:\n"
                        "  - name: first\n    run: echo first-log-line\n"
                        "  - name: second\n    run: echo second-log-line; echo second-to-stderr >&2\n")
    bundle = make_host_plan(None, str(playbook), "ubuntu-22.04", StackPins(python="3.11")).bundle()
    state = tmp_path / "state"
    bundle_dir = state / "bundle"
    bundle.write(bundle_dir)
    (state / "markers").mkdir(parents=True)
    (bundle_dir / runner.RUNNER_FILE).write_text(runner.render_runner(bundle, str(state)))
    run = subprocess.run(["bash", str(bundle_dir / runner.RUNNER_FILE), "n0", "1", "0", "-", "me:test:1", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "log-line" not in run.stderr and "second-to-stderr" not in run.stderr  # nothing of a step's log apart
    out = run.stdout.splitlines()
    for step in ("first", "second"):
        start, output = out.index(f"@gpuprov:n0 start {step}"), out.index(f"@gpuprov:n0 output {step}")
        end = next(i for i, line in enumerate(out) if line.startswith(f"@gpuprov:n0 end {step} 0 "))
        assert start < output < end
        log = out[start + 1:output]
        assert any(line == f"{step}-log-line" for line in log), log  # the step's log, in its place
        assert out[output + 1:end] == ["GPUPROV_RESULT=changed"]  # then its stdout: the result line
    second = out[out.index("@gpuprov:n0 start second") + 1:out.index("@gpuprov:n0 output second")]
    assert "second-to-stderr" in second
def test_the_busy_check_asks_the_lock_only_while_the_recorded_runner_lives(host_pool):
    """The first exec's busy check (runner.busy_check), run in a host: another install's runner that is gone
    (its pid dead, or a live pid that holds no lock) lets the run on; one that holds the lock stops it (exit 75,
    naming it) unless --takeover; this install's own never does."""
    from gpuprov.hosts import runner

    pool = host_pool
    reset(pool, [7])
    lock = "/var/lib/gpuprov/runner.lock"

    def check(client: str = "mine:me@here:1", takeover: bool = False) -> subprocess.CompletedProcess[str]:
        return pool.exec_in(7, runner.busy_check(client, takeover) + "echo passed")

    assert check().stdout == "passed\n"  # never bootstrapped: no lock file at all
    pool.exec_in(7, f"mkdir -p /var/lib/gpuprov; echo '2147483646 1 other:them@there 1700000000' > {lock}.pid",
                 check=True)
    assert check().stdout == "passed\n"  # its runner's pid is dead: the lock is free
    inside = ["nsenter", "-t", str(pool.supervisor_pid(7)), "-n", "-m", "-u", "--"] if pool.mode == "netns" else []
    # its own process group: flock's child `sleep` holds the lock too, and goes with it
    holder = subprocess.Popen([*inside, "flock", lock, "sleep", "60"], start_new_session=True)
    try:
        for _ in range(200):  # until it holds the lock
            if pool.exec_in(7, f"flock -n {lock} true").returncode != 0:
                break
            time.sleep(0.02)
        pool.exec_in(7, f"echo '{holder.pid} 1 other:them@there 1700000000' > {lock}.pid", check=True)
        refused = check()
        assert refused.returncode == runner.BUSY and refused.stdout == ""
        assert "another gpuprov (other:them@there, its runner pid" in refused.stderr and "--takeover" in refused.stderr
        assert check(takeover=True).stdout == "passed\n"
        assert check(client="other:them@there:2").stdout == "passed\n"  # this install's own: its client lock decides
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    idle = subprocess.Popen(["sleep", "60"])  # a live process that holds no lock (its pid reused, say)
    try:
        pool.exec_in(7, f"echo '{idle.pid} 1 other:them@there 1700000000' > {lock}.pid", check=True)
        assert check().stdout == "passed\n"
    finally:
        idle.kill()
        idle.wait()
