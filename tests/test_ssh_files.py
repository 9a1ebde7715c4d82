"""The ssh files gpuprov writes (issue 20, section 3): its own ssh_config, the one Include line it adds to the
user's ~/.ssh/config, and the nodes' known_hosts. Each is written whole or not at all (a temp file in the same
folder, renamed over the old one) and every read-modify-write of them holds one lock, so:

- three processes adding nodes at once, their first read-modify-write forced to overlap, keep every entry
  (before: 48 of 180 survived) and the user's file gets exactly one Include;
- a full disk (a small tmpfs mounted as ~/.ssh or as the state dir) leaves the old file as it was, not cut
  short, and the error says which file and why;
- the user's ~/.ssh/config keeps its mode, and stays a symlink when it is one.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import skip_or_fail

WRITERS = 3
EACH = 60


def _writer(home: str, state: str, who: int, start: Any, first_read: Any) -> None:
    """One `up` finishing EACH times: add_node for its own nodes. Its first read of gpuprov's ssh_config waits
    (up to 2 s) for the other writers' first reads, so without a lock all three read the same old file before
    any of them writes; with the lock the others cannot read yet, the wait runs out, and each goes on alone."""
    import pathlib
    import threading

    os.environ["HOME"], os.environ["GPUPROV_HOME"] = home, state
    real = pathlib.Path.read_text
    waited = threading.Event()

    def read_text(self: pathlib.Path, *args: Any, **kwargs: Any) -> str:
        text = real(self, *args, **kwargs)
        if self.name == "ssh_config" and not waited.is_set():
            waited.set()
            with contextlib.suppress(threading.BrokenBarrierError):
                first_read.wait(timeout=2)
        return text

    pathlib.Path.read_text = read_text  # type: ignore[method-assign]
    from gpuprov.hosts import sshconfig

    start.wait(timeout=60)
    for n in range(EACH):
        sshconfig.add_node(f"w{who}-n{n}", f"10.{who}.0.{n}", "ubuntu", f"/keys/{who}")


def test_three_concurrent_writers_keep_every_node_and_add_one_include(tmp_path: Path) -> None:
    home, state = tmp_path / "home", tmp_path / "state"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host mine\n  User me\n")
    ctx = multiprocessing.get_context("spawn")
    start, first_read = ctx.Barrier(WRITERS), ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_writer, args=(str(home), str(state), w, start, first_read)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    os.environ["GPUPROV_HOME"] = str(state)
    try:
        from gpuprov.hosts.sshconfig import config_path
        text = config_path().read_text()
    finally:
        del os.environ["GPUPROV_HOME"]
    hosts = [line.split()[1] for line in text.splitlines() if line.startswith("Host ")]
    assert len(hosts) == len(set(hosts)) == WRITERS * EACH, f"{len(set(hosts))} of {WRITERS * EACH} kept"
    assert f"  HostName 10.2.0.{EACH - 1}" in text
    user = (home / ".ssh" / "config").read_text()
    assert user.count("Include ") == 1 and user.endswith("Host mine\n  User me\n")
    leftovers = [p.name for p in [*state.iterdir(), *(home / ".ssh").iterdir()] if p.name.endswith(".tmp")]
    assert leftovers == []


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        skip_or_fail("mounting a small tmpfs (a full disk) needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        skip_or_fail(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> None:
    """Take every free byte of the file system `folder` is on."""
    with (folder / "filler").open("wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0")
    assert os.statvfs(folder).f_bavail == 0


@pytest.mark.heavy  # a small tmpfs: root
def test_a_full_disk_as_ssh_leaves_the_users_config_whole(gp_home: Path) -> None:
    from gpuprov.errors import GpuprovError
    from gpuprov.hosts import sshconfig

    ssh = Path(os.environ["HOME"]) / ".ssh"
    with tmpfs(ssh, "16k"):
        config = ssh / "config"
        before = "".join(f"Host box{n:04d}\n  User me\n" for n in range(400))[:8192]  # two pages
        config.write_text(before)
        config.chmod(0o644)
        fill(ssh)
        with pytest.raises(GpuprovError) as failed:
            sshconfig.add_node("train", "203.0.113.7", "ubuntu", "/keys/k")
        assert config.read_text() == before  # not cut short, not emptied
        assert stat.S_IMODE(config.stat().st_mode) == 0o644
        message = str(failed.value)
        assert str(config) in message and "No space left on device" in message, message
        assert "unchanged" in message
        assert sorted(p.name for p in ssh.iterdir()) == ["config", "filler"]  # no temp file left behind


@pytest.mark.heavy  # a small tmpfs: root
def test_a_full_state_disk_leaves_gpuprovs_ssh_config_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprov.errors import GpuprovError
    from gpuprov.hosts import sshconfig

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    with tmpfs(tmp_path / "state", "64k") as state:
        monkeypatch.setenv("GPUPROV_HOME", str(state))
        for n in range(40):
            sshconfig.add_node(f"node{n:02d}", f"198.51.100.{n}", "ubuntu", f"/keys/{'k' * 40}")
        before = sshconfig.config_path().read_text()
        # the new block takes the file past its last page, so no rewrite of it fits in the room it had
        room = -len(before) % 4096 + 1
        fill(state)
        with pytest.raises(GpuprovError) as failed:
            sshconfig.add_node("one-more", "198.51.100.99", "ubuntu", "/keys/" + "k" * room)
        assert sshconfig.config_path().read_text() == before
        assert "No space left on device" in str(failed.value) and str(sshconfig.config_path()) in str(failed.value)
        with pytest.raises(GpuprovError):
            sshconfig.remove_node("node07")  # a rewrite that shrinks the file still needs room for the new one
        assert sshconfig.config_path().read_text() == before


def test_the_users_config_keeps_its_mode_and_its_symlink(gp_home: Path, tmp_path: Path) -> None:
    from gpuprov.hosts import sshconfig

    dotfiles = tmp_path / "dotfiles" / "ssh_config"
    dotfiles.parent.mkdir()
    dotfiles.write_text("Host mine\n  User me\n")
    dotfiles.chmod(0o640)
    ssh = Path(os.environ["HOME"]) / ".ssh"
    ssh.mkdir()
    (ssh / "config").symlink_to(dotfiles)
    sshconfig.add_node("train", "203.0.113.7", "ubuntu", "/keys/k")
    assert (ssh / "config").is_symlink() and (ssh / "config").resolve() == dotfiles
    assert dotfiles.read_text().startswith(f"Include {sshconfig.config_path()}")
    assert dotfiles.read_text().endswith("Host mine\n  User me\n")
    assert stat.S_IMODE(dotfiles.stat().st_mode) == 0o640  # the user's own mode, not gpuprov's 0600
    assert stat.S_IMODE(sshconfig.config_path().stat().st_mode) == 0o600


def test_node_known_hosts_moves_are_whole_and_keep_0600(gp_home: Path) -> None:
    from gpuprov.hosts import sshconfig

    path = sshconfig.node_known_hosts("train")
    path.write_text("203.0.113.7 ssh-ed25519 AAAAkey1\n# a comment\n203.0.113.7 ssh-rsa AAAAkey2\n")
    path.chmod(0o644)
    inode = path.stat().st_ino
    sshconfig.move_node_key("train", "198.51.100.8")
    assert path.read_text() == "198.51.100.8 ssh-ed25519 AAAAkey1\n# a comment\n198.51.100.8 ssh-rsa AAAAkey2\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_ino != inode  # a new file renamed over the old, not the old one rewritten
