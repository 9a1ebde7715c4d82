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
