"""Where `gpuprov up` spends its time, phase by phase, on a fresh image and on a baked one, against the
local endpoint (moto behind the fault proxy) and SSH test hosts.

    sudo .venv/bin/python bench/up_timeline.py [--runs 3]

Each `up` is a whole CLI process, `gpuprov up NODE --json` (its timeline comes back in the JSON), on a
fresh moto state, landing on a T4 test host (network namespace, GPU and package tools shimmed). Per run:
the reference, `up --no-bootstrap` (launch, SSH, host key pinned, nothing installed); then `up --image
fresh` on a wiped host; `gpuprov image bake` of that node, `down`, and `up` again, which picks the baked
image by its stack hash and lands on the second host, holding the baked disk (`tests/aws/cli.copy_disk`:
the local endpoint keeps no disks). Prints the last fresh and baked timelines as `up` prints them, then
the median seconds per phase and step of each kind, and the processes' wall times. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

SUBNET = "10.231.0"  # the bench's own: the test suite uses 10.220.N, bench/fanout.py 10.230.0
SYSROOT = "/var/lib/gpuprov-shim/root"
REBOOT_DELAY = 1.0  # the test host's simulated reboot (HostPool's default)
UP_ARGS = ["--gpu", "T4", "--connect", "private", "--ssh-user", "root", "--os", "ubuntu-22.04", "--python", "3.11",
           "--ssh-cidr", "198.51.100.7/32", "--yes", "--json"]


@dataclass
class Run:
    """One `up`: its timeline (as `up --json` gives it) and the CLI process's wall time."""

    kind: str
    wall_s: float
    timeline: dict[str, object]
    rows: dict[str, float] = field(default_factory=dict)  # phase or "  step" -> seconds


@dataclass
class Site:
    """The local endpoint and the test host every run lands on (the first instance moto launches in the
    subnet gets the host's address; the endpoint is reset before each run)."""

    aws: object
    pool: object
    work: Path

    def env(self, home: Path) -> dict[str, str]:
        return {**os.environ, **self.aws.env(), "GPUPROV_HOME": str(home),  # type: ignore[attr-defined]
                "HOME": str(home / "user"), "GPUPROV_TEST_POLL_SECONDS": "0.1", "COLUMNS": "100"}

    def fresh_host(self) -> None:
        """The host as a new instance of Canonical's image would be: nothing installed, no markers."""
        self.pool.exec_in(0, "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/*; "  # type: ignore[attr-defined]
                             "echo 'export GPUPROV_SHIM_GPU=T4' > /var/lib/gpuprov-shim/env", check=True)

    def new_home(self, name: str) -> Path:
        """A gpuprov state dir of its own, with the region key the test host trusts (as cloud-init would)."""
        home = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.work))
        (home / "user").mkdir()
        keys = home / "keys" / "us-east-1"
        keys.mkdir(parents=True)
        shutil.copy(self.pool.key_path, keys / "id_ed25519")  # type: ignore[attr-defined]
        shutil.copy(f"{self.pool.key_path}.pub", keys / "id_ed25519.pub")  # type: ignore[attr-defined]
        return home


