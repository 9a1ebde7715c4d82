"""One signal path: SIGINT, SIGTERM and SIGHUP all end a command the way Ctrl-C does.

Python turns only SIGINT into KeyboardInterrupt; SIGTERM (`kill`, `timeout`, CI cancellations, systemd) and
SIGHUP (a closed terminal or laptop lid) kill the process where it stands, which leaves a launched, billed
instance running with nothing taken back. Here each of them raises `errors.Interrupted` in the main thread,
so `up`, `up --nodes`, `start` and `image bake` take back what they made for every one of them, and a second
signal during the take-back stops it, which then says exactly what is left.

A SIGHUP usually means the terminal is gone: writing to it would fail (EIO) in the middle of the take-back,
so where the terminal no longer answers its output is sent to /dev/null from then on (the state's events and the
node's log still record it); a `kill -HUP` with the terminal still there says its last line as the others do.

Each signal keeps its own name and code wherever it lands, a prompt included (Click's prompts turn an interrupt
into `Abort`, whose context is the interrupt: `behind`). Python runs a handler between bytecodes, so a signal that
lands just before a blocking read would wait for the next key pressed: `read_line` waits on the terminal and on
the wakeup fd the C-level handler writes at once, and never misses one.

The take-backs each signal runs: `up`/`up --nodes` (cloud/launch.take_back: everything recorded comes down), `start`
(stopstart.stop_again: the instance stops again), `image bake` (before EC2 took CreateImage: the node is put back).
The take-back's summary is the command's last line (`Interrupted.note`) and the exit is 128 + the signal's number.
hosts/fanout.run_parallel leaves at once on an interrupt (the take-back must not wait for every host's step), and
`cli.run` does not wait for abandoned workers after a signal.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import sys
import termios
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
            # a terminal's device (isatty() is False once it hung up), no longer answering
            if stream is not None and stat.S_ISCHR(os.fstat(stream.fileno()).st_mode) and not _answers(stream.fileno()):
                os.dup2(null, stream.fileno())
    os.close(null)


def _answers(fd: int) -> bool:
    """Whether the terminal on `fd` is still there: a hung-up one answers every request with EIO."""
    try:
        termios.tcgetattr(fd)
    except (OSError, termios.error):
        return False
    return True


def read_line() -> str:
    """One line typed on standard input (a terminal), "" at its end (Ctrl-D); a signal that arrives at any instant
    of the wait raises its `Interrupted` at once (main thread), and so does a terminal that hung up (SIGHUP's)."""
    fd = sys.stdin.fileno()
    wake_read, wake_write = os.pipe()
    for end in (wake_read, wake_write):
        os.set_blocking(end, False)
    before = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    line = b""
    try:
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([fd, wake_read], [], [])
            if wake_read in ready:  # a signal: its handler runs before the next bytecode, and raises
                os.read(wake_read, 512)
                continue
            try:
                chunk = os.read(fd, 4096)  # a terminal hands over a line at a time
            except OSError:  # EIO: the terminal hung up, and its SIGHUP may not be here yet: the same end
                _away_from_a_dead_terminal()
                raise Interrupted(signal.SIGHUP, SIGNALS[signal.SIGHUP]) from None
            if not chunk:
                if not _answers(fd):  # a terminal that hung up reads as its end
                    _away_from_a_dead_terminal()
                    raise Interrupted(signal.SIGHUP, SIGNALS[signal.SIGHUP])
                break
            line += chunk
    finally:
        signal.set_wakeup_fd(before)
        os.close(wake_read)
        os.close(wake_write)
    return line.decode(errors="replace")


def behind(exc: BaseException) -> BaseException:
    """The interrupt that `exc` stands for: Click's prompts raise `Abort() from None` for one, which keeps it as
    the context."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, Interrupted):
        seen = seen.__cause__ or seen.__context__
    return seen or exc


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
    ending = False
    try:
        yield
    except KeyboardInterrupt:
        ending = _last_command
        raise
    finally:
        for sig, handler in before.items():  # the process's last command, ended by a signal: a second one (a
            # terminal's SIGHUP after its EIO, Ctrl-C again) must neither cut its last line nor kill it uncounted
            signal.signal(sig, signal.SIG_IGN if ending else handler)


_last_command = False


def last_command() -> None:
    """The executable's one command is the process's (cli.run): once a signal ends it, the process ends with it."""
    global _last_command
    _last_command = True


def exit_code(exc: BaseException) -> int:
    """128 + the signal's number, as a shell reports a process a signal ended (130, 143, 129)."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))
