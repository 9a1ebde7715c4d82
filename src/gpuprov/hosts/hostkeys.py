"""Host-key pinning: gpuprov's own known_hosts, trust-on-first-use only when asked, never silently.

- A host already in gpuprov's known_hosts must present the same key, or the connection is refused
  (HostKeyChanged names the host and both fingerprints).
- Keys the user already trusts (~/.ssh/known_hosts, the ssh config's UserKnownHostsFile) count as
  pinned for existing hosts; a different key from such a host is refused the same way. A launched
  node is checked against its own file only.
- An unknown host is refused (UnknownHostKey, with its fingerprint) unless the caller passed
  accept_new (the user's --accept-new-host-key, or a provider that learned the key out of band), or the
  file awaits its first key (`await_first_key`: a machine gpuprov has just made, whose key nobody has seen
  yet, pinned by whichever command reaches it first, as `up` pins a new node's). An accepted key is pinned
  at once, and the file awaits no more.
- known_hosts files are read as OpenSSH reads them (sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT"): a key on an
  `@revoked` line "must not ever be accepted", so a host presenting it is refused (RevokedHostKey), with
  --accept-new-host-key too and for launched nodes too (the user's ~/.ssh/known_hosts revokes it for every
  connection); `@cert-authority` lines are skipped (gpuprov asks for no host certificates).

`await_first_key` is for a machine gpuprov has just launched whose SSH was not reached yet (`up --no-wait`, a failed
first login, a move whose SSH did not answer): the first gpuprov command to reach it pins that key. Keys the user
trusts (`HostSettings.trusted`) are read only and checked first: a host they know is checked against them alone.
A broken line in gpuprov's file is bad input naming the line (bootstrap checks it once, before any host); in the
user's, it is skipped. Each file is parsed once per change (`known_hosts_file`, by mtime and size) and each host's
client gets only its own host's pins. `pin` rewrites the file whole (files.write_atomic) under the lock beside it
(files.lock_beside), so a full disk leaves the old file, not a cut line.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.files import lock_beside, locked, write_atomic

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


@dataclass(frozen=True)
class Revoked:
    """One `@revoked` line: the host patterns it applies to, the key, and where it was read."""

    patterns: tuple[str, ...]
    blob: bytes
    source: Path
    line: int

    def applies_to(self, host: str) -> bool:
        """OpenSSH's match_hostname: comma-separated patterns with `*` and `?`, `!` negates (a negated match
        wins), a hashed `|1|salt|hash` name matches by its HMAC; names compare case-insensitively."""
        name, hit = host.lower(), False
        for pattern in self.patterns:
            if pattern.startswith("|1|"):
                with contextlib.suppress(binascii.Error, ValueError, AssertionError):
                    hit = hit or hmac.compare_digest(paramiko.HostKeys.hash_host(name, pattern), pattern)
                continue
            negated = pattern.startswith("!")
            glob = re.escape(pattern.lstrip("!").lower()).replace(r"\*", ".*").replace(r"\?", ".")
            if re.fullmatch(glob, name):
                if negated:
                    return False
                hit = True
        return hit


class RevokedHostKey(GpuprovError):
    def __init__(self, host: str, key: paramiko.PKey, revoked: Revoked) -> None:
        self.host = host
        super().__init__(
            f"{host}: its host key {key.get_name()} {fingerprint(key)} is REVOKED ({revoked.source} line "
            f"{revoked.line}: @revoked); refusing to connect. That key must not be trusted again: ask whoever runs "
            "the host for its new key."
        )


def _path_hint() -> str:
    from gpuprov.paths import known_hosts_path

    return str(known_hosts_path())


class PinPolicy(paramiko.MissingHostKeyPolicy):
    """paramiko calls this only for hosts with no known key."""

    def __init__(self, known_hosts: Path, accept_new: bool, revoked: tuple[Revoked, ...] = ()) -> None:
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.revoked = revoked

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        found = revocation(self.revoked, key, hostname)
        if found is not None:
            raise RevokedHostKey(hostname, key, found)
        if not self.accept_new and not awaits_first_key(self.known_hosts):
            raise UnknownHostKey(hostname, key)
        pin(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


def revocation(revoked: tuple[Revoked, ...], key: paramiko.PKey, host: str | None = None) -> Revoked | None:
    """The `@revoked` line naming `key` (for `host`, when given), if any."""
    blob = key.asbytes()
    return next((r for r in revoked if r.blob == blob and (host is None or r.applies_to(host))), None)


def known_host_name(address: str, port: int) -> str:
    """The name known_hosts files use: `host`, or `[host]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def pin(known_hosts: Path, hostname: str, key: paramiko.PKey) -> None:
    """Add one pinned key (a provider that learned the key out of band calls this too): the file is
    rewritten whole under its writers' lock, so a full disk leaves the old file, not a cut line."""
    with _LOCK:
        known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with locked(lock_beside(known_hosts)):  # sshconfig's moves and merges take it too
            old = known_hosts.read_text() if known_hosts.exists() else ""
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            try:
                write_atomic(known_hosts, old + ("\n" if old and not old.endswith("\n") else "") + line)
            except OSError as exc:
                raise GpuprovError(f"cannot pin the host key of {hostname} in {known_hosts}: "
                                   f"{exc.strerror or exc}; the file is unchanged") from None
            _awaiting(known_hosts).unlink(missing_ok=True)  # one first key: any other is an unknown host's


def _awaiting(known_hosts: Path) -> Path:
    return known_hosts.with_name(known_hosts.name + ".awaiting-first-key")


def await_first_key(known_hosts: Path, why: str) -> None:
    """`known_hosts` is a machine's that gpuprov has just made and whose key nobody has seen (a new instance,
    its SSH not reached yet): its old pins are void, and the first key it presents is pinned by whichever
    command reaches it first, then no other. `why` is kept in the marker for whoever reads the folder."""
    with _LOCK, locked(lock_beside(known_hosts)):
        known_hosts.unlink(missing_ok=True)
        write_atomic(_awaiting(known_hosts), why + "\n")


def awaits_first_key(known_hosts: Path) -> bool:
    """The file was marked by await_first_key and holds no key yet (OpenSSH's accept-new may have written one)."""
    if not _awaiting(known_hosts).exists():
        return False
    try:
        text = known_hosts.read_text()
    except FileNotFoundError:
        return True
    return not any(line.split() and not line.startswith(("#", "@")) for line in text.splitlines())


def user_known_hosts() -> tuple[Path, ...]:
    """The keys the user already trusts for hosts they ssh into: ~/.ssh/known_hosts (read, never written)."""
    path = Path.home() / ".ssh" / "known_hosts"
    return (path,) if path.is_file() else ()


@dataclass(frozen=True)
class KnownHosts:
    """A known_hosts file as OpenSSH reads it: the keys of its plain lines, and its `@revoked` keys apart."""

    pinned: paramiko.HostKeys
    revoked: tuple[Revoked, ...]


def prepare_client(client: paramiko.SSHClient, known_hosts: Path, accept_new: bool,
                   trusted: tuple[Path, ...] = (), host: str | None = None) -> tuple[Revoked, ...]:
    """Make `client` check keys against gpuprov's known_hosts and the user's `trusted` files (a key there
    counts as pinned, and a host they know is checked against them alone; a different key is refused as
    changed), with the pin policy for the rest; returns the revocations that apply (RevokedHostKey's source).
    `host` (known_host_name's form): the client gets only that host's pinned keys, from a parse of the file
    shared by every host of the run; None: the whole file. A revoked key is never among the pinned ones."""
    readable = []
    for path in dict.fromkeys((*trusted, *user_known_hosts())):  # the user's own: an unreadable one is not trusted
        with contextlib.suppress(OSError, UnicodeDecodeError, ValueError):
            readable.append((path in trusted, known_hosts_file(path, strict=False)))
    own = known_hosts_file(known_hosts, strict=True) if known_hosts.exists() else None
    revoked = tuple(r for _, f in readable for r in f.revoked) + (own.revoked if own else ())
    if host is not None:
        revoked = tuple(r for r in revoked if r.applies_to(host))
    keys = client.get_host_keys()
    sources = [f.pinned for used, f in readable if used] + ([own.pinned] if own else [])
    names = [host] if host is not None else list(dict.fromkeys(n for s in sources for n in s))
    for name in names:
        for source in sources:  # the first file that knows the host decides, as paramiko's system keys did
            found = source.lookup(name)
            if found:
                for keytype, key in found.items():
                    if revocation(revoked, key, name) is None:
                        keys.add(name, keytype, key)
                break
    client.set_missing_host_key_policy(PinPolicy(known_hosts, accept_new, revoked))
    return revoked


_PARSED: dict[tuple[Path, bool], tuple[tuple[int, int], KnownHosts]] = {}


def pinned_keys(known_hosts: Path) -> paramiko.HostKeys:
    """gpuprov's known_hosts, parsed once for as long as it does not change (a broken line is bad input)."""
    return known_hosts_file(known_hosts, strict=True).pinned


def known_hosts_file(path: Path, strict: bool) -> KnownHosts:
    """A known_hosts file, parsed once for as long as it does not change. Each host of a fan-out checks its
    key against the same file: parsing all of it for each host made N hosts cost N x N lines. `strict`
    (gpuprov's own file): a line that is no host key is bad input naming it; else (the user's) it is skipped."""
    with _LOCK:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        cached = _PARSED.get((path, strict))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        parsed = _parse(path, path.read_text(), strict)
        _PARSED[(path, strict)] = (stamp, parsed)
        return parsed


def _parse(path: Path, text: str, strict: bool) -> KnownHosts:
    pinned = paramiko.HostKeys()
    seen: set[tuple[str, str]] = set()
    revoked: list[Revoked] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = line.split(None, 1)[0] if line.startswith("@") else None
        if marker is not None:
            line = line[len(marker):].strip()
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        except (paramiko.hostkeys.InvalidHostKey, paramiko.SSHException, ValueError):
            entry = None
            if strict:
                raise UserInputError("known_hosts", f"{path}: the line {raw.strip()[:80]!r} is not a host key",
                                     "fix or delete that line (gpuprov pins the key again with "
                                     "--accept-new-host-key)") from None
        if entry is None or entry.key is None or marker == "@cert-authority":
            continue  # a key type paramiko does not know, or a CA for host certificates, which gpuprov does not use
        if marker == "@revoked":
            revoked.append(Revoked(tuple(entry.hostnames), entry.key.asbytes(), path, number))
        elif marker is None:
            for name in entry.hostnames:  # the first key of a type for a host wins, as in paramiko's own load
                if (name, entry.key.get_name()) not in seen:
                    seen.add((name, entry.key.get_name()))
                    pinned.add(name, entry.key.get_name(), entry.key)
    return KnownHosts(pinned, tuple(revoked))


def explain(exc: paramiko.BadHostKeyException, revoked: tuple[Revoked, ...] = ()) -> GpuprovError:
    found = revocation(revoked, exc.key)
    if found is not None:
        return RevokedHostKey(exc.hostname, exc.key, found)
    return HostKeyChanged(exc.hostname, exc.expected_key, exc.key)
