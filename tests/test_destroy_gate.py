"""The one gate for destruction (cloud/destroy.py): no module but the gate asks a provider to terminate, delete or
cancel (read over the source, and broken on purpose in a copy of it); the gate refuses a destroy without the node's
lock, outside an open gate, and a node whose `when: down` data cannot be saved; through the CLI, `down` of a cluster
saves every node's data, and `gc --stopped-for` (or `gc` with `stopped_for` in the config) leaves a stopped node with
data to save, by name, and takes the others."""

from __future__ import annotations

import ast
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuprov.cloud import destroy
from gpuprov.cloud.providers.base import IMAGES, SHARED, CloudResource
from gpuprov.state import NodeState, Store, locks
from gpuprov.state.sqlite import SqliteStore
from tests.aws.cli import gp, nothing_left, up_args

SRC = Path(__file__).resolve().parents[1] / "src" / "gpuprov"
R = "us-east-1"

# the provider's destructive calls (cloud/providers/base.py), and boto3's own, by the name they are called with
DESTROYS = {"terminate", "delete", "delete_image", "delete_key_pair", "delete_node_role", "delete_node_profile"}
PREFIXES = ("terminate_", "delete_", "deregister_", "cancel_", "release_address")
NOT_CLOUD = {"delete_cluster"}  # the store's record of a cluster (state/), no cloud resource


def destroys_outside_the_gate(src: Path) -> list[str]:
    """`path:line: call` for each call of a destructive method outside the gate, the providers themselves and
    state/ (whose only deletes are the records' own objects in the team's bucket)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        where = path.relative_to(src).as_posix()
        if where == "cloud/destroy.py" or where.startswith(("cloud/providers/", "state/")):
            continue
        for call in ast.walk(ast.parse(path.read_text(), where)):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                continue
            name = call.func.attr
            if name in NOT_CLOUD or not (name in DESTROYS or name.startswith(PREFIXES)):
                continue
            found.append(f"{where}:{call.lineno}: .{name}(…)")
    return found


def test_only_the_gate_calls_the_providers_destroys():
    assert destroys_outside_the_gate(SRC) == []


@pytest.mark.parametrize(("module", "line"), [
    ("cloud/gc.py", "def _f(provider):\n    provider.delete(None)\n"),
    ("cloud/teardown.py", "def _f(provider):\n    provider.terminate('r', ['i-1'], settle=0)\n"),
    ("cloud/move.py", "def _f(p):\n    return p.delete_image('r', 'ami-1')\n"),
    ("cli/cloud.py", "def _f(self):\n    self.provider.delete_key_pair('r', 'k')\n"),
    ("cloud/node.py", "def _f(ec2):\n    ec2.cancel_spot_instance_requests(SpotInstanceRequestIds=[])\n"),
])
def test_a_destroy_outside_the_gate_is_found(tmp_path, module, line):
    """A copy of the tree with one destroy added outside the gate: the check names it."""
    shutil.copytree(SRC, tmp_path / "gpuprov", ignore=shutil.ignore_patterns("__pycache__", "data"))
    target = tmp_path / "gpuprov" / module
    target.write_text(target.read_text() + "\n" + line)
    found = destroys_outside_the_gate(tmp_path / "gpuprov")
    assert len(found) == 1 and found[0].startswith(f"{module}:"), found


# --- the gate, in-process ------------------------------------------------------------------------------


class Cloud:
    """Records each destructive call; the gate must refuse before any is made."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def terminate(self, region: str, ids: Sequence[str], settle: float) -> None:
        self.calls.append(("terminate", tuple(ids)))

    def delete(self, resource: CloudResource, settle: float = 0) -> None:
        self.calls.append(("delete", resource.kind, resource.id))

    def delete_image(self, region: str, image_id: str, settle: float = 0) -> list[str]:
        self.calls.append(("delete_image", image_id))
        return [image_id]

    def delete_key_pair(self, region: str, name: str, settle: float = 0) -> None:
        self.calls.append(("delete_key_pair", name))


DOWN_SAVES = {"data": [{"from": "/work/ckpt", "to": "s3://ckpt/run1", "when": ["down"]}]}


@pytest.fixture
def store(gp_home: Path, tmp_path: Path) -> Store:
    s = SqliteStore(tmp_path / "state.sqlite")
    s.create_node("n1", "aws", R)
    s.create_node("saver", "aws", R, plan_json=json.dumps(DOWN_SAVES))
    s.update_node("saver", state=NodeState.RUNNING)
    s.update_node("saver", state=NodeState.STOPPING)
    s.update_node("saver", state=NodeState.STOPPED)
    return s


