"""`bootstrap HOST --offline DIR`: the bundle onto the host, over the same SSH connection (SFTP), before its steps run.

Only what the host lacks goes: the host's copy is read first (`sha256sum` of every file under plan/offline.py's
OFFLINE_DIR), each file of the manifest whose sha256 differs or is absent is sent, and the host's copy is read again
and must match the manifest file for file, so a cut transfer is resumed by the next run and a damaged one is never
installed from. A login that is not root sends into a folder of its home (STAGE), which sudo then copies into
OFFLINE_DIR as root's and removes: the login cannot change what is installed from the bundle, and its home keeps no
second copy; what a cut transfer left in STAGE counts as sent, as what is in OFFLINE_DIR does.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from gpuprov.errors import GpuprovError
from gpuprov.hosts.remote import Remote
from gpuprov.plan.offline import MANIFEST, OFFLINE_DIR, Manifest

STAGE = ".gpuprov-offline"  # in the login's home, for a login that is not root


def _sums(remote: Remote, folder: str, sudo: bool) -> dict[str, str]:
    """path (relative) -> sha256 of every file under `folder` on the host."""
    quoted = shlex.quote(folder)
    done = remote.run(f"mkdir -p {quoted} && cd {quoted} && find . -type f -print0 | xargs -0 -r sha256sum",
                      sudo=sudo)
    if not done.ok:
        raise GpuprovError(f"cannot read {folder} on the host: {done.stderr.strip()[-300:]}")
    out = {}
    for line in done.stdout.splitlines():
        sha, _, path = line.partition("  ")
        if path:
            out[path.removeprefix("./")] = sha
    return out


def push(remote: Remote, folder: Path, manifest: Manifest, note: Callable[[str], None]) -> int:
    """Make the host's OFFLINE_DIR hold the bundle in `folder`; the bytes sent."""
    root = remote.is_root
    target = OFFLINE_DIR if root else STAGE
    want = {i.path: i.sha256 for i in manifest.items}
    have = _sums(remote, OFFLINE_DIR, sudo=not root)
    staged = {} if root else _sums(remote, STAGE, sudo=False)
    send = sorted(p for p, sha in want.items() if sha not in (have.get(p), staged.get(p)))
    sent = 0
    if send:
        parents = sorted({str(PurePosixPath(target) / PurePosixPath(p).parent) for p in send})
        made = remote.run("mkdir -p " + " ".join(shlex.quote(p) for p in parents))
        if not made.ok:
            raise GpuprovError(f"cannot make {target} on the host: {made.stderr.strip()[-300:]}")
        sftp = remote.conn.sftp()
        for path in send:
            local = folder / path
            note(f"offline: sending {path} ({local.stat().st_size} bytes)")
            sftp.put(str(local), f"{target}/{path}")
            sent += local.stat().st_size
    remote.put_bytes((folder / MANIFEST).read_bytes(), f"{target}/{MANIFEST}")
    if not root:  # into place as root's (cp -R: the login's ownership is not kept), the stage gone
        copied = remote.run(f"mkdir -p {OFFLINE_DIR} && cp -R {STAGE}/. {OFFLINE_DIR}/ && "
                            f"chown -R root:root {OFFLINE_DIR} && rm -rf {STAGE}", sudo=True)
        if not copied.ok:
            raise GpuprovError(f"cannot copy the bundle into {OFFLINE_DIR}: {copied.stderr.strip()[-300:]}")
    now = _sums(remote, OFFLINE_DIR, sudo=not root)
    bad = sorted(p for p, sha in want.items() if now.get(p) != sha)
    if bad:
        raise GpuprovError(f"the bundle on the host differs from {folder / MANIFEST} after the transfer: "
                           f"{', '.join(bad[:5])}{' …' if len(bad) > 5 else ''}; nothing was installed")
    note(f"offline: {OFFLINE_DIR} holds the bundle ({len(want)} files, {sent} bytes sent)")
    return sent
