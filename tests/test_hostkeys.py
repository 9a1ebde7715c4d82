"""Host-key pinning in-process (the SSH tests in test_bootstrap_ssh.py prove it against real sshd; these pin
each rule where mutation testing can see it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest

from gpuprov.hosts.hostkeys import (
    HostKeyChanged,
    PinPolicy,
    Revoked,
    RevokedHostKey,
    UnknownHostKey,
    explain,
    fingerprint,
    known_host_name,
    known_hosts_file,
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


# --- @revoked and @cert-authority (sshd(8), SSH_KNOWN_HOSTS FILE FORMAT) --------------------------


def _revoked(*patterns: str) -> Revoked:
    return Revoked(patterns, b"k", Path("kh"), 1)


def test_a_revocation_matches_hosts_as_openssh_patterns_do() -> None:
    assert _revoked("*").applies_to("10.0.0.5") and _revoked("*").applies_to("[10.0.0.5]:2222")
    assert _revoked("10.0.0.?").applies_to("10.0.0.5") and not _revoked("10.0.0.?").applies_to("10.0.0.55")
    assert _revoked("*.Example.COM").applies_to("gpu.example.com")  # names compare case-insensitively
    assert not _revoked("*", "!10.0.0.5").applies_to("10.0.0.5")  # a negated match wins over any other
    assert _revoked("*", "!10.0.0.5").applies_to("10.0.0.6")
    assert not _revoked("!10.0.0.5").applies_to("10.0.0.6")  # negation alone matches nothing
    assert _revoked("[10.0.0.5]:2222").applies_to("[10.0.0.5]:2222")  # brackets are literal, not a class
    assert not _revoked("[10.0.0.5]:2222").applies_to("1")
    hashed = paramiko.HostKeys.hash_host("10.0.0.5")
    assert _revoked(hashed).applies_to("10.0.0.5") and not _revoked(hashed).applies_to("10.0.0.6")


def test_marker_lines_are_read_and_a_revoked_key_is_neither_pinned_nor_accepted(keys, gp_home, tmp_path) -> None:
    key, _, other = keys
    user = Path(os.environ["HOME"]) / ".ssh" / "known_hosts"
    user.parent.mkdir()
    user.write_text(f"@cert-authority * ssh-ed25519 {other.get_base64()}\n"
                    f"10.0.0.5,10.0.0.6 ssh-ed25519 {key.get_base64()}\n"
                    f"@revoked 10.0.0.5 ssh-ed25519 {key.get_base64()}\n")
    known = tmp_path / "known_hosts"
    for host in ("10.0.0.5", "10.0.0.6"):
        client = paramiko.SSHClient()
        revoked = prepare_client(client, known, accept_new=True, trusted=(user,), host=host)
        if host == "10.0.0.6":  # the revocation names another host: the key pins as before
            assert revoked == () and client.get_host_keys().lookup(host)["ssh-ed25519"] == key
            continue
        assert len(revoked) == 1 and revoked[0].line == 3 and revoked[0].source == user
        assert client.get_host_keys().lookup(host) is None  # the revoked key is not pinned
        with pytest.raises(RevokedHostKey) as refused:  # and --accept-new-host-key does not pin it either
            client._policy.missing_host_key(client, host, key)
        assert "REVOKED" in str(refused.value) and f"{user} line 3" in str(refused.value)
        assert fingerprint(key) in str(refused.value) and not known.exists()
        assert isinstance(explain(paramiko.BadHostKeyException(host, key, other), revoked), RevokedHostKey)
        assert isinstance(explain(paramiko.BadHostKeyException(host, other, key), revoked), HostKeyChanged)
    assert known_hosts_file(user, strict=False).revoked[0].patterns == ("10.0.0.5",)


def test_the_users_revocations_hold_for_launched_nodes_too(keys, gp_home, tmp_path) -> None:
    """A node's own known_hosts is all it trusts, yet a key the user revoked is refused there too."""
    key, _, _ = keys
    user = Path(os.environ["HOME"]) / ".ssh" / "known_hosts"
    user.parent.mkdir()
    user.write_text(f"@revoked * ssh-ed25519 {key.get_base64()}\n")
    node = tmp_path / "node_known_hosts"
    pin(node, "203.0.113.7", key)
    client = paramiko.SSHClient()
    assert len(prepare_client(client, node, accept_new=False, host="203.0.113.7")) == 1
    assert client.get_host_keys().lookup("203.0.113.7") is None


