"""The role a node's guards stop it with, on a cloud that declares capabilities.STOP_ROLE (Alibaba Cloud: a RAM role
its `ecs-stop` asks ECS for economical mode with): one per owner, shared by the owner's nodes of that cloud in every
region (RAM is global), as the region's key pair is shared by the region's nodes (cloud/keys.py).

Its row is written before the role is asked for, under the name the provider gives it (node None, region "global"),
so that a kill between the record and the create leaves a row that `down` or `gc` deletes the role by, or learns
there is none. It is made under the lock of the pseudo-region "global", which its release takes too: counted there,
it is never deleted under an `up` about to launch with it. The release deletes it through the one destroy gate
(destroy.role) once no node of the cloud needs it: with the last node's `down`, a failed `up`'s take-back, or `gc`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuprov.cloud import destroy
from gpuprov.cloud.keys import release_lock
from gpuprov.cloud.providers.base import GLOBAL, SHARED, CloudResource, NotFound, Provider
from gpuprov.cloud.providers.capabilities import STOP_ROLE, offered, title
from gpuprov.cloud.settle import settle
from gpuprov.errors import GpuprovError
from gpuprov.state import Store, locks

if TYPE_CHECKING:
    from gpuprov.say import Say
    from gpuprov.state.records import Resource


def for_launch(provider: Provider, store: Store, say: Say) -> str | None:
    """The role's name, recorded and made (or found) first; None where the cloud has no such role."""
    roles = offered(provider, STOP_ROLE)
    if roles is None:
        return None
    name = roles.stop_role_name()
    with locks.hold(locks.region(GLOBAL), "stop role"):
        rows = [r for r in store.resources(None, region=GLOBAL, kind="ram-role") if r.client_token == name]
        made = [r for r in rows if r.status == "created"]
        # a role made moments ago may not be readable yet: its fresh record is trusted, an older one is checked
        if made and (settle(made[0]) > 0 or roles.has_stop_role()):
            return name
        rid = rows[0].id if rows else store.intend(None, "ram-role", GLOBAL, name)
        say(f"stop role {name}: the node's guards ask {title(provider)} to stop it with this role (shared by "
            f"your {title(provider)} nodes, deleted with the last of them)")
        roles.create_stop_role()
        store.created(rid, name)
    return name


def users(provider: str, store: Store) -> list[str]:
    """The nodes that need the role: every live record of the cloud but one being taken down and one whose `up` died
    (locks.abandoned), and every node the store names but does not list (`store.moved()`), as for a key pair."""
    live = [n.name for n in store.nodes() if n.provider == provider and n.state != "terminating"
            and not locks.abandoned(n)]
    return live + sorted(set(store.moved()) - set(live))


def release_if_unused(provider: Provider, store: Store, say: Say, unrecorded: Sequence[str] = ()) -> list[str]:
    """The role goes with the cloud's last node, counted and deleted under its lock; `unrecorded`: roles of this
    owner gc found by their tags with no record. Returns the names deleted."""
    if offered(provider, STOP_ROLE) is None:
        return []
    rows = store.resources(None, region=GLOBAL, kind="ram-role")
    if not rows and not unrecorded:
        return []
    gone: list[str] = []
    held = release_lock(GLOBAL, "stop role", "the role of the nodes' guards", "the role of the nodes' guards", say)
    if held is None:
        return gone
    with held:
        if users(provider.name, store):
            return gone
        names: list[tuple[str, Resource | None]] = [(r.cloud_id or r.client_token or "", r) for r in rows]
        names += [(n, None) for n in unrecorded if n not in {m for m, _ in names}]
        for name, row in names:
            try:
                destroy.role(provider, CloudResource("ram-role", name, GLOBAL, SHARED),
                             settle=settle(row) if row is not None else 0.0)
            except NotFound:
                pass
            except GpuprovError as exc:
                say(f"  could not delete the role {name}: {exc} (`gpuprov gc` finds it)")
                continue
            if row is not None:
                store.deleted(row.id)
            gone.append(name)
    return gone
