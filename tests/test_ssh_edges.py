"""SSH edge cases that hung or crashed, through the real CLI (issue 20, section 5):

- a server that sends its SSH banner and then says nothing more: `ssh`, `sync`, `exec` and `check` all give up
  within their bound, with words that say so (the system ssh hung forever);
- `@cert-authority` and `@revoked` lines in ~/.ssh/known_hosts: the first is skipped, a key the second names
  is refused (by gpuprov's own connections and by the system ssh), and nothing crashes;
- 8 MB of `exec` output arrives whole (the capture was quadratic: bench/exec_output.py times it);
- a bootstrap step that prints a lot keeps only the head and the tail of its output in the host's log, says
  how much it dropped, and `--verbose` still shows every line.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import forkcli
from tests.conftest import skip_or_fail
from tests.test_access import key, pin
from tests.test_bootstrap_ssh import addrs, bootstrap, reset


def gp(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=timeout,
                       env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **env})


# --- a banner, then silence -------------------------------------------------------------------


@pytest.fixture
def banner_then_silence() -> Iterator[int]:
    """A TCP port whose server sends an SSH identification line and then never another byte (a hung sshd,
    or something in between that stalls the key exchange)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn = server.accept()[0]
                conn.sendall(b"SSH-2.0-x\r\n")
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.heavy  # the OpenSSH client and rsync
def test_every_command_gives_up_on_a_server_that_stalls_after_its_banner(banner_then_silence, gp_home, tmp_path):
    """The bound is --connect-timeout (2 s here); a subprocess timeout of 40 s stands for "forever": before,
    `ssh` and `sync` were still waiting when it struck."""
    if shutil.which("ssh") is None or shutil.which("rsync") is None:
        skip_or_fail("needs the OpenSSH client and rsync (tools/sysdeps.sh installs them)")
    host = f"127.0.0.1:{banner_then_silence}"
    (tmp_path / "f").write_text("data\n")
    bound = ("--connect-timeout", "2")

    ssh = gp("ssh", host, *bound, "--", "true", timeout=40)
    assert ssh.returncode == 255, ssh.stderr
    assert f"Connection to 127.0.0.1 port {banner_then_silence} timed out" in ssh.stderr, ssh.stderr

    sync = gp("sync", host, *bound, str(tmp_path / "f"), ":/tmp/gp-f", timeout=40)
    # rsync passes on ssh's 255, or reports the stream it lost (its 12: gpuprov's 1), as the race between the two goes
    assert sync.returncode in (255, 1), sync.stderr
    assert f"Connection to 127.0.0.1 port {banner_then_silence} timed out" in sync.stderr, sync.stderr
    assert "error: rsync exited" in sync.stderr

    words = "sent its SSH banner but did not finish the handshake within 2s"
    ran = gp("exec", host, *bound, "--", "true", timeout=40)
    assert ran.returncode == 255 and words in ran.stderr, ran.stderr
    assert "authentication failed" not in ran.stderr  # it never got that far
    checked = gp("check", host, *bound, timeout=40)
    assert checked.returncode == 1 and words in checked.stdout, checked.stdout + checked.stderr


@pytest.mark.heavy  # the OpenSSH client
def test_the_bound_is_the_connect_timeout_unless_the_users_ssh_config_sets_its_own(tmp_path):
    """ssh and sync get ServerAliveInterval x ServerAliveCountMax ~ --connect-timeout (OpenSSH's bound on each
    wait for the server, from the handshake on); a host whose ssh config sets an interval keeps the user's."""
    if shutil.which("ssh") is None:
        skip_or_fail("needs the OpenSSH client")
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.hosts.sshcli import ssh_argv
    from gpuprov.plan.inventory import Target

    config = tmp_path / "ssh_config"
    config.write_text("Host patient\n  ServerAliveInterval 60\n")
    settings = HostSettings(known_hosts=tmp_path / "known_hosts", connect_timeout=10, ssh_config=config)
    ours = ssh_argv(Target(host="10.0.0.5"), settings)
    assert "ServerAliveInterval=4" in ours and "ServerAliveCountMax=3" in ours  # 4 s x 3 >= 10 s
    theirs = ssh_argv(Target(host="patient"), settings)
    assert not any(word.startswith("ServerAlive") for word in theirs)


# --- known_hosts markers ------------------------------------------------------------------------


def _ca_line(tmp_path: Path) -> str:
    ca = tmp_path / "host_ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ca)], check=True)
    return "@cert-authority *.example.com,10.* " + " ".join(ca.with_suffix(".pub").read_text().split()[:2])


