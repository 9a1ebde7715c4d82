"""Output capture: `gpuprov exec HOST -- CMD` beside `ssh HOST CMD` printing the same bytes, in the same run.

    sudo .venv/bin/python bench/exec_output.py [--sizes 1,8,64] [--runs 3]

One real OpenSSH test host in a network namespace (tests/hosts/fixture.py, prefix "gpx", bridge "gpxbr0",
subnet 10.232.0, shifted by GPUPROV_TEST_NET as the tests' pools are). For each size N (MiB) and shape:

  line    `head -c NM /dev/zero | tr '\\0' a`: one line of N MiB, no newline (a line splitter's worst case)
  lines   `yes 0123456789a | head -c NM`: N MiB in 12-byte lines (gpuprov prefixes and prints each line)

  gpuprov  `gpuprov exec HOST --no-prefix -- CMD`, a whole CLI process (interpreter, imports, connection)
  ssh      `ssh HOST CMD` with the same key and pinned known_hosts: the floor

Both write to a file; its size is checked against N MiB (+1 for the newline exec ends the last line with).
Wall time and the child's CPU (user+sys) per run, the median of --runs; the two tools alternate.
gpuprov's sources are byte-compiled first, as a wheel install leaves them.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.hosts.fixture

SHAPES = {
    "line": "head -c {n}M /dev/zero | tr '\\\\0' a",
    "lines": "yes 0123456789a | head -c {n}M",
}


def timed(argv: list[str], env: dict[str, str], out: Path) -> tuple[float, float, int]:
    """(wall s, CPU s, bytes written) of one whole process, its stdout into `out`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with out.open("wb") as f:
        start = time.perf_counter()
        r = subprocess.run(argv, stdout=f, stderr=subprocess.PIPE, env=env, timeout=900)
        wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} exit {r.returncode}: {r.stderr.decode()[-500:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu, out.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,8,64", help="MiB of output, comma-separated (default 1,8,64)")
    parser.add_argument("--shapes", default="line,lines", help=f"of {', '.join(SHAPES)} (default both)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per size, shape and tool; the median")
    parser.add_argument("--src", default=str(ROOT / "src"), help="the gpuprov sources to time (default: this "
                        "checkout's src/; another tree's, e.g. from `git archive`, for a before/after)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/exec_output.py starts an SSH server in a network namespace and needs root; run it as root.")
        return 0
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    shapes = [s for s in args.shapes.split(",") if s in SHAPES]

    work = Path(tempfile.mkdtemp(prefix="gpuprov-exec-output-"))
    home = work / "home"
    home.mkdir()
    from tests import testnet
    from tests.hosts.fixture import HostPool

    src = Path(args.src).resolve()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(src / "gpuprov")], check=True,
                   stdout=subprocess.DEVNULL)
    env = dict(os.environ, GPUPROV_HOME=str(home), HOME=str(home), NO_COLOR="1", PYTHONPATH=str(src))
    pool = HostPool(1, work / "hosts", offset=10, prefix=testnet.prefix("gpx"), bridge=testnet.bridge("gpxbr0"),
                    subnet=testnet.subnet("10.232.0"))
    pool.start()
    try:
        host = pool[0]
        pool.write_known_hosts(home / "known_hosts")
        target = f"root@{host.address}" + (f":{host.port}" if host.port != 22 else "")
        ssh_target = ["-p", str(host.port), f"root@{host.address}"]
        ssh = ["ssh", "-i", str(pool.key_path), "-o", f"UserKnownHostsFile={home / 'known_hosts'}",
               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", *ssh_target]
        gpuprov = [sys.executable, "-m", "gpuprov", "exec", target, "-i", str(pool.key_path), "--no-prefix", "--"]
        print(f"gpuprov from {src}; host: {host.address} ({pool.mode}); median of {args.runs} runs; wall and CPU "
              "in seconds\n")
        print(f"{'shape':>6} {'MiB':>5}  {'gpuprov':>8} {'ssh':>7} {'gp-ssh':>7}  {'gp CPU':>7} {'ssh CPU':>8}  {'MB/s gp':>8}")
        for shape in shapes:
            for n in sizes:
                command = SHAPES[shape].format(n=n)
                runs: dict[str, list[tuple[float, float]]] = {"gpuprov": [], "ssh": []}
                for _ in range(args.runs):
                    for tool, argv, extra in (("gpuprov", [*gpuprov, command], 1), ("ssh", [*ssh, command], 0)):
                        wall, cpu, size = timed(argv, env, work / f"{tool}.out")
                        expected = (n << 20) + extra
                        if size != expected:
                            raise RuntimeError(f"{tool} {shape} {n} MiB: {size} bytes, expected {expected}")
                        runs[tool].append((wall, cpu))
                gp = statistics.median(w for w, _ in runs["gpuprov"])
                sh = statistics.median(w for w, _ in runs["ssh"])
                gp_cpu = statistics.median(c for _, c in runs["gpuprov"])
                sh_cpu = statistics.median(c for _, c in runs["ssh"])
                print(f"{shape:>6} {n:>5}  {gp:>8.2f} {sh:>7.2f} {gp - sh:>+7.2f}  {gp_cpu:>7.2f} {sh_cpu:>8.2f}  "
                      f"{n * 1.048576 / gp:>8.1f}", flush=True)
    finally:
        pool.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
