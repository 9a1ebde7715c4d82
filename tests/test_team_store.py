"""Team state below the CLI: the imitation's S3 conditional writes, the S3 store's records and races, leases.

Against moto's S3 behind the fault proxy (tests/aws): races are forced by a rule's delay between a writer's read
and its write, or by an answer held, never by sleeping and hoping.
"""

from __future__ import annotations

import json
import os
import threading
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from gpuprov.errors import UserInputError
from gpuprov.state import NodeState, leases, locks
from gpuprov.state.machine import IllegalTransition
from gpuprov.state.s3 import S3Store
from gpuprov.state.url import parse

BUCKET = "team-bucket"


@pytest.fixture
def url(aws, gp_home, monkeypatch):
    for key, value in aws.env().items():
        monkeypatch.setenv(key, value)
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    monkeypatch.setenv("GPUPROV_STATE", f"s3://{BUCKET}/gp")
    monkeypatch.setenv("GPUPROV_LEASE_SECONDS", "3")
    return parse(f"s3://{BUCKET}/gp", "test")


@pytest.fixture(params=[pytest.param("moto-server", marks=pytest.mark.heavy), "in-process"])
def team_url(request, gp_home, monkeypatch):
    """The tests that need no fault or log of the proxy's run twice: against the moto server behind the proxy
    (`url`), and against moto's in-process mock (the fast lane's S3: `make test-fast`)."""
    if request.param == "moto-server":
        return request.getfixturevalue("url")
    from email.utils import formatdate

    from moto import mock_aws

    from gpuprov.state import s3 as s3_state

    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(gp_home.parent / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(gp_home.parent / "no-aws-credentials"))
    real_client = s3_state.client

    def dated(**kwargs):  # S3 dates every answer, and a lease's age is read against it; the mock's have no Date
        kwargs["parsed"].setdefault("ResponseMetadata", {}).setdefault("HTTPHeaders", {}).setdefault(
            "date", formatdate(usegmt=True))

    def client():
        made = real_client()
        made.meta.events.register("after-call.s3.GetObject", dated)
        return made

    monkeypatch.setattr(s3_state, "client", client)
    mock = mock_aws()
    mock.start()
    request.addfinalizer(mock.stop)
    s3 = boto3.client("s3", region_name="us-east-1")  # the test's own setup: not a call gpuprov makes
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    monkeypatch.setenv("GPUPROV_STATE", f"s3://{BUCKET}/gp")
    monkeypatch.setenv("GPUPROV_LEASE_SECONDS", "3")
    return parse(f"s3://{BUCKET}/gp", "test")


def _code(exc: ClientError) -> tuple[str, int]:
    return exc.response["Error"]["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"]


def test_the_imitation_keeps_s3s_conditional_write_contract(aws, url):
    """412 for a lost condition (moto's own check, PutObject's and DeleteObject's), and 409
    ConditionalRequestConflict for a conditional write to an object while another is in flight (moto checks and
    writes in two unlocked steps; S3 does not)."""
    s3 = aws.client("s3", via_proxy=True)
    first = s3.put_object(Bucket=BUCKET, Key="k", Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError) as taken:
        s3.put_object(Bucket=BUCKET, Key="k", Body=b"2", IfNoneMatch="*")
    assert _code(taken.value) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as stale:
        s3.put_object(Bucket=BUCKET, Key="k", Body=b"2", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert _code(stale.value) == ("PreconditionFailed", 412)
    second = s3.put_object(Bucket=BUCKET, Key="k", Body=b"2", IfMatch=first["ETag"])
    with pytest.raises(ClientError) as kept:  # a conditional delete of a version since rewritten (leases' release)
        s3.delete_object(Bucket=BUCKET, Key="k", IfMatch=first["ETag"])
    assert _code(kept.value) == ("PreconditionFailed", 412)
    s3.delete_object(Bucket=BUCKET, Key="k", IfMatch=second["ETag"])
    assert "Contents" not in aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="k")

    aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/slow"}, "delay": 1.5, "times": 1})
    done: list[object] = []
    slow = threading.Thread(target=lambda: done.append(s3.put_object(Bucket=BUCKET, Key="gp/slow", Body=b"a",
                                                                     IfNoneMatch="*")))
    slow.start()
    deadline = time.monotonic() + 10
    while not [e for e in aws.log("PutObject") if e["form"].get("Key") == "gp/slow"]:  # the slow one is in flight
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(ClientError) as conflict:
        s3.put_object(Bucket=BUCKET, Key="gp/slow", Body=b"b", IfNoneMatch="*")
    assert _code(conflict.value) == ("ConditionalRequestConflict", 409)
    s3.put_object(Bucket=BUCKET, Key="gp/other", Body=b"c", IfNoneMatch="*")  # another object is not held up
    s3.put_object(Bucket=BUCKET, Key="gp/slow-plain", Body=b"d")  # nor an unconditional write
    slow.join(10)
    assert done and aws.client("s3").get_object(Bucket=BUCKET, Key="gp/slow")["Body"].read() == b"a"


