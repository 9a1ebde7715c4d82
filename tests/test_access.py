"""`gpuprov ssh | exec | tunnel | jupyter | sync | monitor` against real OpenSSH test hosts.

Each test runs the real CLI in a subprocess and checks what a user would see: output, exit
codes, bytes through the tunnel, files on both sides. Host keys are pinned first (written into
gpuprov's known_hosts, or by `exec --accept-new-host-key`); nothing ever turns checking off.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpuprov.errors import UserInputError
from gpuprov.hosts.access import parse_forward
from gpuprov.hosts.sshcli import split_sync, sync_host
from tests import forkcli
from tests.conftest import skip_or_fail
from tests.test_bootstrap_ssh import addrs, bootstrap, by_step, gpuprov, reset

SYSROOT = "/var/lib/gpuprov-shim/root"


def pin(pool, gp_home: Path, hosts) -> None:
    """Put the hosts' current keys into gpuprov's known_hosts (what --accept-new-host-key would pin)."""
    gp_home.mkdir(parents=True, exist_ok=True)
    with (gp_home / "known_hosts").open("a") as f:
        f.writelines(pool[i].known_hosts_line() + "\n" for i in hosts)


def key(pool) -> list[str]:
    return ["-i", str(pool.key_path)]


def start(*args: str) -> subprocess.Popen[str]:
    return forkcli.Popen([sys.executable, "-m", "gpuprov", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "COLUMNS": "200"})


def first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line:
        proc.kill()
        pytest.fail(f"no output (exit {proc.wait()}): {proc.stderr.read() if proc.stderr else ''}")
    return line


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=10)
        if code != 0:
            print(proc.stderr.read() if proc.stderr else "")
        return code
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("did not stop on SIGTERM")


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def serve_in_host(pool, i: int, command: str, name: str, port: int) -> None:
    """Start a server inside host i (detached, pid in /tmp/gp-NAME.pid) and wait until it listens there."""
    pool.exec_in(i, f"setsid nohup {command} >/tmp/gp-{name}.log 2>&1 </dev/null & echo $! >/tmp/gp-{name}.pid", check=True)
    probe = (f"python3 -c \"import socket,time\nfor _ in range(100):\n  try: socket.create_connection(('127.0.0.1',{port}),1)"
             f"; break\n  except OSError: time.sleep(0.1)\nelse: raise SystemExit(1)\"")
    assert pool.exec_in(i, probe).returncode == 0, pool.exec_in(i, f"cat /tmp/gp-{name}.log").stdout


def stop_in_host(pool, i: int, name: str) -> None:
    pool.exec_in(i, f"kill $(cat /tmp/gp-{name}.pid) 2>/dev/null || true; rm -f /tmp/gp-{name}.pid")


# --- ssh --------------------------------------------------------------------------------------


def test_ssh_runs_a_command_on_a_pinned_host_and_refuses_an_unpinned_one(host_pool, gp_home):
    pool = host_pool
    reset(pool, [0, 1])
    pin(pool, gp_home, [0])
    result = gpuprov("ssh", *addrs(pool, [0]), *key(pool), "--", "hostname")
    assert result.returncode == 0, result.stderr
    if pool.isolated:
        assert result.stdout.strip() == pool[0].name
    assert gpuprov("ssh", *addrs(pool, [0]), *key(pool), "--", "exit", "7").returncode == 7

    refused = gpuprov("ssh", *addrs(pool, [1]), *key(pool), "--", "touch", "/tmp/gp-ran")
    assert refused.returncode == 255
    assert "not pinned" in refused.stderr and "--accept-new-host-key" in refused.stderr
    assert "Host key verification failed" in refused.stderr  # ssh itself refused (StrictHostKeyChecking=yes)
    assert pool.exec_in(1, "test -e /tmp/gp-ran").returncode != 0


# --- exec -------------------------------------------------------------------------------------


def test_exec_streams_prefixed_complete_output_and_passes_exit_codes(host_pool, gp_home):
    pool = host_pool
    hosts = [0, 1, 2]
    reset(pool, hosts)
    codes = {pool[0].address: 0, pool[1].address: 3, pool[2].address: 0}
    # each host picks its exit code from the address it was reached on
    cases = " ".join(f"{a}) code={c};;" for a, c in codes.items())
    command = ["set", "--", "$SSH_CONNECTION;", "case", "$3", "in", cases, "esac;",
               "seq", "1", "2000", "|", "sed", "s/^/line-/;", "echo", "oops", ">&2;", "exit", "$code"]
    result = gpuprov("exec", *addrs(pool, hosts), "root@127.0.0.1:1", *key(pool), "--accept-new-host-key",
                     "--connect-timeout", "3", "--", *command)
    assert result.returncode == 3, result.stderr  # the first failure's code
    names = [pool[i].address if pool[i].port == 22 else f"{pool[i].address}:{pool[i].port}" for i in hosts]
    out = result.stdout.splitlines()
    for name in names:
        mine = [line.split(" | ", 1) for line in out if line.split(" | ", 1)[0].strip() == name]
        assert [text for _, text in mine] == [f"line-{n}" for n in range(1, 2001)], name  # complete, in order
        assert f"{name}" in result.stderr and any(
            line.split(" | ", 1)[0].strip() == name and line.endswith("| oops") for line in result.stderr.splitlines())
    assert len(out) == 3 * 2000
    assert "127.0.0.1:1" in result.stderr and "error:" in result.stderr  # the unreachable one, named
    assert "127.0.0.1:1: exit 255" in result.stderr and f"{names[1]}: exit 3" in result.stderr

    one = gpuprov("exec", *addrs(pool, [1]), *key(pool), "--", "echo", "hi;", "exit", "42")
    assert one.returncode == 42 and one.stdout.strip().endswith("| hi")
    ok = gpuprov("exec", *addrs(pool, [0, 2]), *key(pool), "--no-prefix", "--", "echo", "plain")
    assert ok.returncode == 0 and ok.stdout.splitlines() == ["plain", "plain"]
    assert gpuprov("exec", *addrs(pool, [0]), *key(pool)).returncode == 2  # no command


# --- tunnel -----------------------------------------------------------------------------------


def test_tunnel_forwards_a_local_port_to_a_server_bound_to_the_hosts_loopback(host_pool, gp_home):
    pool = host_pool
    reset(pool, [3])
    pin(pool, gp_home, [3])
    pool.exec_in(3, "mkdir -p /tmp/gp-www && echo hello-from-$(hostname) > /tmp/gp-www/index.html", check=True)
    serve_in_host(pool, 3, "python3 -m http.server 8765 --bind 127.0.0.1 --directory /tmp/gp-www", "http", 8765)
    try:
        proc = start("tunnel", *addrs(pool, [3]), "0:8765", *key(pool))
        try:
            url = first_line(proc)
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url)
            for _ in range(3):  # several connections through one tunnel
                status, body = fetch(url + "index.html")
                assert status == 200 and body.startswith("hello-from-")
                if pool.isolated:
                    assert body.strip() == f"hello-from-{pool[3].name}"
        finally:
            assert stop(proc) == 0
    finally:
        stop_in_host(pool, 3, "http")


def test_forward_and_sync_arguments():
    assert parse_forward("8888") == parse_forward("8888:8888")
    assert parse_forward("0:6006").local_port == 0 and parse_forward("9000:db:5432").remote_host == "db"
    for bad in ("0", "x", "1:2:3:4", "70000:1"):
        with pytest.raises(UserInputError):
            parse_forward(bad)
    assert split_sync("n1", "./a", "n1:b").upload and split_sync("n1", ":b", "./a").remote_path == "b"
    assert sync_host("./code", "exp1:/work/code") == "exp1"
    assert sync_host("ubuntu@[2001:db8::1]:out", "./out") == "ubuntu@[2001:db8::1]"
    assert sync_host("ubuntu@10.1.2.3:out/", "/tmp/x:y") == "ubuntu@10.1.2.3"  # a colon after a slash is local
    for pair in (("./a", "./b"), ("n1:a", "n2:b")):
        with pytest.raises(UserInputError):
            sync_host(*pair)
    with pytest.raises(UserInputError):
        split_sync("n1", "./a", "./b")


# --- jupyter ----------------------------------------------------------------------------------


def test_jupyter_step_makes_a_root_only_token_and_the_command_opens_it(host_pool, gp_home, tmp_path):
    pool = host_pool
    reset(pool, [4])
    playbook = tmp_path / "nb.yml"
    playbook.write_text("name: nb\nstack: none\nenv:\n  manager: uv\n  path: /opt/gpuprov/env\njupyter: true\n")
    code, hosts = bootstrap(pool, [4], "-p", str(playbook))
    assert code == 0, hosts
    assert by_step(hosts[0])["jupyter"] == "changed"
    token_file = f"{SYSROOT}/var/lib/gpuprov/jupyter-token"
    token = pool.exec_in(4, f"cat {token_file}", check=True).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{48}", token)
    assert pool.exec_in(4, f"stat -c '%a %u' {token_file}", check=True).stdout.split() == ["600", "0"]
    unit = pool.exec_in(4, f"cat {SYSROOT}/etc/systemd/system/gpuprov-jupyter.service", check=True).stdout
    assert "--ip=127.0.0.1" in unit and "EnvironmentFile=" in unit and token not in unit
    shim_calls = pool.exec_in(4, "cat /var/lib/gpuprov-shim/calls.log").stdout
    assert "systemctl enable --now gpuprov-jupyter" in shim_calls

    code, again = bootstrap(pool, [4], "-p", str(playbook), "--force")  # idempotent: same token, nothing to do
    assert code == 0 and by_step(again[0])["jupyter"] == "unchanged"
    assert pool.exec_in(4, f"cat {token_file}").stdout.strip() == token

    # systemd stands in: run the unit's ExecStart (its jupyter is the shim) with its EnvironmentFile
    exec_start = re.search(r"^ExecStart=\S+/jupyter (.*)$", unit, re.M)
    env_file = re.search(r"^EnvironmentFile=(.*)$", unit, re.M)
    assert exec_start and env_file
    serve_in_host(pool, 4, f"bash -c 'set -a; . {env_file.group(1)}; exec jupyter {exec_start.group(1)}'", "jupyter", 8888)
    try:
        proc = start("jupyter", *addrs(pool, [4]), *key(pool), "--accept-new-host-key", "--port", "0")
        try:
            url = first_line(proc)
            assert re.fullmatch(rf"http://127\.0\.0\.1:\d+/lab\?token={token}", url)
            status, body = fetch(url)
            assert status == 200 and "JupyterLab" in body
            assert fetch(url.replace(token, "0" * 48))[0] == 403
        finally:
            assert stop(proc) == 0
    finally:
        stop_in_host(pool, 4, "jupyter")

    reset(pool, [4])
    missing = gpuprov("jupyter", *addrs(pool, [4]), *key(pool), "--port", "0")
    assert missing.returncode == 1 and "jupyter: true" in missing.stderr


# --- sync -------------------------------------------------------------------------------------


def test_sync_round_trips_a_folder(host_pool, gp_home, tmp_path):
    if shutil.which("rsync") is None:
        skip_or_fail("needs rsync (tools/sysdeps.sh installs it)")
    pool = host_pool
    reset(pool, [5])
    pin(pool, gp_home, [5])
    (host,) = addrs(pool, [5])
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"a.txt": "alpha\n", "b.bin": "\x00\x01binary", "sub/c.txt": "gamma\n" * 1000, "with space.txt": "s\n"}
    for name, text in files.items():
        (src / name).write_text(text)
    pool.exec_in(5, "rm -rf /tmp/gp-sync", check=True)
    up = gpuprov("sync", host, *key(pool), f"{src}/", f"{host}:/tmp/gp-sync/")
    assert up.returncode == 0, up.stderr
    for name, text in files.items():
        assert pool.exec_in(5, f"cat '/tmp/gp-sync/{name}'", check=True).stdout == text
    pool.exec_in(5, "echo changed > /tmp/gp-sync/a.txt && echo new > /tmp/gp-sync/sub/d.txt", check=True)
    back = tmp_path / "back"
    down = gpuprov("sync", host, *key(pool), ":/tmp/gp-sync/", f"{back}/")
    assert down.returncode == 0, down.stderr
    got = {str(p.relative_to(back)): p.read_text() for p in back.rglob("*") if p.is_file()}
    assert got == {**files, "a.txt": "changed\n", "sub/d.txt": "new\n"}

    bad = gpuprov("sync", host, *key(pool), str(src), str(back))
    assert bad.returncode == 2 and "exactly one" in bad.stderr

    # a path the host lacks: rsync's own 23 (a partial copy) is gpuprov's 1, said with rsync's code
    partial = gpuprov("sync", host, *key(pool), ":/tmp/gp-no-such-file", f"{back}/")
    assert partial.returncode == 1, partial.stderr
    assert "error: rsync exited 23: some files were not copied: the copy is partial" in partial.stderr

    # rsync's shape: the host only in the remote side's HOST:PATH
    again = tmp_path / "again"
    assert gpuprov("sync", *key(pool), f"{src}/", f"{host}:/tmp/gp-sync2/").returncode == 0
    assert gpuprov("sync", *key(pool), f"{host}:/tmp/gp-sync2/", f"{again}/").returncode == 0
    assert {str(p.relative_to(again)): p.read_text() for p in again.rglob("*") if p.is_file()} == files
    neither = gpuprov("sync", *key(pool), str(src), str(back))
    assert neither.returncode == 2 and "error: SRC DST: exactly one" in neither.stderr


def test_sync_makes_dst_a_copy_of_src_whatever_the_slashes(host_pool, gp_home, tmp_path):
    """The README's `sync ./code train:code` then `torchrun train -- code/train.py`: ~/code/train.py, never
    ~/code/code/train.py (plain rsync's rule for a source without a slash); the same back; folders above DST
    are made; a file into a DST ending in / lands inside it."""
    if shutil.which("rsync") is None:
        skip_or_fail("needs rsync (tools/sysdeps.sh installs it)")
    pool = host_pool
    reset(pool, [5])
    pin(pool, gp_home, [5])
    (host,) = addrs(pool, [5])
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    pool.exec_in(5, "rm -rf /root/code /tmp/gp-deep", check=True)
    for src in ("./code", "./code/"):
        for dst in ("code", "code/"):
            result = forkcli.run([sys.executable, "-m", "gpuprov", "sync", *key(pool), src, f"{host}:{dst}"],
                                 capture_output=True, text=True, cwd=tmp_path, timeout=120)
            assert result.returncode == 0, result.stderr
            listed = pool.exec_in(5, "cd /root && find code -type f | sort", check=True).stdout.split()
            assert listed == ["code/train.py"], (src, dst, listed)
    back = tmp_path / "back"
    assert gpuprov("sync", *key(pool), f"{host}:code", str(back)).returncode == 0
    assert [p.name for p in back.iterdir()] == ["train.py"]
    deep = gpuprov("sync", *key(pool), str(code / "train.py"), f"{host}:/tmp/gp-deep/a/b/")
    assert deep.returncode == 0, deep.stderr
    assert pool.exec_in(5, "cat /tmp/gp-deep/a/b/train.py", check=True).stdout == "print('hi')\n"


@pytest.mark.heavy  # the OpenSSH client and rsync
def test_ssh_and_rsync_read_the_ssh_config_gpuprov_read(tmp_path, monkeypatch):
    """Whenever HOME is not the passwd home (sudo -E, containers, CI) the system ssh would read another
    ~/.ssh/config than gpuprov: it gets -F with gpuprov's."""
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.hosts.sshcli import ssh_argv
    from gpuprov.plan.inventory import Target

    monkeypatch.setenv("HOME", str(tmp_path))
    settings = HostSettings(known_hosts=tmp_path / "known_hosts")
    assert "-F" not in ssh_argv(Target(host="gpu-box"), settings)  # no config anywhere: ssh's own defaults
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host gpu-box\n  HostName 10.1.2.3\n")
    argv = ssh_argv(Target(host="gpu-box"), settings)
    assert argv[argv.index("-F") + 1] == str(tmp_path / ".ssh" / "config")
    mine = tmp_path / "mine.conf"
    mine.write_text("")
    argv = ssh_argv(Target(host="gpu-box"), HostSettings(known_hosts=tmp_path / "k", ssh_config=mine))
    assert argv[argv.index("-F") + 1] == str(mine)


# --- monitor ----------------------------------------------------------------------------------


def test_monitor_into_a_file_prints_a_table_per_sample(host_pool, gp_home, tmp_path):
    """`monitor NODE > file`: without a terminal a live display draws nothing; a table per sample instead."""
    import time

    pool = host_pool
    reset(pool, [7], GPUPROV_SHIM_GPU="T4", GPUPROV_SHIM_GPU_COUNT="1")
    pool.exec_in(7, "echo 'nvidia-open 580.95.05-0ubuntu1' > /var/lib/gpuprov-shim/installed", check=True)
    out = tmp_path / "monitor.txt"
    with out.open("w") as f:
        proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "monitor", *addrs(pool, [7]), *key(pool),
                                 "--accept-new-host-key", "--interval", "0.2"], stdout=f, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "COLUMNS": "120"})
        try:
            deadline = time.monotonic() + 30
            while out.read_text().count("Tesla T4") < 2 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
    assert out.read_text().count("Tesla T4") >= 2, out.read_text()  # two samples, each its own table




