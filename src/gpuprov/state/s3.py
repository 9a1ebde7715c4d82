"""Team state: the records in an S3 bucket a team shares, one object per node, written with conditional writes.

Layout under the prefix (`state = "s3://BUCKET/PREFIX"`, url.py):

    nodes/NAME.json      the node's record, its resources and its events (one object: one conditional write
                         changes all three together)
    unowned.json         resources and events that belong to no node (images outlive the node they were baked from)
    clusters/NAME.json   clusters of existing hosts
    leases/KEY.json      who works on a node now (leases.py)
    members/MEMBER.pub   the team's public keys (team.py); known_hosts/NAME: the nodes' pinned host keys

No server and no lock table: S3's conditional writes (user guide, "How to prevent object overwrites with
conditional writes"; PutObject's If-None-Match / If-Match) decide every race. A node is created with
`If-None-Match: *` (two teammates' `up NAME` at once: exactly one write succeeds, the other gets 412 and the name
is taken), and every change re-reads the object, applies itself and writes with `If-Match: <etag>`; a 412
(someone wrote in between) or a 409 ConditionalRequestConflict (a conflicting write in flight) re-reads and
re-applies, so concurrent `status --refresh`, `stop`, `autostop` lose nothing.

`Bucket.change` is read, apply, PutObject If-Match; a 412 or 409 (or a 404 on an object deleted meanwhile) re-reads
and re-applies, jittered, up to 60 times. A conditional write whose answer was lost may have landed (botocore
sends it again, and the repeat meets its own write: 412): before calling the object someone else's, what is stored
is compared with what was sent, so a node's creation is not "taken" by itself and a change is not applied twice.
A terminated node's name is taken over with If-Match. Resource ids are microseconds plus randomness (unique across
members, growing with time, so rows read back in order); the store learns which object holds a row as it reads.
`nodes()` is one ListObjectsV2 and a GET per node, 16 at a time.

What the bucket holds is input, written by any member's gpuprov, of any version, or by hand: a record whose name
is not its object's, or breaks the name rule, is refused by name (BadObject), as is an object that does not parse
or a state word this gpuprov does not know. A listing (`status`, `gc`) names it in a warning and goes on with the
rest; a name read from the bucket passes the name rule before it names a lock or a local file.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

from gpuprov import mutations
from gpuprov.endpoints import WebPage, endpoint_url, no_web_page, unreadable_answer
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.state.errors import StateUnavailable
from gpuprov.state.machine import NodeState, check_move
from gpuprov.state.records import Event, Node, Resource, ResourceKind, node_fields
from gpuprov.state.store import no_such_node
from gpuprov.state.url import StateUrl

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpuprov.state.coordinator import Coordinator
    from gpuprov.state.records import NodeFields, NodeUpdate

T = TypeVar("T")
_NODE_FIELDS = {f.name for f in fields(Node)}
_ATTEMPTS = 60  # conditional-write retries before giving up (40 writers at once settle in far fewer)
UNOWNED = "unowned.json"
# a node's name as `up` takes it (cloud/launch.py, check_name): a name read from the bucket is held to it before it
# names an object, a lock or a local file
NAME_RULE = re.compile(r"[a-z0-9][a-z0-9-]{0,38}")
_CLUSTER_RULE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # a cluster's (cluster/__init__.py, check_name)


@dataclass(frozen=True)
class Stored:
    doc: dict[str, Any]
    etag: str
    age: float | None  # seconds since it was last written, by the bucket's clock (None: the answer had no Date)


class Conflict(Exception):
    """A conditional write lost: 412 PreconditionFailed, 409 ConditionalRequestConflict, or the object went."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code

    @property
    def in_flight(self) -> bool:
        """S3's 409: another conditional write to the object was in flight. Nothing was decided: this one may be
        sent again as it is (a 412 says the condition itself failed)."""
        return self.code == "ConditionalRequestConflict"


class BadObject(UserInputError):
    """An object in the bucket that is not a record this gpuprov reads: it does not parse, its record names another
    object or breaks the name rule, or its state is a word this gpuprov does not know (a newer gpuprov's). What the
    bucket holds is input: the object is named, and where many are read (`status`, `gc`) skipped."""

    def __init__(self, url: StateUrl, name: str, problem: str) -> None:
        super().__init__(f"{url}{name}", problem, "fix or remove that object (the bucket keeps its versions), or use "
                         "the gpuprov that wrote it")


