"""`up --wait`'s loop in-process (cloud/waiting.py): the backoff, the time limit, what stops the wait at once,
the record between passes. The CLI's passes against the imitation: test_aws_capacity.py."""

from __future__ import annotations

import pytest

from gpuprov.cloud.failover import Candidate
from gpuprov.cloud.launch import Attempt, NoCapacity
from gpuprov.cloud.waiting import Wait, delays, until_capacity
from gpuprov.errors import GpuprovError, Interrupted
from gpuprov.state import open_store


def _refused(zone: str = "us-east-1a") -> NoCapacity:
    cand = Candidate("g4dn.xlarge", zone, "on-demand", 0.526)
    return NoCapacity("no capacity anywhere", [Attempt(cand, "InsufficientInstanceCapacity", "no"),
                                                Attempt(cand, "InsufficientInstanceCapacity", "no")])


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_backoff_doubles_from_30s_to_5_minutes_jittered_between_half_and_whole() -> None:
    low = delays(Wait(3600), rng=lambda: 0.0)
    assert [next(low) for _ in range(7)] == [15.0, 30.0, 60.0, 120.0, 150.0, 150.0, 150.0]
    high = delays(Wait(3600), rng=lambda: 0.999999)
    assert [round(next(high)) for _ in range(6)] == [30, 60, 120, 240, 300, 300]


def test_passes_repeat_until_one_lands_and_each_refused_one_prints_its_line(gp_home) -> None:
    store, clock, lines = open_store(), Clock(), []
    outcomes: list[object] = [_refused(), _refused(), "landed"]

    def attempt(say):  # one `up` pass: it records the node, and a refused one takes it back (terminated)
        store.create_node("w", "aws", "us-east-1")
        say("asking for g4dn.xlarge in us-east-1a (on-demand)")
        got = outcomes.pop(0)
        if isinstance(got, NoCapacity):
            say("  InsufficientInstanceCapacity: no")
            store.update_node("w", state="terminated")
            raise got
        say("i-1 launched; waiting for it to run")
        return got

    got = until_capacity(attempt, "w", store, lines.append, Wait(3600, first=30), sleep=clock.sleep,
                         clock=clock.time, rng=lambda: 0.5)
    assert got == "landed"
    assert clock.slept == [22.5, 45.0]
    passes = [line for line in lines if line.startswith("pass ")]
    assert [p.split(";")[0] for p in passes] == ["pass 1: 2 refused: InsufficientInstanceCapacity ×2 (g4dn.xlarge)",
                                                 "pass 2: 2 refused: InsufficientInstanceCapacity ×2 (g4dn.xlarge)"]
    assert "next pass in 22s" in passes[0] and "next pass in 45s" in passes[1]
    # pass 2's asking stayed quiet; pass 3's came out once its ask was granted
    assert lines.count("asking for g4dn.xlarge in us-east-1a (on-demand)") == 2
    assert lines[-1] == "i-1 launched; waiting for it to run"
    assert [e.message.split(":")[0] for e in store.events("w") if e.kind == "waiting"] == ["pass 1", "pass 2"]


def test_time_up_is_no_capacity_naming_the_passes_and_the_record_is_closed(gp_home) -> None:
    store, clock = open_store(), Clock()

    def attempt(say):
        store.create_node("w", "aws", "us-east-1")
        store.update_node("w", state="terminated")
        raise _refused()

    with pytest.raises(NoCapacity, match=r"no capacity after waiting 1m\d\ds \(3 passes\)"):
        until_capacity(attempt, "w", store, lambda _line: None, Wait(100, first=30), sleep=clock.sleep,
                       clock=clock.time, rng=lambda: 0.999)
    assert store.node("w").state == "terminated"  # never left `waiting`


def test_anything_but_no_capacity_stops_at_once_with_the_passes_own_lines(gp_home) -> None:
    store, clock, lines = open_store(), Clock(), []
    calls = []

    def attempt(say):
        calls.append(1)
        store.create_node("w", "aws", "us-east-1")
        store.update_node("w", state="terminated")
        if len(calls) == 1:
            raise _refused()
        say("  VcpuLimitExceeded: raise your quota")
        raise GpuprovError("quota")

    with pytest.raises(GpuprovError, match="quota"):
        until_capacity(attempt, "w", store, lines.append, Wait(3600), sleep=clock.sleep, clock=clock.time)
    assert len(calls) == 2 and "  VcpuLimitExceeded: raise your quota" in lines


def test_a_pass_whose_take_back_left_something_stops_the_wait(gp_home) -> None:
    store, clock, lines = open_store(), Clock(), []

    def attempt(say):
        store.create_node("w", "aws", "us-east-1")
        store.update_node("w", state="terminating")
        say("  still there: security-group sg-1")
        raise _refused()

    with pytest.raises(NoCapacity):
        until_capacity(attempt, "w", store, lines.append, Wait(3600), sleep=clock.sleep, clock=clock.time)
    assert clock.slept == [] and "  still there: security-group sg-1" in lines


def test_a_signal_while_waiting_closes_the_record_and_says_nothing_is_left(gp_home) -> None:
    store = open_store()

    def attempt(say):
        store.create_node("w", "aws", "us-east-1")
        store.update_node("w", state="terminated")
        raise _refused()

    def sleep(_seconds: float) -> None:
        assert store.node("w").state == "waiting"  # what `status` shows meanwhile
        raise Interrupted(15, "SIGTERM")

    with pytest.raises(Interrupted) as stopped:
        until_capacity(attempt, "w", store, lambda _line: None, Wait(3600), sleep=sleep)
    assert stopped.value.note == "stopped waiting for capacity: nothing of w is left"
    node = store.node("w")
    assert node.state == "terminated" and node.state_reason == "stopped waiting for capacity"
    assert not node.live  # `status` lists it no more