def test_records_round_trip_and_a_taken_name_says_whose(team_url):
    store = S3Store(team_url)
    store.create_node("a", "aws", "us-east-1", owner="alice@laptop/1", gpu="T4")
    rid = store.intend("a", "instance", "us-east-1", "tok-1")
    S3Store(team_url).created(rid, "i-0abc")  # another process learns where the row lives by reading
    store.add_resource(None, "image", "us-east-1", "ami-1")
    store.event("a", "note", "hello")
    store.save_cluster("c", '{"x": 1}')
    other = S3Store(team_url)
    assert [(r.kind, r.cloud_id, r.status) for r in other.resources("a")] == [("instance", "i-0abc", "created")]
    assert [r.cloud_id for r in other.resources(None, kind="image")] == ["ami-1"]
    assert [e.message for e in other.events("a")] == ["hello"]
    assert other.cluster_names() == ["c"] and other.cluster_json("c") == '{"x": 1}'
    with pytest.raises(UserInputError, match="taken by alice@laptop/1 \\(launching\\)"):
        other.create_node("a", "aws", "us-east-1")
    other.deleted(rid)
    other.update_node("a", state="terminated")
    store.create_node("a", "aws", "us-west-2")  # a terminated node's name is free again
    assert store.node("a").region == "us-west-2" and other.nodes()[0].state == "launching"


def test_the_buckets_store_reads_the_enum_and_refuses_a_misspelt_field_or_a_move_the_table_lacks(aws, url):
    """As the local store (test_node_states.py): a field Node lacks is a TypeError naming it, and a move the table
    lacks a bug, both before the object is written (its ETag unchanged)."""
    store = S3Store(url)
    assert store.create_node("a", "aws", "us-east-1").state is NodeState.LAUNCHING
    before = store.bucket.get("nodes/a.json")
    with pytest.raises(TypeError, match="'stat'"):
        store.update_node("a", stat="ready")
    with pytest.raises(TypeError, match="'adress'"):
        store.create_node("b", "aws", "us-east-1", adress="203.0.113.9")
    with pytest.raises(IllegalTransition, match="'a': no move from launching to stopped"):
        store.update_node("a", state=NodeState.STOPPED, address="203.0.113.9")
    assert store.bucket.get("nodes/a.json") == before and store.find_node("b") is None
    store.update_node("a", state=NodeState.RUNNING, address="203.0.113.9")
    assert S3Store(url).node("a").state is NodeState.RUNNING and S3Store(url).nodes()[0].state is NodeState.RUNNING
    assert store.bucket.get("nodes/a.json")[0]["node"]["state"] == "running"  # the plain word in the JSON
    store.update_node("a", state=NodeState.FAILED)  # a take-back: never refused
    store.update_node("a", state=NodeState.TERMINATING)


