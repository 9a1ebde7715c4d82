"""`gpuprov bootstrap` and `check` against real OpenSSH hosts with shimmed GPU tools.

Each test runs the real CLI in a subprocess, as a user would, and asserts on what the user and
the hosts see: results per host, the calls the shims recorded, markers, reboots, host keys.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import forkcli
from tests.shimrun import DMI_DIR, ec2_dmi

HOSTS = 8


def gpuprov(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def reset(pool, hosts=None, **shim_env: str) -> None:
    """Wipe gpuprov's and the shims' state on the hosts; optional per-host shim settings (with an instance
    type, the host's DMI says EC2, under its sysroot)."""
    dmi = ""
    if shim_env.get("GPUPROV_SHIM_INSTANCE_TYPE"):
        where = f"/var/lib/gpuprov-shim/root/{DMI_DIR}"  # conftest.HOST_ENV's GPUPROV_SYSROOT
        dmi = f"; mkdir -p {where}" + "".join(f"; printf %s {shlex.quote(text)} > {where}/{name}"
                                              for name, text in ec2_dmi().items())
    for i in hosts if hosts is not None else range(len(pool)):
        env = "".join(f"export {k}={v}\n" for k, v in shim_env.items())
        # the sysroot is the host's `/`: 0755, as a real root is (the runner's umask 077 would make it 0700)
        pool.exec_in(i, "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/* /tmp/gp-*; "
                        "install -d -m 0755 /var/lib/gpuprov-shim/root; "
                        f"printf %s '{env}' > /var/lib/gpuprov-shim/env" + dmi, check=True)


def calls(pool, i) -> list[str]:
    return pool.exec_in(i, "cat /var/lib/gpuprov-shim/calls.log 2>/dev/null || true").stdout.splitlines()


def addrs(pool, hosts) -> list[str]:
    return [f"root@{pool[i].address}" + (f":{pool[i].port}" if pool[i].port != 22 else "") for i in hosts]


def bootstrap(pool, hosts, *extra: str) -> tuple[int, list[dict]]:
    result = gpuprov("bootstrap", *addrs(pool, hosts), "-i", str(pool.key_path), "--accept-new-host-key",
                     "--os", "ubuntu-22.04", "--python", "3.11", "--connect-timeout", "3", "--reboot-timeout", "30",
                     "--json", *extra)
    try:
        return result.returncode, json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"bootstrap printed no JSON (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")


def by_step(host: dict) -> dict[str, str]:
    return {s["name"]: s["outcome"] for s in host["steps"]}


def test_parallel_bootstrap_reboots_verifies_and_a_rerun_changes_nothing(host_pool, gp_home):
    pool = host_pool
    reset(pool)
    boots = [pool.boots(i) for i in range(HOSTS)]
    code, hosts = bootstrap(pool, range(HOSTS))
    assert code == 0, hosts
    for i, host in enumerate(hosts):
        assert host["status"] == "changed", host
        steps = by_step(host)
        assert steps["nvidia-driver"] == "reboot"
        assert steps["verify"] == "unchanged"
        assert host["report"]["torch"]["is_available"] is True
        assert all(d["matmul_ok"] for d in host["report"]["torch"]["devices"])
        assert pool.boots(i) == boots[i] + 1  # the engine really rebooted it, once
        assert Path(host["log"]).is_file() and "GPUPROV_RESULT" in Path(host["log"]).read_text()
    installs_before = [sum("apt-get" in c and " install" in c for c in calls(pool, i)) for i in range(HOSTS)]

    code, again = bootstrap(pool, range(HOSTS))
    assert code == 0
    for i, host in enumerate(again):
        assert host["status"] == "ok"
        steps = by_step(host)
        # every step but verify is skipped by its marker; verify runs every time and judges the host again
        assert {name for name, outcome in steps.items() if outcome != "skipped"} == {"verify"}
        assert steps["verify"] == "unchanged"
        assert host["report"]["torch"]["is_available"] is True
        assert all(d["matmul_ok"] for d in host["report"]["torch"]["devices"])
        assert sum("apt-get" in c and " install" in c for c in calls(pool, i)) == installs_before[i]
        assert pool.boots(i) == boots[i] + 1  # no second reboot
    # -q at 60 columns: the summary alone (no line per step), and the log column kept (folded) for a failed host
    human = forkcli.run([sys.executable, "-m", "gpuprov", "bootstrap", *addrs(pool, range(2)), "-i", str(pool.key_path),
                         "--os", "ubuntu-22.04", "--python", "3.11", "-q"], capture_output=True, text=True,
                        timeout=180, env={**os.environ, "COLUMNS": "60"})
    assert human.returncode == 0 and "nothing to do" in human.stdout
    assert "verify" not in human.stderr, human.stderr
    assert [line for line in human.stdout.splitlines() if "host" in line and "log" in line], human.stdout
    assert not [line for line in human.stdout.splitlines() if "left out" in line and "log" in line], human.stdout


