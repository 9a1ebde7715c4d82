"""`ssh gpuprov-NAME` works: one Host block per ready node in gpuprov's own ssh config file,
which the user's ~/.ssh/config Includes (added once, at the top, where Include must go).

Every file here is written whole or not at all (gpuprov.files.write_atomic: a temp file in the same
folder, renamed over the old one), so a full disk or a kill mid-write leaves the old file as it was, and
every read-modify-write of them holds a flock: `edit()` (a file in the state dir) for ssh_config and the
Include in ~/.ssh/config, so several `up`s finishing at once each keep their block; a known_hosts file's own
lock beside it (files.lock_beside, the one hostkeys.pin takes) for a node's pinned keys.

A launched cluster's per-node known_hosts are merged into one (`merge_known_hosts`). A failed write is a
`GpuprovError` naming the file and saying it is unchanged; the user's ~/.ssh/config keeps its own mode, and a
symlink to it stays one. The lock for ssh_config is `.ssh_files.lock` in the state dir, never in ~/.ssh; its
wait is bounded (`EDIT_PATIENCE`), so a holder stopped mid-write cannot keep an `up` or a `down` waiting: the write
fails, naming the holder, as a write the disk refused does.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from gpuprov.errors import GpuprovError
from gpuprov.files import lock_beside, locked, write_atomic
from gpuprov.paths import state_dir
from gpuprov.state import locks

MARK = "# added by gpuprov"
# how long an edit waits for another's: a read-modify-write of two small files takes moments, unless its process was
# stopped mid-write (a suspended shell)
EDIT_PATIENCE = 20.0


def config_path() -> Path:
    return state_dir() / "ssh_config"


def node_known_hosts(name: str) -> Path:
    folder = state_dir() / "nodes" / name
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / "known_hosts"


def await_new_key(name: str) -> None:
    """Node `name` is a machine gpuprov has just launched (`up`, a moved node's new instance), whose host key
    nobody has seen: what was pinned for it is void, and the first gpuprov command or `ssh gpuprov-NAME` that
    reaches it pins its key (hostkeys.await_first_key), as `up` does when it waits for SSH."""
    from gpuprov.hosts.hostkeys import await_first_key

    await_first_key(node_known_hosts(name), f"node {name}: a new machine, its host key not seen yet")


def _awaits_new_key(name: str) -> bool:
    from gpuprov.hosts.hostkeys import awaits_first_key

    return awaits_first_key(node_known_hosts(name))


@contextlib.contextmanager
def edit() -> Iterator[None]:
    """Hold the lock of ssh_config and the Include for one read-modify-write (the lock file stays in the state dir,
    never in ~/.ssh). Re-entered by the same process it would deadlock: callers take it once, at the top."""
    with locks.exclusive(state_dir() / ".ssh_files.lock", "ssh config", subject="gpuprov's ssh config file",
                         patience=locks.patience(EDIT_PATIENCE)):
        yield


def write(path: Path, text: str, mode: int | None = 0o600) -> None:
    """One of gpuprov's ssh files, whole or not at all; a failure names the file and leaves it unchanged.
    `mode` None keeps the file's own (the user's ~/.ssh/config)."""
    try:
        write_atomic(path, text, mode=mode)
    except OSError as exc:
        raise GpuprovError(f"cannot write {path}: {exc.strerror or exc}; it is unchanged"
                           + (" (free some space and rerun)" if exc.errno == 28 else "")) from None


def _blocks(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for block in re.split(r"(?m)^(?=Host gpuprov-)", text):
        m = re.match(r"Host gpuprov-(\S+)", block)
        if m:
            found[m.group(1)] = block.rstrip() + "\n"
    return found


def _write_blocks(path: Path, blocks: dict[str, str]) -> None:
    write(path, "".join(blocks[n] + "\n" for n in sorted(blocks)))


def add_node(name: str, address: str, user: str, key: str) -> str:
    """Write the node's Host block (replacing an old one); returns the alias. A node whose key is awaited
    gets OpenSSH's accept-new (ssh_config(5): new keys are added, changed ones refused), so its first
    `ssh gpuprov-NAME` pins it too; every later block is written with `yes`."""
    path = config_path()
    known_hosts = node_known_hosts(name)
    checking = "accept-new" if _awaits_new_key(name) else "yes"
    with edit():
        blocks = _blocks(path.read_text() if path.exists() else "")
        blocks[name] = (
            f"Host gpuprov-{name}\n  HostName {address}\n  User {user}\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking {checking}\n"
        )
        _write_blocks(path, blocks)
        _ensure_include(path)
    return f"gpuprov-{name}"


def move_node_key(name: str, address: str) -> None:
    """The node came back on another address (a stopped instance gets a new public IP): its pinned host
    key now names that address. The key itself is kept: a different key there is still refused."""
    path = node_known_hosts(name)
    with locked(lock_beside(path)):
        if not path.exists():
            return
        lines: list[str] = []
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and not line.startswith(("#", "@")):
                line = " ".join([address, *parts[1:]])
            if line not in lines:
                lines.append(line)
        write(path, "".join(f"{line}\n" for line in lines))


def merge_known_hosts(name: str, parts: list[str]) -> None:
    """The pinned keys of the nodes `parts` (a cluster's members' own files), gathered into node `name`'s
    known_hosts (what `ssh gpuprov-NAME` uses); the parts' entries are removed."""
    target = node_known_hosts(name)
    with locked(lock_beside(target)):
        lines: list[str] = []
        for part in parts:
            path = node_known_hosts(part)
            if path.exists():
                lines += [line for line in path.read_text().splitlines() if line and line not in lines]
        write(target, "".join(f"{line}\n" for line in lines))
    for part in parts:
        remove_node(part)


def remove_node(name: str) -> None:
    path = config_path()
    with edit():
        if path.exists():
            blocks = _blocks(path.read_text())
            if blocks.pop(name, None) is not None:
                _write_blocks(path, blocks)
        folder = state_dir() / "nodes" / name
        for f in folder.glob("*"):
            f.unlink()
        if folder.exists():
            folder.rmdir()


def _ensure_include(path: Path) -> None:
    """The Include line at the top of the user's ~/.ssh/config (a symlink stays one; the file keeps its mode)."""
    user_config = Path.home() / ".ssh" / "config"
    line = f"Include {path}"
    text = user_config.read_text() if user_config.exists() else ""
    if line in text:
        return
    user_config.parent.mkdir(mode=0o700, exist_ok=True)
    write(user_config, f"{line}  {MARK}\n{text}", mode=None)
