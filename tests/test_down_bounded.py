"""A `down` ends within bounded time whatever else of this install is alive (docs/testing.md, the walk's finding 5):
the region's key pair is released under the region's lock, and a holder stopped mid-call (its request held, its
shell suspended) must not keep the `down`, and the node's lock or lease, waiting with it."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time

from tests import forkcli
from tests.aws.cli import EMPTY, gp, up_args

# the bounded waits' patience here (RELEASE_PATIENCE is 20 s): the holders below are held on purpose, whatever it is
PATIENCE = {"GPUPROV_TEST_PATIENCE_SECONDS": "2"}


def test_down_leaves_the_key_pair_and_ends_when_another_process_holds_the_regions_lock(aws, env, gp_home):
    assert gp(env, *up_args("k1", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    # another gpuprov of this install at work on the key pair, stopped there (as an `up` held at ImportKeyPair)
    path = gp_home / "locks" / "region-us-east-1.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, f"{os.getpid()} {time.time():.3f} up\n".encode(), 0)
        began = time.monotonic()
        result = gp({**env, **PATIENCE}, "down", "k1", "--yes", timeout=90)
        took = time.monotonic() - began
    finally:
        os.close(fd)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert took < 30, out
    assert f"left the key pair of us-east-1: gpuprov up (pid {os.getpid()}" in out, out
    assert "held the region's lock for all of 2 s" in out, out
    assert "k1: down" in out, out
    assert json.loads(gp(env, "status", "--json").stdout) == []
    assert aws.leftovers()["key_pairs"] and not aws.leftovers()["instances"]
    # kept, not forgotten: once the lock is free the next gc deletes it
    assert gp(env, "gc", "--yes").returncode == 0
    assert aws.leftovers() == EMPTY


def test_a_team_down_ends_while_the_same_members_up_is_held_importing_its_key_pair(aws, env, tmp_path):
    """The walk's case: alice's `down` of bob's node, while an `up` of alice's own is stopped at ImportKeyPair (its
    answer held: the process alive, holding alice's region lock)."""
    aws.client("s3").create_bucket(Bucket="team-bucket")
    alice, bob = ({**env, "GPUPROV_HOME": str(tmp_path / who / "gp"), "HOME": str(tmp_path / who / "home"),
                   "GPUPROV_STATE": "s3://team-bucket/gp", "GPUPROV_LEASE_SECONDS": "30"} for who in ("alice", "bob"))
    for who in ("alice", "bob"):
        (tmp_path / who / "home").mkdir(parents=True)
    assert gp(bob, *up_args("n3", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    aws.faults({"action": "ImportKeyPair", "hold": True, "times": 1})
    held = forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args("n2", "--gpu", "T4", "--no-bootstrap",
                                                                       "--no-wait")],
                         env=alice, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        aws.wait_held(1, timeout=60)
        began = time.monotonic()
        result = gp({**alice, **PATIENCE}, "down", "n3", "--yes", timeout=90)
        took = time.monotonic() - began
    finally:
        aws.release()
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    # at most the patience for the lock; without it the `down` waited as long as the `up` did (60 s here: the held
    # answer's read timeout; a stopped `up`, for ever)
    assert took < 30, out
    assert f"left the key pair of us-east-1: gpuprov key pair (pid {held.pid}" in out, out
    assert held.wait(120) == 0, held.communicate()
    aws.clear_faults()
    assert gp(alice, "down", "--all", "--team", "--yes").returncode == 0
    assert aws.leftovers() == EMPTY
