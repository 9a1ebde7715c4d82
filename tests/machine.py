"""What test processes share on one machine, guarded: xdist workers, and other checkouts' runs, all as root.

    with machine_lock("chroot"):          # one process at a time builds the debootstrap cache
        ...
    with shared_user("gpuprov-sudoer"):   # the login user exists while any test process holds it
        ...

Locks are flock(2) on files under /run/lock: the kernel drops a lock when its process dies, so a killed
run never leaves one behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_DIR = Path(os.environ.get("GPUPROV_TEST_LOCK_DIR", "/run/lock"))


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Exclusive across every process on this machine that asks for `name`; blocks until it is free."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_DIR / f"gpuprov-tests-{name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def shared_user(user: str, home: str | None = None) -> Iterator[None]:
    """A local login user (home, bash, password '*': no password, but not locked ('!'), which sshd without PAM
    would refuse even for key logins) that exists while any holder needs it. A test run creates it if missing;
    the last holder out deletes it, but only when a test run created it. Holders are process ids in
    <LOCK_DIR>/gpuprov-tests-user-<user>.json; those of dead processes are dropped. `home`: its home folder, not
    made here (a path inside the test hosts' private mounts, which each test host makes for itself)."""
    record = LOCK_DIR / f"gpuprov-tests-user-{user}.json"
    me = os.getpid()
    with machine_lock(f"user-{user}"):
        state = json.loads(record.read_text()) if record.exists() else {"created": False, "holders": []}
        holders = [p for p in state["holders"] if _alive(p)]
        where = ["--create-home"] if home is None else ["--no-create-home", "--home-dir", home]
        added = subprocess.run(["useradd", *where, "--shell", "/bin/bash", user],
                               capture_output=True).returncode == 0  # 9: it exists already
        created = added or (bool(state["created"]) and _exists(user))  # made by an earlier run
        subprocess.run(["usermod", "--password", "*", user], check=True, capture_output=True)
        record.write_text(json.dumps({"created": created, "holders": [*holders, me]}))
    try:
        yield
    finally:
        with machine_lock(f"user-{user}"):
            state = json.loads(record.read_text()) if record.exists() else {"created": False, "holders": []}
            holders = [p for p in state["holders"] if p != me and _alive(p)]
            if holders:
                record.write_text(json.dumps({"created": state["created"], "holders": holders}))
            else:
                if state["created"]:
                    subprocess.run(["userdel", "--remove", user], capture_output=True)
                record.unlink(missing_ok=True)


def _exists(user: str) -> bool:
    return subprocess.run(["id", "-u", user], capture_output=True).returncode == 0
