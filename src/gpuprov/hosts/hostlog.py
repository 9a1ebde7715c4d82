"""A host's bootstrap log: what each step printed, capped, with gpuprov's own notes between the steps.

A step may print without bound (a build's every line, a `run:` that cats a dataset): 400 MB once made a
404 MB log on the state disk. Each section of the log (the output between two notes: a step's, the facts')
keeps its first LOG_HEAD and its last LOG_TAIL bytes, and one line between them says how many were dropped.
The tail is on disk as it comes: past the head the log grows to at most LOG_TAIL x 2 before the part that
is no longer among the last LOG_TAIL bytes is cut, so an interrupted run's log still ends with the newest
output. The --verbose echo is not capped: every line reaches it as it arrives.

stdout and stderr reach the log (and the echo) in whole lines, each stream's unfinished line held apart, so a
line of one never lands inside a line of the other (a line longer than LINE_MAX goes out in pieces).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

LOG_HEAD = 1 << 20  # a section's first bytes, kept
LOG_TAIL = 1 << 20  # and its last ones
LINE_MAX = 64 << 10  # an unfinished line held back longer than this goes out as it is


class HostLog:
    """One host's log file (appended to, run after run); with --verbose each line also goes to `echo`,
    prefixed by the host. One writer: the host's own bootstrap thread."""

    def __init__(self, path: Path, host: str, echo: Callable[[str], None] | None) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        self._end = os.lseek(self._fd, 0, os.SEEK_END)  # no O_APPEND: a cut rewrites the tail in place
        self._host = host
        self._echo = echo
        self._unfinished: dict[str, list[str]] = {"out": [], "err": []}  # each stream's line so far, in pieces
        self._held = {"out": 0, "err": 0}
        self._section()

    def _section(self) -> None:
        self._head = 0  # bytes of the section's head written
        self._cut_at = -1  # where the dropped-bytes line starts once something was dropped, else -1
        self._dropped = 0
        self._tail = bytearray()  # the section's last bytes past the head (at most LOG_TAIL x 2)

    def write(self, text: str, stream: str = "err") -> int:
        """Output of the host on `stream` ("out" or "err"), in whatever pieces it arrived."""
        pieces = self._unfinished[stream]
        if "\n" not in text and self._held[stream] + len(text) <= LINE_MAX:
            pieces.append(text)
            self._held[stream] += len(text)
            return len(text)
        done, _, rest = text.rpartition("\n") if "\n" in text else (text, "", "")
        pieces.append(done + ("\n" if "\n" in text else ""))
        self._lines("".join(pieces))
        self._unfinished[stream], self._held[stream] = ([rest], len(rest)) if rest else ([], 0)
        return len(text)

    def _lines(self, text: str) -> None:
        """Whole lines (or a piece of an overlong one) into the section and the echo."""
        if self._echo:
            for line in text.removesuffix("\n").split("\n"):
                self._echo(f"[{self._host}] {line}")
        data = text.encode("utf-8", "replace")
        if self._head < LOG_HEAD:
            first, data = data[:LOG_HEAD - self._head], data[LOG_HEAD - self._head:]
            self._append(first)
            self._head += len(first)
        if data:
            self._tail += data
            self._append(data)
            if len(self._tail) > 2 * LOG_TAIL:
                self._cut()

    def _finish_lines(self) -> None:
        for stream, pieces in self._unfinished.items():
            if pieces:
                self._lines("".join(pieces) + "\n")
                self._unfinished[stream], self._held[stream] = [], 0

    def _append(self, data: bytes) -> None:
        os.pwrite(self._fd, data, self._end)
        self._end += len(data)

    def _cut(self) -> None:
        """Drop all but the last LOG_TAIL bytes past the head, in place: the dropped-bytes line, then those."""
        extra = len(self._tail) - LOG_TAIL
        if extra <= 0:
            return
        self._dropped += extra
        del self._tail[:extra]
        if self._cut_at < 0:
            self._cut_at = self._end - len(self._tail) - extra
        line = (f"\n[gpuprov: {self._dropped} bytes of this step's output dropped here; the log keeps the first "
                f"{LOG_HEAD} and the last {LOG_TAIL}]\n").encode()
        os.pwrite(self._fd, line + self._tail, self._cut_at)
        self._end = self._cut_at + len(line) + len(self._tail)
        os.ftruncate(self._fd, self._end)

    def note(self, text: str) -> None:
        """gpuprov's own line (a step starts, a host is done); it ends the section before it. A stream's
        unfinished line stays held across it: sshd may send the runner's next event (stdout) before a step's
        last stderr bytes, so a line cut there is finished in the next section rather than cut in two."""
        self._cut()
        line = f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {text}"
        if self._echo:
            self._echo(f"[{self._host}] {line}")
        self._append(f"\n{line}\n".encode())
        self._section()

    def flush(self) -> None:
        return None  # every write is already in the file (no buffer of ours)

    def close(self) -> None:
        self._finish_lines()
        self._cut()
        os.close(self._fd)
