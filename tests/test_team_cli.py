"""Team state end to end: two gpuprov homes (two members) sharing one bucket in moto's S3, nodes in moto's EC2, the
real CLI in subprocesses. Races are forced with a held answer (the fault proxy), never with sleeps."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import forkcli
from tests.aws.cli import EMPTY, gp, up_args

BUCKET = "team-bucket"
STATE = f"s3://{BUCKET}/gp"


def _bucket(aws, name: str = BUCKET, versioning: bool = True) -> None:
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=name)
    if versioning:
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})


@pytest.fixture
def homes(aws, env, tmp_path):
    """Two members' environments: each its own gpuprov home (own install id: another member) and HOME. Their
    leases outlive a loaded machine's stalls (a lease unrenewed past its expiry stops its holder); a test of an
    expiry sets its own."""
    _bucket(aws)
    out = []
    for who in ("alice", "bob"):
        (tmp_path / who / "home").mkdir(parents=True)
        out.append({**env, "GPUPROV_HOME": str(tmp_path / who / "gp"), "HOME": str(tmp_path / who / "home"),
                    "GPUPROV_STATE": STATE, "GPUPROV_LEASE_SECONDS": "15"})
    return out


def _status(env) -> list[dict]:
    result = gp(env, "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _member(env) -> str:
    return json.loads(gp(env, "state", "--json").stdout)["member"]


def _objects(aws, prefix: str = "gp/") -> list[str]:
    return [o["Key"] for o in aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


def test_a_teammate_sees_stops_starts_and_downs_a_node_and_a_race_for_a_name_has_one_winner(aws, homes):
    alice, bob = homes
    shown = gp(bob, "state")
    assert shown.returncode == 0 and f"{STATE}/" in shown.stdout and "versioning: Enabled" in shown.stdout
    assert "warning" not in shown.stderr

    up = gp(alice, *up_args("a", "--gpu", "T4", "--no-bootstrap", "--no-wait"))
    assert up.returncode == 0, up.stdout + up.stderr
    (row,) = _status(bob)
    assert (row["name"], row["state"], row["owner"]) == ("a", "ready", _member(alice))
    assert f"a ({_member(alice).split('/')[0]})" in gp(bob, "status").stdout  # who made it, in the table
    typo = gp(bob, "exec", "aa", "--", "true")  # bob has no local state file: the names are the bucket's
    assert typo.returncode == 2 and "did you mean 'a'?" in typo.stderr and "nodes: a;" in typo.stderr, typo.stderr
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags["gpuprov:team"] == f"{BUCKET}/gp" and tags["gpuprov:member"] == _member(alice)
    assert _objects(aws, "gp/leases/") == []  # alice's `up` let go of the node's lease when it ended

    assert gp(bob, "stop", "a").returncode == 0
    assert [n["state"] for n in _status(alice)] == ["stopped"]
    assert gp(bob, "start", "a", "--no-bootstrap").returncode == 0
    assert [n["state"] for n in _status(alice)] == ["ready"]

    # both members `up x` at once: alice's lease on the name is written, its answer held; bob's `up x` meets it.
    # Her renewals start only once that answer comes: a lease long enough that bob never finds it expired, however
    # slowly a loaded machine starts his command (the 3 s of the fixture did, at a load of 10 on 2 cores)
    alice = {**alice, "GPUPROV_LEASE_SECONDS": "120"}
    aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/leases/node-x.json"}, "hold": True,
                "times": 1})
    first = forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args("x", "--gpu", "T4", "--no-bootstrap",
                                                                        "--no-wait")],
                          env=alice, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        aws.wait_held(1, timeout=60)
        second = gp(bob, *up_args("x", "--gpu", "T4", "--no-bootstrap", "--no-wait"))
    finally:
        aws.release()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, out + err
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"error: NAME: the name 'x' is taken by gpuprov up of {_member(alice)} on " in second.stderr
    runs = [e for e in aws.log("RunInstances") if e["status"] == 200]
    assert len(runs) == 2  # a's and alice's x: bob's `up x` launched nothing

    down = gp(bob, "down", "a", "x", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert aws.leftovers() == EMPTY
    assert [n["name"] for n in _status(alice)] == []


def test_an_up_killed_mid_way_is_taken_down_by_the_teammate_once_its_lease_expires(aws, homes):
    alice, bob = homes
    # a lease that outlives bob's command starting up on a busy machine (3 s did not, beside another worker)
    alice = {**alice, "GPUPROV_LEASE_SECONDS": "8"}
    aws.faults({"action": "RunInstances", "hold": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args("k", "--gpu", "T4", "--no-bootstrap",
                                                                       "--no-wait")],
                         env=alice, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        aws.wait_held(1, timeout=60)  # EC2 launched it; the answer never reaches alice's `up`
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        aws.release()
    assert "gp/leases/node-k.json" in _objects(aws)  # the dead `up` left its lease behind
    started = time.monotonic()
    down = gp(bob, "down", "k", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "k: waiting for gpuprov up of " in down.stdout + down.stderr
    assert time.monotonic() - started >= 2  # it waited for the lease (8 s after its last renewal) to expire
    assert aws.leftovers() == EMPTY


def test_state_unlock_breaks_a_lease_and_says_whose(aws, homes):
    alice, bob = homes
    aws.faults({"action": "RunInstances", "hold": True, "times": 1})
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", *up_args("u", "--gpu", "T4", "--no-bootstrap",
                                                                       "--no-wait")],
                         env=alice, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        aws.wait_held(1, timeout=60)
        broke = gp(bob, "state", "unlock", "u")
        assert broke.returncode == 0, broke.stderr
        assert broke.stdout.startswith(f"u: broke the lease of gpuprov up of {_member(alice)}")
        assert f"pid {proc.pid}" in broke.stdout
        assert "gp/leases/node-u.json" not in _objects(aws)
        again = gp(bob, "state", "unlock", "u")
        assert again.stdout.strip() == "u: no lease held"
        # alice's next renewal meets the lease gone and reads it back: none, so hers is lost
        deadline = time.monotonic() + 30
        while not _read_back_gone(aws, "gp/leases/node-u.json"):
            assert time.monotonic() < deadline, "alice's `up` never noticed"
            time.sleep(0.05)
    finally:
        aws.release()
        out, err = proc.communicate(timeout=120)
    # the lost lease stops her `up` before its next cloud call, saying so (bob's `down` owns the node now)
    assert proc.returncode == 1 and "Traceback" not in err, out + err
    assert "error: u: this gpuprov up lost its lease on it: it was broken (`gpuprov state unlock`); stopped before " \
        "its next cloud call" in err, out + err
    assert gp(bob, "down", "u", "--yes").returncode == 0
    assert aws.leftovers() == EMPTY


def _read_back_gone(aws, key: str) -> bool:
    """A renewal of `key` refused (412, or 404: If-Match on an object that is gone), and the lease read back after it
    found none."""
    log = [e for e in aws.log() if e["form"].get("Key") == key]
    refused = [e["seq"] for e in log if e["action"] == "PutObject" and e["status"] in (404, 412)]
    return bool(refused) and any(e["action"] == "GetObject" and e["status"] == 404 and e["seq"] > refused[0]
                                 for e in log)


def test_push_a_local_state_then_adopt_after_every_record_is_deleted(aws, env, homes, tmp_path):
    alice, bob = homes
    aws.realism(tag_lag=0)  # adopt reads tags moments after the launches; EC2's lag is a rerun away, not tested here
    local = {k: v for k, v in alice.items() if k != "GPUPROV_STATE"}  # alice before the team: the local file
    assert gp(local, *up_args("p", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    assert gp(bob, *up_args("q", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    from gpuprov.state.sqlite import SqliteStore

    folder = Path(alice["GPUPROV_HOME"])
    mine = SqliteStore(folder / "state.sqlite")  # alice's own q, a record only: the bucket has bob's q
    mine.create_node("q", "aws", "us-east-1", state="ready", ready_at=time.time())
    pinned = folder / "nodes" / "p" / "known_hosts"  # as p's first contact pins it (hosts/sshconfig.py)
    pinned.parent.mkdir(parents=True, exist_ok=True)
    pinned.write_text("10.0.0.9 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinnedKeyOfP\n")
    pushed = gp(local, "state", "push", STATE)
    assert pushed.returncode == 1, pushed.stdout + pushed.stderr
    # p's pinned host key goes with it, so a teammate's SSH to p verifies the same key
    shared = aws.client("s3").get_object(Bucket=BUCKET, Key="gp/known_hosts/p")["Body"].read().decode()
    assert shared == pinned.read_text() and "gpuprov team sync p" in pushed.stdout
    assert f"p: moved to {STATE}/ (the local file no longer lists it)" in pushed.stdout
    assert f"q: refused: {STATE}/ already has a node of that name" in pushed.stderr
    (backup,) = folder.glob("state.sqlite.before-push-*")
    assert f"the local file as it was: {backup}" in pushed.stdout
    assert [n.name for n in SqliteStore(backup).nodes()] == ["p", "q"]
    # one store per node: the local file no longer has p live (its `down` would race the team's), and its gc
    # still counts p's resources as owned
    assert [n["name"] for n in _status(local)] == ["q"]
    moved = gp(local, "down", "p", "--yes")
    assert moved.returncode == 2 and moved.stderr.startswith(
        f"error: NAME: p was moved to {STATE}/ by `gpuprov state push`"), moved.stderr
    swept = gp(local, "gc", "--json")
    assert swept.returncode == 0 and json.loads(swept.stdout)["found"] == [], swept.stdout + swept.stderr
    assert [n["name"] for n in _status(bob)] == ["p", "q"]

    s3 = aws.client("s3")
    for key in _objects(aws):  # every record gone (a lost bucket prefix, or a lost laptop's file)
        s3.delete_object(Bucket=BUCKET, Key=key)
    assert _status(bob) == []
    swept = gp(alice, "gc", "--json")  # no record owns q now: the team's orphan, and gc says bob made it
    assert swept.returncode == 0, swept.stdout + swept.stderr
    made = {(r["kind"], r["member"]) for r in json.loads(swept.stdout)["found"] if r["node"] == "q"}
    assert ("instance", _member(bob)) in made and {m for _, m in made} == {_member(bob)}
    assert f"node=q running by {_member(bob).split('/')[0]}" in gp(alice, "gc").stdout
    # alice: the team's q, and her own p from before the team (its tags name her install, not the team); bob, whose
    # install never tagged p, would name it another install's and leave it
    adopted = gp(alice, "state", "adopt", "--region", "us-east-1")
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    assert "2 node(s) adopted: p, q" in adopted.stdout
    back = {n["name"]: n for n in _status(alice)}
    assert sorted(back) == ["p", "q"] and back["q"]["state"] == "ready" and back["q"]["instance_type"] == "g4dn.xlarge"
    assert gp(alice, "stop", "q").returncode == 0
    down = gp(alice, "down", "p", "q", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert aws.leftovers() == EMPTY


def test_a_bucket_without_versioning_warns_and_a_bad_url_is_one_line_naming_its_place(aws, env, tmp_path):
    _bucket(aws, "plain-bucket", versioning=False)
    shown = gp({**env, "GPUPROV_STATE": "s3://plain-bucket/t"}, "state")
    assert shown.returncode == 0 and "versioning: Off" in shown.stdout
    assert "warning: the bucket plain-bucket has versioning off" in shown.stderr
    bad = gp({**env, "GPUPROV_STATE": "s3:/plain-bucket"}, "status")
    assert bad.returncode == 2 and bad.stderr.startswith("error: GPUPROV_STATE: 's3:/plain-bucket' is not an s3:// URL")
    config = tmp_path / "config.toml"
    config.write_text('region = "us-east-1"\nstate = "s3://No_Such/x"\n')
    bad = gp({**env, "GPUPROV_CONFIG": str(config)}, "status")
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.startswith(f"error: {config}:2: state: ")
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) <= 2


def test_every_members_key_reaches_a_teammates_node_and_a_real_sshd_lets_them_in(aws, homes, aws_hosts, tmp_path):
    """bob joins; alice's `up` (SSH, no bootstrap) puts bob's key in the node's ~/.ssh/authorized_keys; carol joins
    later and alice's `team sync` adds hers. An OpenSSH server on the node that reads ~/.ssh/authorized_keys (as
    EC2's images do; the test host's own sshd reads the pool's file) lets bob and carol in, and nobody else."""
    from tests.aws.cli import launch_site

    alice, bob = homes
    pool = aws_hosts
    subnet = launch_site(aws, pool, Path(alice["GPUPROV_HOME"]))
    carol = {**bob, "GPUPROV_HOME": str(tmp_path / "carol" / "gp")}
    keys = {}
    for who in ("bob", "carol", "mallory"):  # mallory's key is never joined
        folder = tmp_path / who / "gp" / "keys" / "us-east-1"
        folder.mkdir(parents=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(folder / "id_ed25519")],
                       check=True)
        keys[who] = folder / "id_ed25519"
    joined = gp(bob, "team", "join")
    assert joined.returncode == 0 and "1 public key(s)" in joined.stdout, joined.stderr
    assert gp(bob, "team", "join", "--key", str(keys["bob"])).returncode == 2  # a private key is refused unread

    up = gp(alice, *up_args("a", "--gpu", "T4", "--subnet", subnet, "--connect", "private", "--ssh-user", "root",
                            "--no-bootstrap"))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "a: the keys of 1 member(s) authorized (1 new)" in up.stdout + up.stderr
    pinned = (tmp_path / "alice" / "gp" / "nodes" / "a" / "known_hosts").read_text()
    shared = aws.client("s3").get_object(Bucket=BUCKET, Key="gp/known_hosts/a")["Body"].read().decode()
    assert shared == pinned and pool[0].host_key_pub.split()[1] in shared
    assert not [k for k in _objects(aws) if "id_ed25519" in k and not k.endswith(".pub")]

    assert gp(carol, "team", "join").returncode == 0
    synced = gp(alice, "team", "sync", "a")
    assert synced.returncode == 0, synced.stderr
    assert "the keys of 2 member(s) authorized (1 new)" in synced.stdout + synced.stderr
    authorized = pool.exec_in(0, "cat /root/.ssh/authorized_keys; stat -c %a /root/.ssh /root/.ssh/authorized_keys",
                              check=True).stdout
    for who in ("bob", "carol"):
        assert Path(f"{keys[who]}.pub").read_text().split()[1] in authorized
    assert authorized.split()[-2:] == ["700", "600"]

    pool.exec_in(0, "ssh-keygen -q -t ed25519 -N '' -f /tmp/gp-hk2 && /usr/sbin/sshd -f /dev/null -o Port=2222 "
                    "-o HostKey=/tmp/gp-hk2 -o AuthorizedKeysFile=.ssh/authorized_keys -o PidFile=/tmp/gp-sshd2.pid "
                    "-o UsePAM=no -o PasswordAuthentication=no -o PermitRootLogin=prohibit-password", check=True)
    try:
        def login(who: str) -> int:
            return subprocess.run(["ssh", "-i", str(keys[who]), "-p", "2222", "-o", "BatchMode=yes",
                                   "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                                   "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10", f"root@{pool[0].address}",
                                   "true"], capture_output=True, timeout=30).returncode

        assert (login("bob"), login("carol")) == (0, 0)
        assert login("mallory") != 0
    finally:
        pool.exec_in(0, "kill $(cat /tmp/gp-sshd2.pid); rm -f /tmp/gp-hk2* /tmp/gp-sshd2.pid")

    # a TTL locked by alice: bob can neither lift nor change it (nothing reaches the node), alice can
    locked = gp(alice, "ttl", "a", "8h", "--locked")
    assert locked.returncode == 0, locked.stdout + locked.stderr
    for change in (("ttl", "a", "off"), ("autostop", "a", "2h"), ("ttl", "a", "9h", "--unlocked"),
                   ("bootstrap", "a", "--ttl", "90d")):
        refused = gp(bob, *change)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.startswith(f"error: NAME: a's autostop, TTL and budget are locked by {_member(alice)}: "
                                         f"only they can change or lift them ({change[0]}")
        assert "Traceback" not in refused.stderr
    (row,) = _status(bob)
    assert row["guards_locked_by"] == _member(alice) and row["ttl_seconds"] == 8 * 3600
    assert "(locked)" in gp(bob, "status").stdout
    lifted = gp(alice, "ttl", "a", "off", "--unlocked")
    assert lifted.returncode == 0 and "TTL off" in lifted.stdout, lifted.stdout + lifted.stderr
    assert _status(bob)[0]["guards_locked_by"] is None
    assert gp(alice, "down", "a", "--yes").returncode == 0
    assert aws.leftovers() == EMPTY


