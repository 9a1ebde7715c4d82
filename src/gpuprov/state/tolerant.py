"""The state store as a take-back uses it: one that keeps going when the state file cannot be written.

Taking back a failed `up` (or stopping an interrupted `start` again) must not depend on writing the state:
the disk that filled during the `up` is still full, the file another process locked is still locked. The
records stay readable (state.Store keeps their WAL alive), so the teardown can follow them.

The first failed write is remembered and later ones skipped, the resource rows kept in memory, so the cloud
resources still come down; the message says what the state file could not be told.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpuprov.errors import GpuprovError
from gpuprov.state.errors import StateUnavailable
from gpuprov.state.records import Resource, ResourceKind
from gpuprov.state.store import Store

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpuprov.state.records import Node, NodeFields, NodeUpdate


class TolerantStore:
    """The store as a take-back uses it: taking back a failed `up` must not depend on writing the state (the
    disk that filled during the `up` is still full; the file another process locked is still locked). Reads go
    through. A write that fails is remembered (`failure`), every later one is skipped at once instead of waiting
    30 s for the same lock, and what the resource rows would have become is kept in memory and read back, so the
    teardown that follows them still finds the instance whose id it just learnt: the cloud resources come down,
    and the caller says what the state file could not be told."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.failure: GpuprovError | None = None
        self._rows: dict[int, Resource] = {}  # rows as the writes that did not land left them
        self._next = -1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)  # reads, and the node writes a take-back can do without

    def _write(self, fn: Any, *args: Any, **kwargs: Any) -> bool:
        if self.failure is not None:
            return False
        try:
            fn(*args, **kwargs)
            return True
        except StateUnavailable as exc:  # a full or read-only disk, a lock held too long
            self.failure = exc
            return False

    def create_node(self, name: str, provider: str, region: str, **fields: Unpack[NodeFields]) -> Node:
        return self._store.create_node(name, provider, region, **fields)  # a take-back makes no node: no tolerance

    def update_node(self, name: str, **fields: Unpack[NodeUpdate]) -> None:
        self._write(self._store.update_node, name, **fields)

    def event(self, node: str | None, kind: str, message: str) -> None:
        self._write(self._store.event, node, kind, message)

    def delete_cluster(self, name: str) -> bool:
        return self._write(self._store.delete_cluster, name)

    def created(self, resource_id: int, cloud_id: str) -> None:
        if not self._write(self._store.created, resource_id, cloud_id):
            self._change(resource_id, cloud_id=cloud_id, status="created")

    def deleted(self, resource_id: int) -> None:
        if not self._write(self._store.deleted, resource_id):
            self._change(resource_id, status="deleted", deleted_at=time.time())

    def add_resource(self, node: str | None, kind: ResourceKind, region: str, cloud_id: str,
                     client_token: str | None = None) -> int:
        known = [r for r in self.resources(node, region=region, kind=kind, live_only=False) if r.cloud_id == cloud_id]
        if known:
            return known[0].id
        if self.failure is None:
            try:
                return self._store.add_resource(node, kind, region, cloud_id, client_token)
            except StateUnavailable as exc:
                self.failure = exc
        self._next -= 1
        self._rows[self._next] = Resource(self._next, node, kind, region, client_token, cloud_id, "created",
                                          time.time(), None)
        return self._next

    def resources(self, node: str | None = None, *, region: str | None = None, kind: str | None = None,
                  live_only: bool = True) -> list[Resource]:
        rows = {r.id: r for r in self._store.resources(node, region=region, kind=kind, live_only=False)}
        for rid, row in self._rows.items():
            if (node is None or row.node == node) and (region is None or row.region == region) and \
                    (kind is None or row.kind == kind):
                rows[rid] = row
        found = sorted(rows.values(), key=lambda r: (r.id < 0, abs(r.id)))
        return [r for r in found if not live_only or r.status != "deleted"]

    def _change(self, resource_id: int, **fields: Any) -> None:
        from dataclasses import replace

        row = self._rows.get(resource_id) or next(
            (r for r in self._store.resources(live_only=False) if r.id == resource_id), None)
        if row is not None:
            self._rows[resource_id] = replace(row, **fields)
