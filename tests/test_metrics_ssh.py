"""Issue 26 on real OpenSSH test hosts: `up --metrics` (moto + a test host) and `bootstrap --metrics` install the
exporters on the host's 127.0.0.1 only (the real prometheus-node-exporter runs in the host's network namespace;
dcgm-exporter and nv-hostengine are shims); `gpuprov metrics serve` holds the tunnels, reconnecting when the SSH
connection is cut; a real Prometheus (Debian's package, on 127.0.0.1) scrapes them through the file_sd list and a
PromQL query over its HTTP API returns the shimmed GPUs' readings with the machines' labels. The health watch
posts to the test's own HTTP server once for an Xid line the test writes into the host's kernel log and once for
a GPU that disappears, and not again within the hour (its clock injected with GPUPROV_NOW); its hook sees the
finding in its environment; `doctor` and `status` show what it found.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests import forkcli
from tests.aws.cli import gp, launch_site, nothing_left, up_args
from tests.prometheus import Prometheus, need
from tests.test_bootstrap_ssh import addrs, bootstrap, by_step, gpuprov, reset

SYSROOT = "/var/lib/gpuprov-shim/root"  # tests/conftest.py HOST_ENV
ON_HOST = ("--connect", "private", "--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11")
XID_79 = "{t} {host} kernel: NVRM: Xid (PCI:0000:{bus}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@pytest.fixture(autouse=True)
def _exporter_installed() -> None:
    """The test hosts run the machine's own prometheus-node-exporter (tools/sysdeps.sh installs it)."""
    need("/usr/bin/prometheus-node-exporter")