def test_a_cert_authority_line_is_skipped_and_a_revoked_key_is_refused(host_pool, gp_home, tmp_path):
    pool = host_pool
    i = 4
    reset(pool, [i])
    host = addrs(pool, [i])[0]
    user_known = Path(os.environ["HOME"]) / ".ssh" / "known_hosts"
    user_known.parent.mkdir(exist_ok=True)
    host_line = pool[i].known_hosts_line()
    blob = " ".join(host_line.split()[1:3])
    ca = _ca_line(tmp_path)

    # a CA line (gpuprov uses no host certificates) beside the host's own key: skipped, the key still pins
    user_known.write_text(f"# the site's host CA\n{ca}\n{host_line}\n")
    for command in (["exec", host, *key(pool), "--", "echo", "reached"], ["ssh", host, *key(pool), "--", "echo", "reached"],
                    ["check", host, *key(pool)]):
        result = gp(*command)
        assert "hit a bug" not in result.stdout + result.stderr, (command, result.stdout, result.stderr)
        if command[0] != "check":
            assert result.returncode == 0 and result.stdout.strip().endswith("reached"), (command, result.stderr)
        else:  # reached and probed: the shim host has no torch yet, which check reports as a host problem
            assert "unknown host key" not in result.stdout and "unreachable" not in result.stdout, result.stdout

    # the same key revoked for every host: refused by gpuprov's connections and by ssh, even with
    # --accept-new-host-key, and even where gpuprov itself has it pinned
    user_known.write_text(f"{ca}\n@revoked * {blob}\n{host_line}\n")
    pin(pool, gp_home, [i])
    fingerprint = subprocess.run(["ssh-keygen", "-lf", "-"], input=host_line, capture_output=True, text=True,
                                 check=True).stdout.split()[1]
    for extra in ([], ["--accept-new-host-key"]):
        refused = gp("exec", host, *key(pool), *extra, "--", "touch", "/tmp/gp-revoked-ran")
        assert refused.returncode == 255, refused.stderr
        assert "REVOKED" in refused.stderr and fingerprint in refused.stderr, refused.stderr
        assert str(user_known) in refused.stderr  # where the revocation came from
    by_ssh = gp("ssh", host, *key(pool), "--", "touch", "/tmp/gp-revoked-ran")
    assert by_ssh.returncode == 255 and "REVOKED HOST KEY" in by_ssh.stderr, by_ssh.stderr
    assert "hit a bug" not in by_ssh.stderr
    assert pool.exec_in(i, "test -e /tmp/gp-revoked-ran").returncode != 0  # nothing ran

    # revoked for other hosts only (a pattern that does not match this address): this host is unaffected
    user_known.write_text(f"@revoked 192.0.2.*,!{pool[i].address} {blob}\n{host_line}\n")
    fine = gp("exec", host, *key(pool), "--", "true")
    assert fine.returncode == 0, fine.stderr


# --- a lot of output -----------------------------------------------------------------------------


def test_eight_megabytes_of_exec_output_arrive_whole(host_pool, gp_home):
    """8 MiB as one line with no newline (the worst case for a line splitter), and 8 MB of three-byte UTF-8
    characters in lines (a character cut between two reads must still arrive whole: the capture read 1000
    bytes at a time and decoded each read on its own, so most cuts became two U+FFFD)."""
    pool = host_pool
    i = 6
    reset(pool, [i])
    pin(pool, gp_home, [i])
    host = addrs(pool, [i])[0]
    size = 8 << 20
    one_line = gp("exec", host, *key(pool), "--no-prefix", "--", f"head -c {size} /dev/zero | tr '\\0' a",
                  timeout=300)
    assert one_line.returncode == 0, one_line.stderr[-500:]
    assert len(one_line.stdout) == size + 1 and one_line.stdout == "a" * size + "\n"  # exec ends the last line

    euros = "yes \"$(printf '\u20ac%.0s' $(seq 34))\" | head -n 81445"  # 103 bytes a line, 8,388,835 in all
    expected = ("\u20ac" * 34 + "\n") * 81445
    many = gp("exec", host, *key(pool), "--no-prefix", "--", euros, timeout=300)
    assert many.returncode == 0, many.stderr[-500:]
    assert "\ufffd" not in many.stdout
    assert len(many.stdout.encode()) == len(expected.encode()) == 8_388_835
    assert hashlib.sha256(many.stdout.encode()).hexdigest() == hashlib.sha256(expected.encode()).hexdigest()


def _step_section(log: str, step: str) -> str:
    """What the log holds between the note that starts `step` and the next note."""
    start = log.index("\n", log.index(f" step {step} (")) + 1
    return log[start:log.index("\n=== ", start)]


