"""`ssh gpuprov-NAME` works: one Host block per ready node in gpuprov's own ssh config file,
which the user's ~/.ssh/config Includes (added once, at the top, where Include must go)."""

from __future__ import annotations

import re
from pathlib import Path

from gpuprov.paths import state_dir

MARK = "# added by gpuprov"


def config_path() -> Path:
    return state_dir() / "ssh_config"


def node_known_hosts(name: str) -> Path:
    folder = state_dir() / "nodes" / name
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / "known_hosts"


def _blocks(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for block in re.split(r"(?m)^(?=Host gpuprov-)", text):
        m = re.match(r"Host gpuprov-(\S+)", block)
        if m:
            found[m.group(1)] = block.rstrip() + "\n"
    return found


def add_node(name: str, address: str, user: str, key: str) -> str:
    """Write the node's Host block (replacing an old one); returns the alias."""
    path = config_path()
    blocks = _blocks(path.read_text() if path.exists() else "")
    blocks[name] = (
        f"Host gpuprov-{name}\n  HostName {address}\n  User {user}\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {node_known_hosts(name)}\n  StrictHostKeyChecking yes\n"
    )
    path.write_text("".join(blocks[n] + "\n" for n in sorted(blocks)))
    path.chmod(0o600)
    _ensure_include(path)
    return f"gpuprov-{name}"


def move_node_key(name: str, address: str) -> None:
    """The node came back on another address (a stopped instance gets a new public IP): its pinned host
    key now names that address. The key itself is kept: a different key there is still refused."""
    path = node_known_hosts(name)
    if not path.exists():
        return
    lines = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            line = " ".join([address, *parts[1:]])
        if line not in lines:
            lines.append(line)
    path.write_text("".join(f"{line}\n" for line in lines))
    path.chmod(0o600)


def remove_node(name: str) -> None:
    path = config_path()
    if path.exists():
        blocks = _blocks(path.read_text())
        blocks.pop(name, None)
        path.write_text("".join(blocks[n] + "\n" for n in sorted(blocks)))
    folder = state_dir() / "nodes" / name
    for f in folder.glob("*"):
        f.unlink()
    if folder.exists():
        folder.rmdir()


def _ensure_include(path: Path) -> None:
    user_config = Path.home() / ".ssh" / "config"
    line = f"Include {path}"
    text = user_config.read_text() if user_config.exists() else ""
    if line in text:
        return
    user_config.parent.mkdir(mode=0o700, exist_ok=True)
    user_config.write_text(f"{line}  {MARK}\n{text}")
    user_config.chmod(0o600)
