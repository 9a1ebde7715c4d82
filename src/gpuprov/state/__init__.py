"""The ground floor: the records gpuprov keeps and who may touch them.

`records` (a node, a cluster's member, a cloud resource, an event, the journal of a move in flight), `machine` (a
node's states and the moves between them, which every store checks), `store` (the one interface every command
keeps them through), its two backends (`sqlite`: the local file; `s3`: a bucket a team shares), `tolerant` (a
take-back's store that survives a failing disk), `url` (where the records live), `errors` (what a store's
failures mean to the user), and the coordination of who works on what: `locks` (a file lock per node, region,
image and host) and `leases` (the same across a team, in the bucket).

`open_store()` is the door every command uses; a command that only reads asks `unrecorded()` first, so a look into
a state folder that has no state makes none there, and says what it read (`described()`) and where else this install
keeps nodes (`elsewhere()`) when it lists none. Nothing here imports a part above it (plan, hosts, cluster, cloud,
cli); boto3 is reached by the bucket's backend only.

What the floor holds to, whichever backend: the money rule (a resource is recorded, with its ClientToken or name,
before the call that creates it, and is tagged `gpuprov:node` and `gpuprov:owner` at creation: a crash at any
instant leaves a row and tags that `down NAME` and `gc` follow), one operation per node at a time (locks.py,
leases.py), and a state file that never lies (sqlite.py, errors.py, tolerant.py: it is never re-created, and a
failure says what failed, never with advice that leads to `gc` while the records are intact). Every store is
reached through `Store` (store.py), so a command does not know which backend it has.
"""

from __future__ import annotations

from pathlib import Path

from gpuprov.state.machine import NodeState
from gpuprov.state.records import (
    UP_STATES,
    Event,
    Journal,
    Member,
    Node,
    NodeFields,
    NodeUpdate,
    Resource,
    ResourceKind,
    members_json,
)
from gpuprov.state.store import Store

__all__ = ["UP_STATES", "Event", "Journal", "Member", "Node", "NodeFields", "NodeState", "NodeUpdate", "Resource",
           "ResourceKind", "Store", "described", "elsewhere", "members_json", "open_store", "unrecorded"]


def open_store() -> Store:
    """The store this install is configured for: an S3 bucket's (`state = "s3://…"` in config.toml, or
    GPUPROV_STATE), else the local SQLite file; its `coordinator` is who may work on what (leases in that bucket,
    else this machine's file locks)."""
    from gpuprov.paths import state_dir
    from gpuprov.state.locks import coordinator
    from gpuprov.state.url import configured

    url = configured()
    store: Store
    if url is not None:
        from gpuprov.state.s3 import S3Store

        store = S3Store(url)
    else:
        from gpuprov.state.sqlite import SqliteStore

        store = SqliteStore(state_dir() / "state.sqlite")
    store.coordinator = coordinator()  # chosen by the same settings: leases with the bucket, file locks with the file
    return store


def unrecorded() -> Path | None:
    """The local state file's path when there is none and no team state is configured: a command that only reads
    has nothing to read, and must say where it looked rather than make a fresh, empty state there (a typo in
    GPUPROV_HOME, a HOME that does not exist). None when there is a state to open."""
    from gpuprov.paths import state_folder
    from gpuprov.state.url import configured

    path = state_folder() / "state.sqlite"
    return path if configured() is None and not path.exists() else None


def elsewhere(store: Store) -> str:
    """Where else this install keeps nodes when `store` lists none, in words ("" when nowhere): the bucket the local
    file's nodes were pushed to (`state push`, the config not yet pointed at it), or the local file's own nodes
    while the team bucket is read."""
    from gpuprov.paths import state_folder
    from gpuprov.state.url import configured

    if configured() is None:
        moved = sorted(set(store.moved().values()))
        if not moved:
            return ""
        count = len(store.moved())
        return (f"{count} node{'s' if count > 1 else ''} of this file moved to {', '.join(moved)} by `gpuprov state "
                f"push`: set state = \"{moved[0]}\" in config.toml (or GPUPROV_STATE) to see them")
    path = state_folder() / "state.sqlite"
    if not path.exists():
        return ""
    from gpuprov.errors import GpuprovError
    from gpuprov.state.sqlite import SqliteStore

    try:
        local = SqliteStore(path)
        count = len(local.nodes())
        local.close()
    except GpuprovError:  # a damaged local file is its own commands' to report, not the team status's
        return ""
    if not count:
        return ""
    return (f"the local file {path} has {count} node{'s' if count > 1 else ''} of its own (GPUPROV_STATE=local "
            "gpuprov status lists them; `gpuprov state push` moves them to the team)")


def described() -> str:
    """The state this install reads, in words: the team bucket's URL, or the local file's path."""
    from gpuprov.paths import state_folder
    from gpuprov.state.url import configured

    url = configured()
    return f"team state {url}" if url is not None else str(state_folder() / "state.sqlite")
