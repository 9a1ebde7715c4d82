"""Where the records live: `state = "s3://BUCKET/PREFIX"` in config.toml or GPUPROV_STATE (the environment wins),
else the local SQLite file; and how long a node's lease lasts (`lease`, GPUPROV_LEASE_SECONDS).

Both come from the process's settings (gpuprov/settings.py, the one reader of the config file; plan/config.py
validates the whole file for the commands, above this floor); a value that is refused names where it came from:
the variable, or `PATH:LINE: key`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpuprov.errors import UserInputError
from gpuprov.settings import settings

LEASE_SECONDS = 120.0  # a dead holder's lease is free this long after its last renewal
# S3's bucket naming rules (user guide, "General purpose bucket naming rules"): 3-63 characters, lowercase letters,
# digits, dots and hyphens, beginning and ending with a letter or digit
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX = re.compile(r"[A-Za-z0-9!_.*'()/-]*")  # S3's "safe characters" for object keys


@dataclass(frozen=True)
class StateUrl:
    bucket: str
    prefix: str  # "" or "team/" (always ends in "/")

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def team(self) -> str:
        """The team's id as tags carry it: the bucket and prefix, which every member's config names alike."""
        return f"{self.bucket}/{self.prefix}".rstrip("/")


def parse(value: str, field: str) -> StateUrl | None:
    """`s3://BUCKET[/PREFIX]` → StateUrl; "" or "local" → None (the local file); anything else is bad input."""
    text = value.strip()
    if text in ("", "local"):
        return None
    hint = 's3://BUCKET/PREFIX (a bucket with versioning on), or "local" for the state file on this machine'
    m = re.fullmatch(r"s3://([^/]+)(?:/(.*))?", text)
    if m is None:
        raise UserInputError(field, f"{value!r} is not an s3:// URL", hint)
    bucket, prefix = m.group(1), (m.group(2) or "").strip("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise UserInputError(field, f"{bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, dots, "
                                    "hyphens)", hint)
    if not _PREFIX.fullmatch(prefix) or "//" in prefix:
        raise UserInputError(field, f"{prefix!r} is not a prefix gpuprov writes under (letters, digits, / . _ - only)",
                             hint)
    return StateUrl(bucket, f"{prefix}/" if prefix else "")


def configured() -> StateUrl | None:
    """The S3 state this install uses (None: the local file)."""
    found = settings().state
    return parse(found.text, found.where) if found else None


def lease_seconds() -> float:
    """How long a lease lasts past its last renewal: GPUPROV_LEASE_SECONDS, config `lease`, else 120."""
    found = settings().lease
    if found is None:
        return LEASE_SECONDS
    value, field = found.text, found.where
    try:
        seconds = float(value)
        if not math.isfinite(seconds) or not 1 <= seconds <= 3600:
            raise ValueError
    except ValueError:
        raise UserInputError(field, f"{value!r} is not a number of seconds from 1 to 3600",
                             "e.g. 120 (a dead holder's lease is free this long after its last renewal)") from None
    return seconds