def test_the_gate_refuses_a_destroy_without_the_lock(store: Store) -> None:
    cloud = Cloud()
    said: list[str] = []
    with pytest.raises(destroy.Unguarded, match="without holding node-n1"), \
            destroy.node("n1", store, said.append, anyone=True, no_save=False):
        pass
    with pytest.raises(destroy.Unguarded, match="without holding node-n1"), destroy.take_back("n1", "up"):
        pass
    with pytest.raises(destroy.Unguarded, match="without holding node-n1"):
        destroy.orphan(cloud, CloudResource("volume", "vol-1", R, "n1"))  # type: ignore[arg-type]
    with pytest.raises(destroy.Unguarded, match=f"without holding region-{R}"):
        destroy.key_pair(cloud, R, "gpuprov-k")  # type: ignore[arg-type]
    with pytest.raises(destroy.Unguarded, match=f"without holding region-{R}"):  # a snapshot whose image is gone
        destroy.orphan(cloud, CloudResource("snapshot", "snap-1", R, IMAGES, "of image x (gone)"))  # type: ignore[arg-type]
    with pytest.raises(destroy.Unguarded, match="without holding image-baked"):
        destroy.image(cloud, R, "ami-1", "baked")  # type: ignore[arg-type]
    # the lock alone opens nothing: the gate's own destroys ask for an open gate too
    with locks.hold(locks.node("n1"), "test"), pytest.raises(destroy.Unguarded, match="outside the destroy gate"):
        destroy.end(cloud, "n1", R, ["i-1"], settle=0)  # type: ignore[arg-type]
    assert cloud.calls == [] and said == []


