"""The timeline `up` prints at the end and puts in `--json` (issue 12): phases in order, the capacity
search's attempts with AWS's code per refusal, each bootstrap step with its outcome; stored in state for
`gpuprov status NODE --timeline`. Only order and consistency are asserted, never durations."""

from __future__ import annotations

import json

import pytest

from gpuprov.cloud import timeline as tl
from gpuprov.hosts.bootstrap import StepResult
from tests.aws.cli import gp, launch_site, nothing_left, up_args

UP_PHASES = [tl.CHECKS, tl.ACCESS, tl.CAPACITY, tl.RUNNING, tl.SSH, tl.BOOTSTRAP, tl.VERIFY]
CAPACITY = {"action": "RunInstances", "status": 500, "code": "InsufficientInstanceCapacity",
            "message": "We currently do not have sufficient capacity in the Availability Zone you requested"}


def assert_consistent(t: dict) -> None:
    """Offsets only grow: each phase starts where or after the last ended, its rows lie inside it."""
    last = 0.0
    for phase in t["phases"]:
        assert last <= phase["start_s"] <= phase["end_s"] <= t["total_s"], phase
        last = phase["end_s"]
        inner = 0.0
        for row in phase["attempts"] + phase["steps"]:
            assert phase["start_s"] <= row["start_s"] <= row["end_s"] <= phase["end_s"], (phase["name"], row)
            assert row["start_s"] >= inner, (phase["name"], row)
            inner = row["end_s"]


