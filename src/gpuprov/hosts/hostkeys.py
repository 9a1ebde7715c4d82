"""Host-key pinning: gpuprov's own known_hosts, trust-on-first-use only when asked, never silently.

- A host already in gpuprov's known_hosts must present the same key, or the connection is refused
  (HostKeyChanged names the host and both fingerprints).
- Keys the user already trusts (~/.ssh/known_hosts, the ssh config's UserKnownHostsFile) count as
  pinned for existing hosts; a different key from such a host is refused the same way. A launched
  node is checked against its own file only.
- An unknown host is refused (UnknownHostKey, with its fingerprint) unless the caller passed
  accept_new (the user's --accept-new-host-key, or a provider that learned the key out of band).
  An accepted key is pinned at once.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import threading
from pathlib import Path

import paramiko

from gpuprov.errors import GpuprovError, UserInputError

_LOCK = threading.Lock()  # several hosts pin at once during fan-out


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint, as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class UnknownHostKey(GpuprovError):
    def __init__(self, host: str, key: paramiko.PKey) -> None:
        self.host = host
        super().__init__(
            f"{host}: unknown host key {key.get_name()} {fingerprint(key)}; not connecting. "
            "Check the fingerprint out of band, then rerun with --accept-new-host-key to pin it."
        )


class HostKeyChanged(GpuprovError):
    def __init__(self, host: str, pinned: paramiko.PKey, offered: paramiko.PKey) -> None:
        self.host = host
        super().__init__(
            f"{host}: HOST KEY CHANGED — pinned {pinned.get_name()} {fingerprint(pinned)}, "
            f"offered {offered.get_name()} {fingerprint(offered)}. Refusing to connect (possible "
            "man-in-the-middle, or the machine was rebuilt). If you trust the new key, remove the "
            f"old line for {host} from {_path_hint()} and rerun with --accept-new-host-key."
        )


def _path_hint() -> str:
    from gpuprov.paths import known_hosts_path

    return str(known_hosts_path())


class PinPolicy(paramiko.MissingHostKeyPolicy):
    """paramiko calls this only for hosts with no known key."""

    def __init__(self, known_hosts: Path, accept_new: bool) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise UnknownHostKey(hostname, key)
        pin(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


def known_host_name(address: str, port: int) -> str:
    """The name known_hosts files use: `host`, or `[host]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def pin(known_hosts: Path, hostname: str, key: paramiko.PKey) -> None:
    """Append one pinned key (a provider that learned the key out of band calls this too)."""
    with _LOCK:
        known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with known_hosts.open("a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        known_hosts.chmod(0o600)


def user_known_hosts() -> tuple[Path, ...]:
    """The keys the user already trusts for hosts they ssh into: ~/.ssh/known_hosts (read, never written)."""
    path = Path.home() / ".ssh" / "known_hosts"
    return (path,) if path.is_file() else ()


def prepare_client(client: paramiko.SSHClient, known_hosts: Path, accept_new: bool,
                   trusted: tuple[Path, ...] = (), host: str | None = None) -> None:
    """Make `client` check keys against gpuprov's known_hosts and the user's `trusted` files (a key there
    counts as pinned; a different key is refused as changed), with the pin policy for the rest.
    `host` (known_host_name's form): the client gets only that host's pinned keys, from a parse of the file
    shared by every host of the run; None: the whole file."""
    for path in trusted:  # the user's own files: an unreadable or odd one is simply not trusted
        with contextlib.suppress(OSError, paramiko.SSHException, UnicodeDecodeError, ValueError):
            client.load_system_host_keys(str(path))
    if known_hosts.exists():
        pinned = pinned_keys(known_hosts)
        if host is None:
            client.get_host_keys().update(pinned)
        else:
            for keytype, key in (pinned.lookup(host) or {}).items():
                client.get_host_keys().add(host, keytype, key)
    client.set_missing_host_key_policy(PinPolicy(known_hosts, accept_new))


_PARSED: dict[Path, tuple[tuple[int, int], paramiko.HostKeys]] = {}


def pinned_keys(known_hosts: Path) -> paramiko.HostKeys:
    """gpuprov's known_hosts, parsed once for as long as it does not change. Each host of a fan-out checks its
    key against the same file: parsing all of it for each host made N hosts cost N x N lines."""
    with _LOCK:
        stat = known_hosts.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        cached = _PARSED.get(known_hosts)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            pinned = paramiko.HostKeys(str(known_hosts))
        except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, UnicodeDecodeError, ValueError) as exc:
            line = getattr(exc, "line", "")
            what = f"the line {line.strip()[:80]!r}" if line else "a line"
            raise UserInputError("known_hosts", f"{known_hosts}: {what} is not a host key",
                                 "fix or delete that line (gpuprov pins the key again with --accept-new-host-key)") from None
        _PARSED[known_hosts] = (stamp, pinned)
        return pinned


def explain(exc: paramiko.BadHostKeyException) -> HostKeyChanged:
    return HostKeyChanged(exc.hostname, exc.expected_key, exc.key)