@pytest.mark.parametrize("lose", ["500", "drop"])
def test_an_up_whose_record_was_written_with_its_answer_lost_is_not_told_the_name_is_taken(aws, homes, lose):
    """S3's conditional PutObject (mutations.py CONDITIONAL): botocore sends it again after a lost answer, S3
    answers the second 412 (the first one's object is there), and `up` used to say the name was taken by its own
    member and leave the record behind."""
    alice, _ = homes
    aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/nodes/train.json"}, "lose": lose,
                "times": 1})
    up = gp(alice, *up_args("train", "--gpu", "T4", "--no-bootstrap", "--no-wait"))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "is taken" not in up.stderr
    assert [e["outcome"] for e in aws.log("PutObject")].count(f"lost-{lose}") == 1
    assert gp(alice, "down", "train", "--yes").returncode == 0
    assert aws.leftovers() == EMPTY


def test_state_adopt_takes_this_installs_nodes_and_names_another_installs_of_the_same_user_and_host(aws, env, homes,
                                                                                                   tmp_path):
    """Found by the randomized walk: a team member's `state adopt` adopted the root volume of a node another install
    on the same machine (same user@host, its own local file) was running, and `down` of it looped on VolumeInUse."""
    alice, _ = homes
    carol = {**env, "GPUPROV_HOME": str(tmp_path / "carol" / "gp"), "HOME": str(tmp_path / "carol" / "home")}
    (tmp_path / "carol" / "home").mkdir(parents=True)
    assert gp(carol, *up_args("n2", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    aws.realism(tag_lag=0)
    adopted = gp(alice, "state", "adopt", "--region", "us-east-1")
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    assert "0 node(s) adopted" in adopted.stdout and "left n2 (us-east-1): another gpuprov install" in adopted.stdout
    assert _status(alice) == []
    lost = {**carol, "GPUPROV_HOME": str(tmp_path / "carol" / "lost")}  # carol's state folder lost: a new install
    assert "0 node(s) adopted" in gp(lost, "state", "adopt", "--region", "us-east-1").stdout
    back = gp(lost, "state", "adopt", "--region", "us-east-1", "--all-installs")
    assert back.returncode == 0 and "1 node(s) adopted: n2" in back.stdout, back.stdout + back.stderr
    down = gp(lost, "down", "n2", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert aws.leftovers() == EMPTY


def test_a_local_gc_never_takes_a_teams_node_made_from_the_same_install(aws, homes):
    """The same install switched back to its local file (whose records never knew the team's nodes) runs `gc --yes`:
    the team's node carries this install's owner tag, but its gpuprov:team says shared records own it: left."""
    alice, _ = homes
    assert gp(alice, *up_args("t", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    local = {k: v for k, v in alice.items() if k != "GPUPROV_STATE"}
    swept = gp(local, "gc", "--yes")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert inst["State"]["Name"] == "running"
    assert [g["GroupName"] for g in aws.ec2().describe_security_groups(
        Filters=[{"Name": "tag:gpuprov:node", "Values": ["t"]}])["SecurityGroups"]]
    assert gp(alice, "down", "t", "--yes").returncode == 0
    assert aws.leftovers() == EMPTY


def test_a_record_this_gpuprov_cannot_read_is_named_status_and_gc_go_on_and_its_node_is_no_orphan(aws, homes):
    """A teammate's newer gpuprov wrote a state word this one does not know, and another object is torn: `status`
    lists the rest with a warning naming each; `gc --yes` goes on and takes none of the unread node's resources
    (it may be live), nor the region's shared key pair; `down` of it names the object, exit 2, no traceback."""
    alice, bob = homes
    aws.realism(tag_lag=0)  # gc's listing by tag sees n's resources and the key pair at once, as after EC2's lag
    assert gp(alice, *up_args("n", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    s3 = aws.client("s3")
    record = json.loads(s3.get_object(Bucket=BUCKET, Key="gp/nodes/n.json")["Body"].read())
    newer = {**record, "node": {**record["node"], "state": "hibernating"}}
    s3.put_object(Bucket=BUCKET, Key="gp/nodes/n.json", Body=json.dumps(newer).encode())
    s3.put_object(Bucket=BUCKET, Key="gp/nodes/torn.json", Body=b'{"node": {"na')
    shown = gp(bob, "status", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout) == [], shown.stderr
    assert f"warning: {STATE}/nodes/n.json: its state 'hibernating' is not one this gpuprov knows" in shown.stderr
    assert f"warning: {STATE}/nodes/torn.json: is not JSON" in shown.stderr
    pairs = [p["KeyName"] for p in aws.ec2().describe_key_pairs()["KeyPairs"]]
    assert len(pairs) == 1, pairs  # alice's, which n was launched with
    swept = gp(bob, "gc", "--yes")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    (inst,) = [i for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]]
    assert inst["State"]["Name"] == "running"
    # the unread node may use the region's key pair: it is kept (a `start --move` of n launches with it)
    assert [p["KeyName"] for p in aws.ec2().describe_key_pairs()["KeyPairs"]] == pairs, swept.stdout
    down = gp(bob, "down", "n", "--yes")
    assert down.returncode == 2 and "Traceback" not in down.stderr
    assert down.stderr.startswith(f"error: {STATE}/nodes/n.json: its state 'hibernating'"), down.stderr
    s3.put_object(Bucket=BUCKET, Key="gp/nodes/n.json", Body=json.dumps(record).encode())  # the newer gpuprov's own
    s3.delete_object(Bucket=BUCKET, Key="gp/nodes/torn.json")  # else it may be a node that needs the key pair
    assert gp(alice, "down", "n", "--yes").returncode == 0
    assert aws.leftovers() == EMPTY


def _running(aws) -> list[str]:
    """The nodes whose instance is running (their gpuprov:node tag)."""
    return sorted({t["Value"] for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]
                   if i["State"]["Name"] == "running" for t in i["Tags"] if t["Key"] == "gpuprov:node"})


def test_down_all_takes_this_members_nodes_and_with_team_everyones_naming_each_member(aws, env, homes):
    """A CI job's clean-up (`down --all --yes`) with team state takes its own nodes only, and says whose it left;
    `--team` takes every member's, naming each node's member (and `member` in --json)."""
    alice, bob = homes
    for who, name in ((alice, "a"), (bob, "b")):
        made = gp(who, *up_args(name, "--gpu", "T4", "--no-bootstrap", "--no-wait"))
        assert made.returncode == 0, made.stdout + made.stderr
    short = _member(bob).split("/")[0]  # user@host: the same for both members here (one machine, two installs)
    down = gp(bob, "down", "--all", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"left a ({short}): a teammate's node (`down --all --team` takes every member's)" in down.stdout
    assert f"b ({short}): down (" in down.stdout
    assert _running(aws) == ["a"] and [n["name"] for n in _status(alice)] == ["a"]
    again = gp(bob, "down", "--all", "--yes")
    assert again.returncode == 0 and "nothing to do: gpuprov manages no nodes of yours" in again.stdout

    assert gp(bob, *up_args("b", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    everyone = gp(bob, "down", "--all", "--team", "--yes", "--json")
    assert everyone.returncode == 0, everyone.stdout + everyone.stderr
    result = json.loads(everyone.stdout)
    assert {name: r["member"] for name, r in result.items()} == {"a": _member(alice), "b": _member(bob)}
    assert all(r["complete"] for r in result.values()) and "left a" not in everyone.stderr
    assert _running(aws) == [] and _status(alice) == []
    assert aws.leftovers() == EMPTY

    for wrong, says in (((bob, "down", "a", "--team", "--yes"), "error: --team: goes with --all"),
                        ((env, "down", "--all", "--team", "--yes"), "error: --team: the records are in the local "
                                                                       "state file, not a team's bucket")):
        refused = gp(*wrong)
        assert refused.returncode == 2 and refused.stderr.startswith(says), refused.stderr
        assert "Traceback" not in refused.stderr


def test_gc_stopped_for_takes_this_members_stopped_nodes_and_with_team_everyones(aws, homes):
    alice, bob = homes
    s3 = aws.client("s3")
    for who, name in ((alice, "a"), (bob, "b")):
        assert gp(who, *up_args(name, "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
        assert gp(who, "stop", name).returncode == 0
        key = f"gp/nodes/{name}.json"  # time passes: stopped 20 days ago
        record = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        record["node"]["stopped_at"] = time.time() - 20 * 86400
        s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(record).encode())
    short = _member(bob).split("/")[0]
    swept = gp(bob, "gc", "--stopped-for", "14d", "--yes")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    out = swept.stdout + swept.stderr
    assert f"left a ({short}), stopped 20d: a teammate's node (`gc --stopped-for … --team` takes every " \
        "member's)" in out
    assert f"b (us-east-1) by {short}: stopped 20d" in out and f"b ({short}): down (stopped 14d+)" in out
    assert [(n["name"], n["state"]) for n in _status(alice)] == [("a", "stopped")]

    listed = gp(alice, "gc", "--stopped-for", "14d", "--team", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert [(r["name"], r["member"]) for r in json.loads(listed.stdout)["stopped"]] == [("a", _member(alice))]
    refused = gp(bob, "gc", "--team")
    assert refused.returncode == 2 and refused.stderr.startswith("error: --team: goes with --stopped-for")
    assert gp(bob, "gc", "--stopped-for", "14d", "--team", "--yes").returncode == 0
    assert _status(alice) == [] and aws.leftovers() == EMPTY


_HOLD = ("import sys\nfrom gpuprov.state import locks\n"
         "with locks.FILE_LOCKS.hold(locks.node('p'), 'start'):\n    print('held', flush=True)\n    sys.stdin.read()\n")


def test_state_push_leaves_a_node_whose_local_lock_is_held_with_team_state_configured(aws, homes):
    """The README's order: set `state`, then push. The push still asks the local file's lock of each node (a local
    `start` at work on it would go on writing the local record, and its instance be left running), not the lease."""
    alice, _ = homes
    local = {k: v for k, v in alice.items() if k != "GPUPROV_STATE"}
    assert gp(local, *up_args("p", "--gpu", "T4", "--no-bootstrap", "--no-wait")).returncode == 0
    holder = subprocess.Popen([sys.executable, "-c", _HOLD], env=local, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        pushed = gp(alice, "state", "push", STATE)
        assert pushed.returncode == 1, pushed.stdout + pushed.stderr
        assert f"p is being worked on by gpuprov start (pid {holder.pid}, since " in pushed.stderr
        assert "left in the local file (push again once it is done)" in pushed.stderr
        assert _objects(aws, "gp/nodes/") == [] and _status(alice) == []
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    again = gp(alice, "state", "push", STATE)
    assert again.returncode == 0 and f"p: moved to {STATE}/" in again.stdout, again.stdout + again.stderr
    assert [n["name"] for n in _status(alice)] == ["p"]
    assert gp(alice, "down", "p", "--yes").returncode == 0
    assert aws.leftovers() == EMPTY
