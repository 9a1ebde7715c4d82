"""SSH failures named plainly, through the CLI: refused, name not resolved, not an SSH server, no such key,
authentication failed (naming the key), host key unknown (with its fingerprint) or changed, a command
past `exec --timeout` (exit 124), and a word that is neither a node nor an address (not sent to DNS)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests import forkcli

ROOT = Path(__file__).resolve().parents[1]


def gp(*args: str, home: Path, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPROV_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "300", **env_extra}
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=120)


@pytest.fixture
def silent_port():
    """A TCP port that accepts connections and never says a word (not an SSH server)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def test_connection_refused_is_named(tmp_path: Path) -> None:
    port = closed_port()
    result = gp("check", f"127.0.0.1:{port}", "--connect-timeout", "3", home=tmp_path)
    assert result.returncode == 1
    assert f"connection refused on port {port}" in result.stdout
    assert "NoValidConnectionsError" not in result.stdout + result.stderr


def test_a_name_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    result = gp("exec", "gpu-box.invalid", "--connect-timeout", "3", "--", "true", home=tmp_path)
    assert result.returncode == 255
    assert "'gpu-box.invalid' does not resolve" in result.stderr and "gaierror" not in result.stderr


def test_a_port_that_is_not_ssh_is_named(tmp_path: Path, silent_port: int) -> None:
    result = gp("check", f"127.0.0.1:{silent_port}", "--connect-timeout", "2", home=tmp_path)
    assert result.returncode == 1
    assert "did not speak SSH" in result.stdout
    assert "No existing session" not in result.stdout and "authentication" not in result.stdout


def test_ssh_to_a_closed_port_does_not_blame_the_host_key(tmp_path: Path) -> None:
    result = gp("ssh", f"127.0.0.1:{closed_port()}", "--connect-timeout", "3", "--", "true", home=tmp_path)
    assert result.returncode == 255
    assert "not pinned" not in result.stderr and "Connection refused" in result.stderr


def test_a_missing_key_file_is_bad_input(tmp_path: Path) -> None:
    result = gp("check", "-i", str(tmp_path / "nope"), "10.0.0.1", home=tmp_path)
    assert result.returncode == 2 and "error: --identity: no such key file" in result.stderr


@pytest.mark.parametrize("word", ["trian", "gpu-box"])
def test_a_word_that_is_no_node_and_no_alias_is_not_sent_to_dns(tmp_path: Path, word: str) -> None:
    home = tmp_path / "home"
    os.environ["GPUPROV_HOME"] = str(home)
    try:
        from gpuprov.state import open_store

        open_store().create_node("train", "aws", "us-east-1", state="ready", address="203.0.113.9", ssh_user="ubuntu")
    finally:
        del os.environ["GPUPROV_HOME"]
    for command in (["ssh", word], ["exec", word, "--", "true"], ["check", word], ["monitor", word, "--once"]):
        result = gp(*command, home=home, HOME=str(tmp_path))
        assert result.returncode == 2, (command, result.stderr)
        assert f"error: HOST: no node called {word!r}" in result.stderr
        if word == "trian":
            assert "did you mean 'train'?" in result.stderr


def test_a_host_from_the_ssh_config_still_works(tmp_path: Path) -> None:
    port = closed_port()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host trian\n  HostName 127.0.0.1\n  Port {port}\n")
    result = gp("check", "--ssh-config", str(config), "trian", "--connect-timeout", "3", home=tmp_path / "home")
    assert result.returncode == 1 and f"connection refused on port {port}" in result.stdout  # tried, not refused up front
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(config.read_text())
    result = gp("check", "trian", "--connect-timeout", "3", home=tmp_path / "home", HOME=str(tmp_path))
    assert result.returncode == 1 and "connection refused" in result.stdout


# --- against a real sshd ------------------------------------------------------------------------


def test_auth_host_keys_and_timeout_over_real_ssh(host_pool, gp_home, tmp_path):
    from tests.test_access import key
    from tests.test_bootstrap_ssh import addrs

    pool = host_pool
    host = addrs(pool, [3])[0]

    unknown = gp("exec", host, *key(pool), "--", "true", home=gp_home)
    assert unknown.returncode == 255
    fingerprint = subprocess.run(["ssh-keygen", "-lf", "-"], input=pool[3].known_hosts_line(), capture_output=True,
                                 text=True).stdout.split()[1]
    assert "unknown host key" in unknown.stderr and fingerprint in unknown.stderr, unknown.stderr

    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    denied = gp("exec", host, "-i", str(wrong), "--accept-new-host-key", "--", "true", home=gp_home)
    assert denied.returncode == 255
    assert "authentication failed as 'root'" in denied.stderr and str(wrong) in denied.stderr, denied.stderr

    slow = gp("exec", host, *key(pool), "--timeout", "1", "--", "sleep", "20", home=gp_home)
    assert slow.returncode == 124, slow.stderr
    assert "still running after 1s" in slow.stderr

    changed = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(changed)], check=True)
    name = pool[3].known_hosts_line().split()[0]
    (gp_home / "known_hosts").write_text(f"{name} {' '.join(changed.with_suffix('.pub').read_text().split()[:2])}\n")
    refused = gp("exec", host, *key(pool), "--", "true", home=gp_home)
    assert refused.returncode == 255 and "HOST KEY CHANGED" in refused.stderr and fingerprint in refused.stderr