def serve(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return forkcli.Popen([sys.executable, "-m", "gpuprov", "metrics", "serve", *args], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM (as Ctrl-C): serve stops at once and exits 0; its stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def refused_from_outside(address: str, port: int) -> bool:
    """Nothing answers on the host's own address: the exporter is bound to its loopback only."""
    try:
        socket.create_connection((address, port), timeout=3).close()
    except ConnectionRefusedError:
        return True
    return False


def env_line(pool, i: int, **values: str) -> None:
    """Shim settings for the host's next shim calls (tests/shims/lib/common.sh sources the env file)."""
    pool.exec_in(i, "".join(f"echo 'export {k}={v}' >> /var/lib/gpuprov-shim/env; " for k, v in values.items()), check=True)


def kernel_log(pool, i: int, line: str) -> None:
    pool.exec_in(i, f"printf '%s\\n' {json.dumps(line)} >> /run/gpuprov-shim/kmsg", check=True)


def watch_once(pool, i: int, now: int) -> None:
    done = pool.exec_in(i, f"{SYSROOT}/usr/local/lib/gpuprov/health-watch --once",
                        env={"GPUPROV_SYSROOT": SYSROOT, "GPUPROV_NOW": str(now)})
    assert done.returncode == 0, done.stderr


def one_value(result: list[dict], **labels: str) -> float:
    (match,) = [r for r in result if all(r["metric"].get(k) == v for k, v in labels.items())]
    return float(match["value"][1])


# --- up --metrics: DCGM's exporter on a node gpuprov launched ------------------------------------


def test_up_metrics_then_prometheus_scrapes_the_nodes_gpu_through_serve(aws, env, aws_hosts, gp_home, tmp_path):
    pool = aws_hosts
    subnet = launch_site(aws, pool, gp_home)
    env_line(pool, 0, GPUPROV_SHIM_UTIL="37", GPUPROV_SHIM_TEMP="61")
    up = gp(env, *up_args("gpu1", "--gpu", "T4", "--subnet", subnet, *ON_HOST, "--metrics"))
    assert up.returncode == 0, up.stdout + up.stderr
    address = pool[0].address
    # the security group opens SSH only; the exporters answer on the node's loopback and nowhere else
    groups = aws.ec2().describe_security_groups(Filters=[{"Name": "tag:gpuprov:node", "Values": ["gpu1"]}])["SecurityGroups"]
    assert [p["FromPort"] for g in groups for p in g["IpPermissions"]] == [22]
    for port in (9100, 9400, 5555):
        assert refused_from_outside(address, port), port
    curl = "/usr/bin/curl -s"  # the real one: the shim's curl plays the internet
    inside = pool.exec_in(0, f"{curl} 127.0.0.1:9400/metrics; {curl} 127.0.0.1:9100/metrics", check=True).stdout
    assert re.search(r'^DCGM_FI_DEV_GPU_UTIL\{gpu="0",.*\} 37$', inside, re.M) and "node_uname_info" in inside
    calls = pool.exec_in(0, "cat /var/lib/gpuprov-shim/calls.log", check=True).stdout
    assert "datacenter-gpu-manager-4-cuda13" in calls and "datacenter-gpu-manager-exporter" in calls
    assert "dcgm-exporter -f /etc/gpuprov/dcgm-counters.csv -a 127.0.0.1:9400" in calls  # gpuprov's drop-in ran it

    file_sd = tmp_path / "sd" / "gpuprov.json"
    file_sd.parent.mkdir()
    proc = serve(env, "--file-sd", str(file_sd), "--base-port", "19510", "--poll", "1")
    try:
        with Prometheus(tmp_path / "prom", file_sd) as prom:
            util = prom.wait_for('DCGM_FI_DEV_GPU_UTIL{node="gpu1"}', lambda r: len(r) == 1)
            labels = util[0]["metric"]
            assert labels == {**labels, "node": "gpu1", "instance_type": "g4dn.xlarge", "gpu_model": "T4",
                              "exporter": "dcgm", "job": "gpuprov", "gpu": "0", "modelName": "Tesla T4"}
            assert labels["owner"].endswith("/" + (gp_home / "install-id").read_text().strip())  # user@host/ID
            assert float(util[0]["value"][1]) == 37
            temp = prom.wait_for('DCGM_FI_DEV_GPU_TEMP{node="gpu1"}', lambda r: len(r) == 1)
            assert float(temp[0]["value"][1]) == 61
            ups = prom.wait_for('up{node="gpu1"}', lambda r: len(r) == 2 and all(x["value"][1] == "1" for x in r))
            assert {u["metric"]["exporter"] for u in ups} == {"node", "dcgm"}
        targets = gp(env, "metrics", "targets", "--base-port", "19510")
        assert targets.returncode == 0 and json.loads(targets.stdout) == json.loads(file_sd.read_text())

        # a finding of the node's watch reaches `gpuprov status` through serve's poll
        kernel_log(pool, 0, XID_79.format(t="2026-12-01T21:30:00+0000", host=pool[0].name, bus="00:1e"))
        watch_once(pool, 0, 2_000_000)
        end = time.monotonic() + 30
        while "xid" not in (status := gp(env, "status")).stdout and time.monotonic() < end:
            time.sleep(0.5)
        said = r"health gpu1: \S+ xid: Xid 79 on GPU 0000:00:1e: GPU has fallen off the bus"
        assert re.search(said, status.stdout), status.stdout
        (row,) = json.loads(gp(env, "status", "--json").stdout)
        assert row["health"]["kind"] == "xid" and row["health"]["key"] == "xid-0000-00-1e-79"
        assert (gp_home / "health" / "gpu1.json").is_file()
    finally:
        err = stop(proc)
    assert "gpu1: serving 9100 on 127.0.0.1:19510, 9400 on 127.0.0.1:19511" in err, err
    _units_pass_systemd_analyze(pool, 0, tmp_path / "units", ("nvidia-dcgm-exporter.service", "nvidia-dcgm.service"))
    assert gp(env, "down", "gpu1", "--yes").returncode == 0
    assert not (gp_home / "health" / "gpu1.json").exists()  # a later gpu1 starts with no finding of this one's
    nothing_left(aws)


# --- bootstrap --metrics textfile --cluster: the real node exporter, a cluster's labels, reconnects ----


def test_a_clusters_textfile_metrics_reach_prometheus_and_serve_reconnects_a_cut_connection(host_pool, gp_home, tmp_path):
    pool = host_pool
    hosts = [5, 6]
    reset(pool, hosts, GPUPROV_SHIM_GPU="H100", GPUPROV_SHIM_GPU_COUNT="2")
    env_line(pool, 5, GPUPROV_SHIM_UTIL="11,22", GPUPROV_SHIM_TEMP="41,42")
    env_line(pool, 6, GPUPROV_SHIM_UTIL="33,44", GPUPROV_SHIM_TEMP="43,44")
    code, results = bootstrap(pool, hosts, "-p", "minimal", "--metrics", "textfile", "--cluster", "tm")
    assert code == 0, results
    assert by_step(results["hosts"][0])["metrics"] == "changed"
    for i in hosts:
        assert refused_from_outside(pool[i].address, 9100)
        assert pool.exec_in(i, "ss -Hltn 'sport = :9100'", check=True).stdout.split()[3] == "127.0.0.1:9100"
    again = bootstrap(pool, hosts[:1], "-p", "minimal", "--metrics", "textfile")
    assert again[0] == 0 and by_step(again[1][0])["metrics"] == "skipped"

    file_sd = tmp_path / "gpuprov.json"
    env = {**os.environ, "COLUMNS": "200"}
    proc = serve(env, "--file-sd", str(file_sd), "--base-port", "19530", "-i", str(pool.key_path))
    try:
        with Prometheus(tmp_path / "prom", file_sd) as prom:
            util = prom.wait_for('DCGM_FI_DEV_GPU_UTIL{cluster="tm"}', lambda r: len(r) == 4)
            assert {(u["metric"]["node"], u["metric"]["gpu"]): float(u["value"][1]) for u in util} == {
                ("tm:0", "0"): 11, ("tm:0", "1"): 22, ("tm:1", "0"): 33, ("tm:1", "1"): 44}
            assert {u["metric"]["exporter"] for u in util} == {"node"}  # learnt from the hosts' manifests
            temps = prom.wait_for('DCGM_FI_DEV_GPU_TEMP{node="tm:1"}', lambda r: len(r) == 2)
            assert one_value(temps, gpu="1") == 44
            errors = prom.wait_for("node_textfile_scrape_error", lambda r: len(r) == 2)
            assert all(e["value"][1] == "0" for e in errors)  # the node exporter parsed gpuprov's file

            # cut host 5's SSH connection (its sshd session processes, as a dropped link would); serve reconnects
            env_line(pool, 5, GPUPROV_SHIM_UTIL="55,66")
            assert pool.kill_in(5, r"^sshd: root", signal.SIGKILL)
            pool.exec_in(5, f"{SYSROOT}/usr/local/lib/gpuprov/gpu-metrics", env={"GPUPROV_SYSROOT": SYSROOT}, check=True)
            util = prom.wait_for('DCGM_FI_DEV_GPU_UTIL{node="tm:0",gpu="0"}', lambda r: r and r[0]["value"][1] == "55")
            assert prom.query('up{node="tm:0"}')[0]["value"][1] == "1"
    finally:
        err = stop(proc)
    assert "tm:0: the SSH connection dropped; trying again" in err and err.count("tm:0: serving 9100") == 2, err
    assert json.loads(file_sd.read_text())[0]["labels"] == {"node": "tm:0", "cluster": "tm", "exporter": "node"}
    _units_pass_systemd_analyze(pool, 5, tmp_path / "units", ("gpuprov-gpu-metrics.service", "gpuprov-gpu-metrics.timer"))


# --- the health watch's alerts ---------------------------------------------------------------------


class Hooks:
    """The test's webhook receiver, on the bridge the test hosts reach (their subnet's .1)."""

    def __init__(self, address: str, fail_first: int = 0) -> None:
        self.posts: list[tuple[str, dict]] = []
        self.fail_first = fail_first
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if hooks.fail_first:
                    hooks.fail_first -= 1
                    self.send_response(503)
                else:
                    hooks.posts.append((self.path, json.loads(body)))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks(host_pool):
    found = Hooks(f"{host_pool.subnet}.1")
    yield found
    found.close()


def test_the_watch_posts_an_xid_and_a_lost_gpu_once_each_within_the_hour_and_the_hook_sees_them(host_pool, gp_home, hooks):
    pool = host_pool
    i = 7
    reset(pool, [i], GPUPROV_SHIM_GPU="H100", GPUPROV_SHIM_GPU_COUNT="2", GPUPROV_SHIM_CURL_PASSTHROUGH=hooks.url)
    hook = 'printf "%s|%s|%s\\n" "$GPUPROV_ALERT_KIND" "$GPUPROV_ALERT_GPU" "$GPUPROV_ALERT_MESSAGE" >> /tmp/gp-alerts'
    code, results = bootstrap(pool, [i], "-p", "minimal", "--gpu", "H100:2", "--alert-webhook", f"{hooks.url}/services/T/B/k",
                              "--on-alert", hook)
    assert code == 0, results
    assert by_step(results[0])["health"] == "changed" and "metrics" not in by_step(results[0])
    t0 = 3_000_000
    watch_once(pool, i, t0)
    assert hooks.posts == []  # a healthy host: nothing to say
    kernel_log(pool, i, XID_79.format(t="2026-12-01T21:30:00+0000", host=pool[i].name, bus="64:00"))
    watch_once(pool, i, t0 + 15)
    (path, xid), = hooks.posts
    assert path == "/services/T/B/k" and xid["kind"] == "xid" and xid["gpu"] == "0000:64:00"
    assert "Xid 79 on GPU 0000:64:00: GPU has fallen off the bus: reboot the machine" in xid["text"]  # Slack's field
    env_line(pool, i, GPUPROV_SHIM_GPU_COUNT="1")  # the GPU is gone from the bus
    watch_once(pool, i, t0 + 30)
    assert [p[1]["kind"] for p in hooks.posts] == ["xid", "gpus-missing"]
    assert "1 of 2 GPUs answer nvidia-smi" in hooks.posts[1][1]["message"]
    for later in (t0 + 45, t0 + 600, t0 + 3600 + 29):
        watch_once(pool, i, later)
    assert len(hooks.posts) == 2  # not again within the hour (the Xid line is read once)
    watch_once(pool, i, t0 + 3600 + 30)
    assert [p[1]["kind"] for p in hooks.posts] == ["xid", "gpus-missing", "gpus-missing"]  # an hour on, still gone
    alerts = pool.exec_in(i, "cat /tmp/gp-alerts", check=True).stdout.splitlines()
    assert alerts[0] == f"xid|0000:64:00|{xid['message']}" and [a.split("|")[0] for a in alerts] == [
        "xid", "gpus-missing", "gpus-missing"]
    assert pool.exec_in(i, f"stat -c %a {SYSROOT}/etc/gpuprov/alert-webhook", check=True).stdout.strip() == "600"

    doctor = gpuprov("doctor", *addrs(pool, [i]), "-i", str(pool.key_path), "--json")
    (report,) = json.loads(doctor.stdout)
    assert doctor.returncode == 1  # a GPU fell off the bus: the host is not well
    checks = {c["name"]: c for c in report["findings"]}
    assert "GPU has fallen off the bus" in checks["xid 79"]["detail"] and checks["xid 79"]["severity"] == "fail"
    assert "1 of 2 GPUs answer nvidia-smi" in checks["health: gpus-missing"]["detail"]


def test_an_ntfy_webhook_gets_ntfys_json_at_the_servers_root_and_a_failed_post_is_retried(host_pool, gp_home):
    pool = host_pool
    i = 4
    hooks = Hooks(f"{pool.subnet}.1", fail_first=1)
    try:
        reset(pool, [i], GPUPROV_SHIM_GPU="A100", GPUPROV_SHIM_CURL_PASSTHROUGH=hooks.url)
        code, results = bootstrap(pool, [i], "-p", "minimal", "--health", "--alert-webhook",
                                  f"ntfy+{hooks.url}/gpu-alerts")
        assert code == 0, results
        kernel_log(pool, i, XID_79.format(t="2026-12-01T21:30:00+0000", host=pool[i].name, bus="10:1c"))
        watch_once(pool, i, 4_000_000)
        assert hooks.posts == []  # the server answered 503
        watch_once(pool, i, 4_000_015)
        (path, body), = hooks.posts
        assert path == "/" and body["topic"] == "gpu-alerts" and body["title"].startswith("gpuprov: xid on ")
        assert body["priority"] == 4 and "GPU has fallen off the bus" in body["message"]
        watch_once(pool, i, 4_000_030)
        assert len(hooks.posts) == 1
    finally:
        hooks.close()


# --- systemd accepts what the steps wrote ----------------------------------------------------------


def _units_pass_systemd_analyze(pool, i: int, root: Path, expected: tuple[str, ...]) -> None:
    """`systemd-analyze verify --root` on the units and drop-ins the steps wrote on host i (sysroot taken out), on
    top of the packages' own units (the shims' copies of the real files) and the machine's targets."""
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is missing (tools/sysdeps.sh installs the systemd package)"
    tar = pool.exec_in(i, f"tar -C {SYSROOT} -cf - etc/systemd/system lib/systemd/system usr/local/lib/gpuprov "
                          "etc/gpuprov 2>/dev/null | base64 -w0")
    root.mkdir(parents=True)
    subprocess.run(["tar", "-C", str(root), "-xf", "-"], input=__import__("base64").b64decode(tar.stdout), check=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True, dirs_exist_ok=True)
    # what the packages and the base system bring (the packaged node exporter unit reloads with /bin/kill)
    for stand_in in ("usr/bin/dcgm-exporter", "usr/bin/nv-hostengine", "usr/bin/prometheus-node-exporter", "bin/kill"):
        (root / stand_in).parent.mkdir(parents=True, exist_ok=True)
        (root / stand_in).write_text("#!/bin/sh\n")
        (root / stand_in).chmod(0o755)
    units = sorted(p.name for p in (root / "etc/systemd/system").iterdir() if p.suffix in (".service", ".timer"))
    units += sorted(p.name for p in (root / "lib/systemd/system").iterdir())
    for name in expected:
        assert name in units, (name, units)
    result = subprocess.run([tool, "verify", f"--root={root}", *units], capture_output=True, text=True,
                            env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
    noise = [line for line in (result.stdout + result.stderr).splitlines()
             if line.strip() and "Failed to put bus name" not in line]
    assert result.returncode == 0 and not noise, "\n".join(noise)
