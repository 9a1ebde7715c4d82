"""Why the state file cannot be used, said as it is: damaged, empty, from a newer gpuprov, intact on a disk that
is read-only, full or held by another process, or refusing a statement gpuprov got wrong (a bug).

Only a damaged (or empty) file is a reason to think the records are gone, and only then is moving it aside
and sweeping the cloud by tag (`gc --all-regions`) the advice. An intact file on a read-only or full disk,
or one another process holds, still lists every node: advice that leads to `gc --yes` there would delete
live, billed machines, so it is never given for those.

A file held by another process past 30 s is `StateUnavailable`, naming what failed.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from gpuprov.errors import GpuprovBug, GpuprovError, UserInputError


class StateError(UserInputError):
    """The state file cannot be read. It is never replaced or recreated: it may hold the only record
    of cloud resources that cost money, so the user decides what to do with it."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            "state", f"{path} {problem}; gpuprov changed nothing",
            f"it lists your nodes and their cloud resources, so nothing replaces it: restore it from a backup, or "
            f"move it aside (mv {path} {path}.broken) and run `gpuprov gc --all-regions` to find what is still "
            f"tagged as yours")


class StateTooNew(UserInputError):
    """The file was written by a newer gpuprov, whose records this one may not read right."""

    def __init__(self, path: Path, schema: int, mine: int, written_by: str | None, version: str) -> None:
        by = f"gpuprov {written_by}" if written_by else "a newer gpuprov"
        super().__init__("state", f"{path} was written by {by} (state schema {schema}); this is gpuprov {version}, "
                         f"which reads schema {mine} and older; gpuprov changed nothing",
                         "upgrade gpuprov (pip install -U gpuprov), or use the gpuprov that wrote it")


class StateUnavailable(GpuprovError):
    """The records are intact but cannot be written (or read) now: the disk is read-only or full, or another
    process holds the file. `reason` is "read-only", "full", "locked" or "io"."""

    def __init__(self, path: Path, reason: str, detail: str) -> None:
        self.path = path
        self.reason = reason
        fix = {"read-only": f"make {path.parent} writable again (a read-only mount or file system), or point "
                            "GPUPROV_HOME at a writable copy of the folder",
               "full": f"free space on the disk that holds {path.parent}, then run the command again",
               "locked": "another gpuprov process is writing to it; wait for it to finish, then run the command again",
               "io": f"check the disk that holds {path.parent}"}[reason]
        what = {"read-only": "is on a read-only disk", "full": "is on a full disk", "locked": "is locked by another "
                "process (for over 30 s)", "io": "cannot be read or written"}[reason]
        super().__init__(f"state: {path} {what} ({detail}); its records are intact and still list your nodes\n"
                         f"  fix: {fix}")


class StateBug(GpuprovBug):
    """SQLite refused a statement gpuprov made (an unknown column, bad SQL): a mistake in gpuprov, not the file's.
    The records are as they were; nothing about it is advice to move the file aside."""

    def __init__(self, path: Path, exc: sqlite3.Error) -> None:
        super().__init__(f"state: {path}: SQLite refused gpuprov's own statement ({type(exc).__name__}: {exc}); "
                         "the file is intact and was not changed")


# SQLite's words for a file that holds no database, or one whose pages are damaged: the only failures that say the
# records may be lost, and so the only ones that get the move-aside advice
_DAMAGED = ("is not a database", "database disk image is malformed")
# ... and for a statement it could not run on an intact file: gpuprov's own mistake
_MISTAKES = ("no such column", "has no column named", "no such table", "syntax error", "no such function",
             "unrecognized token", "incomplete input", "bindings", "values for", "values were supplied", "ambiguous column")


def explain(exc: sqlite3.Error, path: Path) -> GpuprovError | StateBug:
    """What went wrong for an SQLite error on the state file, from the disk's own state where SQLite's words
    are vague ("unable to open database file" is a read-only folder as often as a missing one). Only SQLite's own
    word for damage makes it StateError; a statement gpuprov got wrong is a bug (StateBug), never damage."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StateUnavailable(path, "locked", text)
    if "full" in text:
        return StateUnavailable(path, "full", text)
    if isinstance(exc, (sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.IntegrityError)) \
            or any(words in text for words in _MISTAKES):
        return StateBug(path, exc)
    try:
        disk = os.statvfs(path.parent)
    except OSError:
        disk = None
    if "readonly" in text or "read-only" in text or (disk is not None and disk.f_flag & os.ST_RDONLY) \
            or not os.access(path.parent, os.W_OK):
        return StateUnavailable(path, "read-only", text)
    if disk is not None and disk.f_bavail * disk.f_frsize < 64 * 1024:
        return StateUnavailable(path, "full", text)
    if any(words in text for words in _DAMAGED):
        return StateError(path, f"is not a readable SQLite database ({text})")
    if isinstance(exc, sqlite3.OperationalError) and ("unable to open" in text or "disk I/O" in text):
        return StateUnavailable(path, "io", text)
    return StateBug(path, exc)  # words gpuprov does not know: said as they are, never as damage
