"""Where the records live: `state = "s3://BUCKET/PREFIX"` in config.toml or GPUPROV_STATE (the environment wins),
else the local SQLite file; and how long a node's lease lasts (`lease`, GPUPROV_LEASE_SECONDS).

The ground floor reads the config file's two keys itself (plan/config.py, which validates the whole file for the
commands, is above it); a value that is refused names where it came from: the variable, or `PATH:LINE: key`.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass

from gpuprov.errors import UserInputError

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


def _config_value(key: str) -> tuple[str, str] | None:
    """The config file's `key` as (value, where: `PATH:LINE: key`), None when it is not set there."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]

    from gpuprov.paths import config_path

    path = config_path()
    try:
        text = path.read_text()
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # the commands' own check of the file (plan/config.py) says what is wrong with it
    if key not in data:
        return None
    line = next((n for n, t in enumerate(text.splitlines(), 1) if re.match(rf"\s*{re.escape(key)}\s*=", t)), None)
    return str(data[key]), (f"{path}:{line}: {key}" if line else f"{path}: {key}")


def configured() -> StateUrl | None:
    """The S3 state this install uses (None: the local file)."""
    env = os.environ.get("GPUPROV_STATE")
    if env is not None and env.strip():
        return parse(env, "GPUPROV_STATE")
    found = _config_value("state")
    return parse(*found) if found else None


def lease_seconds() -> float:
    """How long a lease lasts past its last renewal: GPUPROV_LEASE_SECONDS, config `lease`, else 120."""
    env = os.environ.get("GPUPROV_LEASE_SECONDS")
    value, field = (env, "GPUPROV_LEASE_SECONDS") if env else (_config_value("lease") or (None, ""))
    if value is None:
        return LEASE_SECONDS
    try:
        seconds = float(value)
        if not math.isfinite(seconds) or not 1 <= seconds <= 3600:
            raise ValueError
    except ValueError:
        raise UserInputError(field, f"{value!r} is not a number of seconds from 1 to 3600",
                             "e.g. 120 (a dead holder's lease is free this long after its last renewal)") from None
    return seconds

