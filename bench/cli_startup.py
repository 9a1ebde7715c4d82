"""Cold-start time of the CLI beside a bare interpreter. Prints figures; asserts nothing.

    python bench/cli_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

# the `gpuprov` executable, as a user runs it (else `python -m gpuprov`)
GPUPROV = [str(Path(sys.executable).with_name("gpuprov"))] if Path(sys.executable).with_name("gpuprov").exists() \
    else [sys.executable, "-m", "gpuprov"]
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "gpuprov --help": [*GPUPROV, "--help"],
    "gpuprov plan --gpu A100 --spot": [*GPUPROV, "plan", "--gpu", "A100", "--spot"],
    "gpuprov plan --json": [*GPUPROV, "plan", "--gpu", "H100:8", "--json"],
    "gpuprov bootstrap --help": [*GPUPROV, "bootstrap", "--help"],
    # what `bootstrap`/`check`/`exec` import before their first connection, beside what Fabric alone costs
    "import bootstrap --json's path": [sys.executable, "-c", "import gpuprov.cli, gpuprov.hosts.bootstrap"],
    "import bootstrap's path": [sys.executable, "-c", "import gpuprov.cli.hosts, gpuprov.hosts.bootstrap, gpuprov.cli.report"],
    "import exec's path": [sys.executable, "-c", "import gpuprov.cli.access, gpuprov.hosts.access, gpuprov.cli.report"],
    "import check's path": [sys.executable, "-c", "import gpuprov.cli.hosts, gpuprov.hosts.check, gpuprov.cli.report"],
    "import fabric": [sys.executable, "-c", "import fabric"],
}
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    # byte-compiled first, as a wheel install leaves them: a source checkout under PYTHONDONTWRITEBYTECODE
    # (set on the shared test machine) would otherwise compile every gpuprov module again in every process
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "src" / "gpuprov")], check=True,
                   stdout=subprocess.DEVNULL)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; CPU = the child's user+sys "
          "time, steadier than wall time on a shared machine")
    print(f"{'command':<34} {'median':>9} {'min':>9} {'CPU med':>9} {'CPU min':>9}   ({args.runs} runs, cold process each)")
    base = None
    for label, argv in CASES.items():
        times, cpus = [], []
        for _ in range(args.runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        med = statistics.median(times)
        base = base or med
        print(f"{label:<34} {med * 1000:8.0f}ms {min(times) * 1000:8.0f}ms {statistics.median(cpus) * 1000:8.0f}ms "
              f"{min(cpus) * 1000:8.0f}ms   ({med / base:.1f}× python)")

if __name__ == "__main__":
    main()
