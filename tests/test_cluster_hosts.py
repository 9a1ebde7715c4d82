"""Several real sshd test hosts as one cluster: `bootstrap --cluster`, `ssh NAME:K`, `exec NAME`,
`torchrun NAME` and `check NAME --cluster`, through the real CLI.

The hosts live in network namespaces on one bridge, so they reach each other by address like the
nodes of a real cluster; one host's firewall (iptables inside its namespace) can drop a port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import testnet
from tests.conftest import SHIMS, skip_or_fail

NODES = 3
SYSROOT = "/var/lib/gpuprov-shim/root"


@pytest.fixture(scope="module")
def cluster_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """3 hosts with 2 fake GPUs each, on their own bridge (so a firewall rule here touches no other test)."""
    if os.environ.get("GPUPROV_MUTATE"):
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
    return subprocess.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True,
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
