"""Host-key pinning in-process (the SSH tests in test_bootstrap_ssh.py prove it against real sshd; these pin
each rule where mutation testing can see it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest

from gpuprov.hosts.hostkeys import (
    HostKeyChanged,
    PinPolicy,
    UnknownHostKey,
    explain,
    fingerprint,
    known_host_name,
    pin,
    pinned_keys,
    prepare_client,
)


def _key(tmp_path: Path, name: str) -> tuple[paramiko.PKey, Path]:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path)), path.with_suffix(".pub")


@pytest.fixture
def keys(tmp_path: Path) -> tuple[paramiko.PKey, Path, paramiko.PKey]:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("needs ssh-keygen (openssh-client)")
    first, pub = _key(tmp_path, "a")
    second, _ = _key(tmp_path, "b")
    return first, pub, second


def test_fingerprint_is_what_ssh_keygen_prints(keys) -> None:
    key, pub, other = keys
    printed = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout
    assert printed.split()[1] == fingerprint(key)
    assert fingerprint(other) != fingerprint(key)


def test_known_host_name_brackets_other_ports() -> None:
    assert known_host_name("10.0.0.5", 22) == "10.0.0.5"
    assert known_host_name("10.0.0.5", 2222) == "[10.0.0.5]:2222"


def test_an_unknown_key_is_refused_with_its_fingerprint_and_nothing_is_pinned(keys, tmp_path) -> None:
    key, _, _ = keys
    known = tmp_path / "kh" / "known_hosts"
    client = paramiko.SSHClient()
    with pytest.raises(UnknownHostKey) as exc:
        PinPolicy(known, accept_new=False).missing_host_key(client, "10.0.0.5", key)
    assert exc.value.host == "10.0.0.5"
    assert fingerprint(key) in str(exc.value) and "--accept-new-host-key" in str(exc.value)
    assert not known.exists() and len(client.get_host_keys()) == 0


def test_accept_new_pins_the_key_0600_and_trusts_it_for_this_client(keys, tmp_path) -> None:
    key, _, other = keys
    known = tmp_path / "kh" / "known_hosts"
    client = paramiko.SSHClient()
    PinPolicy(known, accept_new=True).missing_host_key(client, "[10.0.0.5]:2222", key)
    assert known.read_text() == f"[10.0.0.5]:2222 ssh-ed25519 {key.get_base64()}\n"
    assert known.stat().st_mode & 0o777 == 0o600
    assert client.get_host_keys().lookup("[10.0.0.5]:2222")["ssh-ed25519"] == key
    pin(known, "10.0.0.6", other)  # a second pin appends
    assert known.read_text().splitlines()[1] == f"10.0.0.6 ssh-ed25519 {other.get_base64()}"


def test_prepare_client_checks_against_gpuprovs_known_hosts_only(keys, tmp_path) -> None:
    key, _, _ = keys
    known = tmp_path / "known_hosts"
    client = paramiko.SSHClient()
    prepare_client(client, known, accept_new=False)  # no file yet: nothing known, unknown keys refused
    assert len(client.get_host_keys()) == 0
    pin(known, "10.0.0.5", key)
    client = paramiko.SSHClient()
    prepare_client(client, known, accept_new=True)
    assert client.get_host_keys().lookup("10.0.0.5")["ssh-ed25519"] == key
    policy = client._policy  # paramiko keeps the policy here
    assert isinstance(policy, PinPolicy) and policy.accept_new is True and policy.known_hosts == known


def test_each_client_gets_its_own_hosts_pins_and_a_new_pin_is_seen(keys, tmp_path) -> None:
    """A fan-out parses the file once (not once per host), yet a key pinned mid-run counts for the next host."""
    key, _, other = keys
    known = tmp_path / "known_hosts"
    pin(known, "10.0.0.5", key)
    pin(known, "[10.0.0.6]:2222", other)
    client = paramiko.SSHClient()
    prepare_client(client, known, accept_new=False, host="10.0.0.5")
    assert client.get_host_keys().lookup("10.0.0.5")["ssh-ed25519"] == key
    assert client.get_host_keys().lookup("[10.0.0.6]:2222") is None and len(client.get_host_keys()) == 1
    assert pinned_keys(known) is pinned_keys(known)  # one parse while the file stays as it is
    pin(known, "10.0.0.7", other)
    client = paramiko.SSHClient()
    prepare_client(client, known, accept_new=False, host="10.0.0.7")
    assert client.get_host_keys().lookup("10.0.0.7")["ssh-ed25519"] == other


def test_pin_creates_the_folders_it_needs(keys, tmp_path) -> None:
    key, _, _ = keys
    deep = tmp_path / "state" / "ssh" / "known_hosts"
    pin(deep, "10.0.0.5", key)
    assert deep.read_text().startswith("10.0.0.5 ssh-ed25519 ")


def test_a_changed_key_names_the_host_and_both_fingerprints(keys, gp_home) -> None:
    from gpuprov.paths import known_hosts_path

    pinned, _, offered = keys
    changed = explain(paramiko.BadHostKeyException("10.0.0.5", offered, pinned))
    assert isinstance(changed, HostKeyChanged) and changed.host == "10.0.0.5"
    text = str(changed)
    assert "HOST KEY CHANGED" in text and "--accept-new-host-key" in text
    assert f"remove the old line for 10.0.0.5 from {known_hosts_path()} " in text and str(gp_home) in text
    assert text.index(fingerprint(pinned)) < text.index(fingerprint(offered))  # pinned first, then offered
