"""One signal path: SIGINT, SIGTERM and SIGHUP all end a command the way Ctrl-C does.

Python turns only SIGINT into KeyboardInterrupt; SIGTERM (`kill`, `timeout`, CI cancellations, systemd) and
SIGHUP (a closed terminal or laptop lid) kill the process where it stands, which leaves a launched, billed
instance running with nothing taken back. Here each of them raises `errors.Interrupted` in the main thread,
so `up`, `up --nodes`, `start` and `image bake` take back what they made for every one of them, and a second
signal during the take-back stops it, which then says exactly what is left.

A SIGHUP usually means the terminal is gone: writing to it would fail (EIO) in the middle of the take-back,
so its output is sent to /dev/null from then on (the state's events and the node's log still record it).

The take-backs each signal runs: `up`/`up --nodes` (cloud/launch.take_back: everything recorded comes down), `start`
(stopstart.stop_again: the instance stops again), `image bake` (before EC2 took CreateImage: the node is put back).
The take-back's summary is the command's last line (`Interrupted.note`) and the exit is 128 + the signal's number.
hosts/fanout.run_parallel leaves at once on an interrupt (the take-back must not wait for every host's step), and
`cli.run` does not wait for abandoned workers after a signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from gpuprov.errors import Interrupted

SIGNALS = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


def _raise(signum: int, _frame: FrameType | None) -> None:
    if signum == signal.SIGHUP:
        _away_from_a_dead_terminal()
    raise Interrupted(signum, SIGNALS.get(signal.Signals(signum), f"signal {signum}"))


def _away_from_a_dead_terminal() -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if stream is not None and stream.isatty():
                stream.flush()
                os.dup2(null, stream.fileno())
    os.close(null)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise `Interrupted` while the block runs (main thread only: signals are
    delivered there); the handlers before it come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        if before[sig] is signal.SIG_IGN and sig != signal.SIGINT:  # nohup: the user asked to keep running
            continue
        signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def exit_code(exc: BaseException) -> int:
    """128 + the signal's number, as a shell reports a process a signal ended (130, 143, 129)."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))