def test_force_reruns_every_step(host_pool, gp_home):
    pool = host_pool
    reset(pool, [0])
    assert bootstrap(pool, [0])[0] == 0
    code, hosts = bootstrap(pool, [0], "--force")
    assert code == 0
    assert "skipped" not in by_step(hosts[0]).values()


def test_unknown_host_key_is_refused_and_nothing_runs(host_pool, gp_home):
    pool = host_pool
    reset(pool, [1])
    result = gpuprov("bootstrap", *addrs(pool, [1]), "-i", str(pool.key_path), "--os", "ubuntu-22.04", "--json")
    assert result.returncode == 1
    host = json.loads(result.stdout)[0]
    assert "unknown host key" in host["error"] and "SHA256:" in host["error"]
    assert "--accept-new-host-key" in host["error"]
    assert calls(pool, 1) == []


def test_changed_host_key_is_refused_naming_both_fingerprints(host_pool, gp_home):
    pool = host_pool
    reset(pool, [2])
    assert bootstrap(pool, [2], "-p", "minimal")[0] == 0
    old = pool[2].host_key()
    pool.change_host_key(2)
    reset(pool, [2])
    code, hosts = bootstrap(pool, [2], "-p", "minimal")  # --accept-new-host-key does not override a pin
    assert code == 1
    error = hosts[0]["error"]
    assert "HOST KEY CHANGED" in error and pool[2].address in error
    from gpuprov.hosts.hostkeys import fingerprint

    assert fingerprint(old) in error and fingerprint(pool[2].host_key()) in error
    assert calls(pool, 2) == []


def test_unreachable_host_fails_within_timeout_and_others_succeed(host_pool, gp_home):
    pool = host_pool
    reset(pool, [3, 4, 5])
    pool.kill_host(5)
    forkcli.warm()  # the fork server's start is not the command's time
    try:
        start = time.monotonic()
        code, hosts = bootstrap(pool, [3, 4, 5], "-p", "minimal")
        elapsed = time.monotonic() - start
    finally:
        pool.restart(5)
    assert code == 1
    assert [h["status"] for h in hosts] == ["changed", "changed", "unreachable"]
    assert hosts[2]["result"] == "unreachable" and "timed out" in hosts[2]["error"].lower()
    assert elapsed < 40  # bounded by --connect-timeout, not by a TCP default of minutes


def test_gpu_mismatch_stops_the_host_before_anything_is_installed(host_pool, gp_home):
    pool = host_pool
    reset(pool, [6], GPUPROV_SHIM_GPU="T4")
    code, hosts = bootstrap(pool, [6], "--gpu", "H100")
    assert code == 1
    assert hosts[0]["result"] == "failed at plan"
    assert "T4" in hosts[0]["error"] and "H100" in hosts[0]["error"]
    assert not any("apt-get" in c for c in calls(pool, 6))


def test_an_inventorys_gpu_that_the_host_does_not_have_is_blamed_on_the_inventory(host_pool, gp_home, tmp_path):
    pool = host_pool
    reset(pool, [6], GPUPROV_SHIM_GPU="T4")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(f"defaults: {{user: root, key: {pool.key_path}}}\n"
                         f"hosts:\n  - {{host: {pool[6].address}, name: trainer-b, gpu: H100}}\n")
    result = gpuprov("bootstrap", "--inventory", str(inventory), "--accept-new-host-key", "--os", "ubuntu-22.04",
                     "--connect-timeout", "3", "--json")
    assert result.returncode == 1, result.stderr
    (host,) = json.loads(result.stdout)
    assert host["result"] == "failed at plan"
    assert host["error"].startswith(f"{inventory}: trainer-b.gpu: trainer-b has T4"), host["error"]  # not --gpu
    assert not any("apt-get" in c for c in calls(pool, 6))


