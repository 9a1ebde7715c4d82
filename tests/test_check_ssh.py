"""`gpuprov check`, inventories, ~/.ssh/config and ProxyJump against real OpenSSH test hosts."""

from __future__ import annotations

import json

from tests.test_bootstrap_ssh import addrs, bootstrap, gpuprov, reset


def check(pool, hosts, *extra: str):
    result = gpuprov("check", *addrs(pool, hosts), "-i", str(pool.key_path), "--accept-new-host-key", "--json", *extra)
    return result.returncode, json.loads(result.stdout)


def checks_of(host: dict) -> dict[str, dict]:
    return {c["name"]: c for c in host["report"]["checks"]}


def test_check_after_bootstrap_passes_and_judges_against_the_manifest(host_pool, gp_home):
    pool = host_pool
    reset(pool, [0, 1], GPUPROV_SHIM_GPU="A100", GPUPROV_SHIM_GPU_COUNT="2")
    assert bootstrap(pool, [0, 1])[0] == 0
    code, hosts = check(pool, [0, 1])
    assert code == 0, [c for h in hosts for c in h["report"]["checks"] if not c["ok"]]
    for host in hosts:
        assert host["ok"], [c for c in host["report"]["checks"] if not c["ok"]]
        report = host["report"]
        assert len(report["gpus"]) == 2 and report["gpus"][0]["compute_cap"] == "8.0"
        assert report["torch"]["cuda"] == "13.2"  # the plan's cu132 wheel (torch 2.15's default)
        assert checks_of(host)["gpu model"]["ok"]
    human = gpuprov("check", *addrs(pool, [0]), "-i", str(pool.key_path))
    assert human.returncode == 0 and "OK" in human.stdout and "matmul gpu1" in human.stdout


def test_check_reports_failures_with_reason_and_fix_per_host(host_pool, gp_home):
    pool = host_pool
    reset(pool, [2, 3, 4])
    assert bootstrap(pool, [2, 3, 4])[0] == 0
    pool.exec_in(3, "echo 'export GPUPROV_SHIM_FAIL=nvml-mismatch' >> /var/lib/gpuprov-shim/env", check=True)
    pool.exec_in(4, "echo 'export GPUPROV_SHIM_FAIL=torch-newer-cuda' >> /var/lib/gpuprov-shim/env", check=True)
    code, hosts = check(pool, [2, 3, 4])
    assert code == 1
    ok, mismatch, newer = hosts
    assert ok["ok"], [c for c in ok["report"]["checks"] if not c["ok"]]
    smi = checks_of(mismatch)["nvidia-smi"]
    assert not smi["ok"] and "version mismatch" in smi["detail"] and "reboot" in smi["fix"]
    assert not checks_of(newer)["torch.cuda"]["ok"]
    assert not newer["ok"]


def test_check_unreachable_and_cpu_only_hosts(host_pool, gp_home):
    pool = host_pool
    reset(pool, [4])
    reset(pool, [5], GPUPROV_SHIM_GPU_COUNT="0")  # CPU only: no NVIDIA device on the bus, no driver
    reset(pool, [6], GPUPROV_SHIM_FAIL="no-gpu")  # a driver, but no GPU visible to it
    pool.kill_host(4)
    try:
        code, hosts = check(pool, [4, 5, 6], "--connect-timeout", "3")
    finally:
        pool.restart(4)
    assert code == 1
    unreachable, cpu_only, no_gpu = hosts
    assert unreachable["unreachable"] and not unreachable["ok"] and unreachable["report"] is None
    assert "timed out" in unreachable["error"].lower()
    assert not cpu_only["unreachable"] and not cpu_only["ok"]
    assert cpu_only["report"]["gpus"] == [] and cpu_only["report"]["torch"] is None
    assert "not installed" in checks_of(cpu_only)["nvidia-smi"]["detail"]
    assert not no_gpu["unreachable"]
    assert "no GPU visible" in checks_of(no_gpu)["nvidia-smi"]["detail"]


def test_inventory_ssh_config_alias_and_proxy_jump(host_pool, gp_home, tmp_path):
    pool = host_pool
    reset(pool, [6, 7], GPUPROV_SHIM_GPU="T4")
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        f"Host jumpbox\n  HostName {pool[6].address}\n  User root\n  IdentityFile {pool.key_path}\n\n"
        f"Host trainer\n  HostName {pool[7].address}\n  User root\n  Port 22\n  IdentityFile {pool.key_path}\n"
        "  ProxyJump jumpbox\n"
    )
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("hosts:\n  - host: trainer\n    name: trainer-a\n    gpu: T4\n")
    result = gpuprov("bootstrap", "--inventory", str(inventory), "--ssh-config", str(ssh_config), "-p", "minimal",
                     "--os", "ubuntu-24.04", "--accept-new-host-key", "--json")
    hosts = json.loads(result.stdout)
    assert result.returncode == 0, hosts
    assert hosts[0]["host"] == "trainer-a" and hosts[0]["status"] == "changed"
    # through the jump host: the target saw the connection come from host 6, not from the test machine
    log = (pool.base / pool[7].name / "sshd.log").read_text()
    accepted = [line for line in log.splitlines() if "Accepted publickey" in line]
    assert accepted and f"from {pool[6].address} " in accepted[-1]
    known = (gp_home / "known_hosts").read_text()
    assert pool[6].address in known and pool[7].address in known  # both hops pinned


def test_bad_inventory_is_exit_2_naming_line_and_field(gp_home, tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("defaults:\n  user: ubuntu\nhosts:\n  - host: 10.0.0.1\n    prot: 22\n")
    result = gpuprov("check", "--inventory", str(inventory))
    assert result.returncode == 2
    assert f"{inventory}:5" in result.stderr and "hosts.0.prot" in result.stderr and "port" in result.stderr


def test_bad_target_is_exit_2(gp_home):
    result = gpuprov("check", "root@bad;host")
    assert result.returncode == 2 and "[USER@]HOST[:PORT]" in result.stderr


def test_a_login_whose_shell_runs_no_command_is_named_on_its_row(host_pool, gp_home):
    """`nobody` (shell /usr/sbin/nologin) logs in with the pool's key and runs nothing: its row says so, naming the
    user and host, instead of a bug reading the shell's refusal as the host's facts."""
    pool = host_pool
    address = pool[3].address + (f":{pool[3].port}" if pool[3].port != 22 else "")
    result = gpuprov("check", f"nobody@{address}", "-i", str(pool.key_path), "--accept-new-host-key", "--json")
    assert "hit a bug" not in result.stderr and result.stdout.strip(), result.stderr
    (refused,) = json.loads(result.stdout)
    assert result.returncode == 1 and not refused["ok"] and refused["report"] is None
    assert refused["error"].startswith(f"nobody@{pool[3].address}: the login shell of nobody did not run the "
                                       "command (it said: This account is currently not available.)"), refused
