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

With team state (records in S3) every resource also carries `gpuprov:team` (the bucket/prefix) and `gpuprov:member`;
the team's records are shared, so `gc` sweeps by the team tag: what no shared record owns, whoever made it.
"""

from __future__ import annotations

import getpass
import socket

from gpuprov.cloud.providers.base import TAG_MEMBER, TAG_TEAM  # team state: whose records own it, who made it
from gpuprov.paths import install_id

__all__ = ["TAG_MEMBER", "TAG_TEAM", "legacy_owner", "owner", "team_tags"]


def legacy_owner() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def owner() -> str:
    return f"{legacy_owner()}/{install_id()}"




def team_tags() -> dict[str, str] | None:
    """With team state, the tags that say whose team and which member made a resource; `gc` then sweeps the
    team's resources (every member's) that no shared record owns. None with local state."""
    from gpuprov.state.leases import member
    from gpuprov.state.url import configured

    url = configured()
    return {TAG_TEAM: url.team, TAG_MEMBER: member()} if url is not None else None