def test_two_homes_times_twenty_concurrent_updates_lose_nothing(aws, url):
    """40 writers (two homes' stores, 20 threads each) change one node's object at once; a delay between each
    writer's read and its write (on every PutObject) makes them overlap, so most writes lose the race first."""
    S3Store(url).create_node("busy", "aws", "us-east-1")
    aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/nodes/busy.json"}, "delay": 0.02})
    homes = [S3Store(url), S3Store(url)]
    errors: list[BaseException] = []

    def work(home: int, i: int) -> None:
        try:
            homes[home].event("busy", "update", f"{home}-{i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(h, i)) for h in range(2) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    messages = sorted(e.message for e in S3Store(url).events("busy"))
    assert messages == sorted(f"{h}-{i}" for h in range(2) for i in range(20))
    lost = [e for e in aws.log("PutObject") if e["status"] in (409, 412)]
    assert lost, "the writers never overlapped: the test proved nothing"


def test_a_lease_is_renewed_while_held_refused_to_others_and_taken_over_once_expired(team_url):
    bucket_lease = None
    with leases.hold(team_url, "node-l", "up", expiry=3) as held:
        bucket_lease = held
        first = leases.read(held.bucket, "node-l")
        assert first is not None and first[0].what == "up" and first[0].pid == os.getpid()
        deadline = time.monotonic() + 10
        while leases.read(held.bucket, "node-l")[1] == first[1]:  # the renewal thread rewrote it
            assert time.monotonic() < deadline, "never renewed"
            time.sleep(0.1)
        assert not held.lost
    assert leases.read(bucket_lease.bucket, "node-l") is None  # released on exit
    # a dead holder: a lease written once and never renewed. Its expiry is long while the test needs it alive
    # (a refusal, then a taker that waits), and cut short once the taker is waiting: a loaded machine could
    # otherwise let a short one expire before the refusal was asked for, and the refused taker took it over
    dead = leases.Lease(bucket_lease.bucket, "node-d", "up", 60)
    dead.doc["pid"] = 999999
    dead.etag = dead.bucket.put("leases/node-d.json", dead.doc, create=True)
    with pytest.raises(leases.Taken) as taken, leases.hold(team_url, "node-d", "down", expiry=2, wait=False):
        pass
    assert taken.value.holding.pid == 999999 and taken.value.waited is None
    with pytest.raises(leases.Taken) as taken, leases.hold(team_url, "node-d", "down", expiry=2, patience=0.3):
        pass  # a bounded wait: refused once its patience is spent, naming the holder
    assert taken.value.holding.pid == 999999 and taken.value.waited == 0.3
    told: list[str] = []

    def waiting(holding: leases.Holding) -> None:
        told.append(str(holding))
        dead.doc["expiry"] = 0.5  # expired once the bucket's clock has moved on a second
        dead.etag = dead.bucket.put("leases/node-d.json", dead.doc, etag=dead.etag)

    with leases.hold(team_url, "node-d", "down", expiry=2, waiting=waiting, took_over=lambda h: told.append("took over")):
        holding = leases.read(dead.bucket, "node-d")
        assert holding is not None and holding[0].what == "down"
    assert told[0].startswith("gpuprov up of ") and "pid 999999" in told[0] and told[-1] == "took over"


def test_locks_use_leases_with_team_state_and_unlock_says_whose(team_url):
    with locks.hold(locks.node("u"), "up"):
        assert leases.read(S3Store(team_url).bucket, "node-u") is not None
        assert locks.is_free(locks.node("u"))  # this process counts as nobody, as with flock
        holding = leases.unlock(team_url, "node-u")
        assert holding is not None and holding.what == "up" and holding.holder == leases.member()
        held = leases._held["node-u"][0]
        deadline = time.monotonic() + 10
        while not held.lost:  # the next renewal finds it gone, and says so rather than write it again
            assert time.monotonic() < deadline, "the holder never noticed"
            time.sleep(0.1)
        assert leases.read(S3Store(team_url).bucket, "node-u") is None
    assert leases.unlock(team_url, "node-u") is None
    # an image's lock too: a bake's intent row is in the shared records, and a teammate's gc must see the bake
    with locks.hold(locks.image("gpuprov-u-1"), "image bake"):
        holding = leases.read(S3Store(team_url).bucket, "image-gpuprov-u-1")
        assert holding is not None and holding[0].what == "image bake"
    assert leases.read(S3Store(team_url).bucket, "image-gpuprov-u-1") is None


def test_a_release_never_deletes_a_lease_taken_over_after_it_expired(aws, url):
    """A holder frozen past its lease (a closed lid) wakes and lets go just as a teammate takes the expired lease
    over: its delete is paused on the way (the proxy's `pause`: S3 has not seen it) until the takeover is written.
    The release must be S3's to decide (DeleteObject If-Match: 412) and leave the teammate's lease alone."""
    bucket = S3Store(url).bucket
    frozen = leases.Lease(bucket, "node-o", "up", 1)
    frozen.etag = bucket.put("leases/node-o.json", frozen.doc, create=True)  # written once, never renewed
    aws.faults({"service": "s3", "action": "DeleteObject", "match": {"Key": "gp/leases/node-o.json"}, "pause": True,
                "times": 1})
    letting_go = threading.Thread(target=frozen.release)
    letting_go.start()
    aws.wait_held(1)
    took: list[leases.Holding] = []
    with leases.hold(url, "node-o", "down", expiry=30, took_over=took.append) as mine:
        assert took and took[0].what == "up"  # the overlap: the frozen lease expired and was taken over
        aws.release()
        letting_go.join(10)
        found = leases.read(bucket, "node-o")
        assert found is not None and found[0].what == "down" and found[1] == mine.etag
    deletes = [e["status"] for e in aws.log("DeleteObject") if e["form"].get("Key") == "gp/leases/node-o.json"]
    assert deletes == [412, 204]  # the frozen holder's refused; the teammate's own release


def test_team_state_from_config_toml_gives_the_store_leases_and_the_file_is_read_once(url, tmp_path, monkeypatch,
                                                                                     reads_of):
    """`state = "s3://…"` in config.toml: the store opened and every lock after it agree on the team's leases,
    chosen once; the file is not read again at each hold (it once was, at every hold, is_free and holder)."""

    from gpuprov.state import open_store

    config = tmp_path / "config.toml"
    config.write_text(f'state = "s3://{BUCKET}/gp"\nlease = 3\n')
    monkeypatch.delenv("GPUPROV_STATE")
    monkeypatch.delenv("GPUPROV_LEASE_SECONDS")
    monkeypatch.setenv("GPUPROV_CONFIG", str(config))
    reads = reads_of(config)
    store = open_store()
    assert isinstance(store, S3Store) and isinstance(store.coordinator, locks.TeamLeases)
    assert store.coordinator is locks.coordinator() and store.coordinator.url == url
    for _ in range(3):
        with locks.hold(locks.node("u"), "up"):
            holding = leases.read(store.bucket, "node-u")
            assert holding is not None and holding[0].expiry == 3
            assert locks.holder(locks.node("u")).by is not None
            assert locks.is_free(locks.node("u"))
        assert leases.read(store.bucket, "node-u") is None
    assert len(reads) == 1


def _renewed(bucket, key: str, etag: str, timeout: float = 10) -> str:
    """The lease's ETag once a renewal has rewritten it (its thread writes every third of the expiry)."""
    deadline = time.monotonic() + timeout
    while (found := leases.read(bucket, key)) is not None and found[1] == etag:
        assert time.monotonic() < deadline, "never renewed"
        time.sleep(0.05)
    assert found is not None, "the lease went"
    return found[1]


def test_a_renewal_that_meets_a_409_sends_it_again_and_the_lease_stays_held(aws, url):
    """S3 answers 409 ConditionalRequestConflict to a conditional write while another to the same key is in flight:
    nothing was decided, and the renewal is sent again (it once marked the lease lost and stopped renewing). A
    creation that meets one is sent again too."""
    aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/leases/node-r.json"},
                "code": "ConditionalRequestConflict", "status": 409, "times": 2})
    with leases.hold(url, "node-r", "up", expiry=3, wait=False) as held:
        aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/leases/node-r.json"},
                    "code": "ConditionalRequestConflict", "status": 409, "times": 2})
        etag = _renewed(held.bucket, "node-r", held.etag)
        assert [e["status"] for e in aws.log("PutObject") if e["form"].get("Key") == "gp/leases/node-r.json"][-3:] \
            == [409, 409, 200]
        assert not held.lost and held.etag == etag
        _renewed(held.bucket, "node-r", etag)  # and the renewals go on
        assert not held.lost
    assert leases.read(held.bucket, "node-r") is None  # released: the ETag it kept was the bucket's


