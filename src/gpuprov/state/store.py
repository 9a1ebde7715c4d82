"""The one interface every command keeps its records through, whichever backend holds them.

Two backends implement it: `sqlite.SqliteStore` (the default: a SQLite file in the state folder, one person on
one machine) and `s3.S3Store` (one object per node in an S3 bucket a team shares, written with
conditional writes). `gpuprov.state.open_store()` picks the one configured (`state` in config.toml, `GPUPROV_STATE`;
url.py). The money rule holds on both: a resource is recorded *before* the call that creates it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gpuprov.errors import UserInputError
from gpuprov.state.records import Event, Node, Resource, ResourceKind

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpuprov.state.coordinator import Coordinator
    from gpuprov.state.records import NodeFields, NodeUpdate


class Store(Protocol):
    """Nodes, the cloud resources each owns, events, clusters of existing hosts."""

    coordinator: Coordinator  # who may work on what beside these records: chosen with them (open_store)

    def close(self) -> None: ...

    def create_node(self, name: str, provider: str, region: str, **fields: Unpack[NodeFields]) -> Node:
        """Claim `name` for a new node; refused (UserInputError, exit 2) while a live node has that name. A field
        Node lacks is a TypeError, before anything is written."""
        ...

    def update_node(self, name: str, **fields: Unpack[NodeUpdate]) -> None:
        """Change a node's fields. A field Node lacks is a TypeError, and a change of state the table lacks
        (machine.py) a machine.IllegalTransition (a bug, not the user's), both before anything is written."""
        ...

    def node(self, name: str) -> Node: ...

    def find_node(self, name: str) -> Node | None: ...

    def nodes(self, include_terminated: bool = False) -> list[Node]: ...

    def moved(self) -> dict[str, str]:
        """Nodes whose records this store does not list (name -> where): `state push` moved them elsewhere (the
        local file), or their object cannot be read (the bucket's): their resources are never orphans."""
        ...

    def intend(self, node: str | None, kind: ResourceKind, region: str, client_token: str | None) -> int: ...

    def created(self, resource_id: int, cloud_id: str) -> None: ...

    def add_resource(self, node: str | None, kind: ResourceKind, region: str, cloud_id: str,
                     client_token: str | None = None) -> int: ...

    def deleted(self, resource_id: int) -> None: ...

    def resources(self, node: str | None = None, *, region: str | None = None, kind: str | None = None,
                  live_only: bool = True) -> list[Resource]: ...

    def save_cluster(self, name: str, spec_json: str) -> None: ...

    def cluster_json(self, name: str) -> str | None: ...

    def delete_cluster(self, name: str) -> bool: ...

    def cluster_names(self) -> list[str]: ...

    def event(self, node: str | None, kind: str, message: str) -> None: ...

    def events(self, node: str) -> list[Event]: ...


def no_such_node(name: str, store: Store, where: str = "") -> UserInputError:
    """The refusal for a name no record has (both backends' `node`), listing the live nodes there are."""
    known = [n.name for n in store.nodes() if n.live]
    return UserInputError("NAME", f"no node called {name!r}{where}",
                          f"known nodes: {', '.join(known)}" if known else "`gpuprov status` lists nodes")
