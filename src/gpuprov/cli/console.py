"""The console every command prints through: rich's, made to read at 80 columns and in a pipe, and the plain
line echo of `--verbose`.

`make_console` falls back to the terminal's width, else 80, when COLUMNS is 0 or junk; `line_echo` writes each
remote line in one write.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def make_console(*, stderr: bool = False) -> Console:
    """rich's console (it honours NO_COLOR, and COLUMNS when not on a terminal); `stderr` for progress
    lines while stdout carries JSON."""
    import shutil

    from rich.console import Console

    columns = os.environ.get("COLUMNS")
    width = None  # rich's own: the terminal's, else COLUMNS, else 80
    if columns is not None and not (columns.strip().isdigit() and int(columns) > 0):
        # COLUMNS=0 or junk (some CI runners, `docker exec` without -t): rich would print nothing at all
        width = shutil.get_terminal_size((80, 24)).columns

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """`gpuprov plan | head -1`: the reader left, which is no error (rich's own exits 1, silently)."""
            self.quiet = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(0)

    return _Console(highlight=False, emoji=False, stderr=stderr, width=width)  # no ':1234:' → emoji in an IPv6 address


def line_echo(console: Console) -> Callable[[str], None]:
    """`--verbose`'s echo of every remote line, written as it is to the console's file: rich's print of each line
    made echoing a long build log a real load on the CPU; one lock keeps hosts' lines whole. Only where no live
    display shares the console (--verbose turns it off)."""
    import threading

    lock = threading.Lock()

    def echo(line: str) -> None:
        with lock:
            try:
                console.file.write(line + "\n")
            except BrokenPipeError:
                console.on_broken_pipe()

    return echo