def test_with_team_state_the_gate_wants_the_nodes_lease_whole(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease this process holds but lost (a teammate broke or took it), or left unrenewed past its expiry, stops
    its holder at the gate, as before its next cloud call (LeaseLost, not a bug); no lease at all is a bug."""
    from types import SimpleNamespace

    from gpuprov.state import leases, url

    monkeypatch.setattr(url, "configured", lambda: object())  # the records are a team's: node locks are leases
    assert isinstance(locks.coordinator(), locks.TeamLeases)
    with pytest.raises(destroy.Unguarded, match="without holding node-n1"), destroy.take_back("n1", "up"):
        pass
    for lost, unsure in ((True, False), (False, True)):
        lease = SimpleNamespace(key="node-n1", lost=lost, unsure=unsure, taken_by=None, doc={"what": "up"},
                                written_at=time.time() - 60, expiry=30.0)
        monkeypatch.setitem(leases._held, "node-n1", (lease, 1))
        with pytest.raises(leases.LeaseLost, match="n1: this gpuprov up"), destroy.take_back("n1", "up"):
            pass
    whole = SimpleNamespace(key="node-n1", lost=False, unsure=False)
    monkeypatch.setitem(leases._held, "node-n1", (whole, 1))
    with destroy.take_back("n1", "up"):
        pass


def test_inside_the_gate_the_destroys_go_and_it_closes_behind_them(store: Store) -> None:
    cloud = Cloud()
    with locks.hold(locks.node("n1"), "down"):
        with destroy.node("n1", store, [].append, anyone=True, no_save=False) as record:
            assert record.name == "n1"
            destroy.end(cloud, "n1", R, ["i-1"], settle=0)  # type: ignore[arg-type]
            destroy.remove(cloud, CloudResource("volume", "vol-1", R, "n1"))  # type: ignore[arg-type]
            with pytest.raises(destroy.Unguarded):  # another node's resource: its gate is not open
                destroy.remove(cloud, CloudResource("volume", "vol-2", R, "n2"))  # type: ignore[arg-type]
        with pytest.raises(destroy.Unguarded, match="outside the destroy gate"):
            destroy.end(cloud, "n1", R, ["i-2"], settle=0)  # type: ignore[arg-type]
    with locks.hold(locks.region(R), "key pair"):
        destroy.key_pair(cloud, R, "gpuprov-k")  # type: ignore[arg-type]
        destroy.orphan(cloud, CloudResource("key-pair", "gpuprov-k2", R, SHARED))  # type: ignore[arg-type]
    assert cloud.calls == [("terminate", ("i-1",)), ("delete", "volume", "vol-1"), ("delete", "key-pair", "gpuprov-k"),
                           ("delete", "key-pair", "gpuprov-k2")]


def test_a_stopped_node_whose_data_goes_up_on_down_is_refused_by_name_unless_no_save(store: Store) -> None:
    with locks.hold(locks.node("saver"), "gc --stopped-for"):
        with pytest.raises(destroy.Refused, match="saver is stopped: it cannot save its data before `down`") as refused, \
                destroy.node("saver", store, [].append, anyone=True, no_save=False):
            pytest.fail("the gate opened")
        assert "`gpuprov start saver` first, or `gpuprov down saver --no-save`" in str(refused.value)
        with destroy.node("saver", store, [].append, anyone=True, no_save=True):
            pass


def test_with_team_state_a_teammates_node_goes_only_when_the_caller_chose_everyones(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprov.state import url

    store.update_node("n1", owner="alice@laptop/abc")
    with locks.hold(locks.node("n1"), "down"):  # this machine's lock, chosen before the records look a team's
        monkeypatch.setattr(url, "configured", lambda: object())
        with pytest.raises(destroy.Refused, match="n1 is alice@laptop's node, not yours"), \
                destroy.node("n1", store, [].append, anyone=False, no_save=False):
            pytest.fail("the gate opened")
        with destroy.node("n1", store, [].append, anyone=True, no_save=False):
            pass
        with pytest.raises(destroy.Refused, match="n1 is alice@laptop's node"):  # `down`: before any node goes
            destroy.before_all([store.node("n1")], store, anyone=False, no_save=False, reach=None, settings=None,
                               say=[].append)


# --- through the CLI --------------------------------------------------------------------------------------

NO_WAIT = ("--gpu", "T4", "--max-hourly", "0.6", "--no-bootstrap", "--no-wait")
CKPT = ("name: ckpt\nstack: none\nenv: null\ndata:\n  - from: /work/ckpt\n    to: s3://my-ckpt/run1\n    when: down\n"
        "steps:\n  - name: train\n    run: 'mkdir -p \"$GPUPROV_SYSROOT/work/ckpt\"; "
        "hostname > \"$GPUPROV_SYSROOT/work/ckpt/$(hostname).pt\"'\n")


def _states(aws) -> dict[str, str]:
    """Each node's instance state, by the node's tag."""
    return {next(t["Value"] for t in i["Tags"] if t["Key"] == "gpuprov:node"): i["State"]["Name"]
            for r in aws.ec2().describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] != "terminated"}


def test_gc_stopped_for_leaves_a_stopped_node_whose_data_goes_up_on_down_and_takes_the_others(aws, env, gp_home,
                                                                                             tmp_path):
    from gpuprov.state import open_store

    playbook = tmp_path / "ckpt.yml"
    playbook.write_text(CKPT)
    for name, more in (("saver", ("-p", str(playbook))), ("plain", ()), ("later", ())):
        made = gp(env, *up_args(name, *NO_WAIT, *more))
        assert made.returncode == 0, made.stdout + made.stderr
    assert gp(env, "stop", "saver", "plain", "later").returncode == 0
    store = open_store()  # time passes: all three were stopped 20 days ago
    for name in ("saver", "plain", "later"):
        store.update_node(name, stopped_at=time.time() - 20 * 86400)

    swept = gp(env, "gc", "--stopped-for", "14d", "--yes")
    out = swept.stdout + swept.stderr
    assert swept.returncode == 1, out
    assert "left saver: saver is stopped: it cannot save its data before `down`" in out
    assert "saver: saver is stopped: it cannot save its data before `down` (nothing was taken down)" in swept.stderr
    assert "plain: down (stopped 14d+)" in swept.stdout and "later: down (stopped 14d+)" in swept.stdout
    assert "Traceback" not in out
    assert _states(aws) == {"saver": "stopped"}  # its disk, with the data, is still there

    # the same with the config's stopped_for and a plain `gc --yes`
    made = gp(env, *up_args("plain2", *NO_WAIT))
    assert made.returncode == 0 and gp(env, "stop", "plain2").returncode == 0
    open_store().update_node("plain2", stopped_at=time.time() - 20 * 86400)
    config = tmp_path / "config.toml"
    config.write_text('stopped_for = "14d"\n')
    taken = gp({**env, "GPUPROV_CONFIG": str(config)}, "gc", "--yes", "--json")
    assert taken.returncode == 1, taken.stdout + taken.stderr
    report = json.loads(taken.stdout)
    assert [line.split(":")[0] for line in report["left"]] == ["saver"]
    assert _states(aws) == {"saver": "stopped"}
    assert [n["name"] for n in json.loads(gp(env, "status", "--json").stdout)] == ["saver"]

    lost = gp(env, "down", "saver", "--no-save", "--yes")  # said by the user: the data goes with the disk
    assert lost.returncode == 0, lost.stdout + lost.stderr
    nothing_left(aws)


def test_down_of_a_cluster_saves_every_nodes_data_first(aws, env, aws_hosts, gp_home, tmp_path):
    from tests.test_aws_cluster import BOOT, _two_hosts
    from tests.test_data_s3 import _s3_for, _shim_env

    pool = aws_hosts
    subnet = _two_hosts(aws, pool, gp_home)
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="my-ckpt")
    playbook = tmp_path / "ckpt.yml"
    playbook.write_text(CKPT)
    with _s3_for(pool, aws) as url:
        for i in range(2):
            pool.exec_in(i, f"printf %s '{_shim_env(pool, url)}' >> /var/lib/gpuprov-shim/env", check=True)
        up = gp(env, *up_args("shards", *BOOT, "--nodes", "2", "--subnet", subnet, "-p", str(playbook)), timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        down = gp(env, "down", "shards", "--yes", timeout=300)
        out = down.stdout + down.stderr
        assert down.returncode == 0, out
    assert "shards:0: saving its data first" in out and "shards:1: saving its data first" in out
    for host in pool.hosts:  # each rank's shard went up before its disk went
        key = f"run1/{host.name}.pt"
        assert s3.get_object(Bucket="my-ckpt", Key=key)["Body"].read() == f"{host.name}\n".encode()
    nothing_left(aws)