def test_hosts_included_into_the_ssh_config_count_as_known(tmp_path: Path) -> None:
    """gpuprov's own `Host gpuprov-NAME` entries reach ~/.ssh/config through an Include."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / "nodes.conf").write_text("Host gpuprov-train\n  HostName 127.0.0.1\n")
    (tmp_path / ".ssh" / "config").write_text(f"Include {tmp_path}/nodes.conf\nHost=alpha beta\n")
    for word in ("gpuprov-train", "beta"):
        result = gp("check", word, "--connect-timeout", "2", home=tmp_path / "home", HOME=str(tmp_path))
        assert "no node called" not in result.stderr and result.returncode == 1, result.stderr
    typo = gp("check", "gpuprov-trian", home=tmp_path / "home", HOME=str(tmp_path))
    assert typo.returncode == 2 and "did you mean 'gpuprov-train'?" in typo.stderr


def test_keys_in_the_users_known_hosts_count_as_pinned_and_a_different_one_is_refused(host_pool, gp_home, tmp_path):
    """`gp_home` sets HOME: bootstrapping a machine you already ssh into needs no --accept-new-host-key."""
    from tests.test_access import key
    from tests.test_bootstrap_ssh import addrs

    pool = host_pool
    host = addrs(pool, [2])[0]
    home = Path(os.environ["HOME"])
    (home / ".ssh").mkdir(exist_ok=True)
    user_known = home / ".ssh" / "known_hosts"
    user_known.write_text(pool[2].known_hosts_line() + "\n")
    for command in (["exec", host, *key(pool), "--", "true"], ["ssh", host, *key(pool), "--", "true"]):
        result = gp(*command, home=gp_home, HOME=str(home))
        assert result.returncode == 0, (command, result.stderr)
        assert "not pinned" not in result.stderr
    assert not (gp_home / "known_hosts").exists() or pool[2].address not in (gp_home / "known_hosts").read_text()

    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    name = pool[2].known_hosts_line().split()[0]
    user_known.write_text(f"{name} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    refused = gp("exec", host, *key(pool), "--accept-new-host-key", "--", "true", home=gp_home, HOME=str(home))
    assert refused.returncode == 255 and "HOST KEY CHANGED" in refused.stderr, refused.stderr


def test_each_connect_failure_has_its_own_words(tmp_path: Path) -> None:
    """The failures this machine cannot stage (a dropped SYN, an unreachable network) as the OS reports them."""
    import errno

    import paramiko

    from gpuprov.hosts.remote import HostSettings, Remote, why_unreachable
    from gpuprov.plan.inventory import Target

    remote = Remote(Target(host="10.9.8.7", user="ubuntu"), HostSettings(known_hosts=tmp_path / "kh", connect_timeout=4))
    said = {
        "timeout": why_unreachable(TimeoutError("timed out"), remote),
        "no route": why_unreachable(paramiko.ssh_exception.NoValidConnectionsError(
            {("10.9.8.7", 22): OSError(errno.EHOSTUNREACH, "No route to host")}), remote),
        "network": why_unreachable(OSError(errno.ENETUNREACH, "Network is unreachable"), remote),
        "refused": why_unreachable(paramiko.ssh_exception.NoValidConnectionsError(
            {("10.9.8.7", 22): ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")}), remote),
        "dns": why_unreachable(socket.gaierror(socket.EAI_NONAME, "Name or service not known"), remote),
        "auth": why_unreachable(paramiko.AuthenticationException("Authentication failed."), remote),
    }
    assert said["timeout"].startswith("timed out after 4s with no answer")
    assert said["no route"].startswith("no route to host") and said["network"].startswith("no route to host")
    assert said["refused"].startswith("connection refused on port 22")
    assert said["dns"].startswith("the name '10.9.8.7' does not resolve")
    assert said["auth"].startswith("authentication failed as 'ubuntu'; keys tried: the ssh agent's")
    assert len(set(said.values())) == len(said) - 1  # the two no-route cases read the same; the rest differ