@pytest.mark.parametrize("lose", ["drop", "500"])
def test_a_renewal_whose_answer_was_lost_reads_the_lease_back_and_keeps_it(aws, url, lose):
    """The renewal lands but its answer is lost (the connection dropped, or S3's 500 InternalError after the write);
    botocore sends it again and the repeat's If-Match names the ETag the first one replaced: 412. The lease read
    back is still this holder's (holder, pid, start): its ETag adopted."""
    with leases.hold(url, "node-a", "up", expiry=3) as held:
        aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/leases/node-a.json"},
                    "lose": lose, "times": 1})
        etag = _renewed(held.bucket, "node-a", held.etag)
        deadline = time.monotonic() + 10
        while 412 not in [e["status"] for e in aws.log("PutObject")]:
            assert time.monotonic() < deadline, "the lost answer was never followed by a 412"
            time.sleep(0.05)
        _renewed(held.bucket, "node-a", etag)  # the renewals go on from the adopted ETag
        assert not held.lost
    assert leases.read(held.bucket, "node-a") is None
    assert [e["outcome"] for e in aws.log("PutObject")].count(f"lost-{lose}") == 1


def test_a_lease_created_behind_a_lost_answer_is_its_own_not_a_teammates(aws, url):
    """A creation (If-None-Match) that landed with its answer lost: the repeat's 412 is this holder's own lease, read
    back and kept (it once waited for itself, or refused itself as `Taken`)."""
    aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/leases/node-c.json"}, "lose": "drop",
                "times": 1})
    with leases.hold(url, "node-c", "up", expiry=3, wait=False) as held:
        found = leases.read(held.bucket, "node-c")
        assert found is not None and held.owns(found[0]) and found[1] == held.etag
        _renewed(held.bucket, "node-c", held.etag)
        assert not held.lost
    assert leases.read(held.bucket, "node-c") is None