def test_a_step_that_prints_a_lot_keeps_its_head_and_tail_in_the_log(host_pool, gp_home, tmp_path):
    from gpuprov.hosts.hostlog import LOG_HEAD, LOG_TAIL

    pool = host_pool
    i = 3
    reset(pool, [i])
    lines = 400_000  # "line-000001\n" ...: 12 bytes each, 4.8 MB, well past head + tail
    playbook = tmp_path / "chatty.yml"
    playbook.write_text(
        "name: chatty\nstack: none\nenv: null\nsteps:\n"
        f"  - name: chatty\n    run: seq -f 'line-%06g' 1 {lines}\n"
        "  - name: after\n    run: echo after-step-ran\n"
    )
    code, hosts = bootstrap(pool, [i], "-p", str(playbook))
    assert code == 0, hosts
    log = Path(hosts[0]["log"])
    assert log.stat().st_size < LOG_HEAD + LOG_TAIL + 64 * 1024  # not the 4.8 MB the step printed
    text = log.read_text()
    assert "after-step-ran" in _step_section(text, "after")  # the next step's output is kept again

    section = _step_section(text, "chatty")
    marks = [line for line in section.split("\n") if line.startswith("[gpuprov: ") and "dropped" in line]
    assert len(marks) == 1, marks
    head, tail = section.split(f"\n{marks[0]}\n")
    assert (len(head.encode()), len(tail.encode())) == (LOG_HEAD, LOG_TAIL)
    dropped = int(marks[0].split()[1])
    # the head is the step's first bytes (a log line of the step, then seq from its first line), the tail its
    # last (seq to its last line, then the step's own last lines); what lies between is exactly `dropped`
    seq = "".join(f"line-{n:06d}\n" for n in range(1, lines + 1))
    before = head.index("line-000001\n")
    assert seq.startswith(head[before:])
    # (its last lines may open the next section: sshd can send the runner's `end` event before them)
    assert text.count(f"line-{lines:06d}\n") == 1
    cut, first_whole = tail.split("\n", 2)[0], tail.split("\n", 2)[1]  # a line's end, then whole lines
    resumes = (int(first_whole.removeprefix("line-")) - 1) * 12 - len(cut) - 1  # and its newline
    assert tail.startswith(seq[resumes:resumes + 1000])
    assert dropped == resumes - (len(head) - before), (dropped, resumes, len(head) - before)

    # --verbose still echoes every line live, whatever the log keeps
    reset(pool, [i])
    result = forkcli.run([sys.executable, "-m", "gpuprov", "bootstrap", *addrs(pool, [i]), "-i", str(pool.key_path),
                             "--os", "ubuntu-22.04", "--python", "3.11", "--connect-timeout", "3", "-p", str(playbook),
                             "--verbose"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr[-2000:]
    echoed = [line.split("] ", 1)[-1] for line in result.stdout.splitlines() if "] line-" in line]
    assert echoed == [f"line-{n:06d}" for n in range(1, lines + 1)], [
        line for line in result.stdout.splitlines() if "line-" in line and not line.split("] ", 1)[-1][5:].isdigit()]


def test_a_failing_step_past_the_cap_still_names_its_last_stderr_line(host_pool, gp_home, tmp_path):
    pool = host_pool
    i = 3
    reset(pool, [i])
    playbook = tmp_path / "loud-failure.yml"
    playbook.write_text(
        "name: loud\nstack: none\nenv: null\nsteps:\n"
        "  - name: loud\n    run: |\n      seq 1 500000\n      echo 'the real reason' >&2\n      exit 4\n"
    )
    code, hosts = bootstrap(pool, [i], "-p", str(playbook))
    assert code == 1
    assert hosts[0]["result"] == "failed at loud" and "exit 4: the real reason" in hosts[0]["error"], hosts
    assert "the real reason" in _step_section(Path(hosts[0]["log"]).read_text(), "loud")  # in the kept tail


def test_making_connections_only_reads_the_fabric_config_every_host_shares(tmp_path, monkeypatch):
    """Every host's Connection shares one Fabric Config. Making one must only read it: any write merges it
    again, which empties it first, and a thread reading it meanwhile failed with "No attribute or config key
    found for 'port'" (bench/fanout.py, 64 hosts). And a host with no key of gpuprov's (the user's own) must
    not share its connect_kwargs with the Config, where `Remote.open` puts that host's socket."""
    import invoke.config

    from gpuprov.hosts.remote import HostSettings, connection
    from gpuprov.plan.inventory import Target

    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host 10.9.*\n  IdentityFile ~/.ssh/id_fleet\n")
    settings = HostSettings(known_hosts=tmp_path / "known_hosts", connect_timeout=5, ssh_config=ssh_config)
    first, _ = connection(Target(host="10.9.0.1", user="root", key=str(tmp_path / "k")), settings)
    merged: list[object] = []
    real_merge = invoke.config.Config.merge
    monkeypatch.setattr(invoke.config.Config, "merge", lambda self: (merged.append(self), real_merge(self))[1])
    made = [connection(Target(host=f"10.9.0.{i}", user="root", key=str(tmp_path / "k") if i % 2 else None),
                       settings)[0] for i in range(2, 6)]
    assert all(c.config is first.config for c in made)  # shared, as meant
    assert merged == [] and dict(first.config.connect_kwargs) == {}
    mine, other = made[0], made[2]  # no key of gpuprov's: the ssh config's IdentityFile applies, to each alone
    assert mine.connect_kwargs["key_filename"] == [str(Path.home() / ".ssh" / "id_fleet")]  # paramiko expands ~
    mine.connect_kwargs["sock"] = "this host's socket"
    assert "sock" not in other.connect_kwargs and "sock" not in first.config.connect_kwargs
