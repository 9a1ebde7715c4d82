"""Cold-start time of the CLI beside a bare interpreter. Prints figures; asserts nothing.

    python bench/cli_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "gpuprov --help": [sys.executable, "-m", "gpuprov", "--help"],
    "gpuprov plan --gpu A100 --spot": [sys.executable, "-m", "gpuprov", "plan", "--gpu", "A100", "--spot"],
    "gpuprov plan --json": [sys.executable, "-m", "gpuprov", "plan", "--gpu", "H100:8", "--json"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(f"{'command':<34} {'median':>9} {'min':>9}   ({args.runs} runs, cold process each)")
    base = None
    for label, argv in CASES.items():
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times.append(time.perf_counter() - start)
        med = statistics.median(times)
        base = base or med
        print(f"{label:<34} {med * 1000:8.0f}ms {min(times) * 1000:8.0f}ms   ({med / base:.1f}× python)")


if __name__ == "__main__":
    main()