def test_a_node_created_or_changed_behind_a_lost_answer_is_written_once(aws, url):
    """What is stored is compared with what was sent before calling it someone else's: a node record whose
    creation landed with its answer lost is ours (not 'taken'), and a change is not applied twice."""
    store = S3Store(url)
    aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/nodes/n.json"}, "lose": "drop",
                "times": 1})
    node = store.create_node("n", "aws", "us-east-1", owner="alice@laptop/1")
    assert node.name == "n" and S3Store(url).node("n").owner == "alice@laptop/1"
    aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/nodes/n.json"}, "lose": "drop",
                "times": 1})
    store.event("n", "note", "once")
    assert [e.message for e in S3Store(url).events("n")] == ["once"]
    assert [e["outcome"] for e in aws.log("PutObject")].count("lost-drop") == 2


def test_a_lost_lease_stops_its_holder_before_its_next_cloud_call(aws, url):
    """A teammate takes the lease over (here: broken, then taken): the holder's next renewal finds it, and every
    cloud call after that is refused by the provider's fence (`locks.fence`) with a LeaseLost naming the node and the
    teammate, before it reaches AWS."""
    from gpuprov.cloud.providers.aws import AwsProvider

    provider = AwsProvider("alice@laptop/1")
    provider.fence = locks.fence
    with locks.hold(locks.node("f"), "up"):
        provider.key_pair_exists("us-east-1", "k")  # a whole lease: the call goes through
        held = leases._held["node-f"][0]
        bucket = held.bucket
        leases.unlock(url, "node-f")
        teammate = leases.Lease(bucket, "node-f", "down", 30)
        teammate.doc.update(holder="bob@desk/2", host="desk", pid=4242)
        teammate.etag = bucket.put("leases/node-f.json", teammate.doc, create=True)
        deadline = time.monotonic() + 10
        while not held.lost:
            assert time.monotonic() < deadline, "the holder never noticed"
            time.sleep(0.05)
        calls = len(aws.log())
        with pytest.raises(leases.LeaseLost) as lost:
            provider.key_pair_exists("us-east-1", "k")
        assert len(aws.log()) == calls  # stopped before the call
        message = str(lost.value)
        assert message.startswith("f: this gpuprov up lost its lease on it: gpuprov down of bob@desk/2 (pid 4242")
        assert "stopped before its next cloud call" in message
    found = leases.read(bucket, "node-f")
    assert found is not None and found[0].holder == "bob@desk/2"  # the holder's release left the teammate's lease
    provider.key_pair_exists("us-east-1", "k")  # nothing lost is held any more