def gp(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprov", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def reset(site: Site) -> str:
    """A fresh endpoint (no instances, no images); returns the subnet whose first instance lands on host 0."""
    site.aws.reset()  # type: ignore[attr-defined]
    return str(site.aws.subnet_for_hosts(f"{SUBNET}.0/24", "us-east-1a"))  # type: ignore[attr-defined]


def run_up(env: dict[str, str], node: str, kind: str, subnet: str, image: str | None, extra: tuple[str, ...] = ()
           ) -> Run:
    """One whole `gpuprov up NODE --json` process; `image`: its `--image` choice (None: up's own, which takes a
    baked image of the plan's stack when there is one). The node is left up."""
    args = ["up", node, *UP_ARGS, "--subnet", subnet, *extra, *(["--image", image] if image else [])]
    start = time.perf_counter()
    result = gp(env, *args)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{kind}: `gpuprov {' '.join(args)}` failed:\n{result.stderr[-2000:]}")
    timeline = json.loads(result.stdout)["timeline"]
    return Run(kind, wall, timeline, rows(timeline))


def down(env: dict[str, str], node: str) -> None:
    result = gp(env, "down", node, "--yes")
    if result.returncode != 0:
        raise RuntimeError(f"down {node} failed: {result.stderr[-1000:]}")


def reference_run(site: Site) -> Run:
    """`up --no-bootstrap` on a fresh endpoint and a wiped host: the launch and SSH alone."""
    subnet = reset(site)
    site.fresh_host()
    env = site.env(site.new_home("reference"))
    run = run_up(env, "bench", "reference", subnet, "fresh", ("--no-bootstrap",))
    down(env, "bench")
    return run


def fresh_and_baked_runs(site: Site) -> tuple[Run, Run]:
    """`up --image fresh` on a wiped host, bake it, take it down, then `up` from the baked image (chosen by
    `up` itself) on the second host, which holds the baked disk."""
    subnet = reset(site)
    site.fresh_host()
    env = site.env(site.new_home("fresh"))
    fresh = run_up(env, "bench", "fresh", subnet, "fresh")
    baked_name = "bench-t4"
    bake = gp(env, "image", "bake", "bench", "--name", baked_name, "--yes")
    if bake.returncode != 0:
        raise RuntimeError(f"image bake failed: {bake.stderr[-2000:]}")
    down(env, "bench")
    from tests.aws.cli import copy_disk

    copy_disk(site.pool, 0, 1)  # what an instance launched from the image finds on its disk
    baked = run_up(env, "bench2", "baked", subnet, None)
    if not baked.timeline.get("image", "").startswith("baked "):  # type: ignore[union-attr]
        raise RuntimeError(f"the second up did not take the baked image: {baked.timeline.get('image')}")
    down(env, "bench2")
    removed = gp(env, "image", "rm", baked_name, "--yes")
    if removed.returncode != 0:
        raise RuntimeError(f"image rm failed: {removed.stderr[-1000:]}")
    return fresh, baked


def rows(timeline: dict[str, object]) -> dict[str, float]:
    """Seconds per phase, and per step under bootstrap (indented), in the timeline's order."""
    out: dict[str, float] = {}
    for phase in timeline["phases"]:  # type: ignore[attr-defined]
        out[phase["name"]] = phase["end_s"] - phase["start_s"]
        if phase["name"] == "bootstrap":
            for step in phase["steps"]:
                out[f"  {step['name']}"] = step["end_s"] - step["start_s"]
    out["total (timeline)"] = float(timeline["total_s"])  # type: ignore[arg-type]
    return out


def median_runs(runs: list[Run]) -> dict[str, float]:
    keys = list(runs[-1].rows)
    return {k: statistics.median(r.rows.get(k, 0.0) for r in runs) for k in keys}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind; medians are printed")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/up_timeline.py starts an SSH test host in a network namespace and needs root; run it as root.")
        return 0
    from tests.aws.fixture import AwsEndpoint
    from tests.hosts.fixture import HostPool

    work = Path(tempfile.mkdtemp(prefix="gpuprov-up-timeline-"))
    pool = HostPool(2, work / "hosts", shims_dir=ROOT / "tests" / "shims", offset=3, prefix="gpc", bridge="gpcbr0",
                    subnet=SUBNET, host_env={"GPUPROV_SYSROOT": SYSROOT}, reboot_delay=REBOOT_DELAY)
    try:
        pool.start()
        if pool.mode != "netns":
            print(f"the test hosts need network namespaces (mode {pool.mode}: {pool.fallback_reason})")
            return 0
        with AwsEndpoint() as aws:
            site = Site(aws, pool, work)
            print(f"local endpoint (moto {aws_version()} behind the fault proxy, realistic: fresh ids NotFound "
                  f"twice), T4 test hosts (netns, shims, simulated reboot {REBOOT_DELAY:g}s); {os.cpu_count()} "
                  f"CPUs; whole CLI processes; median of {args.runs}\n", flush=True)
            runs: dict[str, list[Run]] = {"reference": [], "fresh": [], "baked": []}
            for _ in range(args.runs):
                runs["reference"].append(reference_run(site))
                fresh, baked = fresh_and_baked_runs(site)
                runs["fresh"].append(fresh)
                runs["baked"].append(baked)
            report(runs)
    finally:
        pool.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def aws_version() -> str:
    from importlib.metadata import version

    return version("moto")


def report(runs: dict[str, list[Run]]) -> None:
    from rich.console import Console

    from gpuprov.cli.report import timeline_table
    from gpuprov.cloud.timeline import Timeline

    console = Console(width=100, no_color=True)
    for kind in ("fresh", "baked"):
        print(f"the last {kind} run's timeline, as `up` prints it:")
        console.print(timeline_table(Timeline.model_validate(runs[kind][-1].timeline)))
    medians = {kind: median_runs(rs) for kind, rs in runs.items()}
    walls = {kind: statistics.median(r.wall_s for r in rs) for kind, rs in runs.items()}
    print("median seconds per phase and step (reference: up --no-bootstrap, same endpoint and hosts)")
    print(f"{'phase':<28}" + "".join(f"{k:>12}" for k in medians))
    for name in medians["fresh"]:  # the reference's phases are a subset of a fresh run's; a baked run's the same
        print(f"{name:<28}" + "".join(f"{m[name]:>11.2f}s" if name in m else f"{'-':>12}" for m in medians.values()))
    print(f"{'CLI process wall':<28}" + "".join(f"{w:>11.2f}s" for w in walls.values()))
    skipped = [s["name"] for p in runs["baked"][-1].timeline["phases"] for s in p["steps"]  # type: ignore[attr-defined]
               if s["outcome"] == "skipped"]
    print(f"\nthe baked run's steps skipped by their markers: {', '.join(skipped) or 'none'}")


if __name__ == "__main__":
    raise SystemExit(main())
