"""Public keys added to a host's ~/.ssh/authorized_keys (the login user's: the file sshd reads by default and
cloud-init writes the launch key into): a team's members reach the nodes any of them launched.

Each key line is added once (a line already there is left), the file and folder kept private (0700/0600, as
sshd's StrictModes wants), and every key is passed quoted: a key file's comment is a user value.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from gpuprov.errors import GpuprovError

if TYPE_CHECKING:
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target

SCRIPT = """set -eu
umask 077
mkdir -p "$HOME/.ssh"
f="$HOME/.ssh/authorized_keys"
touch "$f"
added=0
for key in {keys}; do
  if ! grep -qxF -- "$key" "$f"; then printf '%s\\n' "$key" >> "$f"; added=$((added + 1)); fi
done
chmod 700 "$HOME/.ssh"; chmod 600 "$f"
echo "added=$added"
"""


def script(keys: list[str]) -> str:
    return SCRIPT.format(keys=" ".join(shlex.quote(k) for k in keys))


def add_keys(target: Target, settings: HostSettings, keys: list[str]) -> int:
    """Add `keys` to the login user's authorized_keys on `target`; returns how many were new."""
    from gpuprov.hosts.remote import Remote

    if not keys:
        return 0
    remote = Remote(target, settings)
    try:
        remote.open()
        result = remote.run(script(keys))
    finally:
        remote.close()
    if not result.ok:
        raise GpuprovError(f"{target.label or target.host}: could not update authorized_keys: "
                           f"{(result.stderr or result.stdout).strip()[-300:]}")
    line = next((w for w in result.stdout.split() if w.startswith("added=")), "added=0")
    return int(line.removeprefix("added="))
