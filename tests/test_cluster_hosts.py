"""Several real sshd test hosts as one cluster: `bootstrap --cluster`, `ssh NAME:K`, `exec NAME`,
`torchrun NAME` and `check NAME --cluster`, through the real CLI.

The hosts live in network namespaces on one bridge, so they reach each other by address like the
nodes of a real cluster; one host's firewall (iptables inside its namespace) can drop a port.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import forkcli, testnet
from tests.conftest import SHIMS, skip_or_fail

pytestmark = pytest.mark.heavy  # its own SSH test hosts

NODES = 3
SYSROOT = "/var/lib/gpuprov-shim/root"


@pytest.fixture(scope="module")
def cluster_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """3 hosts with 2 fake GPUs each, on their own bridge (so a firewall rule here touches no other test)."""
    if os.environ.get("GPUPROV_TEST_MUTATE"):
        pytest.skip("mutation runs use no SSH test hosts")
    if os.geteuid() != 0:
        skip_or_fail("the SSH test hosts need root (network namespaces, sshd on port 22)")
    from tests.hosts.fixture import HostPool

    pool = HostPool(NODES, tmp_path_factory.mktemp("cluster-hosts"), shims_dir=SHIMS, prefix=testnet.prefix("gpw"),
                    bridge=testnet.bridge("gpwbr0"), subnet=testnet.subnet("10.231.0"),
                    host_env={"GPUPROV_SYSROOT": SYSROOT})
    pool.start()
    if pool.mode != "netns":
        pool.stop()
        skip_or_fail("cluster tests need network namespaces (hosts that reach each other by address)")
    for i in range(NODES):
        pool.exec_in(i, "printf 'export GPUPROV_SHIM_GPU=H100\\nexport GPUPROV_SHIM_GPU_COUNT=2\\n' "
                        "> /var/lib/gpuprov-shim/env", check=True)
    try:
        yield pool
    finally:
        pool.stop()


def gpuprov(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def cluster(cluster_pool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The hosts bootstrapped (pytorch playbook: the env with the fake torch and its torchrun) and wired as `train`."""
    home = tmp_path_factory.mktemp("gp-home")
    saved = {k: os.environ.get(k) for k in ("GPUPROV_HOME", "HOME")}
    os.environ["GPUPROV_HOME"] = str(home / "gpuprov")
    os.environ["HOME"] = str(home)
    pool = cluster_pool
    addrs = [f"root@{h.address}" for h in pool.hosts]
    result = gpuprov("bootstrap", "--cluster", "train", *addrs, "-i", str(pool.key_path), "--accept-new-host-key",
                     "--os", "ubuntu-22.04", "--python", "3.11", "--connect-timeout", "3", "--reboot-timeout", "30",
                     "--json")
    try:
        out = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"bootstrap --cluster printed no JSON (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    assert result.returncode == 0, (out["wiring"], [h["error"] for h in out["hosts"]], result.stderr)
    try:
        yield out
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def read(pool, i: int, path: str) -> str:
    return pool.exec_in(i, f"cat {SYSROOT}{path}", check=True).stdout


def test_each_node_gets_its_cluster_env_and_the_same_hostfile(cluster_pool, cluster):
    pool = cluster_pool
    master = pool.hosts[0].address
    for i in range(NODES):
        env = dict(line.split("=", 1) for line in read(pool, i, "/etc/gpuprov/cluster.env").splitlines()
                   if line and not line.startswith("#"))
        assert env == {"GPUPROV_CLUSTER": "train", "MASTER_ADDR": master, "MASTER_PORT": "29500", "NNODES": "3",
                       "NODE_RANK": str(i), "NPROC_PER_NODE": "2"}
        assert read(pool, i, "/etc/gpuprov/hostfile").splitlines() == [f"{h.address} slots=2" for h in pool.hosts]
    assert [m["address"] for m in cluster["cluster"]["members"]] == [h.address for h in pool.hosts]


def test_exec_runs_on_every_node_with_its_own_env(cluster_pool, cluster):
    result = gpuprov("exec", "train", "--", "echo rank=$NODE_RANK of $NNODES via $MASTER_ADDR:$MASTER_PORT on $(hostname)")
    assert result.returncode == 0, result.stderr
    master = cluster_pool.hosts[0].address
    lines = sorted(result.stdout.splitlines())
    assert lines == [f"train:{k} | rank={k} of 3 via {master}:29500 on {h.name}"
                     for k, h in enumerate(cluster_pool.hosts)]
    one = gpuprov("exec", "train:1", "--", "echo $NODE_RANK; exit 3")
    assert (one.returncode, one.stdout) == (3, "train:1 | 1\n")