def test_gpuprovs_own_file_may_hold_markers_but_not_garbage(keys, tmp_path) -> None:
    from gpuprov.errors import UserInputError

    key, _, _ = keys
    known = tmp_path / "known_hosts"
    known.write_text(f"@revoked * ssh-ed25519 {key.get_base64()}\n@cert-authority * ssh-ed25519 {key.get_base64()}\n")
    assert len(known_hosts_file(known, strict=True).revoked) == 1 and len(pinned_keys(known)) == 0
    known.write_text("10.0.0.5 ssh-ed25519 not-base64!\n")
    with pytest.raises(UserInputError, match="is not a host key"):
        pinned_keys(known)


def test_a_pin_is_a_whole_new_file(keys, tmp_path) -> None:
    key, _, other = keys
    known = tmp_path / "known_hosts"
    known.write_text(f"10.0.0.4 ssh-ed25519 {other.get_base64()}")  # no newline at the end: kept apart
    inode = known.stat().st_ino
    pin(known, "10.0.0.5", key)
    assert known.read_text().splitlines() == [f"10.0.0.4 ssh-ed25519 {other.get_base64()}",
                                              f"10.0.0.5 ssh-ed25519 {key.get_base64()}"]
    assert known.stat().st_ino != inode and known.stat().st_mode & 0o777 == 0o600


def test_a_moved_node_is_a_new_instance_whose_new_host_key_is_pinned_on_first_contact(host_pool, gp_home,
                                                                                     tmp_path) -> None:
    """`start --move` launches a new instance from an image of the node's disk, and cloud-init deletes an image's
    host keys on a new instance's first boot and makes new ones (cc_ssh, ssh_deletekeys, default true): the key
    pinned for the old instance is void, and the new one is pinned on first contact, as `up` pins a new node's.
    Here the new instance is a real sshd whose key is not the pinned one."""
    from gpuprov.cloud import timeline as tl
    from gpuprov.cloud.providers.base import Instance
    from gpuprov.cloud.stopstart import StartOptions, came_up
    from gpuprov.errors import GpuprovError
    from gpuprov.hosts import sshconfig
    from gpuprov.hosts.remote import HostSettings, Remote
    from gpuprov.paths import keys_dir, region_key
    from gpuprov.plan.inventory import Target
    from gpuprov.state import open_store

    pool = host_pool
    address = pool[7].address
    key = region_key(keys_dir(), "us-east-1")
    key.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(pool.key_path, key)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "old")], check=True)
    old_key = (tmp_path / "old.pub").read_text().split()[:2]
    pin = sshconfig.node_known_hosts("mv")
    pin.parent.mkdir(parents=True, exist_ok=True)
    pin.write_text(f"{address} {' '.join(old_key)}\n")  # the old instance's key
    store = open_store()
    store.create_node("mv", "aws", "us-east-1", state="starting", address="203.0.113.9", ssh_user="root",
                      instance_type="g4dn.xlarge", market="on-demand", connect="public")
    target = Target(host=address, user="root", key=str(key), label="mv")
    pinned = HostSettings(known_hosts=pin, accept_new_host_key=False, connect_timeout=10)

    def logs_in() -> bool:
        remote = Remote(target, pinned)
        try:
            remote.open()
            return remote.run("true").ok
        except GpuprovError:
            return False
        finally:
            remote.close()

    assert not logs_in()  # the new machine's key is not the pinned one: refused, as a changed key must be
    instance = Instance(id="i-new", region="us-east-1", zone="us-east-1b", instance_type="g4dn.xlarge",
                        state="running", market="on-demand", public_ip=address, private_ip=None, launched_at=None)
    said: list[str] = []
    came_up("mv", store.node("mv"), instance, StartOptions(bootstrap=False, ssh_timeout=30), "g4dn.xlarge", None,
            store, said.append, tl.Recorder("start", "mv"), new_instance=True)
    assert " ".join(old_key) not in pin.read_text() and logs_in()  # the new key pinned, and only it
    assert oct(pin.stat().st_mode & 0o777) == "0o600"
    assert any("new host key is pinned on first contact" in line for line in said), said
    assert store.node("mv").address == address and store.node("mv").zone == "us-east-1b"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """gpuprov as the user runs it, on the state dir and HOME of gp_home (set in the environment)."""
    import sys

    from tests import forkcli

    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=120)


