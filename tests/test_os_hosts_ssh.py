"""Issue 25 on the real sshd test hosts (tests/hosts): each host's sysroot presents its OS (/etc/os-release), the
shims its GPU and driver. One bootstrap per mode, several hosts each, asserting what a user sees:

- a fixed-driver host (R550 installed by its provider, not by gpuprov's packages) with `--keep-driver`: no kernel,
  driver, Fabric Manager, persistence or reboot step runs, the torch wheel is one that runs on R550 (2.14+cu126,
  through CUDA minor-version compatibility) and verify passes on it; the host's package manager is never asked
  to install anything;
- a `stack: none` playbook on a Linux outside gpuprov's table (Arch) runs, where a GPU stack is refused.
"""

from __future__ import annotations

import json
import shlex

import pytest

from tests.test_bootstrap_ssh import addrs, by_step, calls, gpuprov, reset

ARCH = 'NAME="Arch Linux"\nID=arch\nBUILD_ID=rolling\nVERSION_ID=20261101\n'
UBUNTU = 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n'
DRIVER_STEPS = {"kernel-headers", "nouveau-off", "nvidia-driver", "fabric-manager", "persistence"}


def _os_release(pool, hosts, text: str) -> None:
    for i in hosts:
        pool.exec_in(i, "install -d -m 0755 /var/lib/gpuprov-shim/root/etc && printf %s "
                        f"{shlex.quote(text)} > /var/lib/gpuprov-shim/root/etc/os-release", check=True)


def _bootstrap(pool, hosts, *extra: str) -> tuple[int, list[dict], str]:
    result = gpuprov("bootstrap", *addrs(pool, hosts), "-i", str(pool.key_path), "--accept-new-host-key",
                     "--connect-timeout", "3", "--reboot-timeout", "30", "--json", *extra)
    try:
        return result.returncode, json.loads(result.stdout), result.stderr
    except json.JSONDecodeError:
        pytest.fail(f"bootstrap printed no JSON (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")


def test_a_fixed_driver_host_keeps_r550_and_gets_a_wheel_that_runs_on_it(host_pool, gp_home):
    pool = host_pool
    hosts = [0, 1]
    reset(pool, hosts, GPUPROV_SHIM_GPU="L4", GPUPROV_SHIM_DRIVER_PREINSTALLED="550.54.14")
    _os_release(pool, hosts, UBUNTU)
    code, out, err = _bootstrap(pool, hosts, "--keep-driver", "--python", "3.11")
    assert code == 0, json.dumps(out, indent=1) + err
    for i, host in zip(hosts, out, strict=True):
        steps = by_step(host)
        assert not DRIVER_STEPS & set(steps), steps
        assert list(steps) == ["python-env", "pytorch", "verify"]
        torch = host["report"]["torch"]
        assert torch["version"].endswith("+cu126") and torch["version"].startswith("2.14."), torch
        assert torch["is_available"] is True and all(d["matmul_ok"] for d in torch["devices"])
        log = calls(pool, i)
        assert not [c for c in log if c.startswith(("apt-get install", "dpkg -i", "apt-mark", "reboot"))], log
    # a rerun changes nothing
    code, again, err = _bootstrap(pool, hosts, "--keep-driver", "--python", "3.11")
    assert code == 0 and all(h["status"] == "ok" for h in again), (again, err)


def test_stack_none_runs_on_any_linux_but_a_gpu_stack_is_refused_there(host_pool, gp_home, tmp_path):
    pool = host_pool
    hosts = [2]
    reset(pool, hosts, GPUPROV_SHIM_GPU="L4")
    _os_release(pool, hosts, ARCH)
    book = tmp_path / "cpu.yml"
    book.write_text("name: cpu\nstack: none\nenv: {packages: [rich]}\n")
    code, out, err = _bootstrap(pool, hosts, "-p", str(book), "--python", "3.11")
    assert code == 0, (out, err)
    assert list(by_step(out[0])) == ["python-env", "packages"]
    code, out, err = _bootstrap(pool, hosts, "--gpu", "L4")
    assert code != 0 and out[0]["status"] == "failed"
    assert "runs arch-20261101; gpuprov's scripts support" in json.dumps(out[0]), out