def test_ssh_names_node_0_by_the_cluster_and_node_k_by_name_colon_k(cluster_pool, cluster):
    if not __import__("shutil").which("ssh"):
        skip_or_fail("no ssh client")
    for word, index in (("train", 0), ("train:2", 2)):
        result = gpuprov("ssh", word, "--", "hostname")
        assert (result.returncode, result.stdout.strip()) == (0, cluster_pool.hosts[index].name), result.stderr
    bad = gpuprov("ssh", "train:3", "--", "hostname")
    assert bad.returncode == 2 and "nodes 0..2" in bad.stderr


TRAIN = """
import os, socket, sys
import torch
import torch.distributed as dist
rank = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
t = torch.full((1, 1000), float(rank + 1), device=f"cuda:{os.environ['LOCAL_RANK']}")
dist.all_reduce(t)
print(f"rank {rank}/{dist.get_world_size()} on {socket.gethostname()} args={sys.argv[1:]} sum={t.max().item():g}")
dist.destroy_process_group()
"""


def put_script(pool, path: str, text: str) -> None:
    for i in range(NODES):
        pool.exec_in(i, f"cat > {path} <<'EOF'\n{text}\nEOF", check=True)


def torchrun_calls(pool, i: int) -> list[str]:
    log = pool.exec_in(i, "cat /var/lib/gpuprov-shim/calls.log").stdout
    return [line for line in log.splitlines() if line.startswith("torchrun ")]


def test_torchrun_wires_every_node_and_the_all_reduce_sums_across_hosts(cluster_pool, cluster):
    pool = cluster_pool
    put_script(pool, "/tmp/gp-train.py", TRAIN)
    before = [len(torchrun_calls(pool, i)) for i in range(NODES)]
    result = gpuprov("torchrun", "train", "--", "/tmp/gp-train.py", "--lr", "0.1 0.2")
    assert result.returncode == 0, result.stdout + result.stderr
    master = pool.hosts[0].address
    for i in range(NODES):
        calls = torchrun_calls(pool, i)[before[i]:]
        assert calls == [f"torchrun --nnodes 3 --nproc-per-node 2 --node-rank {i} --master-addr {master} "
                         f"--master-port 29500 /tmp/gp-train.py --lr '0.1 0.2'"]
    # 6 ranks hold 1..6: the sum 21 needs every rank's bytes from all three hosts
    ranks = sorted(line for line in result.stdout.splitlines() if " | rank " in line)
    assert ranks == [f"train:{r // 2} | rank {r}/6 on {pool.hosts[r // 2].name} args=['--lr', '0.1 0.2'] sum=21"
                     for r in range(6)]



