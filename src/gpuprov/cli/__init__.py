"""The `gpuprov` command line: parse, call the library, print. Decisions live in the library.

One module per group of commands; importing one registers its commands on `main`, which imports it when one
of them is asked for (cli/lazy.py).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

# pydantic looks for plugins in the entry points of every installed distribution the first time it builds a
# model (a cost every command paid, growing with the venv); gpuprov uses none. A user who wants one sets it.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from gpuprov.cli.common import main

__all__ = ["main", "run"]

# The cyclic collector's young collection every this many net new container objects, not the interpreter's
# default (700). A command's start-up makes tens of thousands of objects that live as long as the process
# (modules, classes, pydantic's validators) and little garbage: with the default, `bootstrap` collected over a
# hundred times before its first host, each older-generation pass scanning those survivors again, a sizeable
# share of its start-up. Cycles are still collected, at most this many allocations later: a few MB at worst, in
# a process that lives minutes.
YOUNG_COLLECTION_EVERY = 100_000


def run() -> None:
    """The `gpuprov` executable (console script and `python -m gpuprov`): `main`, then leave without the
    interpreter's teardown. Freeing every module of paramiko, pydantic, rich and Jinja one by one costs every
    command time that nobody waits for on purpose; what must happen at exit still does (stdout and
    stderr flushed, atexit handlers run). Tests call `main` and keep their process."""
    import gc  # here: at the top it would be this package's `gc`, the `gc` command's module, once that is imported

    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], YOUNG_COLLECTION_EVERY), *threshold[1:])
    try:
        main(prog_name="gpuprov")  # `python -m gpuprov` too: the name the hints tell users to type
        code: int = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    if code < 128 and any(t.is_alive() and not t.daemon for t in threading.enumerate()
                          if t is not threading.main_thread()):
        sys.exit(code)  # a worker still running: let the interpreter wait for it as usual
    # (after a signal, whatever its workers still do is abandoned: the take-back has already run)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a reader gone (`| head`), a closed stream
            stream.flush()
    os._exit(code)
