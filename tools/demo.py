"""`make demo`: a user's whole day against an embedded local AWS endpoint and a local SSH host.

Offline first (gpus, plan, an impossible stack refused). Then, as root: a moto server stands in
for EC2 and real OpenSSH servers (in network namespaces, with shimmed GPU tools) stand at the
addresses moto gives the instances, so `up --spot`, `status`, `check`, `image bake`, `down`, a
second `up` from the baked image (every install step unchanged) and `image rm` run for real.
With AWS credentials and no AWS_ENDPOINT_URL, the same commands talk to real AWS.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def show(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    print(f"\n\033[1m$ gpuprov {' '.join(args)}\033[0m", flush=True)
    result = subprocess.run([sys.executable, "-m", "gpuprov", *args], env=env, text=True, capture_output=True)
    print(result.stdout, end="")
    print(result.stderr, end="", file=sys.stderr)
    if ok and result.returncode != 0:
        sys.exit(f"demo: `gpuprov {args[0]}` failed with exit code {result.returncode}")
    if not ok:
        print(f"(exit code {result.returncode}: refused before anything was created)")
    return result


def offline(env: dict[str, str]) -> None:
    show(env, "gpus")
    show(env, "plan", "--gpu", "A100", "--spot")
    show(env, "plan", "--gpu", "V100", "--torch-cuda", "cu130", ok=False)
    show(env, "plan", "--gpu", "H100:8", "--nodes", "2")  # placement group, EFA interfaces, Elastic IPs


def lifecycle(env: dict[str, str], work: Path) -> None:
    from tests.aws.cli import copy_disk
    from tests.aws.fixture import AwsEndpoint
    from tests.hosts.fixture import HostPool

    print("\n\033[1mstarting a local AWS endpoint (moto) and two SSH hosts with a Tesla T4 (shimmed tools)…\033[0m")
    with AwsEndpoint(workdir=work / "aws") as aws, HostPool(
        2, work / "hosts", shims_dir=ROOT / "tests" / "shims", offset=3, prefix="gpd", bridge="gpdbr0",
        subnet="10.240.0", host_env={"GPUPROV_SYSROOT": "/var/lib/gpuprov-shim/root"},
    ) as pool:
        if pool.mode != "netns":
            print("network namespaces are not available: skipping the launched-node part")
            return
        aws.reset()
        for i in (0, 1):
            pool.exec_in(i, "echo 'export GPUPROV_SHIM_GPU=T4' > /var/lib/gpuprov-shim/env", check=True)
        env = {**env, **aws.env()}
        keys = Path(env["GPUPROV_HOME"]) / "keys" / "us-east-1"
        keys.mkdir(parents=True)  # the local host trusts this key, as cloud-init would on EC2
        shutil.copy(pool.key_path, keys / "id_ed25519")
        shutil.copy(f"{pool.key_path}.pub", keys / "id_ed25519.pub")
        subnet = aws.subnet_for_hosts("10.240.0.0/24", "us-east-1a")
        where = ("--gpu", "T4", "--spot", "--subnet", subnet, "--connect", "private", "--ssh-user", "root",
                 "--ssh-cidr", "10.240.0.1/32", "--os", "ubuntu-22.04", "--python", "3.11", "--yes")
        show(env, "up", "demo", *where, "--autostop", "30m", "--ttl", "8h")
        show(env, "status")
        show(env, "check", "demo")
        show(env, "image", "bake", "demo", "--name", "demo-t4", "--yes")
        show(env, "down", "demo", "--yes")
        # the local endpoint keeps no disks: the image's disk is copied onto the host at the next address
        print("\n(the local endpoint keeps no disks: the baked disk is copied onto the second SSH host, "
              "which stands at the next instance's address)")
        copy_disk(pool, 0, 1)
        show(env, "up", "again", *where)  # picks the baked image: every install step is unchanged
        show(env, "down", "again", "--yes")
        show(env, "image", "rm", "demo-t4", "--yes")
        left = {k: v for k, v in aws.leftovers().items() if v}
        print(f"\nresources tagged gpuprov:node left in the endpoint: {json.dumps(left) if left else 'none'}")
        aws_cluster(env, aws, pool)


def aws_cluster(env: dict[str, str], aws: object, pool: object) -> None:
    """Two nodes as one cluster: one launch in one zone, a placement group, both hosts bootstrapped and wired
    (cluster.env, hostfile), then `exec` with each node's env and a passing `check --cluster`."""
    aws.reset()  # type: ignore[attr-defined]  # a fresh endpoint: its subnet hands out the two hosts' addresses
    for i in range(2):
        pool.exec_in(i, "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/*; "  # type: ignore[attr-defined]
                        "echo 'export GPUPROV_SHIM_GPU=T4' > /var/lib/gpuprov-shim/env", check=True)
    subnet = aws.subnet_for_hosts("10.240.0.0/24", "us-east-1a")  # type: ignore[attr-defined]
    show(env, "up", "train", "--gpu", "T4", "--nodes", "2", "--subnet", subnet, "--connect", "private",
         "--ssh-user", "root", "--ssh-cidr", "10.240.0.1/32", "--os", "ubuntu-22.04", "--python", "3.11", "--yes")
    show(env, "status")
    show(env, "exec", "train", "--", "echo node $NODE_RANK of $NNODES, MASTER_ADDR=$MASTER_ADDR; "
         "cat /var/lib/gpuprov-shim/root/etc/gpuprov/hostfile")
    show(env, "check", "train", "--cluster", "--sizes", "64K,1M")
    show(env, "down", "train", "--yes")
    left = {k: v for k, v in aws.leftovers().items() if v}  # type: ignore[attr-defined]
    print(f"\nresources tagged gpuprov:node left in the endpoint: {json.dumps(left) if left else 'none'}")
    if left:
        sys.exit("demo: `down train` left resources behind")