def test_a_lease_unrenewed_past_its_expiry_stops_its_holder_too(aws, url):
    """The bucket refuses every renewal (or the laptop slept through them): once the last write the bucket took is
    older than the expiry, a teammate may have taken the lease over, and the holder stops before its next cloud call
    rather than wait for a renewal to tell."""
    with leases.hold(url, "node-s", "up", expiry=3) as held:
        leases.check()  # just written: whole
        aws.faults({"service": "s3", "action": "PutObject", "match": {"Key": "gp/leases/node-s.json"},
                    "code": "AccessDenied", "status": 403})
        deadline = time.monotonic() + 10
        while not held.unsure:
            assert time.monotonic() < deadline, "never unsure"
            time.sleep(0.05)
        assert not held.lost  # nobody took it: the bucket only did not answer
        with pytest.raises(leases.LeaseLost, match=r"s: this gpuprov up could not renew its lease on it for \d+ s, "
                                                   r"past its 3 s: a teammate may hold it now; stopped before"):
            locks.fence()
    locks.fence()  # released: nothing held


def test_the_buckets_objects_are_input_named_and_skipped_not_a_crash(aws, url, capsys):
    """An object that does not parse, a record named otherwise than its object or against the name rule, and one in
    a state this gpuprov does not know (a newer gpuprov's) are named and left out; the rest is read."""
    from gpuprov.state.s3 import BadObject

    store = S3Store(url)
    store.create_node("good", "aws", "us-east-1")
    store.add_resource("good", "instance", "us-east-1", "i-0good")
    s3 = aws.client("s3")
    good = json.loads(s3.get_object(Bucket=BUCKET, Key="gp/nodes/good.json")["Body"].read())

    def put(key: str, body: object) -> None:
        s3.put_object(Bucket=BUCKET, Key=f"gp/nodes/{key}", Body=body if isinstance(body, bytes) else
                      json.dumps(body).encode())

    put("torn.json", b'{"node": {"name": "torn"')
    put("list.json", [1, 2])
    put("other.json", {**good, "node": {**good["node"], "name": "good"}})
    put("up.json", {**good, "node": {**good["node"], "name": "../../up"}})
    put("newer.json", {**good, "node": {**good["node"], "name": "newer", "state": "hibernating"}})
    fresh = S3Store(url)
    assert [n.name for n in fresh.nodes(include_terminated=True)] == ["good"]
    assert [r.cloud_id for r in fresh.resources()] == ["i-0good"]
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 5 and all(line.startswith(f"warning: s3://{BUCKET}/gp/nodes/") for line in warned)
    said = "\n".join(warned)
    assert "torn.json: is not JSON" in said and "list.json: holds a JSON list, not a record" in said
    assert "other.json: its record is named 'good': another node's" in said
    assert "up.json: its record's name '../../up' is not a node name" in said
    assert "newer.json: its state 'hibernating' is not one this gpuprov knows" in said
    fresh.nodes()
    assert capsys.readouterr().err == ""  # said once per store
    # gc takes none of their resources for orphans: each may be a teammate's live node (a newer gpuprov's)
    assert sorted(fresh.moved()) == ["list", "newer", "other", "torn", "up"]
    with pytest.raises(BadObject, match=r"newer\.json: its state 'hibernating'") as bad:
        fresh.find_node("newer")  # asked for by name: said, exit 2
    assert bad.value.exit_code == 2