class BucketUnavailable(StateUnavailable):
    """The bucket cannot be read or written now (no such bucket, access denied, the endpoint unreachable)."""

    def __init__(self, url: StateUrl, detail: str, fix: str = "") -> None:
        from pathlib import Path

        self.path = Path(str(url))
        self.reason = "io"
        fix = fix or "check the bucket name, your AWS credentials and the permissions docs/team.md lists"
        GpuprovError.__init__(self, f"state: {url}: {detail}\n  fix: {fix}")


def client() -> Any:
    """boto3's S3 client on the same credential and endpoint chain as EC2 (AWS_ENDPOINT_URL for a local one, where
    buckets are addressed by path: a local endpoint has no per-bucket host names)."""
    import boto3
    from botocore.config import Config

    local = endpoint_url("S3") is not None
    attempts = int(os.environ.get("AWS_MAX_ATTEMPTS") or 5)
    config = Config(retries={"mode": os.environ.get("AWS_RETRY_MODE") or "standard",  # type: ignore[typeddict-item]
                             "total_max_attempts": attempts},
                    connect_timeout=10, read_timeout=60, max_pool_connections=32,
                    s3={"addressing_style": "path"} if local else None)
    made = boto3.session.Session().client("s3", config=config)
    made.meta.events.register("before-parse", no_web_page)
    mutations.guard(made, "s3", retries=attempts > 1)
    return made


def _code(exc: Exception) -> tuple[str, int]:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")), int(response.get("ResponseMetadata", {})
                                                                 .get("HTTPStatusCode", 0) or 0)