def test_connection_killed_mid_step_fails_clearly_and_the_rerun_resumes_there(host_pool, gp_home, tmp_path):
    pool = host_pool
    reset(pool, [7])
    playbook = tmp_path / "slow.yml"
    playbook.write_text(
        "name: slow\nstack: none\nenv: null\nsteps:\n"
        "  - name: first\n    run: echo first >> /var/lib/gpuprov/ran\n"
        "  - name: slow\n    run: |\n"
        "      echo slow >> /var/lib/gpuprov/ran\n"
        "      if [ ! -e /var/lib/gpuprov/slow-once ]; then touch /var/lib/gpuprov/slow-once /tmp/gp-started; sleep 60; fi\n"
        "  - name: last\n    run: echo last >> /var/lib/gpuprov/ran\n"
    )

    def cut_when_started() -> None:
        for _ in range(300):
            if pool.exec_in(7, "test -e /tmp/gp-started").returncode == 0:
                pool.kill_in(7, r"^sshd: root@")  # every session of this host, not the listener
                return
            time.sleep(0.05)

    cutter = threading.Thread(target=cut_when_started)
    cutter.start()
    code, hosts = bootstrap(pool, [7], "-p", str(playbook))
    cutter.join()
    assert code == 1
    assert hosts[0]["result"] == "failed at slow"
    assert "connection lost" in hosts[0]["error"] and "resumes at this step" in hosts[0]["error"]

    code, hosts = bootstrap(pool, [7], "-p", str(playbook))
    assert code == 0, hosts
    assert by_step(hosts[0]) == {"first": "skipped", "slow": "changed", "last": "changed"}
    ran = pool.exec_in(7, "cat /var/lib/gpuprov/ran").stdout.split()
    assert ran == ["first", "slow", "slow", "last"]


def test_a_login_user_with_sudo_gets_the_same_result_as_root(host_pool, gp_home):
    from tests.conftest import SUDO_USER

    pool = host_pool
    reset(pool, [0])
    host = f"{SUDO_USER}@{pool[0].address}"
    result = gpuprov("bootstrap", host, "-i", str(pool.key_path), "--accept-new-host-key", "--os", "ubuntu-22.04",
                     "-p", "minimal", "--reboot-timeout", "30", "--json")
    hosts = json.loads(result.stdout)
    assert result.returncode == 0, hosts
    assert by_step(hosts[0])["nvidia-driver"] == "reboot"
    owners = pool.exec_in(0, "stat -c '%U %a' /var/lib/gpuprov /var/lib/gpuprov/bundle /var/lib/gpuprov/markers/*",
                          check=True).stdout.split("\n")
    assert owners[0] == "root 700" and all(line.startswith("root ") for line in owners if line)
    assert any(line.startswith("apt-get") for line in calls(pool, 0))  # the steps ran, as root, through sudo
    again = gpuprov("bootstrap", host, "-i", str(pool.key_path), "--os", "ubuntu-22.04", "-p", "minimal", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)[0]["status"] == "ok"


def test_existing_hosts_get_the_same_guardrails(host_pool, gp_home):
    pool = host_pool
    reset(pool, [1])
    code, hosts = bootstrap(pool, [1], "-p", "minimal", "--autostop", "45m", "--ttl", "2h",
                            "--on-interrupt", "echo checkpoint")
    assert code == 0, hosts
    steps = by_step(hosts[0])
    assert [s for s in steps if s in ("autostop", "ttl", "spot-interrupt")] == ["autostop", "ttl", "spot-interrupt"]
    root = "/var/lib/gpuprov-shim/root"
    assert "IDLE_SECONDS=2700" in pool.exec_in(1, f"cat {root}/etc/gpuprov/autostop.conf", check=True).stdout
    assert pool.exec_in(1, f"cat {root}/var/lib/gpuprov/ttl-deadline", check=True).stdout.split()[0] == "7200"
    bad = gpuprov("bootstrap", *addrs(pool, [1]), "--autostop", "soon")
    assert bad.returncode == 2 and "--autostop" in bad.stderr


