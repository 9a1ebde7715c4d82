"""The `gpuprov` command line: parse, call the library, print. Decisions live in the library.

The top floor: it may import every part, and nothing but `python -m gpuprov` imports it. One module per group of
commands (offline.py: gpus, plan, render; hosts.py: bootstrap, check, doctor; cloud.py: up, status, stop, start,
down; guardrails.py, gc.py, images.py, access.py, clusters.py, settings.py, team.py, facts.py, metrics.py,
capacity.py); importing one registers its commands on `main`, which imports it when one of them is asked for
(cli/lazy.py, whose tables of command -> module and command -> summary a test checks), so `bootstrap` loads
hosts.py and no other, and `--help` lists every command from the summaries without importing one; the completion
of command names imports them all. The library is imported inside each command, so
`gpuprov --help` loads neither boto3 nor Fabric (a test checks `sys.modules`), and `bootstrap --json` imports no
rich.

common.py holds what the commands share: `Group`, where every error ends (a `GpuprovError`, a Click usage error
reworded as `error: --flag: problem`, Ctrl-C, a broken pipe, and as a last resort any other exception: one line,
the traceback saved to a temp file, `GPUPROV_DEBUG=1` re-raises), the config file as Click's `default_map` (so
precedence is Click's own: flag > envvar > config file > default), `confirm()` (asks on a terminal, says "pass
--yes" without one), and how a NODE or `[USER@]HOST[:PORT]` becomes a `Target`. params.py is what every option
takes and where its value came from; option_sets.py types the option sets several commands share (TypedDicts a
command's `**options` is unpacked as, imported only for type checking); signals.py the one signal path.
help.py puts `up`'s options under headings; examples.py is the examples every command's help ends with. The
rich views (report.py, report_hosts.py, cluster_report.py, report_facts.py, on fittable.py) only present: a reader
that leaves early (`| head -1`) is exit 0.
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

    from gpuprov.cli import signals

    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], YOUNG_COLLECTION_EVERY), *threshold[1:])
    signals.last_command()
    try:
        main(prog_name="gpuprov")  # `python -m gpuprov` too: the name the hints tell users to type
        code: int = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt as exc:  # a signal outside the command's handling (cli/signals.py): its code, and
        code = signals.exit_code(exc)  # no wait below for workers it left
    if code < 128 and any(t.is_alive() and not t.daemon for t in threading.enumerate()
                          if t is not threading.main_thread()):
        sys.exit(code)  # a worker still running: let the interpreter wait for it as usual
    # (after a signal, whatever its workers still do is abandoned: the take-back has already run)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a reader gone (`| head`), a closed stream
            stream.flush()
    os._exit(code)
