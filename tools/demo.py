"""`make demo`: a user's whole day against an embedded local AWS endpoint and a local SSH host.

Offline first (gpus, plan, an impossible stack refused). Then, as root, the sandbox (`make sandbox`,
tools/sandbox.py): a moto server stands in for EC2 and real OpenSSH servers (in network namespaces,
with shimmed GPU tools) stand at the addresses moto gives the instances, so `up --spot`, `status`,
`check`, `image bake`, `down`, a second `up` from the baked image (every install step unchanged),
`image rm`, a two-node cluster, a cluster of machines you already have, and one Alibaba Cloud `up`, `status` and
`down` on the ECS imitation run for real, with the commands a user types (the sandbox's config file says where
nodes go and how they are reached).
With AWS credentials and no AWS_ENDPOINT_URL, the same commands talk to real AWS.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# one launched-node part at a time on a machine: its namespaces, bridges and subnets have fixed names
LOCK = Path(tempfile.gettempdir()) / "gpuprov-demo.lock"


@contextlib.contextmanager
def only_one(lock: Path = LOCK) -> Iterator[None]:
    """Hold the machine's demo lock, or end with one line naming the demo that holds it."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            sys.exit(f"demo: another `make demo` runs on this machine (pid {holder}); run it again once that one ends")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


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
    """The sandbox (`make sandbox`, tools/sandbox.py): its config file says where nodes go and how they are
    reached, so the commands are the ones a user types."""
    from sandbox import Sandbox
    from tests.aws.cli import copy_disk

    print("\n\033[1mthe sandbox: a local AWS endpoint (moto) and SSH hosts with shimmed GPUs (`make sandbox`)…\033[0m")
    with Sandbox(work / "sandbox", nodes=4, aws_subnet="10.240.0", hosts_subnet="10.241.0", prefix="gpd",
                 alibaba_nodes=1, alibaba_subnet="10.242.0") as sb:
        env = {**env, **sb.env}
        show(env, "config")
        show(env, "up", "demo", "--gpu", "T4", "--spot", "--autostop", "30m", "--ttl", "8h", "--yes")
        show(env, "status")
        show(env, "check", "demo")
        show(env, "image", "bake", "demo", "--name", "demo-t4", "--yes")
        show(env, "down", "demo", "--yes")
        # the local endpoint keeps no disks: the image's disk is copied onto the host at the next address
        print("\n(the local endpoint keeps no disks: the baked disk is copied onto the second SSH host, "
              "which stands at the next instance's address)")
        copy_disk(sb.pool, 0, 1)
        sb.stand_for_instances(1)  # the copied disk carried host 0's shim settings
        show(env, "up", "again", "--gpu", "T4", "--spot", "--yes")  # picks the baked image: every install step unchanged
        show(env, "down", "again", "--yes")
        show(env, "image", "rm", "demo-t4", "--yes")
        left = {k: v for k, v in sb.aws.leftovers().items() if v}
        print(f"\nresources tagged gpuprov:node left in the endpoint: {json.dumps(left) if left else 'none'}")
        aws_cluster(env, sb)
        host_cluster(env, sb)
        alibaba(env, sb)


def aws_cluster(env: dict[str, str], sb: object) -> None:
    """Two nodes as one cluster: one launch in one zone, a placement group, both hosts bootstrapped and wired
    (cluster.env, hostfile), then `exec` with each node's env and a passing `check --cluster`."""
    show(env, "up", "train", "--gpu", "T4", "--nodes", "2", "--yes")
    show(env, "status")
    show(env, "exec", "train", "--", "echo node $NODE_RANK of $NNODES, MASTER_ADDR=$MASTER_ADDR; "
         "cat /var/lib/gpuprov-shim/root/etc/gpuprov/hostfile")
    show(env, "check", "train", "--cluster", "--sizes", "64K,1M")
    show(env, "down", "train", "--yes")
    left = {k: v for k, v in sb.aws.leftovers().items() if v}  # type: ignore[attr-defined]
    print(f"\nresources tagged gpuprov:node left in the endpoint: {json.dumps(left) if left else 'none'}")
    if left:
        sys.exit("demo: `down train` left resources behind")


def host_cluster(env: dict[str, str], sb: object) -> None:
    """Two machines you already have (2 shimmed A100-80GB each; the sandbox's key and their pinned host keys)
    wired as one cluster and checked."""
    print("\n\033[1mtwo machines you already have, with 2 A100-80GB each (shimmed tools), as one cluster…\033[0m")
    hosts = [f"ubuntu@{h.address}" for h in sb.hosts.hosts[:2]]  # type: ignore[attr-defined]
    show(env, "bootstrap", "--cluster", "pair", *hosts)
    show(env, "exec", "pair", "--", "cat /var/lib/gpuprov-shim/root/etc/gpuprov/cluster.env | grep RANK")
    show(env, "check", "pair", "--cluster", "--sizes", "64K,1M")


def alibaba(env: dict[str, str], sb: object) -> None:
    """A spot node on Alibaba Cloud: the ECS imitation (tests/alibaba/server.py) launches it at the sandbox's host for
    it, its spot watch reads ECS's notice, and `down` leaves nothing in the imitation."""
    print("\n\033[1mAlibaba Cloud: the ECS imitation, its instance at a local SSH host with a shimmed T4…\033[0m")
    show(env, "up", "ali", "--cloud", "alibaba", "--gpu", "T4", "--spot", "--autostop", "30m",
         "--on-interrupt", "echo saving", "--yes")
    show(env, "status")
    show(env, "down", "ali", "--yes")
    ecs = sb.ecs  # type: ignore[attr-defined]
    left = [*ecs.instances, *ecs.groups, *ecs.keys]
    print(f"\nresources left in the ECS imitation: {', '.join(left) if left else 'none'}")
    if left:
        sys.exit("demo: `down ali` left resources behind")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="gpuprov-demo-"))
    env = {**os.environ, "GPUPROV_HOME": str(work / "home"), "HOME": str(work / "user"), "GPUPROV_TEST_POLL_SECONDS": "0.2",
           "COLUMNS": os.environ.get("COLUMNS", "120")}
    (work / "user").mkdir()
    try:
        offline(env)
        if os.geteuid() == 0:
            with only_one():
                lifecycle(env, work)
        else:
            print("\n(the launched-node part needs root for its local SSH host: run `sudo make demo`)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
