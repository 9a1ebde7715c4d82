"""The randomized walk's world: three gpuprov users against one fake AWS, the commands they run, and the invariants.

Who: `alice` and `bob` share a team bucket (`GPUPROV_STATE=s3://chaos-team/gp`, each their own gpuprov home, so
their own member id); `carol` keeps a local state file. Every command is the real CLI, forked by the fork server
(tests/forkcli.py), against moto behind the fault proxy (tests/aws/fixture.py), in the proxy's realistic kind.
Nodes are launched with `--no-bootstrap --no-wait`, but node `h`: it is bootstrapped on a real SSH host of the
`aws_hosts` pool, with a `when: down` data entry and guards (hosted.py says how its address reaches the host).

The cloud is the world's ground (`Ground`): `AwsGround`, moto behind the proxy, or tests/chaos/ecs.py's `EcsGround`,
the ECS imitation (the same walk on Alibaba Cloud: no hosted node there, so no (b) and (e)); the team's bucket is
moto's S3 on either. Ground truth is the endpoint's own: a boto3 client straight to moto (`aws.ec2()`,
`aws.client("s3")`), or the imitation's state, said in EC2's shape (`Cloud`) so each invariant is written once; never
through gpuprov. The records are read straight too: each home's `state.sqlite` (read-only, as sqlite3 opens it)
and the bucket's `gp/nodes/*.json` and `gp/unowned.json` objects.

The invariants (design.md "Hard rules of the domain"), checked after every step once no command of the walk runs:

(a) nothing billed is untracked: every live resource in moto that carries `gpuprov:owner` (an instance not
    terminated, a volume, a security group, a key pair, an image, a snapshot, an Elastic IP) is named by a record:
    a resource row not marked deleted, in any of the stores (a local file or the bucket), whose `cloud_id` is its id
    (a key pair: its name; an image or a security group: its id or, for the row written before CreateImage or
    CreateSecurityGroup, its name as the row's client token). An instance whose id no row has learnt yet is named
    by an intent row whose client token is the instance's ClientToken (the row written before RunInstances). A
    volume attached to a named instance is named by it (a root volume goes with its instance); a snapshot is named
    by a named image whose block device mapping holds it or whose name its `gpuprov:image` tag carries.
    What is allowed: nothing else. A command that was killed (SIGKILL, SIGTERM) is allowed no grace: the records
    are written before every request (the money rule), so a dead command's resources are named by the rows it
    left, whoever finishes the work later. A command still running is only ever one of an `overlap` step's two,
    and the invariants are checked after both have ended.
(b) no volume of a node with unsaved `when: down` data is deleted unless `--no-save` was given: for the hosted
    nodes, against a ledger of what each host wrote and the bucket the data goes to (hosted.py `data_lost`).
(c) nothing of a node is destroyed while a live process holds its lock or lease: the `overlap` step holds one
    command's request at the proxy (its process alive, holding the node's lock or lease), runs a second one that
    would destroy the node (`down`, `down --all`, `gc --yes`, another member's or the same user's), and checks
    while the first is still held that every instance and volume of that node that was live before is live still.
(d) a node its record calls stopped has no running instance: every instance row of a `stopped` record (and every
    cluster member's instance) is not `pending` or `running` in moto.
(e) a running node has the guards its record shows: for the hosted nodes, read off the host (tests/node_guards.py)
    against `cloud/guards.recorded_guards` of the record (hosted.py `guards_differ`).

And one more, the CLI's own contract: a command that was not signalled ends within 150 s, with 0, 1 or 2 and no
traceback (one signalled ends within 120 s of its signal).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tests import forkcli
from tests.aws.fixture import AwsEndpoint
from tests.chaos.hosted import CKPT_BUCKET, HOSTED, HOSTED_UP, Disk, Hosts, Ledger, data_lost, guards_differ, playbook

BUCKET = "chaos-team"
PREFIX = "gp/"
STATE = f"s3://{BUCKET}/{PREFIX.rstrip('/')}"
TEAM = ("alice", "bob")
LOCAL = ("carol",)
USERS = TEAM + LOCAL
OWNER_TAG = "gpuprov:owner"
NODE_TAG = "gpuprov:node"
IMAGE_TAG = "gpuprov:image"
REGIONS = ("us-east-1",)
CLUSTER = "c"  # `up --nodes 2`, no host either
LIVE = ("pending", "running", "stopping", "stopped", "shutting-down")


@dataclass
class Ran:
    """One command the walk ran, and how it ended."""

    who: str
    args: tuple[str, ...]
    rc: int | None
    out: str
    err: str
    signalled: str | None = None  # "SIGTERM after 0.40 s"
    seconds: float = 0.0

    def line(self) -> str:
        how = f" [{self.signalled}]" if self.signalled else ""
        how += f" ({self.seconds:.1f} s)"
        last = (self.err.strip().splitlines() or self.out.strip().splitlines() or [""])[-1][:160]
        return f"{self.who}$ gpuprov {' '.join(self.args)}{how} -> {self.rc}: {last}"


@dataclass
class Cloud:
    """What the cloud holds that gpuprov made (a `gpuprov:owner` tag), by kind: id -> the resource as EC2 describes
    it, the shape the invariants read (another cloud's ground, tests/chaos/ecs.py, says its listing in it)."""

    instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    images: dict[str, dict[str, Any]] = field(default_factory=dict)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    addresses: dict[str, dict[str, Any]] = field(default_factory=dict)
    sets: dict[str, dict[str, Any]] = field(default_factory=dict)  # placement: {"Name": …} (ECS's deployment sets)


@dataclass
class Records:
    """Every store's records: (store, node record as a dict), and the resource rows not marked deleted."""

    nodes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    rows: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def _text(out: str | bytes | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def _tags(item: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in item.get("Tags", []) or []}


class Broken(AssertionError):
    """An invariant the walk found broken: which, and what shows it."""


class Ground(Protocol):
    """The cloud a walk runs against, as the world needs it: the CLI's environment for it, its ground truth as a
    `Cloud`, one-shot faults, and an answer held while a second command runs (the `overlap` step)."""

    name: str
    unset: tuple[str, ...]  # variables of the test's environment the CLI must not see

    def reset(self) -> None: ...
    def env(self) -> dict[str, str]: ...
    def cloud(self) -> Cloud: ...
    def fault(self, rule: dict[str, Any]) -> None: ...
    def hold(self, action: str) -> int: ...
    def holding(self, hold: int) -> bool: ...
    def release(self) -> None: ...


class AwsGround:
    """moto behind the fault proxy (the `aws` fixture), in the proxy's realistic kind; faults are proxy rules."""

    name = "aws"
    unset: tuple[str, ...] = ()

    def __init__(self, aws: AwsEndpoint) -> None:
        self.aws = aws

    def reset(self) -> None:
        pass  # World resets the endpoint: its S3 is the team's bucket on every cloud

    def env(self) -> dict[str, str]:
        return {}

    def fault(self, rule: dict[str, Any]) -> None:
        self.aws.faults(rule)

    def hold(self, action: str) -> int:
        (rule_id,) = self.aws.faults({"action": action, "hold": True, "times": 1, "name": "chaos-overlap"})
        return int(rule_id)

    def holding(self, hold: int) -> bool:
        return any(r["id"] == hold and r.get("held") for r in self.aws.rules())

    def release(self) -> None:
        self.aws.release()
        # the hold rule, spent whether or not it was met: a rule of the same name replaces it, matching nothing
        self.aws.faults({"name": "chaos-overlap", "action": "ChaosNothing", "times": 0})

    def cloud(self) -> Cloud:
        out = Cloud()
        owned = [{"Name": "tag-key", "Values": [OWNER_TAG]}]
        for region in REGIONS:
            ec2 = self.aws.ec2(region)
            for res in ec2.describe_instances(Filters=owned)["Reservations"]:
                for i in res["Instances"]:
                    if i["State"]["Name"] in LIVE:
                        out.instances[i["InstanceId"]] = i
            out.volumes.update((v["VolumeId"], v) for v in ec2.describe_volumes()["Volumes"]
                               if OWNER_TAG in _tags(v) or self._attached_to(v, out.instances))
            out.groups.update((g["GroupId"], g) for g in ec2.describe_security_groups(Filters=owned)["SecurityGroups"])
            out.keys.update((k["KeyName"], k) for k in ec2.describe_key_pairs(Filters=owned)["KeyPairs"])
            out.images.update((i["ImageId"], i) for i in ec2.describe_images(Owners=["self"])["Images"]
                              if OWNER_TAG in _tags(i))
            out.snapshots.update((s["SnapshotId"], s) for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]
                                 if OWNER_TAG in _tags(s))
            out.addresses.update((a["AllocationId"], a) for a in ec2.describe_addresses(Filters=owned)["Addresses"])
        return out

    @staticmethod
    def _attached_to(volume: dict[str, Any], instances: dict[str, dict[str, Any]]) -> bool:
        return any(a.get("InstanceId") in instances for a in volume.get("Attachments", []))


class World:
    """One walk's users, endpoint and ledger. Fresh per Hypothesis example: the endpoint is reset, the homes new."""

    def __init__(self, aws: AwsEndpoint, root: Path, base_env: dict[str, str], hosts: Hosts | None,
                 lease_seconds: int = 10, ground: Ground | None = None) -> None:
        aws.reset()
        self.aws = aws  # the team's bucket (and, on AWS, the cloud)
        self.ground = ground or AwsGround(aws)
        self.ground.reset()
        self.root = root
        self.hosts = hosts
        self.ledger = Ledger()
        s3 = aws.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        s3.create_bucket(Bucket=CKPT_BUCKET)
        self.subnets: dict[str, str] = {}
        if hosts is not None:
            self.subnets = {side: aws.subnet_for_hosts(hosts.block(side), "us-east-1a") for side in ("team", "local")}
            hosts.homes([root / who / "gp" for who in USERS])
        for side in self.subnets:
            (root / f"{side}.yml").write_text(playbook(side))
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        self.envs: dict[str, dict[str, str]] = {}
        for who in USERS:
            (root / who / "home").mkdir(parents=True, exist_ok=True)
            env = {**base_env, **aws.env(), **self.ground.env(), "GPUPROV_HOME": str(root / who / "gp"),
                   "HOME": str(root / who / "home"),
                   "GPUPROV_TEST_POLL_SECONDS": "0.1", "GPUPROV_TEST_SETTLE_SECONDS": "15", "COLUMNS": "200",
                   "GPUPROV_LEASE_SECONDS": str(lease_seconds)}
            for gone in ("GPUPROV_STATE", *self.ground.unset):
                env.pop(gone, None)
            if who in TEAM:
                env["GPUPROV_STATE"] = STATE
            self.envs[who] = env
        self.ran: list[Ran] = []
        self.counts: Counter[str] = Counter()
        self._began = time.monotonic()  # when the command `start` started last began

    # ------------------------------------------------------------------ commands
    def gp(self, who: str, *args: str, timeout: float = 150) -> Ran:
        """Run one command to its end; a crash (a traceback, an exit status the CLI never gives) is broken."""
        self.counts["commands"] += 1
        self.ledger.no_save |= "--no-save" in args
        began = time.monotonic()
        try:
            done = forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True,
                               timeout=timeout, env=self.envs[who])
            ran = Ran(who, args, done.returncode, done.stdout, done.stderr)
        except subprocess.TimeoutExpired as exc:
            ran = Ran(who, args, None, _text(exc.stdout), _text(exc.stderr), f"hung past {timeout:.0f} s")
        ran.seconds = time.monotonic() - began
        self._ran(ran)
        self._sane(ran)
        return ran

    def start(self, who: str, *args: str) -> forkcli.Popen:
        self.counts["commands"] += 1
        self.ledger.no_save |= "--no-save" in args
        self._began = time.monotonic()
        return forkcli.Popen([sys.executable, "-m", "gpuprov", *args], env=self.envs[who], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)

    def finish(self, proc: forkcli.Popen, who: str, args: tuple[str, ...], signalled: str | None = None,
               timeout: float = 150, began: float | None = None) -> Ran:
        began = began if began is not None else self._began
        sent = signalled
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate(timeout=30)
            signalled = (signalled + ", then " if signalled else "") + f"hung past {timeout:.0f} s"
        ran = Ran(who, args, proc.returncode, out, err, signalled, time.monotonic() - began)
        self._ran(ran)
        if sent is None:  # a command no one signalled: it must end, and as the CLI ends
            self._sane(ran)
        return ran

    def signalled(self, who: str, args: tuple[str, ...], sig: signal.Signals, delay: float) -> Ran:
        """Start a command, send it `sig` after `delay` seconds (unless it ended first), and wait for its end."""
        proc = self.start(who, *args)
        try:
            proc.wait(delay)
            sent = None  # it ended before the signal
        except subprocess.TimeoutExpired:
            proc.send_signal(sig)
            self.counts[sig.name] += 1
            sent = f"{sig.name} after {delay:.2f} s"
        ran = self.finish(proc, who, args, sent, timeout=120)
        if ran.signalled is not None and "hung" in ran.signalled:
            raise self.broken(f"`gpuprov {' '.join(args)}` ({who}) did not end within 120 s of {ran.signalled}")
        return ran

    def _ran(self, ran: Ran) -> None:
        self.ran.append(ran)
        progress = os.environ.get("GPUPROV_TEST_CHAOS_LOG")  # a long walk's commands as they end
        if progress:
            with open(progress, "a") as f:
                f.write(f"{time.strftime('%H:%M:%S')} {self.root.name} {ran.line()}\n")

    def broken(self, what: str) -> Broken:
        """The invariant broken, with the walk that broke it, said at once (Hypothesis's shrinking replays the walk,
        and a replay that does not break it again leaves only this) and returned to be raised."""
        said = (f"BROKEN in walk {self.root.name}: {what}\nthe walk's commands:\n{self.describe()}\n"
                f"the last command's output:\n{self.ran[-1].out[-3000:] if self.ran else ''}"
                f"{self.ran[-1].err[-3000:] if self.ran else ''}\nthe records now:\n{self.said_records()}\n")
        print(said, flush=True)
        progress = os.environ.get("GPUPROV_TEST_CHAOS_LOG")
        if progress:
            with open(progress, "a") as f:
                f.write(said)
        return Broken(what)

    def said_records(self) -> str:
        try:
            records = self.records()
        except Exception as exc:  # a failure's message must not fail
            return f"  (could not read them: {exc})"
        lines = [f"  {store}: node {n['name']} {n.get('state')} ({n.get('state_reason')})" for store, n in records.nodes]
        lines += [f"  {store}: row {r.get('node')} {r.get('kind')} {r.get('cloud_id')} {r.get('client_token')} "
                  f"{r.get('status')}" for store, r in records.rows]
        return "\n".join(lines)

    def _sane(self, ran: Ran) -> None:
        if ran.signalled is not None:
            raise self.broken(f"`gpuprov {' '.join(ran.args)}` ({ran.who}) {ran.signalled}:\n{ran.out[-2000:]}{ran.err[-2000:]}")
        if ran.rc not in (0, 1, 2) or "Traceback (most recent call last)" in ran.err or "hit a bug" in ran.err:
            raise self.broken(f"`gpuprov {' '.join(ran.args)}` ({ran.who}) crashed, exit {ran.rc}:\n"
                         f"{ran.out[-2000:]}{ran.err[-3000:]}")

    def state_of(self, who: str, name: str) -> str | None:
        """The node's state as `who`'s `status --json` says it (None: no such node)."""
        shown = self.gp(who, "status", "--json")
        try:
            rows = json.loads(shown.out) if shown.rc == 0 else []
        except ValueError:
            rows = []
        return next((str(r.get("state")) for r in rows if r.get("name") == name), None)

    def prepare(self, who: str, name: str, want: str | None, up: tuple[str, ...]) -> None:
        """Bring node `name` to `want` ("running" or "stopped") with ordinary commands, as far as they go: a step
        that kills or overlaps a command then catches it at work, not refusing at once. Whatever they do is checked
        like any step's."""
        if want is None:
            return
        state = self.state_of(who, name)
        if state in (None, "terminated"):
            self.up(who, name, up)
            state = self.state_of(who, name)
        if want == "stopped" and state == "ready":
            self.gp(who, "stop", name)
        elif want == "running" and state == "stopped":
            self.gp(who, "start", name, "--no-bootstrap")

    def up(self, who: str, name: str, up: tuple[str, ...]) -> Ran:
        """`up` of a name: node `c` a cluster of two, node `h` bootstrapped on its side's host (wiped first unless an
        instance stands on it)."""
        if name != HOSTED or self.hosts is None:
            return self.gp(who, "up", name, *(("--nodes", "2") if name == CLUSTER else ()), *up)
        side = "team" if who in TEAM else "local"
        if not any(self.hosts.host_of(i.get("PrivateIpAddress")) == (self.hosts.side_host(side), side)
                   for i in self.cloud().instances.values()):
            self.hosts.fresh(side)
        return self.gp(who, "up", name, *HOSTED_UP, "--subnet", self.subnets[side], "-p",
                       str(self.root / f"{side}.yml"), timeout=240)

    def write(self, side: str) -> None:
        """The host of `side` writes a new checkpoint, if a live instance of a hosted node stands on it."""
        host = self.hosts.side_host(side)
        if any(d.host == host and not d.closed for d in self.ledger.disks.values()):
            self.ledger.writes += 1
            if self.hosts.write(host, f"w{self.ledger.writes}-{self.root.name}"):
                self.counts["writes"] += 1

    def held(self, hold: int, proc: forkcli.Popen, timeout: float = 60) -> bool:
        """Wait until the cloud holds the answer `hold` (Ground.hold) stands for (True), or the process ended first
        (False)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.ground.holding(hold):
                return True
            if proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def fault(self, rule: dict[str, Any]) -> None:
        """A one-shot fault: S3's (`service: s3`) at the proxy in front of the team's bucket, the cloud's by its
        ground."""
        if rule.get("service") == "s3":
            self.aws.faults(rule)
        else:
            self.ground.fault(rule)
        self.counts["faults"] += 1

    # ------------------------------------------------------------------ ground truth
    def cloud(self) -> Cloud:
        return self.ground.cloud()

    def records(self) -> Records:
        out = Records()
        for who in USERS:
            path = self.root / who / "gp" / "state.sqlite"
            if not path.exists():
                continue
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
            db.row_factory = sqlite3.Row
            try:
                out.nodes += [(f"{who}'s file", dict(r)) for r in db.execute("SELECT * FROM nodes")]
                out.rows += [(f"{who}'s file", dict(r)) for r in
                             db.execute("SELECT * FROM resources WHERE status != 'deleted'")]
            finally:
                db.close()
        s3 = self.aws.client("s3")
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX).get("Contents", [])
        for obj in listed:
            key = obj["Key"]
            if not (key.startswith(f"{PREFIX}nodes/") or key == f"{PREFIX}unowned.json") or not key.endswith(".json"):
                continue
            doc = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
            if "node" in doc:
                out.nodes.append(("the bucket", doc["node"]))
            out.rows += [("the bucket", r) for r in doc.get("resources", []) if r.get("status") != "deleted"]
        return out

    def leases(self) -> list[str]:
        s3 = self.aws.client("s3")
        return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}leases/").get("Contents", [])]

    # ------------------------------------------------------------------ invariants
    def check(self) -> None:
        """(a), (b), (d) and (e), as the module docstring says them; raises Broken naming each breach."""
        cloud, records = self.cloud(), self.records()
        problems = self.untracked(cloud, records) + self.stopped_but_running(cloud, records)
        if self.hosts is not None:  # the hosted nodes' invariants live on their hosts
            problems += self.data_and_guards(cloud, records)
        if problems:
            raise self.broken("\n".join(problems))

    def data_and_guards(self, cloud: Cloud, records: Records) -> list[str]:
        """(b) against the ledger (then the ledger learns the instances now on a host and what each host holds),
        and (e) for each running node on a host."""
        live = {n["name"] for _, n in records.nodes if n.get("state") not in ("terminated", None)}
        open_before = sum(not d.closed for d in self.ledger.disks.values())
        problems = data_lost(self.ledger, self.aws.ec2(), self.aws.client("s3"), live)
        self.counts["disks gone"] += open_before - sum(not d.closed for d in self.ledger.disks.values())
        self.ledger.no_save = False
        on_host: dict[str, int] = {}
        for iid, inst in cloud.instances.items():
            found = self.hosts.host_of(inst.get("PrivateIpAddress"))
            if found is None or inst["State"]["Name"] == "shutting-down":
                continue
            on_host[iid] = found[0]
            if iid not in self.ledger.disks:
                volumes = tuple(m["Ebs"]["VolumeId"] for m in inst.get("BlockDeviceMappings", []) if "Ebs" in m)
                self.ledger.disks[iid] = Disk(found[0], found[1], _tags(inst).get(NODE_TAG, "?"), volumes)
            self.ledger.disks[iid].written = self.hosts.written(found[0]) or self.ledger.disks[iid].written
        for store, node in records.nodes:
            if node.get("state") not in ("ready", "running") or not node.get("ready_at"):
                continue
            mine = [str(r["cloud_id"]) for s, r in records.rows if s == store and r.get("node") == node["name"]
                    and r.get("kind") == "instance" and r.get("cloud_id")]
            for iid in mine:
                if iid in on_host and cloud.instances[iid]["State"]["Name"] == "running":
                    self.counts["guard checks"] += 1
                    problems += guards_differ(self.hosts, store, node, on_host[iid])
        return problems

    @staticmethod
    def untracked(cloud: Cloud, records: Records) -> list[str]:
        ids = {str(r["cloud_id"]) for _, r in records.rows if r.get("cloud_id")}
        tokens = {str(r["client_token"]) for _, r in records.rows if r.get("client_token")}
        problems = []

        def say(kind: str, rid: str, item: dict[str, Any], extra: str = "") -> None:
            tags = _tags(item)
            problems.append(f"(a) untracked {kind} {rid} (gpuprov:node={tags.get(NODE_TAG)}, "
                            f"owner={tags.get(OWNER_TAG)}{extra}): no record names it")

        named_instances = set()
        for iid, inst in cloud.instances.items():
            if iid in ids or inst.get("ClientToken") in tokens:
                named_instances.add(iid)
            else:
                say("instance", iid, inst, f", {inst['State']['Name']}")
        for vid, vol in cloud.volumes.items():
            if vid not in ids and not any(a.get("InstanceId") in named_instances for a in vol.get("Attachments", [])):
                say("volume", vid, vol, f", {vol['State']}")
        for gid, group in cloud.groups.items():  # an intent row has its name, recorded before CreateSecurityGroup
            if gid not in ids and group.get("GroupName") not in tokens:
                say("security group", gid, group)
        for name, key in cloud.keys.items():
            if name not in ids and key.get("KeyPairId") not in ids:
                say("key pair", name, key)
        named_images = {}
        for aid, image in cloud.images.items():
            if aid in ids or image.get("Name") in tokens or image.get("Name") in ids:
                named_images[aid] = image
            else:
                say("image", aid, image, f", {image.get('Name')}")
        held = {m["Ebs"]["SnapshotId"] for i in named_images.values() for m in i.get("BlockDeviceMappings", [])
                if m.get("Ebs", {}).get("SnapshotId")}
        image_names = {i.get("Name") for i in named_images.values()}
        for sid, snap in cloud.snapshots.items():
            if sid not in ids and sid not in held and _tags(snap).get(IMAGE_TAG) not in image_names:
                say("snapshot", sid, snap)
        for aid, address in cloud.addresses.items():
            if aid not in ids and address.get("PublicIp") not in ids:
                say("address", aid, address)
        for sid, placed in cloud.sets.items():  # the row written before the set was asked for has its name
            if sid not in ids and placed.get("Name") not in ids | tokens:
                say("placement set", sid, placed)
        return problems

    @staticmethod
    def stopped_but_running(cloud: Cloud, records: Records) -> list[str]:
        problems = []
        for store, node in records.nodes:
            if node.get("state") != "stopped":
                continue
            mine = {str(r["cloud_id"]) for s, r in records.rows if s == store and r.get("node") == node["name"]
                    and r.get("kind") == "instance" and r.get("cloud_id")}
            mine |= {m["instance_id"] for m in json.loads(node.get("members_json") or "[]")}
            for iid in sorted(mine):
                state = cloud.instances.get(iid, {}).get("State", {}).get("Name")
                if state in ("pending", "running"):
                    problems.append(f"(d) {store} calls {node['name']} stopped, and its instance {iid} is {state}")
        return problems

    def node_resources(self, name: str, team: bool) -> dict[str, str]:
        """What of node `name` (the team's, else carol's) is live in moto now: id -> kind (instances, volumes)."""
        cloud = self.cloud()
        out: dict[str, str] = {}
        for iid, inst in cloud.instances.items():
            tags = _tags(inst)
            if tags.get(NODE_TAG) == name and ("gpuprov:team" in tags) == team \
                    and inst["State"]["Name"] != "shutting-down":
                out[iid] = "instance"
                out.update((a["VolumeId"], "volume") for a in
                           (v for vol in cloud.volumes.values() for v in vol.get("Attachments", []))
                           if a.get("InstanceId") == iid)
        return out

    def describe(self) -> str:
        """The walk so far, for a failure's message: every command and how it ended."""
        return "\n".join(f"  {i + 1:3d}. {r.line()}" for i, r in enumerate(self.ran))
