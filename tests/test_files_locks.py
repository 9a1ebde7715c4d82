"""gpuprov.files (whole-or-nothing writes, serialised writers) and gpuprov.state.locks (one operation per node),
with real processes holding the locks: the overlap is forced by a held lock, never by sleeping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gpuprov import files
from gpuprov.errors import UserInputError
from gpuprov.hosts import sshconfig
from gpuprov.state import locks


def test_write_atomic_replaces_the_whole_file_and_keeps_a_users_mode_and_link(tmp_path: Path) -> None:
    real = tmp_path / "real_config"
    real.write_text("old\n")
    real.chmod(0o644)
    link = tmp_path / "config"
    link.symlink_to(real)
    files.write_atomic(link, "new\n", mode=None)
    assert link.is_symlink() and real.read_text() == "new\n"
    assert real.stat().st_mode & 0o777 == 0o644
    fresh = tmp_path / "fresh"
    files.write_atomic(fresh, b"x")
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config", "fresh", "real_config"]  # no temp file left


def test_a_write_that_fails_leaves_the_old_file_as_it_was(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "ssh_config"
    target.write_text("Host a\n")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        files.write_atomic(target, "Host a\nHost b\n")
    assert target.read_text() == "Host a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["ssh_config"]


_HOLDER = textwrap.dedent("""
    import os, sys, time
    os.environ["GPUPROV_HOME"] = sys.argv[1]
    from gpuprov.state import locks
    with locks.hold(sys.argv[2], "up"):
        print("held", flush=True)
        sys.stdin.readline()  # until the test says so (or kills us)
""")


def _holder(home: Path, key: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(home), key], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_node_lock_is_busy_for_others_names_its_holder_and_dies_with_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path))
    proc = _holder(tmp_path, locks.node("train"))
    try:
        assert not locks.is_free(locks.node("train"))
        with pytest.raises(locks.Busy) as busy, locks.hold(locks.node("train"), "gc", wait=False, subject="train"):
            pass
        assert busy.value.holder.pid == proc.pid and busy.value.holder.what == "up"
        assert f"train is being worked on by gpuprov up (pid {proc.pid}" in str(busy.value)
        assert locks.is_free(locks.node("other"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert locks.is_free(locks.node("train"))  # the kernel dropped it with the process
    with locks.hold(locks.node("train"), "gc", wait=False):
        pass


def test_a_waiting_holder_is_told_who_it_waits_for_and_gets_the_lock_when_it_is_released(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path))
    proc = _holder(tmp_path, locks.node("n1"))
    told: list[locks.Holder] = []

    def waiting(holder: locks.Holder) -> None:
        told.append(holder)
        assert proc.stdin is not None
        proc.stdin.write("done\n")  # let it go only once we are waiting
        proc.stdin.flush()

    with locks.hold(locks.node("n1"), "down", waiting=waiting):
        assert [h.pid for h in told] == [proc.pid]
        assert locks.holder_of(locks._file(locks.node("n1"))).what == "down"
    proc.wait()


def test_a_bounded_wait_ends_after_its_patience_naming_what_it_waited_for_and_who_holds_it(tmp_path: Path,
                                                                                          monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path))
    proc = _holder(tmp_path, locks.region("us-east-1"))
    try:
        began = time.monotonic()
        with pytest.raises(locks.Overdue) as late, locks.hold(locks.region("us-east-1"), "key pair",
                                                              subject="us-east-1's key pair", patience=0.3):
            pass
        assert 0.3 <= time.monotonic() - began < 5
        assert late.value.holder.pid == proc.pid and late.value.waited == 0.3
        assert str(late.value).startswith(f"us-east-1's key pair is still being worked on by gpuprov up (pid {proc.pid}")
        assert str(late.value).endswith("after 0.3 s of waiting")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with locks.hold(locks.region("us-east-1"), "key pair", patience=0.3):  # free: taken at once
        pass
    monkeypatch.setenv("GPUPROV_TEST_PATIENCE_SECONDS", "soon")
    with pytest.raises(UserInputError, match="GPUPROV_TEST_PATIENCE_SECONDS"):
        locks.patience(20)


def test_the_ssh_config_files_lock_is_one_writer_at_a_time_across_threads_and_its_wait_is_bounded(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path))
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUPROV_TEST_PATIENCE_SECONDS", "0.3")
    holding, done = threading.Event(), threading.Event()

    def stopped_writer() -> None:  # a writer of this process stopped mid-edit
        with sshconfig.edit():
            holding.set()
            done.wait(30)

    writer = threading.Thread(target=stopped_writer)
    writer.start()
    try:
        assert holding.wait(30)
        with pytest.raises(locks.Overdue) as late:
            sshconfig.add_node("n1", "192.0.2.1", "ubuntu", "/k")
        assert str(late.value).startswith(f"gpuprov's ssh config file is still being worked on by gpuprov ssh config "
                                          f"(pid {os.getpid()}")
    finally:
        done.set()
        writer.join()
    assert sshconfig.add_node("n1", "192.0.2.1", "ubuntu", "/k") == "gpuprov-n1"


def test_locks_are_reentrant_within_a_process_and_odd_keys_get_safe_file_names(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path))
    with locks.hold(locks.node("n1"), "up"), locks.hold(locks.node("n1"), "down", wait=False):
        assert locks.is_free(locks.node("n1"))  # this process is nobody to itself
    name = locks.image("my image (v2) / test")
    with locks.hold(name, "bake"):
        (lock,) = [p for p in (tmp_path / "locks").iterdir() if p.name.startswith("image-")]
        assert "/" not in lock.name and " " not in lock.name
    assert os.listdir(tmp_path / "locks")


def test_the_locks_are_chosen_once_with_the_store_and_config_toml_is_read_once(tmp_path: Path, monkeypatch,
                                                                                reads_of) -> None:
    """Which kind of lock a process holds is decided once, as its store is opened, not at every lock: the config
    file is read by the first look at the settings and never again, however many locks are held and asked about."""
    from gpuprov.state import open_store

    config = tmp_path / "config.toml"
    config.write_text('gpu = "L4"\nstate = "local"\n')
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUPROV_CONFIG", str(config))
    monkeypatch.delenv("GPUPROV_STATE", raising=False)
    reads = reads_of(config)
    store = open_store()
    assert store.coordinator is locks.coordinator() is locks.FILE_LOCKS
    for n in range(20):
        with locks.hold(locks.node(f"n{n}"), "up"), locks.hold(locks.image(f"i{n}"), "bake"):
            assert locks.is_free(locks.node(f"n{n}"))
            assert locks.holder(locks.node(f"n{n}")).what == "up"
        with store.coordinator.hold(locks.region("us-east-1"), "up"):
            pass
    assert len(reads) == 1
