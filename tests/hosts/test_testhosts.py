"""Tests of the fake-host harness (tests/hosts/testhosts.sh + fixture.py), over real SSH with Fabric."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
import pytest

from tests import testnet

from .fixture import SCRIPT, HostPool, TestHost

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="fake hosts need root (netns, sshd root login)"),
    pytest.mark.slow,
    pytest.mark.heavy,  # its own pool of SSH test hosts
]

SHIMS = Path(__file__).resolve().parents[1] / "shims"
N = 8


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("testhosts")
    # own prefix/bridge/subnet/offset: may run while another (session-scoped) pool with the defaults is up
    with HostPool(
        N, base, shims_dir=SHIMS, offset=100, prefix=testnet.prefix("ght"), bridge=testnet.bridge("ghtbr0"),
        subnet=testnet.subnet("10.209.0"), loop_net=testnet.NET,
    ) as p:
        yield p


@pytest.fixture
def netns(pool: HostPool) -> HostPool:
    if pool.mode != "netns":
        pytest.skip(f"needs network namespaces; running in loopback mode: {pool.fallback_reason}")
    return pool


def run(h: TestHost, cmd: str, **kw) -> str:
    with h.connection() as c:
        return c.run(cmd, hide=True, **kw).stdout.strip()


def test_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed")
    sc = subprocess.run(
        ["shellcheck", str(SCRIPT), str(SHIMS / "bin" / "reboot"), str(SHIMS / "bin" / "shutdown")],
        capture_output=True,
        text=True,
    )
    assert sc.returncode == 0, sc.stdout


def test_all_hosts_answer_with_own_name(pool: HostPool) -> None:
    assert len(pool.hosts) == N
    with ThreadPoolExecutor(N) as ex:
        names = list(ex.map(lambda h: run(h, "hostname"), pool.hosts))
    if pool.isolated:
        assert names == [h.name for h in pool.hosts]
    assert len({h.host_key_pub for h in pool.hosts}) == N
    assert all(h.host_key_pub.startswith("ssh-ed25519 ") for h in pool.hosts)


def test_host_key_is_pinned_not_auto_added(pool: HostPool) -> None:
    h = pool.hosts[0]
    c = h.connection()
    assert isinstance(c.client._policy, paramiko.RejectPolicy)
    c.open()
    try:
        assert c.transport.get_remote_server_key().get_base64() == h.host_key_pub.split()[1]
    finally:
        c.close()


def test_var_lib_gpuprov_is_private_per_host(netns: HostPool) -> None:
    a, b = netns.hosts[0], netns.hosts[1]
    run(a, "echo from-a > /var/lib/gpuprov/a.txt")
    run(b, "echo from-b > /var/lib/gpuprov/b.txt")
    assert run(a, "ls /var/lib/gpuprov") == "a.txt"
    assert run(b, "ls /var/lib/gpuprov") == "b.txt"
    assert not Path("/var/lib/gpuprov/a.txt").exists()  # nothing leaks to the machine
    dirs = ("/tmp", "/root", "/var/lib/gpuprov-shim", "/run/gpuprov-shim")
    run(a, "; ".join(f"touch {d}/only-on-a" for d in dirs))
    seen = run(b, "; ".join(f"test -e {d}/only-on-a && echo {d} || true" for d in dirs))
    assert seen == ""


def test_shims_first_on_path_also_under_sudo(netns: HostPool) -> None:
    h = netns.hosts[0]
    assert run(h, "echo $PATH").startswith("/usr/local/gpuprov-shims/bin:")
    assert run(h, "command -v reboot") == "/usr/local/gpuprov-shims/bin/reboot"
    assert run(h, "sudo -n sh -c 'command -v shutdown'") == "/usr/local/gpuprov-shims/bin/shutdown"
    assert run(h, "bash -lc 'command -v reboot'") == "/usr/local/gpuprov-shims/bin/reboot"


def test_exec_in_and_shutdown_shim_records_args(netns: HostPool) -> None:
    h = netns.hosts[5]
    run(h, "shutdown -h +5 maintenance")
    r = netns.exec_in(5, "cat /var/lib/gpuprov-shim/calls.log; hostname")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["shutdown -h +5 maintenance", h.name]
    assert netns.state(5).startswith("up 1 ")  # no reboot without -r


def test_reboot_drops_connection_and_keeps_disk(netns: HostPool) -> None:
    h = netns.hosts[2]
    run(h, "echo keep > /var/lib/gpuprov/state; touch /run/gpuprov-shim/booted /tmp/t")
    boot_id = run(h, "cat /proc/sys/kernel/random/boot_id")
    boots = netns.boots(h)
    c = h.connection()
    t0 = time.monotonic()
    try:
        exited = c.run("reboot", hide=True, warn=True, timeout=20).exited
    except Exception as e:  # a dropped transport may also surface as an exception
        exited = repr(e)
    finally:
        c.close()
    assert exited != 0  # the session was killed: no clean exit status
    assert time.monotonic() - t0 < 5
    # back within 10 s, with the same (pinned) host key
    deadline = time.monotonic() + 10
    while True:
        try:
            out = run(
                h, "cat /var/lib/gpuprov/state; ls -A /run/gpuprov-shim; cat /proc/sys/kernel/random/boot_id"
            )
            break
        except (OSError, paramiko.SSHException, EOFError):
            assert time.monotonic() < deadline, "host did not come back within 10 s"
            time.sleep(0.1)
    lines = out.splitlines()
    assert lines[0] == "keep"  # /var/lib/gpuprov survived
    assert len(lines) == 2 and lines[1] != boot_id  # /run/gpuprov-shim emptied; new boot id
    assert netns.boots(h) == boots + 1
    assert "reboot" in netns.exec_in(h, "cat /var/lib/gpuprov-shim/calls.log").stdout
    assert run(h, "test -e /tmp/t && echo kept") == "kept"  # /tmp is not cleared by the simulated reboot


def test_pool_reboot_helper(netns: HostPool) -> None:
    h = netns.hosts[6]
    run(h, "touch /run/gpuprov-shim/booted")
    netns.reboot(h)
    assert run(h, "ls -A /run/gpuprov-shim") == ""


def test_kill_host_times_out_then_restart(pool: HostPool) -> None:
    h = pool.hosts[3]
    pool.kill_host(h)
    c = h.connection(connect_timeout=2)
    t0 = time.monotonic()
    with pytest.raises((socket.timeout, TimeoutError)):
        c.open()
    elapsed = time.monotonic() - t0
    assert 1.5 < elapsed < 3.5
    c.close()
    pool.restart(h)
    assert run(h, "echo ok") == "ok"


def test_change_host_key(pool: HostPool) -> None:
    h = pool.hosts[4]
    old = TestHost(**{**h.__dict__})
    new_pub = pool.change_host_key(h)
    assert new_pub != old.host_key_pub and h.host_key_pub == new_pub
    with pytest.raises(paramiko.BadHostKeyException):
        old.connection().open()
    assert run(h, "echo ok") == "ok"
    assert h.known_hosts_line() in pool.write_known_hosts().read_text()
