"""Who owns a cloud resource: the `gpuprov:owner` tag every resource gpuprov makes carries.

`user@host` alone is not unique: two CI runners, or two cloned VMs, with the same user and host name would
collect each other's live nodes with `gc --yes` and share (and delete, and re-import) one key pair. So the
owner is `user@host/ID`, ID a random id made once per install and kept beside the state (`install-id`):
another machine's state is never this one's, however its user and host are called. (The AWS account needs no
place in it: tags are read inside one account, so no other account's resource is ever seen.)

Resources tagged before this (`user@host`, the legacy owner) are still found by the commands that follow
records (`down`, a recorded node's teardown). `gc` lists every install of this user and host name, and sets
the other installs' unrecorded resources apart (they may be another machine's live nodes): it takes them
only with `--all-installs` (also the way back for this machine's own lost state folder).
"""

from __future__ import annotations

import getpass
import socket

from gpuprov.paths import install_id


def legacy_owner() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def owner() -> str:
    return f"{legacy_owner()}/{install_id()}"

