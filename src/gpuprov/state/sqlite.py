"""Local state: SQLite in the user's state dir. Nodes, the cloud resources each owns, events.

The money rule lives here: a resource row (with its ClientToken or name) is written *before*
the call that creates it, and gets its cloud id after. A crash at any instant therefore leaves
a row that `down`/`gc` can follow to the resource, by id or by tag.

Every call opens its own connection (WAL mode, busy timeout), so threads and concurrent
gpuprov processes never corrupt the file; writes are short transactions.

A node records its spot type (one-time or persistent: `can_stop`), shutdown action, disk size, connect mode,
budget (dollars, the price it was turned into a deadline with, the deadline) and its TTL's own deadline apart from
the sooner of the two (`ttl_end`, `ttl_deadline`), a launched cluster's size and members
(`members_json`, rank order), a resize in progress (`resize_from`/`resize_to`, written before
ModifyInstanceAttribute), a move's journal (`journal_json`), who locked its guardrails, and `moved_to` once `state
push` moved it to a bucket. The clusters table keeps clusters of existing hosts (gpuprov.cluster's JSON).

The file is never re-created: opening runs `PRAGMA quick_check`, and an empty or unreadable file is `StateError`
naming the file and the way out; one of a newer schema (`PRAGMA user_version`, the gpuprov that wrote it in
`meta`) is `StateTooNew` (errors.py). Reads are plain transactions, never waiting for a writer, and the store keeps
one idle connection open, so the WAL and shared-memory files live and the records stay readable on a full disk.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from gpuprov import __version__
from gpuprov.errors import UserInputError
from gpuprov.state.errors import StateError, StateTooNew, explain
from gpuprov.state.machine import NodeState, check_move
from gpuprov.state.records import Event, Node, Resource, ResourceKind, node_fields
from gpuprov.state.store import no_such_node

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpuprov.state.records import NodeFields, NodeUpdate

__all__ = ["SCHEMA_VERSION", "SqliteStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    region TEXT NOT NULL,
    zone TEXT,
    gpu TEXT,
    gpu_count INTEGER,
    instance_type TEXT,
    market TEXT,
    state TEXT NOT NULL,
    state_reason TEXT,
    address TEXT,
    ssh_user TEXT,
    price_usd_hour REAL,
    owner TEXT,
    plan_json TEXT,
    pid INTEGER,
    host TEXT,
    created_at REAL NOT NULL,
    ready_at REAL,
    ended_at REAL,
    autostop_seconds INTEGER,
    ttl_seconds INTEGER,
    ttl_deadline REAL,
    on_interrupt TEXT,
    spot_type TEXT,
    shutdown_action TEXT,
    disk_gb INTEGER,
    connect TEXT,
    budget_usd REAL,
    budget_deadline REAL,
    budget_price REAL,
    resize_from TEXT,
    resize_to TEXT,
    stopped_at REAL,
    cluster_size INTEGER,
    members_json TEXT,
    paid_usd_hour REAL,
    billed_seconds REAL,
    running_since REAL
);
CREATE TABLE IF NOT EXISTS resources (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT,
    kind TEXT NOT NULL,
    region TEXT NOT NULL,
    client_token TEXT,
    cloud_id TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    deleted_at REAL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS resources_node ON resources(node);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS clusters (
    name TEXT PRIMARY KEY,
    spec_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
"""
# The file's layout (PRAGMA user_version). A gpuprov refuses a file of a newer schema rather than misread it;
# older files are brought up to this one on open. 0: files from before the schema had a number.
SCHEMA_VERSION = 7  # 4: guards_locked_by (an older gpuprov would lift a locked TTL unknowingly), moved_to
# 5: journal_json (an older gpuprov would take a moving node's new instance for nothing)
# 6: ttl_end (an older gpuprov's `ttl` would leave it stale, and a `start` would keep a deadline no longer asked for)
# 7: disk_usd_hour (a stopped Alibaba node's disk price, read at launch or stop)
# Columns added after the first release: (name, type), added to an older state file on open.
_NODE_COLUMNS_ADDED = (("autostop_seconds", "INTEGER"), ("ttl_seconds", "INTEGER"), ("ttl_deadline", "REAL"),
                       ("on_interrupt", "TEXT"), ("spot_type", "TEXT"), ("shutdown_action", "TEXT"),
                       ("disk_gb", "INTEGER"), ("connect", "TEXT"), ("budget_usd", "REAL"), ("budget_deadline", "REAL"),
                       ("budget_price", "REAL"),
                       ("resize_from", "TEXT"), ("resize_to", "TEXT"), ("stopped_at", "REAL"),
                       ("cluster_size", "INTEGER"), ("members_json", "TEXT"), ("paid_usd_hour", "REAL"),
                       ("billed_seconds", "REAL"), ("running_since", "REAL"), ("reservation_id", "TEXT"),
                       ("reservation_end", "REAL"),
                       ("guards_locked_by", "TEXT"), ("moved_to", "TEXT"), ("journal_json", "TEXT"),
                       ("ttl_end", "REAL"), ("disk_usd_hour", "REAL"))


