"""Guardrails on the node: idle autostop, a hard TTL, and the spot interruption hook.

The guard steps are ordinary rendered steps; their checkers are small scripts installed on the
node that the tests run directly with an injected clock (GPUPROV_NOW), never with sleeps:
  - autostop and the interrupt watcher on the real-sshd test hosts (a real SSH connection keeps
    a node busy; the watcher talks to a metadata server on the pool's bridge address);
  - the TTL step and check locally under tests/shimrun.py (SSH adds nothing there).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuprov.errors import UserInputError
from gpuprov.plan.plan import Guards, NodeRequest, autostop_script, guard_steps, make_plan
from gpuprov.plan.render import environment, render_steps
from gpuprov.plan.spec import format_duration, parse_duration
from tests import forkcli
from tests.shimrun import ShimHost

SHELLCHECK = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))


def assert_bash_and_shellcheck_pass(paths: list[Path]) -> None:
    """Each script parses (`bash -n`) and shellcheck finds nothing at warning level or above."""
    for path in paths:
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, path.name
    assert SHELLCHECK, "shellcheck is not installed"
    check = subprocess.run([SHELLCHECK, "-S", "warning", "-f", "gcc", *map(str, paths)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout[:4000]
HOST_SYSROOT = "/var/lib/gpuprov-shim/root"  # what the pool's ssh sessions get as GPUPROV_SYSROOT
CHECK = f"{HOST_SYSROOT}/usr/local/lib/gpuprov/autostop-check"
WATCH = f"{HOST_SYSROOT}/usr/local/lib/gpuprov/interrupt-watch"
AUTOSTOP_HOST, INTERRUPT_HOST = 6, 7


def gpuprov(*args: str) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "200"})


# --- durations, plan, render ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1d", 86400),
                                               ("90s", 90), (" 8H ", 28800), ("off", None), (None, None)])
def test_parse_duration(text: str | None, seconds: int | None) -> None:
    assert parse_duration(text, "--ttl") == seconds
    if seconds:
        assert parse_duration(format_duration(seconds), "--ttl") == seconds


@pytest.mark.parametrize("text", ["", "30", "30x", "m", "1m30h", "-5m", "59s", "100d", "2 h"])
def test_bad_durations_name_the_flag(text: str) -> None:
    with pytest.raises(UserInputError) as err:
        parse_duration(text, "--autostop")
    assert err.value.exit_code == 2 and "--autostop" in str(err.value)


def test_plan_lists_the_guard_steps_and_render_writes_the_same_scripts(tmp_path: Path) -> None:
    flags = ["--gpu", "T4", "--spot", "--autostop", "30m", "--ttl", "8h", "--on-interrupt", "echo saved"]
    human = gpuprov("plan", *flags)
    assert human.returncode == 0, human.stderr
    for step in ("autostop", "ttl", "spot-interrupt"):
        assert step in human.stdout
    assert "30m idle" in human.stdout and "8h after" in human.stdout
    data = json.loads(gpuprov("plan", *flags, "--json", "--show-scripts").stdout)
    assert [s["name"] for s in data["steps"]][:3] == ["autostop", "ttl", "spot-interrupt"]
    assert all(s["kind"] == "guard" for s in data["steps"][:3])
    assert data["guards"]["autostop_seconds"] == 1800 and data["guards"]["ttl_seconds"] == 28800
    assert data["guards"]["on_interrupt"] == "echo saved"
    assert gpuprov("render", *flags, "-o", str(tmp_path / "b")).returncode == 0
    for name, text in data["scripts"].items():
        assert (tmp_path / "b" / name).read_text() == text
    plain = json.loads(gpuprov("plan", "--gpu", "T4", "--json").stdout)
    assert not [s for s in plain["steps"] if s["kind"] == "guard"]  # no flags, no guard steps


@pytest.mark.parametrize(("flag", "value"), [("--autostop", "30x"), ("--ttl", "soon"), ("--ttl", "10s")])
def test_bad_durations_exit_2(flag: str, value: str) -> None:
    for command in ("plan", "render", "up"):
        extra = ["-o", "/nonexistent/x"] if command == "render" else ["--yes"] if command == "up" else []
        result = gpuprov(command, "--gpu", "T4", flag, value, *extra)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert flag in result.stderr


def test_guard_templates_are_deterministic_and_shellcheck_clean(tmp_path: Path) -> None:
    variants = [
        Guards(autostop_seconds=1800, ttl_seconds=28800, interrupt_watch=True, on_interrupt="echo 'saved' $HOME"),
        Guards(interrupt_watch=True),
    ]
    scripts = [s for g in variants for s in render_steps(tuple(guard_steps(g)), {}, {}).scripts]
    scripts.append(autostop_script(None))
    again = [s for g in variants for s in render_steps(tuple(guard_steps(g)), {}, {}).scripts]
    assert [s.text for s in scripts[:4]] == [s.text for s in again]
    paths = []
    for i, s in enumerate(scripts):
        paths.append(tmp_path / f"{i}-{s.filename}")
        paths[-1].write_text(s.text)
        assert "{{" not in s.text and "{%" not in s.text and "gp_result()" in s.text
    for helper in ("guard_autostop_check", "guard_ttl_check", "guard_interrupt_watch"):
        paths.append(tmp_path / f"{helper}.sh")
        paths[-1].write_text(environment().get_template(f"{helper}.sh.j2").render())
    assert_bash_and_shellcheck_pass(paths)


# --- TTL, locally under the shims ----------------------------------------------------------------


def test_ttl_deadline_is_set_once_and_fires_at_it_not_before(tmp_path: Path) -> None:
    (step,) = [s for s in make_plan(NodeRequest(gpu="T4", ttl_seconds=28800)).bundle().scripts if s.name == "ttl"]
    host = ShimHost(tmp_path, gpu="T4", extra_env={"GPUPROV_NOW": "1000000"})
    first = host.run_script(step)
    assert first.result == "changed", first.stderr
    deadline = host.sysroot / "var/lib/gpuprov/ttl-deadline"
    assert deadline.read_text().split() == ["28800", str(1000000 + 28800)]
    assert (host.state / "enabled" / "gpuprov-ttl.timer").exists()
    assert "[Timer]" in (host.sysroot / "etc/systemd/system/gpuprov-ttl.timer").read_text()
    host.extra_env["GPUPROV_NOW"] = "1005000"  # a rerun later keeps the first deadline
    assert host.run_script(step).result == "unchanged"
    assert deadline.read_text().split() == ["28800", "1028800"]
    check = str(host.sysroot / "usr/local/lib/gpuprov/ttl-check")

    def tick(now: int) -> list[str]:
        env = {**host.env(), "GPUPROV_NOW": str(now)}
        subprocess.run(["bash", check], env=env, check=True, timeout=10)
        return [c for c in host.calls() if c.startswith("shutdown")]

    assert tick(1000000) == [] and tick(1028799) == []
    assert tick(1028800) == ["shutdown -h now gpuprov ttl: the 28800s deadline has passed"]
    assert "deadline" in (host.sysroot / "var/log/gpuprov/ttl.log").read_text()
    # a different TTL starts a new deadline from "now"
    (longer,) = [s for s in make_plan(NodeRequest(gpu="T4", ttl_seconds=3600)).bundle().scripts if s.name == "ttl"]
    assert host.run_script(longer).result == "changed"
    assert deadline.read_text().split() == ["3600", str(1005000 + 3600)]


# --- autostop and the interrupt watcher on the real-sshd hosts -----------------------------------


def _reset(pool, i: int, env: str = "") -> None:
    pool.exec_in(i, "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/* /tmp/gp-*; "
                    "mkdir -p /var/lib/gpuprov-shim; echo 'nvidia-open 580.95.05-0ubuntu1' > /var/lib/gpuprov-shim/installed; "
                    f"printf %s '{env}' > /var/lib/gpuprov-shim/env", check=True)


def _run_step(pool, i: int, text: str) -> str:
    b64 = base64.b64encode(text.encode()).decode()
    out = pool.exec_in(i, f"printf %s {b64} | base64 -d > /tmp/gp-step.sh && bash /tmp/gp-step.sh",
                       env={"GPUPROV_SYSROOT": HOST_SYSROOT})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def _shutdowns(pool, i: int) -> list[str]:
    calls = pool.exec_in(i, "cat /var/lib/gpuprov-shim/calls.log 2>/dev/null || true").stdout.splitlines()
    return [c for c in calls if c.startswith("shutdown")]


def test_autostop_shuts_down_only_after_a_whole_idle_window(host_pool) -> None:
    pool, i = host_pool, AUTOSTOP_HOST
    _reset(pool, i)
    (step,) = [s for s in make_plan(NodeRequest(gpu="T4", autostop_seconds=1800)).bundle().scripts
               if s.name == "autostop"]
    assert _run_step(pool, i, step.text) == "GPUPROV_RESULT=changed"
    assert _run_step(pool, i, step.text) == "GPUPROV_RESULT=unchanged"
    assert pool.exec_in(i, "test -e /var/lib/gpuprov-shim/enabled/gpuprov-autostop.timer").returncode == 0
    assert "IDLE_SECONDS=1800" in pool.exec_in(i, f"cat {HOST_SYSROOT}/etc/gpuprov/autostop.conf").stdout

    def tick(now: int, util: str = "0", who: str = "") -> list[str]:
        pool.exec_in(i, f"echo 'export GPUPROV_SHIM_GPU_COUNT=2 GPUPROV_SHIM_UTIL={util}' > /var/lib/gpuprov-shim/env; "
                        f"printf %s '{who}' > /var/lib/gpuprov-shim/who", check=True)
        pool.exec_in(i, CHECK, env={"GPUPROV_SYSROOT": HOST_SYSROOT, "GPUPROV_NOW": str(now)}, check=True)
        return _shutdowns(pool, i)

    t = 2_000_000
    # busy GPUs (one of two at 87%) for two windows: never
    assert [tick(t + m * 60, util="3,87") for m in range(0, 61, 20)][-1] == []
    # idle GPUs but someone logged in: never
    assert tick(t + 4000, who="ubuntu pts/0 2026-01-02 10:00 (203.0.113.9)\n") == []
    assert tick(t + 9000, who="ubuntu pts/0 2026-01-02 10:00 (203.0.113.9)\n") == []
    # idle from t+10000; busy again at t+11000 resets the window
    assert tick(t + 10000) == [] and tick(t + 11000, util="50") == []
    assert tick(t + 11500) == [] and tick(t + 13000) == []  # idle 1500s of 1800
    # a real SSH connection (no pty, so not in `who`) keeps it busy too
    ssh = subprocess.Popen(["ssh", "-i", str(pool.key_path), "-o", "StrictHostKeyChecking=no", "-o",
                            "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-p", str(pool[i].port),
                            f"root@{pool[i].address}", "echo up; sleep 20"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    try:
        assert ssh.stdout is not None and ssh.stdout.readline().strip() == "up"
        assert tick(t + 13400) == []
    finally:
        ssh.kill()
        ssh.wait()
    assert tick(t + 14000) == []  # the window restarted at 14000
    assert tick(t + 15799) == []
    assert tick(t + 15800) == ["shutdown -h now gpuprov autostop: idle for 1800s"]
    log = pool.exec_in(i, f"cat {HOST_SYSROOT}/var/log/gpuprov/autostop.log").stdout
    assert "idle window reset" in log and "shutting down" in log
    # off: the timer goes, the check does nothing
    assert _run_step(pool, i, autostop_script(None).text) == "GPUPROV_RESULT=changed"
    assert pool.exec_in(i, "test -e /var/lib/gpuprov-shim/enabled/gpuprov-autostop.timer").returncode != 0
    assert len(tick(t + 20000)) == len(tick(t + 30000)) == 1  # no second shutdown


class _Metadata:
    """A fake IMDSv2: token PUT (the TTL header is required), then GETs that must carry the token."""

    def __init__(self, host: str) -> None:
        self.notice: dict[str, str] | None = None
        self.puts = 0
        self.gets: list[int] = []
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: str) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_PUT(self) -> None:
                if self.path != "/latest/api/token" or self.headers.get("X-aws-ec2-metadata-token-ttl-seconds") != "21600":
                    return self._send(400, "bad token request")
                meta.puts += 1
                self._send(200, "tok-123")

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != "tok-123":
                    meta.gets.append(401)
                    return self._send(401, "")
                if self.path != "/latest/meta-data/spot/instance-action" or meta.notice is None:
                    meta.gets.append(404)
                    return self._send(404, "Not Found")
                meta.gets.append(200)
                self._send(200, json.dumps(meta.notice))

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def metadata(host_pool) -> Iterator[_Metadata]:
    host = f"{host_pool.subnet}.1" if host_pool.mode == "netns" else "127.0.0.1"
    meta = _Metadata(host)
    try:
        yield meta
    finally:
        meta.server.shutdown()
        meta.server.server_close()


def test_interrupt_watcher_runs_the_hook_once_per_notice(host_pool, metadata, gp_home, tmp_path) -> None:
    pool, i = host_pool, INTERRUPT_HOST
    _reset(pool, i, f"export GPUPROV_SHIM_CURL_PASSTHROUGH={metadata.url}\n")
    # through the real bootstrap: the playbook's on_interrupt installs the watcher on an existing host
    playbook = tmp_path / "spot.yml"
    playbook.write_text("name: spot\nstack: none\nenv: null\n"
                        "on_interrupt: 'echo saved $GPUPROV_INTERRUPT_ACTION; echo x >> /tmp/gp-hook-runs'\n")
    result = gpuprov("bootstrap", f"root@{pool[i].address}", "-i", str(pool.key_path), "--accept-new-host-key",
                     "--os", "ubuntu-22.04", "-p", str(playbook), "--connect-timeout", "3", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [(s["name"], s["outcome"]) for s in json.loads(result.stdout)[0]["steps"]] == [("spot-interrupt", "changed")]
    assert pool.exec_in(i, "test -e /var/lib/gpuprov-shim/enabled/gpuprov-interrupt").returncode == 0

    def once() -> tuple[str, str]:
        out = pool.exec_in(i, f"{WATCH} --once", env={"GPUPROV_SYSROOT": HOST_SYSROOT,
                                                      "GPUPROV_METADATA_URL": metadata.url}, timeout=20)
        assert out.returncode == 0, out.stderr
        runs = pool.exec_in(i, "cat /tmp/gp-hook-runs 2>/dev/null || true").stdout
        log = pool.exec_in(i, f"cat {HOST_SYSROOT}/var/log/gpuprov/interrupt.log 2>/dev/null || true").stdout
        return runs, log

    assert once() == ("", "")  # 404: nothing scheduled, nothing logged
    assert metadata.puts == 1 and metadata.gets == [404]
    metadata.notice = {"action": "terminate", "time": "2026-03-01T12:02:00Z"}
    runs, log = once()
    assert runs == "x\n"
    assert "action=terminate time=2026-03-01T12:02:00Z" in log and "saved terminate" in log and "exited 0" in log
    assert once()[0] == "x\n"  # the same notice: the hook does not run again
    metadata.notice = {"action": "stop", "time": "2026-03-01T13:02:00Z"}
    assert once()[0] == "x\nx\n"  # a new notice is a new interruption
    assert metadata.puts == 4 and metadata.gets == [404, 200, 200, 200]


# --- stop instead of terminate, `gpuprov ttl`, budgets (issue 11) --------------------------------


def test_guard_steps_say_what_shutdown_does_and_the_new_variants_are_shellcheck_clean(tmp_path: Path) -> None:
    from gpuprov.plan.plan import ttl_script

    keeps = make_plan(NodeRequest(gpu="T4", autostop_seconds=1800, ttl_seconds=3600))
    assert keeps.guards.shutdown_action == "stop"
    autostop = next(s for s in keeps.bundle().scripts if s.name == "autostop")
    assert "# a shutdown here: the instance stops (its disk is kept)" in autostop.text
    assert all("then the instance stops (its disk is kept)" in s.summary for s in keeps.steps if s.kind == "guard")
    one_time = make_plan(NodeRequest(gpu="T4", spot=True, autostop_seconds=1800))
    assert one_time.guards.shutdown_action == "terminate"
    assert make_plan(NodeRequest(gpu="T4", spot=True, persistent=True, autostop_seconds=60)).guards.shutdown_action == "stop"
    with pytest.raises(UserInputError, match="--autostop-action: a one-time spot instance cannot stop"):
        make_plan(NodeRequest(gpu="T4", spot=True, autostop_action="stop"))
    with pytest.raises(UserInputError, match="--persistent"):
        make_plan(NodeRequest(gpu="T4", persistent=True))
    scripts = [autostop, ttl_script(None), ttl_script(7200, "stop"), autostop_script(600, shutdown_action="stop")]
    paths = []
    for i, script in enumerate(scripts):
        paths.append(tmp_path / f"{i}.sh")
        paths[-1].write_text(script.text)
    assert_bash_and_shellcheck_pass(paths)


def test_ttl_can_be_reset_and_turned_off_and_a_node_started_after_its_deadline_gets_a_new_one(tmp_path: Path) -> None:
    from gpuprov.plan.plan import ttl_script

    (step,) = [s for s in make_plan(NodeRequest(gpu="T4", ttl_seconds=3600)).bundle().scripts if s.name == "ttl"]
    host = ShimHost(tmp_path, gpu="T4", extra_env={"GPUPROV_NOW": "1000000"})
    assert host.run_script(step).result == "changed"
    deadline = host.sysroot / "var/lib/gpuprov/ttl-deadline"
    check = str(host.sysroot / "usr/local/lib/gpuprov/ttl-check")

    def tick(now: int, boot: int) -> list[str]:
        env = {**host.env(), "GPUPROV_NOW": str(now), "GPUPROV_BOOT_TIME": str(boot)}
        subprocess.run(["bash", check], env=env, check=True, timeout=10)
        return [c for c in host.calls() if c.startswith("shutdown")]

    # `gpuprov ttl NODE 1h` again, later: the same TTL, but a new deadline from now
    host.extra_env["GPUPROV_NOW"] = "1002000"
    assert host.run_script(ttl_script(3600, "stop")).result == "changed"
    assert deadline.read_text().split() == ["3600", str(1002000 + 3600)]
    assert tick(1004000, boot=900000) == []
    assert len(tick(1005600, boot=900000)) == 1  # the node shuts down (and stops) at its deadline
    # `gpuprov start` boots it after the deadline: a new deadline one TTL after this boot, not a shutdown
    assert len(tick(1100030, boot=1100000)) == 1
    assert deadline.read_text().split() == ["3600", str(1100000 + 3600)]
    assert "started after the deadline" in (host.sysroot / "var/log/gpuprov/ttl.log").read_text()
    assert len(tick(1103600, boot=1100000)) == 2
    # off: the timer goes, the deadline file too
    off = host.run_script(ttl_script(None))
    assert off.result == "changed" and not deadline.exists()
    assert not (host.state / "enabled" / "gpuprov-ttl.timer").exists()
    assert host.run_script(ttl_script(None)).result == "unchanged"


def test_budget_becomes_the_deadline_when_it_runs_out_first() -> None:
    from gpuprov.plan.plan import budget_seconds, with_budget

    plan = make_plan(NodeRequest(gpu="T4", budget_usd=5.26))  # g4dn.xlarge lists at $0.526/h: 10h
    assert plan.guards.ttl_seconds == 36000 and plan.guards.budget_usd == 5.26
    assert "$5.26 budget at $0.526/h" in next(s.summary for s in plan.steps if s.name == "ttl")
    assert make_plan(NodeRequest(gpu="T4", budget_usd=5.26, ttl_seconds=3600)).guards.ttl_seconds == 3600
    assert budget_seconds(5, 0.25) == 72000
    assert with_budget(Guards(ttl_seconds=None), 5, 0.25).ttl_seconds == 72000
    with pytest.raises(UserInputError, match="--budget"):
        make_plan(NodeRequest(gpu="T4", budget_usd=0))


def test_ttl_and_autostop_change_on_a_host_bootstrapped_with_ttl(host_pool, gp_home, tmp_path) -> None:
    pool, i = host_pool, AUTOSTOP_HOST
    _reset(pool, i)
    playbook = tmp_path / "cpu.yml"
    playbook.write_text("name: cpu\nstack: none\nenv: null\n")
    host = f"root@{pool[i].address}"
    result = gpuprov("bootstrap", host, "-i", str(pool.key_path), "--accept-new-host-key", "--os", "ubuntu-22.04",
                     "-p", str(playbook), "--connect-timeout", "3", "--ttl", "8h", "--autostop", "30m")
    assert result.returncode == 0, result.stdout + result.stderr
    before = pool.exec_in(i, f"cat {HOST_SYSROOT}/var/lib/gpuprov/ttl-deadline", check=True).stdout.split()
    assert before[0] == "28800"

    changed = gpuprov("ttl", host, "2h", "-i", str(pool.key_path))
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "TTL 2h: shuts down at about" in changed.stdout
    ttl, deadline = pool.exec_in(i, f"cat {HOST_SYSROOT}/var/lib/gpuprov/ttl-deadline", check=True).stdout.split()
    assert ttl == "7200" and int(deadline) < int(before[1]) - 6 * 3600 + 60
    assert gpuprov("autostop", host, "1h", "-i", str(pool.key_path)).returncode == 0
    assert "IDLE_SECONDS=3600" in pool.exec_in(i, f"cat {HOST_SYSROOT}/etc/gpuprov/autostop.conf").stdout
    off = gpuprov("ttl", host, "off", "-i", str(pool.key_path))
    assert off.returncode == 0 and "TTL off" in off.stdout
    assert pool.exec_in(i, f"test -e {HOST_SYSROOT}/var/lib/gpuprov/ttl-deadline").returncode != 0
    unknown = gpuprov("ttl", "root@10.255.255.1", "1h", "-i", str(pool.key_path))
    assert unknown.returncode != 0 and "Traceback" not in unknown.stderr