NOSUDO = "gpuprov-nosudo"  # a login user without sudo, as a rented box's account is
NOSUDO_HOME = f"/var/lib/gpuprov-shim/home/{NOSUDO}"  # inside each test host's private shim mount: its own there


def test_a_login_without_root_keeps_r550_puts_the_env_in_its_home_and_skips_what_needs_root(host_pool, gp_home):
    from tests.machine import shared_user

    pool, i = host_pool, 3
    reset(pool, [i], GPUPROV_SHIM_GPU="L4", GPUPROV_SHIM_DRIVER_PREINSTALLED="550.54.14")
    _os_release(pool, [i], UBUNTU)
    root = "/var/lib/gpuprov-shim/root"
    login = [f"{NOSUDO}@{pool[i].address}"]
    base = ["bootstrap", *login, "-i", str(pool.key_path), "--accept-new-host-key", "--connect-timeout", "3",
            "--python", "3.11"]
    with shared_user(NOSUDO, home=NOSUDO_HOME):
        # the provider's driver made the device nodes at boot; the shims' own bookkeeping is writable by anyone (the
        # test's, not the host's: it records what the login ran)
        pool.exec_in(i, f"install -d -m 0755 {root}/dev && touch {root}/dev/nvidia0 {root}/dev/nvidiactl && cd "
                        "/var/lib/gpuprov-shim && touch calls.log installed held && chmod 0666 calls.log installed held "
                        "&& install -d -m 0777 enabled /run/gpuprov-shim/active && "
                        f"install -d -m 0755 home && install -d -o {NOSUDO} -m 0755 {NOSUDO_HOME}", check=True)
        refused = gpuprov(*base, "--json")  # a driver install needs root: refused, nothing done
        assert refused.returncode != 0 and "pass --keep-driver" in refused.stdout, refused.stdout + refused.stderr
        code, out, err = _bootstrap_as(base, "--keep-driver", "--autostop", "2h", "--docker")
        assert code == 0, json.dumps(out, indent=1) + err
        (host,) = out
        steps = by_step(host)
        assert steps == {"autostop": "skipped", "docker": "skipped", "python-env": "changed", "pytorch": "changed",
                         "verify": "unchanged"}, steps
        why = {s["name"]: s["message"] for s in host["steps"] if s["outcome"] == "skipped"}
        assert all("needs root, which this login lacks" in w for w in why.values()), why
        torch = host["report"]["torch"]  # a wheel that runs on R550, in the login's home
        assert torch["version"].startswith("2.14.") and torch["version"].endswith("+cu126"), torch
        assert torch["is_available"] is True and all(d["matmul_ok"] for d in torch["devices"]), torch
        env = f"{NOSUDO_HOME}/.gpuprov/env"
        owner = pool.exec_in(i, f"stat -c %U {env}/bin/python {NOSUDO_HOME}/.local/state/gpuprov/bundle/runner.sh; "
                                "ls -A /var/lib/gpuprov").stdout.split()
        assert owner == [NOSUDO, NOSUDO], owner  # nothing written as root, nothing in root's state folder
        log = calls(pool, i)
        assert not [c for c in log if c.startswith(("apt-get", "dpkg -i", "systemctl", "docker", "nvidia-ctk"))], log
        # a rerun, as a person reads it: nothing to do, and one line per step left out, saying why
        again = gpuprov(*base, "--keep-driver", "--autostop", "2h", "--docker")
    assert again.returncode == 0, again.stdout + again.stderr
    lines = [line for line in again.stdout.splitlines() if "skipped" in line and "needs root" in line]
    assert [line.split(":")[1].strip() for line in lines] == ["skipped autostop", "skipped docker"], again.stdout


def _bootstrap_as(base: list[str], *extra: str) -> tuple[int, list[dict], str]:
    result = gpuprov(*base, "--json", *extra)
    try:
        return result.returncode, json.loads(result.stdout), result.stderr
    except json.JSONDecodeError:
        pytest.fail(f"bootstrap printed no JSON (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