class Bucket:
    """The objects under one prefix, as JSON documents with their ETags; every botocore failure said as a
    BucketUnavailable (or Conflict, for a conditional write that lost)."""

    def __init__(self, url: StateUrl, s3: Any = None) -> None:
        self.url = url
        self.s3 = s3 if s3 is not None else client()

    def key(self, name: str) -> str:
        return self.url.prefix + name

    def _call(self, fn: Callable[[], T], *, conditional: bool = False) -> T:
        from botocore.exceptions import BotoCoreError, ClientError
        from botocore.parsers import ResponseParserError

        try:
            return fn()
        except ClientError as exc:
            code, status = _code(exc)
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                raise Conflict(code or ("ConditionalRequestConflict" if status == 409 else "PreconditionFailed")) \
                    from None
            if conditional and code == "NoSuchKey":  # If-Match on an object someone deleted meanwhile
                raise Conflict(code) from None
            if code == "NoSuchBucket":
                raise BucketUnavailable(self.url, f"no bucket {self.url.bucket!r}",
                                        "create it with versioning on (docs/team.md), or fix "
                                        "`state`") from None
            raise BucketUnavailable(self.url, f"{code or status}: {exc}") from None
        except (ResponseParserError, WebPage) as exc:  # not S3's answer: the endpoint set is something else
            raise unreadable_answer(f"S3 for {self.url}", str(exc), "S3") from None
        except BotoCoreError as exc:
            raise BucketUnavailable(self.url, str(exc)) from None

    def get(self, name: str) -> tuple[dict[str, Any], str] | None:
        """The document and its ETag, None when there is none."""
        got = self.read(name)
        return (got.doc, got.etag) if got else None

    def read(self, name: str) -> Stored | None:
        """The document, its ETag, and how old S3 says it is (its Last-Modified against the answer's Date: the
        bucket's clock, never two members' clocks compared)."""
        from botocore.exceptions import ClientError

        def read() -> Stored | None:
            try:
                got = self.s3.get_object(Bucket=self.url.bucket, Key=self.key(name))
            except ClientError as exc:
                if _code(exc)[0] in ("NoSuchKey", "404"):
                    return None
                raise
            date = got.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            modified = got.get("LastModified")
            age = None
            if date and modified is not None:
                from email.utils import parsedate_to_datetime

                age = (parsedate_to_datetime(date) - modified).total_seconds()
            body = got["Body"].read()
            try:
                doc = json.loads(body)
            except ValueError as exc:  # UnicodeDecodeError is one too
                raise BadObject(self.url, name, f"is not JSON ({exc})") from None
            if not isinstance(doc, dict):
                raise BadObject(self.url, name, f"holds a JSON {type(doc).__name__}, not a record")
            return Stored(doc, str(got["ETag"]), age)

        return self._call(read)

    def read_text(self, name: str) -> str | None:
        """A plain text object (a member's public keys, a node's known_hosts), None when there is none."""
        from botocore.exceptions import ClientError

        def read() -> str | None:
            try:
                return str(self.s3.get_object(Bucket=self.url.bucket, Key=self.key(name))["Body"].read().decode())
            except ClientError as exc:
                if _code(exc)[0] in ("NoSuchKey", "404"):
                    return None
                raise

        return self._call(read)

    def put(self, name: str, doc: dict[str, Any] | str, *, etag: str | None = None, create: bool = False) -> str:
        """Write `doc`: only if there is none (`create`), only over the version `etag` names, or unconditionally.
        Returns the new ETag; a lost condition is Conflict."""
        body = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"))
        extra: dict[str, str] = {"IfNoneMatch": "*"} if create else {"IfMatch": etag} if etag else {}
        answer = self._call(lambda: self.s3.put_object(Bucket=self.url.bucket, Key=self.key(name), Body=body.encode(),
                                                       ContentType="text/plain" if isinstance(doc, str)
                                                       else "application/json", **extra),
                            conditional=etag is not None)
        return str(answer["ETag"])

    def delete(self, name: str, *, etag: str | None = None) -> None:
        """Delete `name`; with `etag`, only that version of it (If-Match): one someone rewrote since is left, and the
        lost condition is Conflict (S3's 412, or NoSuchKey when it is gone). S3 general purpose buckets take
        If-Match on DeleteObject since 2025-09-16 (AWS What's New; user guide, "How to perform conditional
        deletes": 204 on a match, 412 otherwise; it needs s3:GetObject besides s3:DeleteObject)."""
        extra = {"IfMatch": etag} if etag else {}
        self._call(lambda: self.s3.delete_object(Bucket=self.url.bucket, Key=self.key(name), **extra),
                   conditional=etag is not None)

    def names(self, folder: str) -> list[str]:
        """The object names under `folder` ("nodes/"), every page read."""
        out: list[str] = []

        def listing() -> None:
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.url.bucket,
                                                                         Prefix=self.key(folder)):
                out.extend(str(o["Key"])[len(self.url.prefix):] for o in page.get("Contents", []))

        self._call(listing)
        return out

    def change(self, name: str, apply: Callable[[dict[str, Any]], T], *, missing: Callable[[], dict[str, Any]] | None
               = None) -> T | None:
        """Read, apply, write with If-Match; a lost race re-reads and re-applies. A missing object is made from
        `missing()` (with If-None-Match), or the change is skipped (None) when there is no `missing`."""
        sent: tuple[dict[str, Any], T] | None = None  # the document last written and its result, on a Conflict
        for attempt in range(_ATTEMPTS):
            got = self.get(name)
            if got is not None and sent is not None and got[0] == sent[0]:
                return sent[1]  # our write landed behind a lost answer (its repeat got the 412): applying it again
                # would apply it twice (an event, an intent row)
            if got is None and missing is None:
                return None
            doc, etag = got if got is not None else (missing() if missing else {}, None)
            result = apply(doc)
            try:
                self.put(name, doc, etag=etag, create=etag is None)
                return result
            except Conflict:
                sent = _as_stored(doc), result
                time.sleep(random.uniform(0, min(0.5, 0.01 * 2 ** min(attempt, 6))))  # jittered: writers spread out
        raise BucketUnavailable(self.url, f"{name}: {_ATTEMPTS} conditional writes in a row lost to other writers",
                                "run the command again")

    def versioning(self) -> str:
        """The bucket's versioning status: "Enabled", "Suspended" or "" (never enabled)."""
        return str(self._call(lambda: self.s3.get_bucket_versioning(Bucket=self.url.bucket)).get("Status") or "")