def test_the_fake_all_reduce_needs_the_bytes_to_cross_a_dropped_ephemeral_range_fails_it(cluster_pool, cluster):
    """The fake torch's all-reduce is no canned answer: with node 2 dropping its ephemeral ports (where the ring's
    listeners are, as NCCL's), the same script fails instead of printing a sum."""
    pool = cluster_pool
    if subprocess.run(["which", "iptables"], capture_output=True).returncode != 0:
        skip_or_fail("no iptables")
    put_script(pool, "/tmp/gp-train5.py", TRAIN.replace('init_process_group("nccl")',
                                                         'init_process_group("nccl", timeout=__import__("datetime")'
                                                         '.timedelta(seconds=5))'))
    lo, hi = pool.exec_in(2, "cat /proc/sys/net/ipv4/ip_local_port_range", check=True).stdout.split()
    rule = f"INPUT -p tcp --dport {lo}:{hi} -i eth0 -j DROP"
    pool.exec_in(2, f"iptables -I {rule}", check=True)
    try:
        result = gpuprov("torchrun", "train", "--grace", "3", "--", "/tmp/gp-train5.py")
    finally:
        pool.exec_in(2, f"iptables -D {rule}", check=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "sum=" not in result.stdout
    assert "torch.distributed.DistBackendError" in result.stdout, result.stdout  # as a real process group fails

SLEEPER = """
import os, time
os.makedirs("/tmp/gp-sleep", exist_ok=True)
with open(f"/tmp/gp-sleep/{os.environ['RANK']}", "w") as f:
    f.write(f"{os.getpid()} {os.getppid()}\\n")
print("sleeping", flush=True)
time.sleep(600)
"""


def test_ctrl_c_stops_torchrun_and_its_workers_on_every_node(cluster_pool, cluster):
    import signal
    import time

    pool = cluster_pool
    put_script(pool, "/tmp/gp-sleep.py", SLEEPER)
    for i in range(NODES):
        pool.exec_in(i, "rm -rf /tmp/gp-sleep")
    proc = forkcli.Popen([sys.executable, "-m", "gpuprov", "torchrun", "train", "--grace", "5", "--",
                             "/tmp/gp-sleep.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 * 6 and time.monotonic() < deadline:  # each worker: its pid and torchrun's
            pids = [int(p) for i in range(NODES)
                    for p in pool.exec_in(i, "cat /tmp/gp-sleep/* 2>/dev/null").stdout.split()]
            time.sleep(0.2)
        assert len(pids) == 12, (pids, proc.poll())
        assert all(Path(f"/proc/{p}").exists() for p in pids)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "0/3 nodes ok" in err
    # the test hosts share the machine's PID namespace, so the pids are this machine's processes; on a loaded
    # machine a node may be past --grace and hung up, so its processes end a moment after gpuprov exits
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {p: Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ") for p in pids if Path(f"/proc/{p}").exists()}
    assert left == {}, out + err


def check_cluster(*extra: str) -> tuple[int, dict]:
    result = gpuprov("check", "train", "--cluster", "--json", "--port-timeout", "2", *extra)
    try:
        return result.returncode, json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"check --cluster printed no JSON (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")


def test_check_cluster_exchanges_data_between_every_pair_and_all_reduces_through_the_hosts(cluster_pool, cluster):
    pool = cluster_pool
    before = [len(torchrun_calls(pool, i)) for i in range(NODES)]
    code, out = check_cluster("--sizes", "64K,256K")
    assert code == 0, out
    # the probe ran from a path each node made for itself (mktemp: nobody on the node could plant a link
    # there first), and was removed afterwards; not /tmp/gpuprov-allreduce-<ms>.py, the same on every node
    probes = [torchrun_calls(pool, i)[before[i]:][-1].split()[-1] for i in range(NODES)]
    assert len(set(probes)) == NODES, probes
    for i, probe in enumerate(probes):
        assert re.fullmatch(r"/tmp/gpuprov-allreduce\.[A-Za-z0-9]{10}/probe\.py", probe), probe
        assert pool.exec_in(i, f"test -e {os.path.dirname(probe)}").returncode != 0, probe
    net = out["connectivity"]
    # every node connected to every other node's MASTER_PORT and 4 sampled ephemeral ports, and got its bytes back
    pairs = {(r["src"], r["dst"]) for r in net["results"] if r["outcome"] == "ok"}
    assert pairs == {(a, b) for a in range(NODES) for b in range(NODES) if a != b}
    for rank, listener in enumerate(net["listeners"]):
        assert 29500 in listener["ports"] and len(listener["ports"]) == 5
        lo, hi = listener["range"]
        assert all(lo <= p <= hi for p in listener["ports"] if p != 29500)
        assert {r["port"] for r in net["results"] if r["dst"] == rank} == set(listener["ports"])
    report = out["allreduce"]["report"]
    assert (report["world"], report["nnodes"], report["nproc_per_node"], report["correct"]) == (6, 3, 2, True)
    assert [r["bytes"] for r in report["results"]] == [65536, 262144]
    assert all(r["busbw_gbs"] > 0 and r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * 2 * 5 / 6)
               for r in report["results"])
    assert any("Using network Socket" in line for line in report["nccl_lines"])
    # judged against the NIC's line rate (veth says 10000 Mb/s); the floor is unverified, so at worst a warning
    bw = next(c for c in out["allreduce"]["checks"] if c["name"] == "bus bandwidth")
    assert bw["severity"] == "warn" and "the TCP line rate is 1.25 GB/s per node" in bw["detail"]
    assert out["allreduce"]["expectation"]["interface"] == "eth0"


def test_a_firewall_that_drops_the_rendezvous_port_on_one_node_is_named(cluster_pool, cluster):
    pool = cluster_pool
    if subprocess.run(["which", "iptables"], capture_output=True).returncode != 0:
        skip_or_fail("no iptables")
    rule = "INPUT -p tcp --dport 29500 -i eth0 -j DROP"
    add = pool.exec_in(2, f"iptables -I {rule}")
    if add.returncode != 0:
        skip_or_fail(f"iptables inside the test host's namespace failed: {add.stderr.strip()}")
    try:
        code, out = check_cluster("--no-allreduce")
        human = gpuprov("check", "train", "--cluster", "--no-allreduce", "--port-timeout", "2")
    finally:
        pool.exec_in(2, f"iptables -D {rule}", check=True)
    assert code == 1
    failed = [c for c in out["connectivity"]["checks"] if not c["ok"]]
    assert [c["name"] for c in failed] == ["train:2 TCP 29500"]
    address = pool.hosts[2].address
    assert f"train:2 ({address}) TCP 29500 (MASTER_PORT" in failed[0]["detail"]
    assert "from train:0, train:1: no answer within the timeout" in failed[0]["detail"]
    assert "security group" in failed[0]["fix"] and "iptables" in failed[0]["fix"]
    # the other ports of node 2, and every port of the other nodes, still exchanged data
    blocked = [r for r in out["connectivity"]["results"] if r["outcome"] != "ok"]
    assert {(r["dst"], r["port"], r["outcome"]) for r in blocked} == {(2, 29500, "timeout")}
    assert human.returncode == 1 and "train:2 TCP 29500" in human.stdout


def test_master_addr_given_by_hand_reaches_every_nodes_env_and_the_record(cluster_pool, cluster):
    """--master-addr overrides the derived address (runs last: it rewires the hosts, then puts `train` back)."""
    pool = cluster_pool
    extra = pool.hosts[0].address.rsplit(".", 1)[0] + ".200"  # e.g. node 0's address on another network
    hosts = [f"root@{h.address}" for h in pool.hosts]
    try:
        result = gpuprov("bootstrap", "--cluster", "alt", *hosts, "-i", str(pool.key_path), "--os", "ubuntu-22.04",
                         "--python", "3.11", "--master-addr", extra, "--master-port", "29611", "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["cluster"]["master_addr"] == extra
        for i in range(NODES):
            env = read(pool, i, "/etc/gpuprov/cluster.env")
            assert f"MASTER_ADDR={extra}\nMASTER_PORT=29611\n" in env and f"NODE_RANK={i}\n" in env
        # node 0 is known by that address everywhere; the others by the address they send from toward it
        assert read(pool, 1, "/etc/gpuprov/hostfile").splitlines() == [
            f"{extra} slots=2", *(f"{h.address} slots=2" for h in pool.hosts[1:])]
        shown = gpuprov("exec", "alt:1", "--", "echo $MASTER_ADDR:$MASTER_PORT")
        assert shown.stdout == f"alt:1 | {extra}:29611\n"
    finally:
        again = gpuprov("bootstrap", "--cluster", "train", *hosts, "-i", str(pool.key_path), "--os", "ubuntu-22.04",
                        "--python", "3.11", "--json")
        assert again.returncode == 0, again.stderr


def test_status_lists_clusters_of_hosts_and_cluster_rm_forgets_one(cluster_pool, cluster):
    """Runs after the --master-addr test, which leaves `alt` recorded beside `train`."""
    listed = json.loads(gpuprov("cluster", "list", "--json").stdout)
    assert [(c["name"], len(c["members"]), c["node"]) for c in listed] == [("train", 3, None), ("alt", 3, None)]
    shown = forkcli.run([sys.executable, "-m", "gpuprov", "status"], capture_output=True, text=True,
                        env={**os.environ, "COLUMNS": "80"}, timeout=60)
    assert shown.returncode == 0, shown.stderr
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in shown.stdout.splitlines() if "│" in line]
    rows = {c[0]: c[1:4] for c in cells}
    master = cluster_pool.hosts[0].address
    assert rows["train"] == ["3", f"{master}:29500", "2"] and "gpuprov cluster rm NAME" in shown.stdout
    assert all(len(line) <= 80 for line in shown.stdout.splitlines())
    forgot = gpuprov("cluster", "rm", "alt")
    assert forgot.returncode == 0 and "alt: forgotten" in forgot.stdout, forgot.stderr
    assert [c["name"] for c in json.loads(gpuprov("cluster", "list", "--json").stdout)] == ["train"]
    again = gpuprov("cluster", "rm", "alt")
    assert again.returncode == 2 and "no cluster called 'alt'" in again.stderr and "clusters: train" in again.stderr
    assert read(cluster_pool, 1, "/etc/gpuprov/cluster.env")  # the hosts keep their files