def host_cluster(env: dict[str, str], work: Path) -> None:
    """Two existing hosts (SSH servers with 2 shimmed H100s each) wired as one cluster and checked."""
    from tests.hosts.fixture import HostPool

    print("\n\033[1mtwo SSH hosts with 2 H100s each (shimmed tools) as one cluster…\033[0m")
    with HostPool(2, work / "cluster-hosts", shims_dir=ROOT / "tests" / "shims", offset=3, prefix="gpdc",
                  bridge="gpdcbr0", subnet="10.241.0", host_env={"GPUPROV_SYSROOT": "/var/lib/gpuprov-shim/root"},
                  ) as pool:
        if pool.mode != "netns":
            print("network namespaces are not available: skipping the cluster part")
            return
        for i in range(2):
            pool.exec_in(i, "printf 'export GPUPROV_SHIM_GPU=H100\\nexport GPUPROV_SHIM_GPU_COUNT=2\\n' "
                            "> /var/lib/gpuprov-shim/env", check=True)
        hosts = [f"root@{h.address}" for h in pool.hosts]
        show(env, "bootstrap", "--cluster", "pair", *hosts, "-i", str(pool.key_path), "--accept-new-host-key",
             "--os", "ubuntu-22.04", "--python", "3.11")
        show(env, "exec", "pair", "--", "cat /var/lib/gpuprov-shim/root/etc/gpuprov/cluster.env | grep RANK")
        show(env, "check", "pair", "--cluster", "--sizes", "64K,1M")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="gpuprov-demo-"))
    env = {**os.environ, "GPUPROV_HOME": str(work / "home"), "HOME": str(work / "user"), "GPUPROV_POLL_SECONDS": "0.2",
           "COLUMNS": os.environ.get("COLUMNS", "120")}
    (work / "user").mkdir()
    try:
        offline(env)
        if os.geteuid() == 0:
            lifecycle(env, work)
            host_cluster(env, work)
        else:
            print("\n(the launched-node part needs root for its local SSH host: run `sudo make demo`)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