def _as_stored(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` as the bucket gives it back (JSON's types): what a read-back compares with what was sent."""
    loaded: dict[str, Any] = json.loads(json.dumps(doc, separators=(",", ":")))
    return loaded


def _resource(row: dict[str, Any]) -> Resource:
    return Resource(**row)


def _new_id() -> int:
    """A resource row's id, unique across every member's processes (microseconds, then randomness) and growing with
    time, so rows read back in the order they were recorded as the SQLite backend's do."""
    return time.time_ns() // 1000 * 1000 + secrets.randbelow(1000)


class S3Store:
    """store.Store on a bucket: the team's records."""

    coordinator: Coordinator  # the team's leases in this bucket (open_store gives it)

    def __init__(self, url: StateUrl, s3: Any = None) -> None:
        self.url = url
        self.bucket = Bucket(url, s3)
        self._where: dict[int, str] = {}  # resource id -> the object holding its row (learnt as rows are seen)
        self._skipped: set[str] = set()  # the objects a listing left out, said once each
        self._guard = threading.Lock()

    def close(self) -> None:
        """Nothing to let go of: every call is its own request."""

    # --- nodes ---------------------------------------------------------------------------

    @staticmethod
    def _node_object(name: str) -> str:
        return f"nodes/{name}.json"

    def create_node(self, name: str, provider: str, region: str, **fields: Unpack[NodeFields]) -> Node:
        """Claim `name` with If-None-Match: exactly one of two members' `up NAME` at once wins; the other is told
        whose it is. A terminated node's name is taken over with If-Match (its rows stay with it, as in SQLite)."""
        record = {"name": name, "provider": provider, "region": region, "state": NodeState.LAUNCHING,
                  "created_at": time.time(), **node_fields("create_node", fields, region=False)}
        key = self._node_object(name)
        sent: dict[str, Any] | None = None  # the record last written, whose answer was a Conflict
        for _ in range(_ATTEMPTS):
            got = self.bucket.get(key)
            if got is not None and sent is not None and got[0] == sent:
                return self._node(sent)  # our write landed behind a lost answer (its repeat got the 412): ours
            if got is not None and self._record(key, got[0]).state != NodeState.TERMINATED:
                taken = self._record(key, got[0])
                raise UserInputError("NAME", f"the name {name!r} is taken by {taken.owner or 'another member'} "
                                     f"({taken.state})", f"pick another name, or `gpuprov down {name}` first")
            doc = {"node": {k: record.get(k) for k in _NODE_FIELDS},
                   "resources": got[0].get("resources", []) if got else [],
                   "events": got[0].get("events", []) if got else []}
            try:
                self.bucket.put(key, doc, etag=got[1] if got else None, create=got is None)
                return self._node(doc)
            except Conflict:  # someone wrote it first, or we did behind a lost answer: look again
                sent = _as_stored(doc)
        raise BucketUnavailable(self.url, f"{key}: could not claim the name", "run the command again")

    def put_whole(self, node: Node, resources: list[Resource], events: list[Event]) -> bool:
        """Write a node with its rows as they are (`state push`, `state adopt`): only where the bucket has no node
        of that name (If-None-Match). Rows get new ids: another member's rows must never share one."""
        rows = [dict(asdict(r), id=_new_id()) for r in resources]
        doc = {"node": asdict(node), "resources": rows, "events": [asdict(e) for e in events]}
        try:
            self.bucket.put(self._node_object(node.name), doc, create=True)
        except Conflict:  # the name is another's, unless what is there is what we sent (an answer lost)
            got = self.bucket.get(self._node_object(node.name))
            return got is not None and got[0] == _as_stored(doc)
        return True

    @staticmethod
    def _node(doc: dict[str, Any]) -> Node:
        record = doc["node"]
        return Node(**{k: record.get(k) for k in _NODE_FIELDS})  # a newer gpuprov's extra fields are left

    def _record(self, key: str, doc: dict[str, Any]) -> Node:
        """The node the object `key` holds, read as input: its record must be named as its object and by the name
        rule, and be in a state this gpuprov knows; else BadObject names the object."""
        record = doc.get("node")
        if not isinstance(record, dict):
            raise BadObject(self.url, key, "holds no node record")
        name = record.get("name")
        if not isinstance(name, str) or not NAME_RULE.fullmatch(name):
            raise BadObject(self.url, key, f"its record's name {name!r} is not a node name (lowercase letters, "
                            "digits and '-', up to 39)")
        if key != self._node_object(name):
            raise BadObject(self.url, key, f"its record is named {name!r}: another node's, not this object's")
        if record.get("state") not in {state.value for state in NodeState}:
            raise BadObject(self.url, key, f"its state {record.get('state')!r} is not one this gpuprov knows (a "
                            "newer gpuprov's?)")
        try:
            return self._node(doc)
        except (TypeError, ValueError) as exc:
            raise BadObject(self.url, key, f"its record does not read ({exc})") from None

    def _checked(self, key: str) -> dict[str, Any] | None:
        """The object `key` read for a listing: one that is not a record this gpuprov reads is named in a warning
        and left out (None), so `status` and `gc` go on for the rest."""
        try:
            got = self.bucket.get(key)
            if got is None:
                return None
            if key != UNOWNED:
                self._record(key, got[0])
            try:
                for row in got[0].get("resources", []):
                    _resource(row)
            except (TypeError, ValueError, AttributeError) as exc:
                raise BadObject(self.url, key, f"a resource row does not read ({exc})") from None
        except BadObject as bad:
            self._skip(bad)
            return None
        return got[0]

    def _skip(self, bad: BadObject) -> None:
        """Say once per store that an object is left out (stderr: the floor has no console, and a --json on stdout
        stays whole)."""
        with self._guard:
            if bad.field in self._skipped:
                return
            self._skipped.add(bad.field)
        print(f"warning: {bad.field}: {bad.problem}; skipped, the other records are read", file=sys.stderr)

    def update_node(self, name: str, **fields: Unpack[NodeUpdate]) -> None:
        """Change a node's fields; a change of state the table lacks (machine.py) is refused, nothing written."""
        changes = node_fields("update_node", fields, region=True)
        if not changes:
            return

        def apply(doc: dict[str, Any]) -> None:  # on the node as this write finds it (re-read on a lost race)
            if "state" in changes and doc["node"].get("state") is not None:
                check_move(name, doc["node"]["state"], changes["state"])
            doc["node"].update(changes)

        self.bucket.change(self._node_object(name), apply)

    def node(self, name: str) -> Node:
        found = self.find_node(name)
        if found is None:
            raise no_such_node(name, self, f" in {self.url}")
        return found

    def find_node(self, name: str) -> Node | None:
        got = self.bucket.get(self._node_object(name))
        return self._record(self._node_object(name), got[0]) if got else None

    def _documents(self) -> list[tuple[str, dict[str, Any]]]:
        """Every node's object (read at once: a status of 200 nodes is 200 GETs) and the unowned one; an object
        that is not a record this gpuprov reads is named and left out."""
        names = [n for n in self.bucket.names("nodes/") if n.endswith(".json")] + [UNOWNED]
        with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
            got = list(pool.map(self._checked, names))
        return [(name, found) for name, found in zip(names, got, strict=True) if found is not None]

    def nodes(self, include_terminated: bool = False) -> list[Node]:
        found = sorted((self._node(doc) for name, doc in self._documents() if name != UNOWNED),
                       key=lambda n: n.created_at)
        return found if include_terminated else [n for n in found if n.live]

    def moved(self) -> dict[str, str]:
        """A bucket's records are never moved away (`state push` moves a local file's), but a node whose object this
        gpuprov cannot read (BadObject: a newer gpuprov's, a torn write) is not listed either: named here, by its
        object's name, so its resources are never taken for orphans (gc) while it may be a teammate's live node."""
        keys = [n for n in self.bucket.names("nodes/") if n.endswith(".json")]
        read = {key for key, _ in self._documents()}
        return {key.removeprefix("nodes/").removesuffix(".json"): f"{self.url}{key}, which this gpuprov cannot read"
                for key in keys if key not in read}

    # --- resources -----------------------------------------------------------------------

    def _object_of(self, node: str | None) -> str:
        return self._node_object(node) if node is not None else UNOWNED

    def _rows(self, key: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = doc.setdefault("resources", [])
        with self._guard:
            self._where.update((int(r["id"]), key) for r in rows)
        return rows

    def _append(self, node: str | None, row: dict[str, Any]) -> int:
        key = self._object_of(node)

        def add(doc: dict[str, Any]) -> int:
            rows = self._rows(key, doc)
            if row["cloud_id"] is not None:  # a resource learnt twice is one row (add_resource)
                same = [r for r in rows if (r["kind"], r["cloud_id"], r["region"]) ==
                        (row["kind"], row["cloud_id"], row["region"])]
                if same:
                    return int(same[0]["id"])
            rows.append(row)
            return int(row["id"])

        found = self.bucket.change(key, add, missing=(lambda: {"resources": [], "events": []}) if node is None else None)
        if found is None:
            raise UserInputError("NAME", f"no node called {node!r} in {self.url}", "`gpuprov status` lists nodes")
        with self._guard:
            self._where[found] = key
        return found

    def intend(self, node: str | None, kind: ResourceKind, region: str, client_token: str | None) -> int:
        """Record a resource about to be requested; returns its row id."""
        return self._append(node, {"id": _new_id(), "node": node, "kind": kind, "region": region,
                                   "client_token": client_token, "cloud_id": None, "status": "intent",
                                   "created_at": time.time(), "deleted_at": None})

    def add_resource(self, node: str | None, kind: ResourceKind, region: str, cloud_id: str,
                     client_token: str | None = None) -> int:
        return self._append(node, {"id": _new_id(), "node": node, "kind": kind, "region": region,
                                   "client_token": client_token, "cloud_id": cloud_id, "status": "created",
                                   "created_at": time.time(), "deleted_at": None})

    def _set(self, resource_id: int, **changes: Any) -> None:
        with self._guard:
            key = self._where.get(resource_id)
        if key is None:
            self.resources(live_only=False)  # learns where every row lives
            with self._guard:
                key = self._where.get(resource_id)
        if key is None:
            return  # as SQLite's UPDATE of no row: nothing to change

        def apply(doc: dict[str, Any]) -> None:
            for row in self._rows(key, doc):
                if int(row["id"]) == resource_id:
                    row.update(changes)

        self.bucket.change(key, apply)

    def created(self, resource_id: int, cloud_id: str) -> None:
        self._set(resource_id, cloud_id=cloud_id, status="created")

    def deleted(self, resource_id: int) -> None:
        self._set(resource_id, status="deleted", deleted_at=time.time())

    def resources(self, node: str | None = None, *, region: str | None = None, kind: str | None = None,
                  live_only: bool = True) -> list[Resource]:
        if node is not None:
            got = self.bucket.get(self._node_object(node))
            docs = [(self._node_object(node), got[0])] if got else []
        else:
            docs = self._documents()
        rows = [_resource(r) for key, doc in docs for r in self._rows(key, doc)]
        rows = [r for r in rows if (region is None or r.region == region) and (kind is None or r.kind == kind)
                and (not live_only or r.status != "deleted")]
        return sorted(rows, key=lambda r: r.id)

    # --- clusters ------------------------------------------------------------------------

    def save_cluster(self, name: str, spec_json: str) -> None:
        now = time.time()

        def apply(doc: dict[str, Any]) -> None:
            doc.update(spec_json=spec_json, updated_at=now)
            doc.setdefault("created_at", now)

        self.bucket.change(f"clusters/{name}.json", apply, missing=dict)

    def cluster_json(self, name: str) -> str | None:
        got = self.bucket.get(f"clusters/{name}.json")
        return str(got[0]["spec_json"]) if got else None

    def delete_cluster(self, name: str) -> bool:
        if self.bucket.get(f"clusters/{name}.json") is None:
            return False
        self.bucket.delete(f"clusters/{name}.json")
        return True

    def cluster_names(self) -> list[str]:
        names = [n.removeprefix("clusters/").removesuffix(".json") for n in self.bucket.names("clusters/")]
        for bad in [n for n in names if not _CLUSTER_RULE.fullmatch(n)]:  # a name from the bucket is input
            self._skip(BadObject(self.url, f"clusters/{bad}.json", "is not named by the cluster name rule"))
            names.remove(bad)
        docs = {n: self.bucket.get(f"clusters/{n}.json") for n in names}
        return sorted((n for n in names if docs[n]), key=lambda n: docs[n][0].get("created_at", 0))  # type: ignore[index]

    # --- events --------------------------------------------------------------------------

    def event(self, node: str | None, kind: str, message: str) -> None:
        entry = asdict(Event(node, time.time(), kind, message))
        self.bucket.change(self._object_of(node), lambda doc: doc.setdefault("events", []).append(entry),
                           missing=(lambda: {"resources": [], "events": []}) if node is None else None)

    def events(self, node: str) -> list[Event]:
        got = self.bucket.get(self._node_object(node))
        return [Event(**e) for e in got[0].get("events", [])] if got else []