def test_a_moved_node_whose_ssh_did_not_answer_is_pinned_by_the_first_command_that_reaches_it(host_pool, gp_home,
                                                                                                tmp_path) -> None:
    """`start --move` whose new instance does not answer SSH in time leaves no key pinned: the first gpuprov
    command (or `gpuprov ssh`, through OpenSSH's accept-new) that reaches it later pins its key, and then no
    other key is taken, as for any pinned node."""
    from gpuprov.cloud import timeline as tl
    from gpuprov.cloud.providers.base import Instance
    from gpuprov.cloud.stopstart import StartOptions, came_up
    from gpuprov.errors import GpuprovError
    from gpuprov.hosts import sshconfig
    from gpuprov.paths import keys_dir, region_key
    from gpuprov.state import open_store

    pool = host_pool
    h = pool[6]
    key = region_key(keys_dir(), "us-east-1")
    key.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(pool.key_path, key)
    key.chmod(0o600)
    pin = sshconfig.node_known_hosts("mv")
    pin.write_text(f"{h.address} ssh-ed25519 {_key(tmp_path, 'old')[0].get_base64()}\n")  # the old instance's
    store = open_store()
    store.create_node("mv", "aws", "us-east-1", state="starting", address="203.0.113.9", ssh_user="root",
                      instance_type="g4dn.xlarge", market="on-demand", connect="public")
    instance = Instance(id="i-new", region="us-east-1", zone="us-east-1b", instance_type="g4dn.xlarge",
                        state="running", market="on-demand", public_ip=h.address, private_ip=None, launched_at=None)
    pool.kill_host(h)  # the new instance's SSH does not answer in time
    try:
        with pytest.raises(GpuprovError, match="`gpuprov check mv` pins its new host key when SSH answers"):
            came_up("mv", store.node("mv"), instance, StartOptions(bootstrap=False, ssh_timeout=2), "g4dn.xlarge",
                    None, store, lambda line: None, tl.Recorder("start", "mv"), new_instance=True)
    finally:
        pool.restart(h)
    assert not pin.exists()  # the old instance's key is void, and no new one was seen
    assert "StrictHostKeyChecking accept-new" in (gp_home / "ssh_config").read_text()

    # gpuprov's own first contact pins the key the host presents
    ran = _cli("exec", "mv", "--", "true")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert pin.read_text().split() == [h.address, *h.host_key_pub.split()[:2]]

    # OpenSSH's first contact, through `gpuprov ssh`, pins it as well
    sshconfig.await_new_key("mv")  # as another move would leave it
    ran = _cli("ssh", "mv", "--", "true")
    assert ran.returncode == 0 and "not pinned" not in ran.stderr, ran.stdout + ran.stderr
    assert h.host_key_pub.split()[1] in pin.read_text()

    # the key is pinned: a host presenting another one is refused, by either path
    pool.change_host_key(h)
    for refused in (_cli("exec", "mv", "--", "true"), _cli("ssh", "mv", "--", "true")):
        assert refused.returncode != 0 and "HOST KEY" in refused.stdout + refused.stderr.upper(), refused.stderr
    sshconfig.add_node("mv", h.address, "root", str(key))  # the next `start` writes its block with `yes`
    assert "StrictHostKeyChecking yes" in (gp_home / "ssh_config").read_text()
