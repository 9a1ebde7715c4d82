"""backoff.tries: the first try at once, pauses doubling up to their cap, and never a pause past the time given."""

from __future__ import annotations

import time

import pytest

from gpuprov import backoff


def test_no_time_is_one_try() -> None:
    assert list(backoff.tries(0, 1.0, 8.0)) == [1]


def test_pauses_double_up_to_the_cap_and_end_within_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    slept: list[float] = []
    monkeypatch.setattr(time, "monotonic", lambda: now[0])

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(time, "sleep", sleep)
    assert list(backoff.tries(20, 1.0, 4.0)) == [1, 2, 3, 4, 5, 6, 7]
    assert slept == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]  # the next 4 s pause would end past 20 s: no 8th try
    assert sum(slept) <= 20
