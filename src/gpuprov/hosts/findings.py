"""What a node's health watch found (templates/health_watch.sh.j2), as gpuprov reads and keeps it.

On the node, every alerted finding is a JSON line in /var/lib/gpuprov/health/findings.jsonl and the last one is
last.json. gpuprov keeps the last finding it has read from each node in its state folder (health/NAME.json),
written by `gpuprov metrics serve` (each poll) and `gpuprov doctor` (each run), so `gpuprov status` shows it
without reaching the node. Light on purpose: `status` imports this and nothing of SSH.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuprov.files import write_atomic
from gpuprov.paths import state_dir

LAST = "/var/lib/gpuprov/health/last.json"
LOG = "/var/lib/gpuprov/health/findings.jsonl"


class Finding(BaseModel):
    """One finding as the watch writes it (its JSON also carries Slack's and ntfy's fields, ignored here)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: str
    key: str
    message: str
    gpu: str = ""
    host: str = ""
    time: str = ""  # ISO 8601, UTC, as the node's clock said


def parse_lines(text: str) -> list[Finding]:
    """The findings in the watch's JSON lines; lines that are not one (cut short, garbled) are skipped."""
    found = []
    for line in text.splitlines():
        try:
            found.append(Finding.model_validate_json(line))
        except ValidationError:
            continue
    return found


def _path(name: str) -> Path:
    # a node name, or a cluster member NAME:K: kept to one safe file name
    return state_dir() / "health" / (re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".json")


def record(name: str, finding: Finding) -> None:
    """Keep `finding` as `name`'s last (one file per name, replaced whole)."""
    path = _path(name)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, finding.model_dump_json() + "\n")


def last(name: str) -> Finding | None:
    """The last finding gpuprov has read from `name`, or None."""
    try:
        return Finding.model_validate_json(_path(name).read_text())
    except (OSError, ValidationError, json.JSONDecodeError):
        return None


def forget(name: str) -> None:
    """Drop `name`'s kept finding (the node is gone)."""
    _path(name).unlink(missing_ok=True)
