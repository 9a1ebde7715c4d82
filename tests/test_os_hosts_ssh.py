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
