"""Cold-start time of the CLI beside a bare interpreter. Prints figures; asserts nothing.

    python bench/cli_startup.py [--runs N] [--src OTHER_TREE/src [--src THIS_TREE/src]]

`gpuprov bootstrap --json` is timed to its first connection without a host: one inventory entry on
127.0.0.1 port 1, which refuses at once, so the process does all of a one-host bootstrap's start-up (imports,
playbook, inventory, the plan, the bundle) and then ends `unreachable` (exit 1). `--src` times another tree's
sources (its `gpuprov` package first on PYTHONPATH); given twice, both trees, each case's runs alternating
between them, for a before/after in the same minutes.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the `gpuprov` executable, as a user runs it (else `python -m gpuprov`)
GPUPROV = [str(Path(sys.executable).with_name("gpuprov"))] if Path(sys.executable).with_name("gpuprov").exists() \
    else [sys.executable, "-m", "gpuprov"]
WORK = Path(tempfile.mkdtemp(prefix="gpuprov-cli-startup-"))
PLAYBOOK = WORK / "none.yml"  # bench/fanout.py's kind: no stack, so the plan is known before any host answers
INVENTORY = WORK / "refusing.yml"
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "gpuprov --help": [*GPUPROV, "--help"],
    "gpuprov plan --gpu A100 --spot": [*GPUPROV, "plan", "--gpu", "A100", "--spot"],
    "gpuprov plan --json": [*GPUPROV, "plan", "--gpu", "H100:8", "--json"],
    "gpuprov bootstrap --help": [*GPUPROV, "bootstrap", "--help"],
    # the whole start-up of `bootstrap --json` on one host, to its first connect (refused: exit 1)
    "gpuprov bootstrap --json, 1 host": [*GPUPROV, "bootstrap", "--inventory", str(INVENTORY), "-p", str(PLAYBOOK),
                                         "--os", "ubuntu-24.04", "--json", "--parallel", "64"],
    # what `bootstrap`/`check`/`exec` import before their first connection, beside what Fabric alone costs
    "import bootstrap --json's path": [sys.executable, "-c", "import gpuprov.cli.hosts, gpuprov.hosts.bootstrap"],
    "import bootstrap's path": [sys.executable, "-c", "import gpuprov.cli.hosts, gpuprov.hosts.bootstrap, gpuprov.cli.report"],
    "import exec's path": [sys.executable, "-c", "import gpuprov.cli.access, gpuprov.hosts.access, gpuprov.cli.report"],
    "import check's path": [sys.executable, "-c", "import gpuprov.cli.hosts, gpuprov.hosts.check, gpuprov.cli.report"],
    "import fabric": [sys.executable, "-c", "import fabric"],
}
EXIT = {"gpuprov bootstrap --json, 1 host": 1}  # the host refused: `unreachable`
ROOT = Path(__file__).resolve().parent.parent


def one(argv: list[str], env: dict[str, str], expect: int) -> tuple[float, float]:
    """(wall s, the child's user+sys CPU s) of one cold process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    code = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env).returncode
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != expect:
        raise SystemExit(f"{' '.join(argv[:3])}: exit {code}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--src", type=Path, action="append",
                        help="gpuprov's sources to time (another tree's src/); twice: both trees, their runs "
                             "alternating, for a before/after in the same minutes; default this tree's")
    args = parser.parse_args()
    srcs = [p.resolve() for p in args.src or [ROOT / "src"]]
    for src in srcs:
        # byte-compiled first, as a wheel install leaves them: a source checkout under PYTHONDONTWRITEBYTECODE
        # (set on the shared test machine) would otherwise compile every gpuprov module again in every process
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(src / "gpuprov")], check=True,
                       stdout=subprocess.DEVNULL)
        print(f"gpuprov from {src}" + (f" [{srcs.index(src) + 1}]" if len(srcs) > 1 else ""))
    PLAYBOOK.write_text("name: none\ndescription: one step, no stack\nstack: none\nenv: null\nsteps:\n"
                        "  - name: one\n    run: 'true'\n")
    INVENTORY.write_text("defaults: {user: root}\nhosts:\n  - host: 127.0.0.1\n    port: 1\n")
    envs = [dict(os.environ, PYTHONPATH=str(src), GPUPROV_HOME=str(WORK / "home"), NO_COLOR="1") for src in srcs]
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; CPU = the child's user+sys "
          "time, steadier than wall time on a shared machine")
    print(f"{'command':<38} {'median':>9} {'min':>9} {'CPU med':>9} {'CPU min':>9}   ({args.runs} runs, cold process each)")
    base = None
    for label, argv in CASES.items():
        runs: list[list[tuple[float, float]]] = [[] for _ in srcs]
        for _ in range(args.runs):
            for i, env in enumerate(envs):  # the trees alternate, so a change in the machine's load hits both
                runs[i].append(one(argv, env, EXIT.get(label, 0)))
        for i, rs in enumerate(runs):
            times, cpus = [r[0] for r in rs], [r[1] for r in rs]
            med = statistics.median(times)
            base = base or med
            name = label + (f" [{i + 1}]" if len(srcs) > 1 else "")
            print(f"{name:<38} {med * 1000:8.0f}ms {min(times) * 1000:8.0f}ms {statistics.median(cpus) * 1000:8.0f}ms "
                  f"{min(cpus) * 1000:8.0f}ms   ({med / base:.1f}× python)")
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
