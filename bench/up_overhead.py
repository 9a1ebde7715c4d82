"""Control-plane cost of `up` (no bootstrap) against a local moto server: wall time and EC2 calls.

    python bench/up_overhead.py [--nodes 1,8]

N nodes are launched at once (threads, as separate `up`s of one user), then taken down.
Prints figures; asserts nothing. Moto answers in milliseconds, so this measures gpuprov's own
overhead and its number of API calls, not AWS's latency.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", default="1,8")
    args = parser.parse_args()
    from tests.aws.fixture import AwsEndpoint

    with AwsEndpoint() as aws:
        for n in (int(x) for x in args.nodes.split(",")):
            aws.reset()
            os.environ.update(aws.env())
            os.environ["GPUPROV_HOME"] = tempfile.mkdtemp(prefix="gpuprov-bench-")
            from gpuprov.cloud import launch, node, tags, teardown
            from gpuprov.cloud.providers.aws import AwsProvider
            from gpuprov.plan.plan import NodeRequest, make_plan
            from gpuprov.state import open_store

            store = open_store()
            provider = AwsProvider(tags.owner(), poll=0.05)
            plan = make_plan(NodeRequest(gpu="L4", spot=True))

            def one(i: int, plan=plan, provider=provider, store=store) -> None:
                opts = launch.UpOptions(name=f"bench-{i}", ssh_cidr="198.51.100.7/32", bootstrap=False,
                                           wait=False)
                node.up(plan, opts, provider, store, lambda _text: None)

            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=n) as pool:
                list(pool.map(one, range(n)))
            up_s = time.perf_counter() - start
            calls = collections.Counter(e["action"] for e in aws.log())
            aws.clear_faults()
            start = time.perf_counter()
            teardown.down([f"bench-{i}" for i in range(n)], provider, store, lambda _text: None)
            down_s = time.perf_counter() - start
            down_calls = sum(1 for _ in aws.log())
            print(f"{n} node(s): up {up_s:.2f}s wall ({up_s / n:.2f}s/node), {sum(calls.values())} AWS calls "
                  f"({sum(calls.values()) / n:.1f}/node); down {down_s:.2f}s, {down_calls} calls")
            print("   " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