def test_up_json_has_the_timeline_with_the_refused_attempt_and_every_step(aws, env, aws_hosts, gp_home):
    subnet = launch_site(aws, aws_hosts, gp_home)
    aws.faults({**CAPACITY, "match": {"InstanceType": "g4dn.xlarge"}})
    args = ["--gpu", "T4", "--subnet", subnet, "--connect", "private", "--ssh-user", "root", "--os", "ubuntu-22.04",
            "--python", "3.11"]
    steps = [s["name"] for s in json.loads(gp(env, "plan", *args[:2], *args[8:], "--json").stdout)["steps"]]
    result = gp(env, *up_args("tl", *args, "--json"))
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout)  # progress went to stderr
    assert out["node"]["name"] == "tl" and out["node"]["state"] == "ready" and out["ssh_alias"] == "gpuprov-tl"
    t = out["timeline"]
    assert (t["command"], t["node"], t["outcome"]) == ("up", "tl", "ok")
    assert [p["name"] for p in t["phases"]] == UP_PHASES
    assert all(p["outcome"] == "ok" for p in t["phases"])
    assert_consistent(t)

    by_name = {p["name"]: p for p in t["phases"]}
    attempts = [(a["instance_type"], a["zone"], a["outcome"], a["code"]) for a in by_name[tl.CAPACITY]["attempts"]]
    assert attempts == [("g4dn.xlarge", "us-east-1a", "refused", "InsufficientInstanceCapacity"),
                        ("g4dn.2xlarge", "us-east-1a", "launched", None)]
    assert "sufficient capacity" in by_name[tl.CAPACITY]["attempts"][0]["message"]
    assert out["node"]["instance_type"] == "g4dn.2xlarge"

    booted = by_name[tl.BOOTSTRAP]["steps"]
    assert [s["name"] for s in booted] == ["connect", "upload", *(s for s in steps if s != "verify")]
    outcomes = {s["name"]: s["outcome"] for s in booted}
    assert outcomes["nvidia-driver"] == "reboot"  # a fresh host: the driver asks for its reboot
    assert set(outcomes.values()) <= {"ok", "changed", "unchanged", "reboot"}
    assert [(s["name"], s["outcome"]) for s in by_name[tl.VERIFY]["steps"]] == [("verify", "unchanged")]

    # kept in state: the same timeline later, as JSON and as a table that reads at 80 columns in a pipe
    again = gp(env, "status", "tl", "--timeline", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == t
    table = gp({**env, "COLUMNS": "80"}, "status", "tl", "--timeline")
    assert table.returncode == 0, table.stderr
    lines = [line.rstrip() for line in table.stdout.splitlines() if line.strip()]
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
    assert lines[0].startswith("up tl: ready after ")
    names = [*UP_PHASES, "nvidia-driver", "InsufficientInstanceCapacity", "g4dn.2xlarge"]
    at = [next(i for i, line in enumerate(lines) if name in line) for name in names]
    assert at[:len(UP_PHASES)] == sorted(at[:len(UP_PHASES)])
    assert at[names.index(tl.CAPACITY)] < at[names.index("InsufficientInstanceCapacity")] < at[names.index(tl.RUNNING)]
    assert lines[-1].split()[1:] == ["ready"], table.stdout  # the total

    # `start` records its own: no launch, the steps found done by their markers
    assert gp(env, "stop", "tl").returncode == 0
    started = gp(env, "start", "tl", "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    s = json.loads(started.stdout)["timeline"]
    assert (s["command"], s["outcome"]) == ("start", "ok")
    assert [p["name"] for p in s["phases"]] == [tl.CHECKS, tl.RUNNING, tl.SSH, tl.BOOTSTRAP, tl.VERIFY]
    assert_consistent(s)
    again = {st["name"]: st["outcome"] for st in s["phases"][3]["steps"]}
    assert list(again) == list(outcomes) and again["nvidia-driver"] == "skipped"
    assert json.loads(gp(env, "status", "tl", "--timeline", "--json").stdout)["command"] == "start"

    assert gp(env, "down", "tl", "--yes").returncode == 0
    nothing_left(aws)


def test_up_prints_the_timeline_at_80_columns_and_not_with_quiet(aws, env):
    aws.faults({**CAPACITY, "match": {"Placement.AvailabilityZone": "us-east-1a"}})
    loud = gp({**env, "COLUMNS": "80"}, *up_args("tlp", "--gpu", "A10G", "--spot", "--no-bootstrap", "--no-wait"))
    assert loud.returncode == 0, loud.stdout + loud.stderr
    lines = loud.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    start = next(i for i, line in enumerate(lines) if line.startswith("up tlp: ready after "))
    table = lines[start:]
    refused = next(line for line in table if "us-east-1a" in line)
    assert refused.split()[2:] == ["g5.xlarge", "us-east-1a", "spot", "InsufficientInstanceCapacity"]
    rows = [line.split()[2] if len(line.split()) > 2 else "" for line in table]
    assert "capacity" in rows and "instance" in rows and "SSH" not in rows  # --no-wait: no SSH phase
    assert "tlp is ready" in loud.stdout

    quiet = gp(env, *up_args("tlq", "--gpu", "A10G", "--spot", "--no-bootstrap", "--no-wait", "-q"))
    assert quiet.returncode == 0, quiet.stderr
    assert "tlq is ready" in quiet.stdout and "capacity search" not in quiet.stdout
    assert "capacity search" in gp(env, "status", "tlq", "--timeline").stdout  # recorded all the same
    assert [n["name"] for n in json.loads(gp(env, "status", "tlq", "--json").stdout)] == ["tlq"]  # of two nodes
    assert gp(env, "down", "--all", "--yes").returncode == 0
    nothing_left(aws)


def test_a_failed_up_keeps_its_timeline_with_every_refusal_and_the_teardown(aws, env):
    aws.faults(CAPACITY)
    failed = gp(env, *up_args("tlf", "--gpu", "A10G", "--no-bootstrap", "--no-wait"))
    assert failed.returncode == 1 and "no capacity anywhere" in failed.stderr
    nothing_left(aws)
    t = json.loads(gp(env, "status", "tlf", "--timeline", "--json").stdout)
    assert t["outcome"] == "failed"
    assert [(p["name"], p["outcome"]) for p in t["phases"]] == [
        (tl.CHECKS, "ok"), (tl.ACCESS, "ok"), (tl.CAPACITY, "failed"), (tl.TEARDOWN, "ok")]
    capacity = t["phases"][2]
    asked = [(e["form"]["InstanceType"], e["form"]["Placement.AvailabilityZone"]) for e in aws.log("RunInstances")]
    assert [(a["instance_type"], a["zone"]) for a in capacity["attempts"]] == asked and len(asked) > 1
    assert {(a["outcome"], a["code"]) for a in capacity["attempts"]} == {("refused", "InsufficientInstanceCapacity")}
    assert "no capacity anywhere" in capacity["detail"]
    assert_consistent(t)


def test_timeline_needs_a_node_and_one_that_has_one(aws, env):
    bare = gp(env, "status", "--timeline")
    assert bare.returncode == 2 and bare.stderr.startswith("error: --timeline:")
    unknown = gp(env, "status", "nosuch", "--timeline")
    assert unknown.returncode == 2 and "no node called 'nosuch'" in unknown.stderr


# --- the recorder, in-process ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def tick(self, seconds: float) -> None:
        self.t += seconds


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def event(self, host: str, step: str, state: str) -> None:
        self.seen.append((step, state))


def test_the_recorder_places_steps_at_their_events_and_splits_verify_off():
    clock = Clock()
    rec = tl.Recorder("up", "n", clock=clock)
    rec.phase(tl.CAPACITY)
    asked = rec.now()
    clock.tick(1)
    rec.attempt("g5.xlarge", "us-east-1a", "spot", asked, "InsufficientInstanceCapacity", "no capacity")
    asked = rec.now()
    clock.tick(2)
    rec.attempt("g5.xlarge", "us-east-1b", "spot", asked)
    rec.phase(tl.BOOTSTRAP)
    inner = Events()
    reporter = rec.reporter(inner)
    clock.tick(1)
    reporter.event("h", "connect", "running")
    clock.tick(1)
    reporter.event("h", "upload", "running")
    clock.tick(1)
    reporter.event("h", "a", "unchanged")  # skipped by its marker: no "running"
    reporter.event("h", "b", "running")
    clock.tick(5)
    reporter.event("h", "b", "reboot")
    reporter.event("h", "verify", "running")
    clock.tick(2)
    reporter.event("h", "verify", "ok")
    rec.bootstrap_done([StepResult("a", "skipped", 0.0), StepResult("b", "reboot", 5.0),
                        StepResult("verify", "unchanged", 2.0)], {"verify"})
    clock.tick(1)
    t = rec.finish()

    assert inner.seen[0] == ("connect", "running") and len(inner.seen) == 7  # every event passed on
    assert [(p.name, p.start_s, p.end_s) for p in t.phases] == [
        (tl.CAPACITY, 0.0, 3.0), (tl.BOOTSTRAP, 3.0, 11.0), (tl.VERIFY, 11.0, 13.0)]
    assert [(a.start_s, a.end_s, a.outcome, a.code) for a in t.phases[0].attempts] == [
        (0.0, 1.0, "refused", "InsufficientInstanceCapacity"), (1.0, 3.0, "launched", None)]
    assert [(s.name, s.start_s, s.end_s, s.outcome) for s in t.phases[1].steps] == [
        ("connect", 4.0, 5.0, "ok"), ("upload", 5.0, 6.0, "ok"), ("a", 6.0, 6.0, "skipped"), ("b", 6.0, 11.0, "reboot")]
    assert [s.name for s in t.phases[2].steps] == ["verify"]
    assert (t.total_s, t.outcome) == (14.0, "ok")


def test_a_failed_step_fails_its_phase_and_a_failure_closes_the_open_phase():
    clock = Clock()
    rec = tl.Recorder("start", "n", clock=clock)
    rec.phase(tl.BOOTSTRAP)
    clock.tick(3)  # no progress events at all: steps follow one another from the phase's start
    rec.bootstrap_done([StepResult("a", "changed", 1.0), StepResult("b", "failed", 1.5, "exit 1: boom")], {"verify"})
    assert [(s.name, s.start_s, s.end_s) for s in rec.phases[0].steps] == [("a", 0.0, 1.0), ("b", 1.0, 2.5)]
    assert (rec.phases[0].outcome, rec.phases[0].detail, rec.phases[0].end_s) == ("failed", "exit 1: boom", 3.0)
    rec.phase(tl.SSH)
    clock.tick(1)
    rec.failed("SSH on 10.0.0.1:22 did not answer within 600s")
    t = rec.finish("failed")
    assert [(p.name, p.outcome) for p in t.phases] == [(tl.BOOTSTRAP, "failed"), (tl.SSH, "failed")]
    assert t.phases[1].detail.startswith("SSH on") and t.outcome == "failed"
    assert tl.from_events([t.model_dump_json()]) == t and tl.from_events([]) is None


def test_a_host_that_fails_before_any_step_fails_the_bootstrap_phase():
    clock = Clock()
    rec = tl.Recorder("up", "n", clock=clock)
    rec.phase(tl.BOOTSTRAP)
    rec.reporter(Events()).event("h", "connect", "running")
    clock.tick(2)
    rec.bootstrap_done([], {"verify"}, "10.0.0.4:22: connection refused")
    (phase,) = rec.finish("failed").phases
    assert (phase.outcome, phase.detail) == ("failed", "10.0.0.4:22: connection refused")
    assert [(s.name, s.start_s, s.end_s, s.outcome) for s in phase.steps] == [("connect", 0.0, 2.0, "failed")]


@pytest.mark.parametrize("columns", [80, 200])
def test_the_table_keeps_names_and_codes_whole(columns):
    from rich.console import Console

    from gpuprov.cli.report import timeline_table

    t = tl.Timeline(command="up", node="train-llama-70b", started_at=0, total_s=141.2, outcome="ok", phases=[
        tl.Phase(name=tl.CAPACITY, start_s=0.5, end_s=2.0, attempts=[
            tl.LaunchAttempt(instance_type="p4de.24xlarge", zone="us-east-1a", market="on-demand", start_s=0.5,
                             end_s=1.0, outcome="refused", code="InsufficientInstanceCapacity"),
            tl.LaunchAttempt(instance_type="p4de.24xlarge", zone="us-east-1b", market="on-demand", start_s=1.0,
                             end_s=2.0, outcome="launched")]),
        tl.Phase(name=tl.BOOTSTRAP, start_s=2.0, end_s=140.0, steps=[
            tl.StepTime(name="nvidia-driver", start_s=2.0, end_s=100.5, outcome="reboot")])])
    console = Console(width=columns, file=None, force_terminal=False, no_color=True)
    with console.capture() as cap:
        console.print(timeline_table(t))
    lines = cap.get().splitlines()
    assert max(len(line) for line in lines) <= columns
    text = "\n".join(lines)
    for whole in ("InsufficientInstanceCapacity", "p4de.24xlarge", "nvidia-driver", "1m38.5s", "2m21.2s"):
        assert whole in text
