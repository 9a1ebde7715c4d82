"""`gpuprov status` with 200 nodes in a team's bucket (moto's S3 behind the fault proxy, local) beside `gpuprov status`
on the local state file with the same 200 nodes, in the same run. Prints figures (and the ratio); asserts nothing.

    .venv/bin/python bench/team_status.py [--nodes 200] [--runs 5]

The records are written straight through the two stores (no EC2 involved: `status` without --refresh reads only
records); each `status --json` is a fresh CLI process, as a user runs it, its answer checked to list every node.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def fill(store: object, n: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> None:
        name = f"n{i:03d}"
        store.create_node(name, "aws", "us-east-1", gpu="T4", gpu_count=1, instance_type="g4dn.xlarge",  # type: ignore[attr-defined]
                          market="spot", state="ready", zone="us-east-1a", price_usd_hour=0.526, ready_at=time.time())
        store.add_resource(name, "instance", "us-east-1", f"i-{i:017x}")  # type: ignore[attr-defined]
        store.add_resource(name, "security-group", "us-east-1", f"sg-{i:017x}")  # type: ignore[attr-defined]

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(n)))


def timed(env: dict[str, str], n: int, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gpuprov", "status", "--json"], env=env, capture_output=True,
                              text=True, check=True)
        out.append(time.perf_counter() - start)
        assert len(json.loads(done.stdout)) == n, done.stderr
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from tests.aws.fixture import AwsEndpoint

    with AwsEndpoint() as aws, tempfile.TemporaryDirectory() as tmp:
        aws.reset()
        aws.instant()
        os.environ.update(aws.env())
        aws.client("s3").create_bucket(Bucket="bench-team")
        from gpuprov.state.s3 import S3Store
        from gpuprov.state.sqlite import SqliteStore
        from gpuprov.state.url import parse

        url = parse("s3://bench-team/gp", "bench")
        assert url is not None
        local_home = Path(tmp) / "local"
        local_home.mkdir()
        fill(SqliteStore(local_home / "state.sqlite"), args.nodes)
        fill(S3Store(url), args.nodes)
        base = {**os.environ, "HOME": tmp, "COLUMNS": "200"}
        local = timed({**base, "GPUPROV_HOME": str(local_home)}, args.nodes, args.runs)
        team = timed({**base, "GPUPROV_HOME": str(Path(tmp) / "team"), "GPUPROV_STATE": str(url)}, args.nodes,
                     args.runs)
        load = os.getloadavg()
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; "
              f"{args.nodes} nodes; {args.runs} runs each, a fresh `gpuprov status --json` process per run")
        print(f"{'status on':<28} {'median':>9} {'min':>9}")
        for label, times in (("the local file (SQLite)", local), ("the bucket (S3 via proxy)", team)):
            print(f"{label:<28} {statistics.median(times) * 1000:8.0f}ms {min(times) * 1000:8.0f}ms")
        print(f"ratio bucket/local (median): {statistics.median(team) / statistics.median(local):.2f}")


if __name__ == "__main__":
    main()