def test_monitor_once_json_samples_every_gpu_of_several_hosts(host_pool, gp_home):
    pool = host_pool
    if not pool.isolated:
        skip_or_fail("per-host shim GPUs need isolated hosts")
    # readings of a busy node, different per GPU, so each value in the output can only come from its own GPU
    reset(pool, [6], GPUPROV_SHIM_GPU="H100", GPUPROV_SHIM_GPU_COUNT="2", GPUPROV_SHIM_UTIL="37,93",
          GPUPROV_SHIM_TEMP="41,78", GPUPROV_SHIM_POWER="250.5,612.25", GPUPROV_SHIM_MEM_USED="1024,70123")
    reset(pool, [7], GPUPROV_SHIM_GPU="T4", GPUPROV_SHIM_GPU_COUNT="1", GPUPROV_SHIM_UTIL="12",
          GPUPROV_SHIM_TEMP="55", GPUPROV_SHIM_POWER="33.3", GPUPROV_SHIM_MEM_USED="4321")
    for i in (6, 7):  # a loaded driver, as after a bootstrap
        pool.exec_in(i, "echo 'nvidia-open 580.95.05-0ubuntu1' > /var/lib/gpuprov-shim/installed", check=True)
    result = gpuprov("monitor", *addrs(pool, [6, 7]), *key(pool), "--accept-new-host-key", "--once", "--json")
    assert result.returncode == 0, result.stderr
    h100, t4 = json.loads(result.stdout)
    assert h100["host"] == pool[6].address and h100["ok"] and h100["error"] is None
    assert [g["name"] for g in h100["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    readings = [(g["index"], g["utilization_pct"], g["temperature_c"], g["power_w"], g["memory_used_mib"],
                 g["memory_total_mib"]) for g in h100["gpus"]]
    assert readings == [(0, 37, 41, pytest.approx(250.5), 1024, 81559), (1, 93, 78, pytest.approx(612.25), 70123, 81559)]
    assert [(g["name"], g["utilization_pct"], g["temperature_c"], g["power_w"], g["memory_used_mib"])
            for g in t4["gpus"]] == [("Tesla T4", 12, 55, pytest.approx(33.3), 4321)]

    table = gpuprov("monitor", *addrs(pool, [6, 7]), *key(pool), "--once")
    assert table.returncode == 0 and "H100" in table.stdout and "Tesla T4" in table.stdout and "°C" in table.stdout
    assert "93" in table.stdout and "78" in table.stdout and "55" in table.stdout
    reset(pool, [7], GPUPROV_SHIM_FAIL="no-gpu")
    failed = gpuprov("monitor", *addrs(pool, [6, 7]), *key(pool), "--once", "--json")
    assert failed.returncode == 1
    assert [h["ok"] for h in json.loads(failed.stdout)] == [True, False]