def test_a_step_that_exits_non_zero_is_run_again_and_only_from_there(host_pool, gp_home, tmp_path):
    pool = host_pool
    reset(pool, [5])
    playbook = tmp_path / "flaky.yml"
    playbook.write_text(
        "name: flaky\nstack: none\nenv: null\nsteps:\n"
        "  - name: first\n    run: echo first >> /var/lib/gpuprov/ran\n"
        "  - name: flaky\n    run: |\n"
        "      echo flaky >> /var/lib/gpuprov/ran\n"
        "      if [ ! -e /var/lib/gpuprov/flaky-once ]; then touch /var/lib/gpuprov/flaky-once; exit 3; fi\n"
        "  - name: last\n    run: echo last >> /var/lib/gpuprov/ran\n"
    )
    code, hosts = bootstrap(pool, [5], "-p", str(playbook))
    assert code == 1
    assert hosts[0]["result"] == "failed at flaky" and "exit 3" in hosts[0]["error"]
    assert "last" not in by_step(hosts[0])

    code, hosts = bootstrap(pool, [5], "-p", str(playbook))  # the same scripts: only markers decide
    assert code == 0, hosts
    assert by_step(hosts[0]) == {"first": "skipped", "flaky": "changed", "last": "changed"}
    assert pool.exec_in(5, "cat /var/lib/gpuprov/ran").stdout.split() == ["first", "flaky", "flaky", "last"]


def test_a_module_that_does_not_load_after_the_reboot_is_retried_on_the_next_run(host_pool, gp_home):
    pool = host_pool
    reset(pool, [3], GPUPROV_SHIM_MODULE_LOAD="fail")  # e.g. Secure Boot rejects the module's key
    boots = pool.boots(3)
    code, hosts = bootstrap(pool, [3], "-p", "minimal")
    assert code == 1
    assert hosts[0]["result"] == "failed at nvidia-driver"
    assert "not loaded after the reboot" in hosts[0]["error"]
    assert pool.boots(3) == boots + 1

    # still broken: the next run does not take the reboot for success; it retries the driver step
    code, hosts = bootstrap(pool, [3], "-p", "minimal")
    assert code == 1
    assert hosts[0]["result"] == "failed at nvidia-driver", hosts[0]["error"]
    steps = by_step(hosts[0])
    assert steps["nvidia-driver"] == "failed" and steps["kernel-headers"] == "skipped"
    assert "modprobe nvidia" in calls(pool, 3)  # the step ran again: it tried to load the module
    assert pool.boots(3) == boots + 2

    # the user fixes it (enrolls the key); the rerun runs the driver step, then the rest, and verifies
    pool.exec_in(3, "rm -f /var/lib/gpuprov-shim/env", check=True)
    code, hosts = bootstrap(pool, [3], "-p", "minimal")
    assert code == 0, hosts
    steps = by_step(hosts[0])
    assert steps["nvidia-driver"] == "unchanged" and steps["verify"] == "unchanged"
    report = hosts[0]["report"]
    assert report["driver_version"] and report["gpus"]
    assert all(c["ok"] for c in report["checks"] if c["severity"] == "fail")


def test_a_loaded_nouveau_is_blacklisted_rebooted_away_and_the_driver_follows(host_pool, gp_home):
    pool = host_pool
    reset(pool, [2], GPUPROV_SHIM_NOUVEAU="loaded")
    boots = pool.boots(2)
    code, hosts = bootstrap(pool, [2], "-p", "minimal")
    assert code == 0, hosts
    steps = by_step(hosts[0])
    assert steps["nouveau-off"] == "reboot" and steps["nvidia-driver"] == "reboot"  # each checked for its own reboot
    assert pool.boots(2) == boots + 2
    code, hosts = bootstrap(pool, [2], "-p", "minimal")
    assert code == 0 and by_step(hosts[0])["nouveau-off"] == "skipped"
