"""Where `gpuprov up` spends its time, phase by phase, on a fresh image (and, once `gpuprov image bake`
exists, on a baked one), against the local endpoint (moto behind the fault proxy) and an SSH test host.

    sudo .venv/bin/python bench/up_timeline.py [--runs 3]

Each run is a whole CLI process, `gpuprov up NODE --json` (its timeline comes back in the JSON), on a
fresh moto state, landing on one T4 test host (network namespace, GPU and package tools shimmed), then
`down`. Beside it, in the same process tree and on the same host, the reference: `up --no-bootstrap`
(launch, SSH, host key pinned, nothing installed). Prints the last fresh run's timeline as `up` prints
it, then the median seconds per phase and step of each kind of run, and the processes' wall times.
Asserts nothing.

The baked run plugs in at `baked_run`: it takes the same `Site` and returns a `Run` (or None when this
checkout has no `gpuprov image bake`: the figure is printed as pending).
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
                "HOME": str(home / "user"), "GPUPROV_POLL_SECONDS": "0.1", "COLUMNS": "100"}

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


def run_up(site: Site, kind: str, extra: list[str], image: str | None = None, fresh: bool = True) -> Run:
    """One whole `gpuprov up` process on a reset endpoint; `image`: the `--image` choice (None: the default).
    `fresh`: wipe the host first (a baked image's run keeps what its instance booted with)."""
    site.aws.reset()  # type: ignore[attr-defined]
    subnet = site.aws.subnet_for_hosts(f"{SUBNET}.0/24", "us-east-1a")  # type: ignore[attr-defined]
    if fresh:
        site.fresh_host()
    home = site.new_home(kind)
    env = site.env(home)
    args = ["up", "bench", *UP_ARGS, "--subnet", subnet, *extra, *(["--image", image] if image else [])]
    start = time.perf_counter()
    result = gp(env, *args)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{kind}: `gpuprov {' '.join(args)}` failed:\n{result.stderr[-2000:]}")
    timeline = json.loads(result.stdout)["timeline"]
    down = gp(env, "down", "bench", "--yes")
    if down.returncode != 0:
        raise RuntimeError(f"{kind}: down failed: {down.stderr[-1000:]}")
    return Run(kind, wall, timeline, rows(timeline))


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


def has_image_bake() -> bool:
    result = subprocess.run([sys.executable, "-m", "gpuprov", "image", "bake", "--help"], capture_output=True,
                            text=True)
    return result.returncode == 0


def baked_run(site: Site) -> Run | None:
    """`up` from an image baked off a bootstrapped node, where every install step should find its marker.
    None (printed as pending) until it is wired to `gpuprov image bake`.

    The wiring: run_up for a fresh node without its `down`, then `gpuprov image bake bench`, `down`, and
    run_up(site, "baked", [], image=<the AMI, or None to let `up` pick it by stack hash>, fresh=False) on a
    host holding what the baked image holds (the fresh run's host less the per-node state bake clears)."""
    return None


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
    pool = HostPool(1, work / "hosts", shims_dir=ROOT / "tests" / "shims", offset=3, prefix="gpc", bridge="gpcbr0",
                    subnet=SUBNET, host_env={"GPUPROV_SYSROOT": SYSROOT}, reboot_delay=REBOOT_DELAY)
    try:
        pool.start()
        if pool.mode != "netns":
            print(f"the test host needs a network namespace (mode {pool.mode}: {pool.fallback_reason})")
            return 0
        with AwsEndpoint() as aws:
            site = Site(aws, pool, work)
            print(f"local endpoint (moto {aws_version()} behind the fault proxy, realistic: fresh ids NotFound "
                  f"twice), 1 T4 test host (netns, shims, simulated reboot {REBOOT_DELAY:g}s); {os.cpu_count()} "
                  f"CPUs; whole CLI processes; median of {args.runs}\n", flush=True)
            runs: dict[str, list[Run]] = {"reference": [], "fresh": []}
            for _ in range(args.runs):
                runs["reference"].append(run_up(site, "reference", ["--no-bootstrap"]))
                runs["fresh"].append(run_up(site, "fresh", []))
            baked = [baked_run(site) for _ in range(args.runs)]
            report(runs, [b for b in baked if b is not None])
    finally:
        pool.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def aws_version() -> str:
    from importlib.metadata import version

    return version("moto")


def report(runs: dict[str, list[Run]], baked: list[Run]) -> None:
    from rich.console import Console

    from gpuprov.cloud.timeline import Timeline
    from gpuprov.report import timeline_table

    print("the last fresh run's timeline, as `up` prints it:")
    Console(width=100, no_color=True).print(timeline_table(Timeline.model_validate(runs["fresh"][-1].timeline)))
    if baked:
        runs = {**runs, "baked": baked}
    medians = {kind: median_runs(rs) for kind, rs in runs.items()}
    walls = {kind: statistics.median(r.wall_s for r in rs) for kind, rs in runs.items()}
    pending = [] if baked else ["pending"]
    print("\nmedian seconds per phase and step (reference: up --no-bootstrap, same endpoint and host)")
    print(f"{'phase':<28}" + "".join(f"{k:>12}" for k in [*medians, *(["baked"] if pending else [])]))
    for name in medians["fresh"]:  # the reference's phases are a subset of a fresh run's
        cells = [f"{m[name]:>11.2f}s" if name in m else f"{'-':>12}" for m in medians.values()]
        print(f"{name:<28}" + "".join(cells) + "".join(f"{p:>12}" for p in pending))
    print(f"{'CLI process wall':<28}" + "".join(f"{w:>11.2f}s" for w in walls.values())
          + "".join(f"{p:>12}" for p in pending))
    if pending:
        why = ("`gpuprov image bake` exists but bench/up_timeline.py baked_run is not wired to it yet"
               if has_image_bake() else "this checkout has no `gpuprov image bake` yet")
        print(f"\nbaked: pending: {why}")


if __name__ == "__main__":
    raise SystemExit(main())