if TYPE_CHECKING:
    from gpuprov.state.coordinator import Coordinator


class SqliteStore:
    """The default backend: a SQLite file in the state folder (store.Store is the interface)."""

    coordinator: Coordinator  # this machine's file locks (open_store gives it)

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and not path.is_file():
            raise StateError(path, "is not a file")
        if path.exists() and path.stat().st_size == 0:  # SQLite would take it for a new, empty state
            raise StateError(path, "is empty (0 bytes): it holds no records, though your nodes may still run")
        try:
            if not path.exists():
                self._create(path)
            self._open_and_migrate(path)
            if path.stat().st_mode & 0o777 != 0o600:
                path.chmod(0o600)
            # held open, never queried: the WAL and shared-memory files live while any connection does, so each
            # call's own connection finds them instead of making them afresh, which a full disk would refuse even
            # for a read (the records must stay readable there: a take-back follows them)
            self._keeper = sqlite3.connect(path, check_same_thread=False)
            self._keeper.execute("PRAGMA schema_version").fetchone()
        except sqlite3.Error as exc:  # "file is not a database", "malformed", a read-only or full disk, locked …
            raise explain(exc, path) from None
        except OSError as exc:  # chmod on a read-only file system, a folder gpuprov may not write
            raise explain(sqlite3.OperationalError(f"readonly: {exc.strerror}"), path) from None

    @classmethod
    def _create(cls, path: Path) -> None:
        """A new state file appears whole or not at all: made and laid out under a private name, then linked into
        place (a process killed while SQLite writes its first page would otherwise leave an empty file, which is
        refused as damage). If another process made it meanwhile, theirs is kept."""
        tmp = path.with_name(f".{path.name}.new-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        try:
            cls._open_and_migrate(tmp)
            tmp.chmod(0o600)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links: a rename, if nobody made it meanwhile
                if not path.exists():
                    os.rename(tmp, path)
        finally:
            for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
                leftover.unlink(missing_ok=True)

    @staticmethod
    def _open_and_migrate(path: Path) -> None:
        db = sqlite3.connect(path, timeout=30)
        try:
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("database disk image is malformed")
            schema = int(db.execute("PRAGMA user_version").fetchone()[0])
            if schema > SCHEMA_VERSION:
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_written_by'").fetchone() \
                    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone() else None
                raise StateTooNew(path, schema, SCHEMA_VERSION, row[0] if row else None, __version__)
            if schema == SCHEMA_VERSION:
                return  # already this layout: opening writes nothing
            db.execute("PRAGMA journal_mode=WAL")  # readers never block the writer; set once, kept in the file
            db.executescript(_SCHEMA)  # idempotent (IF NOT EXISTS); executescript manages its own transaction
            have = {row[1] for row in db.execute("PRAGMA table_info(nodes)")}
            for column, kind in _NODE_COLUMNS_ADDED:
                if column not in have:
                    try:
                        db.execute(f"ALTER TABLE nodes ADD COLUMN {column} {kind}")
                    except sqlite3.OperationalError as exc:  # another process added it first
                        if "duplicate column" not in str(exc):
                            raise
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_written_by', ?)", (__version__,))
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.commit()
        finally:
            db.close()

    def close(self) -> None:
        """Let go of the file (the connection that keeps its WAL alive); calls after this reopen nothing."""
        self._keeper.close()

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One short transaction. A write takes the file's write lock at once (BEGIN IMMEDIATE: no upgrade
        deadlock); a read is a plain one, which in WAL mode never waits for a writer. Any SQLite failure is
        said as what it is (errors.explain): a full or read-only disk, a lock held too long."""
        try:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        except sqlite3.Error as exc:
            raise explain(exc, self.path) from None
        db.row_factory = sqlite3.Row
        try:
            db.execute("PRAGMA busy_timeout=30000")
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            raise explain(exc, self.path) from None
        finally:
            db.close()

    # --- nodes ---------------------------------------------------------------------------

    def create_node(self, name: str, provider: str, region: str, **fields: Unpack[NodeFields]) -> Node:
        """Claim `name` for a new node; refused while a live node has that name."""
        given = node_fields("create_node", fields, region=False)
        with self._tx() as db:
            row = db.execute("SELECT state, moved_to FROM nodes WHERE name = ?", (name,)).fetchone()
            if row and row["moved_to"]:
                raise _moved(name, row["moved_to"])
            if row and row["state"] != "terminated":
                raise UserInputError("NAME", f"a node called {name!r} already exists ({row['state']})",
                                     f"pick another name, or `gpuprov down {name}` first")
            db.execute("DELETE FROM nodes WHERE name = ?", (name,))
            columns = {"name": name, "provider": provider, "region": region, "state": NodeState.LAUNCHING,
                       "created_at": time.time(), **given}
            db.execute(f"INSERT INTO nodes ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                       tuple(columns.values()))
        return self.node(name)

    def update_node(self, name: str, **fields: Unpack[NodeUpdate]) -> None:
        """Change a node's fields; a change of state the table lacks (machine.py) is refused, nothing written."""
        changes = node_fields("update_node", fields, region=True)
        if not changes:
            return
        sets = ", ".join(f"{k} = ?" for k in changes)
        with self._tx() as db:  # the state read and the change made in one write transaction: no change between
            if "state" in changes:
                row = db.execute("SELECT state FROM nodes WHERE name = ?", (name,)).fetchone()
                if row is not None:
                    check_move(name, row["state"], changes["state"])
            db.execute(f"UPDATE nodes SET {sets} WHERE name = ?", (*changes.values(), name))

    def node(self, name: str) -> Node:
        found = self.find_node(name)
        if found is None:
            moved = self.moved().get(name)
            if moved is not None:
                raise _moved(name, moved)
            raise no_such_node(name, self)
        return found

    def find_node(self, name: str) -> Node | None:
        with self._tx(write=False) as db:
            row = db.execute("SELECT * FROM nodes WHERE name = ? AND moved_to IS NULL", (name,)).fetchone()
        return Node(**dict(row)) if row else None

    def nodes(self, include_terminated: bool = False) -> list[Node]:
        with self._tx(write=False) as db:
            rows = db.execute("SELECT * FROM nodes WHERE moved_to IS NULL ORDER BY created_at").fetchall()
        found = [Node(**dict(r)) for r in rows]
        return found if include_terminated else [n for n in found if n.live]

    def moved(self) -> dict[str, str]:
        """The nodes `state push` moved to a bucket, and where: no local command sees them any more, and a local
        `gc` counts their resources as owned (the bucket's records own them now)."""
        with self._tx(write=False) as db:
            rows = db.execute("SELECT name, moved_to FROM nodes WHERE moved_to IS NOT NULL").fetchall()
        return {str(r["name"]): str(r["moved_to"]) for r in rows}

    def backup(self, to: Path) -> None:
        """A consistent copy of the whole file at `to` (SQLite's online backup: the WAL's pages included), 0600."""
        try:
            src = sqlite3.connect(self.path, timeout=30)
            dst = sqlite3.connect(to)
            try:
                src.backup(dst)
            finally:
                dst.close()
                src.close()
            to.chmod(0o600)
        except sqlite3.Error as exc:
            raise explain(exc, to) from None

    # --- resources -----------------------------------------------------------------------

    def intend(self, node: str | None, kind: ResourceKind, region: str, client_token: str | None) -> int:
        """Record a resource about to be requested; returns its row id."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO resources (node, kind, region, client_token, status, created_at) "
                "VALUES (?, ?, ?, ?, 'intent', ?)", (node, kind, region, client_token, time.time()))
            return int(cur.lastrowid or 0)

    def created(self, resource_id: int, cloud_id: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE resources SET cloud_id = ?, status = 'created' WHERE id = ?", (cloud_id, resource_id))

    def add_resource(self, node: str | None, kind: ResourceKind, region: str, cloud_id: str,
                     client_token: str | None = None) -> int:
        """Record a resource learned after the fact (a volume or spot request AWS made for an instance)."""
        with self._tx() as db:
            row = db.execute("SELECT id FROM resources WHERE kind = ? AND cloud_id = ? AND region = ?",
                             (kind, cloud_id, region)).fetchone()
            if row:
                return int(row["id"])
            cur = db.execute(
                "INSERT INTO resources (node, kind, region, client_token, cloud_id, status, created_at) "
                "VALUES (?, ?, ?, ?, ?, 'created', ?)", (node, kind, region, client_token, cloud_id, time.time()))
            return int(cur.lastrowid or 0)

    def deleted(self, resource_id: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE resources SET status = 'deleted', deleted_at = ? WHERE id = ?", (time.time(), resource_id))

    def resources(self, node: str | None = None, *, region: str | None = None, kind: str | None = None,
                  live_only: bool = True) -> list[Resource]:
        query, args = "SELECT * FROM resources WHERE 1 = 1", []
        if node is not None:
            query += " AND node = ?"
            args.append(node)
        if region is not None:
            query += " AND region = ?"
            args.append(region)
        if kind is not None:
            query += " AND kind = ?"
            args.append(kind)
        if live_only:
            query += " AND status != 'deleted'"
        with self._tx(write=False) as db:
            rows = db.execute(query + " ORDER BY id", args).fetchall()
        return [Resource(**dict(r)) for r in rows]

    # --- clusters (gpuprov.cluster owns the spec: ordered members, master address and port) ----

    def save_cluster(self, name: str, spec_json: str) -> None:
        """Record (or replace) a cluster of existing hosts by name."""
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT INTO clusters (name, spec_json, created_at, updated_at) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT(name) DO UPDATE SET spec_json = excluded.spec_json, updated_at = excluded.updated_at",
                       (name, spec_json, now, now))

    def cluster_json(self, name: str) -> str | None:
        with self._tx(write=False) as db:
            row = db.execute("SELECT spec_json FROM clusters WHERE name = ?", (name,)).fetchone()
        return str(row["spec_json"]) if row else None

    def delete_cluster(self, name: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM clusters WHERE name = ?", (name,)).rowcount > 0

    def cluster_names(self) -> list[str]:
        with self._tx(write=False) as db:
            return [str(r["name"]) for r in db.execute("SELECT name FROM clusters ORDER BY created_at")]

    # --- events --------------------------------------------------------------------------

    def event(self, node: str | None, kind: str, message: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO events (node, at, kind, message) VALUES (?, ?, ?, ?)",
                       (node, time.time(), kind, message))

    def events(self, node: str) -> list[Event]:
        with self._tx(write=False) as db:
            rows = db.execute("SELECT node, at, kind, message FROM events WHERE node = ? ORDER BY id", (node,)).fetchall()
        return [Event(**dict(r)) for r in rows]


def _moved(name: str, url: str) -> UserInputError:
    return UserInputError("NAME", f"{name} was moved to {url} by `gpuprov state push`: its record lives there now",
                          f'set state = "{url}" in config.toml (or GPUPROV_STATE={url}) to work on it')
