"""S3 contracts the proxy keeps in front of moto: what a request is called, and conditional writes that race.

moto 5.2.5 checks `If-None-Match: *` and `If-Match: <etag>` on PutObject (moto/s3/responses.py, put_object: 412
PreconditionFailed), and `If-Match` on DeleteObject, but the check and the write are two steps under no lock, so
two writers at once can both pass it. S3 decides: "If-None-Match ... Otherwise, Amazon S3 returns a 412
Precondition Failed error. If a conflicting operation occurs during the upload S3 returns a 409
ConditionalRequestConflict response" (Amazon S3 API reference, PutObject, IfNoneMatch and IfMatch; user guide,
"How to prevent object overwrites with conditional writes"). So the proxy lets one conditional write per object
reach moto at a time and answers any other that arrives meanwhile 409 ConditionalRequestConflict, as S3 does;
the one in flight is then checked by moto against the object as it is.
"""

from __future__ import annotations

import threading
import urllib.parse
from typing import Any

CONFLICT_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ConditionalRequestConflict</Code>'
                 b"<Message>A conflicting conditional operation is currently in progress against this resource. "
                 b"Please try again.</Message></Error>")
_OBJECT_ACTIONS = {"PUT": "PutObject", "GET": "GetObject", "DELETE": "DeleteObject", "HEAD": "HeadObject"}


def action(method: str, path: str, form: dict[str, str]) -> str | None:
    """The S3 operation of a path-style request: botocore's `x-id` where it sends one, else the method on an object
    (a key under a bucket, no sub-resource); `Bucket` and `Key` are put in `form` so rules can match them."""
    parts = urllib.parse.unquote(urllib.parse.urlsplit(path).path).lstrip("/").split("/", 1)
    if parts and parts[0]:
        form.setdefault("Bucket", parts[0])
    if len(parts) == 2 and parts[1]:
        form.setdefault("Key", parts[1])
    if form.get("x-id"):
        return form["x-id"]
    if len(parts) == 2 and parts[1] and not (set(form) - {"Bucket", "Key", "versionId"}):
        return _OBJECT_ACTIONS.get(method)
    if len(parts) == 1 and method == "GET" and form.get("list-type") == "2":
        return "ListObjectsV2"  # GET /bucket?list-type=2 (S3 API reference, ListObjectsV2), sent without x-id
    return None


class S3Conditional:
    """One conditional write per object in flight; the others get S3's 409."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self.conflicts = 0

    @staticmethod
    def conditional(req: dict[str, Any], headers: Any) -> str | None:
        """The object a conditional PutObject/DeleteObject writes, None for any other request."""
        if req["service"] != "s3" or req["method"] not in ("PUT", "DELETE"):
            return None
        if not (headers.get("If-None-Match") or headers.get("If-Match")):
            return None
        key = req["form"].get("Key")
        return f"{req['form'].get('Bucket')}/{key}" if key else None

    def begin(self, obj: str) -> bool:
        """True: this write may go on (call end() after); False: another is in flight (answer 409)."""
        with self._lock:
            if obj in self._in_flight:
                self.conflicts += 1
                return False
            self._in_flight.add(obj)
            return True

    def end(self, obj: str) -> None:
        with self._lock:
            self._in_flight.discard(obj)
