"""Errors a user can act on. The CLI prints them without a traceback."""

from __future__ import annotations


class GpuprovError(Exception):
    """Something went wrong that the user should read about; exit code 1."""

    exit_code = 1


class UserInputError(GpuprovError):
    """Bad input: names the field, says what is wrong and what would work. Exit code 2.

    Raised before anything is created, so the user can fix the input and run again.
    """

    exit_code = 2

    def __init__(self, field: str, problem: str, hint: str = "") -> None:
        self.field = field
        self.problem = problem
        self.hint = hint
        text = f"{field}: {problem}"
        if hint:
            text += f"\n  {hint}"
        super().__init__(text)


class StackConflict(UserInputError):
    """A GPU x driver x CUDA x torch combination that cannot work.

    `rule` is a stable id of the compatibility rule that refused it (e.g. "driver-no-pinning-package"),
    so callers and tests can tell one refusal from another without reading the wording.
    """

    def __init__(self, field: str, problem: str, hint: str = "", rule: str = "") -> None:
        super().__init__(field, problem, hint)
        self.rule = rule


class Interrupted(KeyboardInterrupt):
    """A termination signal (SIGINT, SIGTERM, SIGHUP), raised in the main thread wherever it is: every signal
    a terminal, `kill`, `timeout`, a CI runner or systemd sends ends a command as Ctrl-C does (cli/signals.py).
    A KeyboardInterrupt, so everything that takes back work on Ctrl-C does it for each of them.
    `note`: what the take-back left, for the last line (set by cloud/launch.take_back)."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(name)
        self.signum = signum
        self.name = name
        self.note: str | None = None


class GpuprovBug(Exception):
    """A mistake in gpuprov's own code, never the user's input nor the machine's state: deliberately no
    GpuprovError, so the CLI says "gpuprov hit a bug" and keeps the traceback, and no `except GpuprovError` that
    carries on past a failing cloud or disk swallows it."""
