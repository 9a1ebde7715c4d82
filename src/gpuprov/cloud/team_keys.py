"""Teammates reach each other's nodes: every member's public key onto a node launched with team state, and the
node's pinned host keys shared in the bucket, so every member verifies the same key (team.py keeps both).

At a launched node's first contact (contact.pin_host_key, contact.bootstrap_launched) `after_contact` puts the
pinned known_hosts in the bucket and every member's key into the login user's ~/.ssh/authorized_keys
(hosts/authorized.py); `team sync NODE` does it again; cli/common.node_target writes the shared pin where a
teammate's SSH reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuprov.state.url import StateUrl, configured

if TYPE_CHECKING:
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target
    from gpuprov.say import Say
    from gpuprov.state.records import Node



def after_contact(name: str, target: Target, settings: HostSettings, say: Say) -> None:
    """Once a launched node answered with its key pinned: share the pin; add the members' keys (team state only)."""
    url = configured()
    if url is None:
        return
    from gpuprov.cloud import team
    from gpuprov.hosts import sshconfig

    team.share_host_keys(url, name, sshconfig.node_known_hosts(name))
    push_keys(url, name, target, settings, say)


def push_keys(url: StateUrl, name: str, target: Target, settings: HostSettings, say: Say) -> int:
    from gpuprov.cloud import team
    from gpuprov.hosts.authorized import add_keys

    members = team.member_keys(url)
    keys = [k for lines in members.values() for k in lines]
    added = add_keys(target, settings, keys)
    say(f"{name}: the keys of {len(members)} member(s) authorized ({added} new)")
    return added


def shared_known_hosts(url: StateUrl, node: Node) -> None:
    """The node's host keys as the member who launched it pinned them, written where this member's SSH reads them
    (the local pin file of a node this member did not launch, or launched before)."""
    from gpuprov.cloud import team
    from gpuprov.files import write_atomic
    from gpuprov.hosts import sshconfig

    text = team.shared_host_keys(url, node.name)
    if text:
        write_atomic(sshconfig.node_known_hosts(node.name), text)


def sync(url: StateUrl, node: Node, key_path: str, say: Say) -> int:
    """`team sync NODE`: every member's key onto the node again, over SSH with the shared host key pin."""
    from gpuprov.errors import UserInputError
    from gpuprov.hosts import sshconfig
    from gpuprov.hosts.remote import HostSettings
    from gpuprov.plan.inventory import Target

    if not node.live or not node.address:
        raise UserInputError("NODE", f"{node.name} has no address to reach ({node.state})", "`gpuprov start` it first")
    shared_known_hosts(url, node)
    known = sshconfig.node_known_hosts(node.name)
    target = Target(host=node.address, user=node.ssh_user, key=key_path, label=node.name, known_hosts=str(known))
    return push_keys(url, node.name, target, HostSettings(known_hosts=known, connect_timeout=15), say)
