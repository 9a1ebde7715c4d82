"""CPU per sample of the GPU metrics textfile collector (`--metrics textfile`), beside the tools it calls, in
the same process tree. Prints figures; asserts nothing.

    python bench/textfile_collector.py [--runs 50] [--gpus 8]

The collector is rendered from gpuprov's own plan and run as the timer runs it, under the test shims (no GPU
here): one `nvidia-smi --query-gpu` (the shim: a bash script, not NVIDIA's binary) and one `journalctl -k` from a
cursor (the shim) per sample. The reference rows run exactly those two calls alone, so "collector's own" =
collector - (nvidia-smi + journalctl) is what gpuprov adds: bash, stat, awk, the temp file and its rename. Real
nvidia-smi and journalctl cost what they cost on the node either way (dcgm-exporter reads the same counters).
CPU = the children's user+sys time (getrusage), steadier than wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpuprov.plan.monitoring import COLLECT_SECONDS, Monitoring  # noqa: E402
from gpuprov.plan.plan import NodeRequest, make_plan  # noqa: E402


def collector(gpus: int) -> str:
    plan = make_plan(NodeRequest(gpu="H100", count=gpus, os="ubuntu-22.04", monitoring=Monitoring(metrics="textfile")))
    (step,) = [s for s in plan.bundle().scripts if s.name == "metrics"]
    found = re.search(r"gpu-metrics\" 755 <<'GPUPROV_EOF'\n(.*?)\nGPUPROV_EOF\n", step.text, re.S)
    assert found
    return found.group(1) + "\n"


def cpu_of(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, float, float]:
    """(median CPU ms, min CPU ms, median wall ms) of `runs` runs of argv."""
    cpus, walls = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(cpus) * 1000, min(cpus) * 1000, statistics.median(walls) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        script = base / "gpu-metrics"
        script.write_text(collector(args.gpus))
        for d in ("root", "state", "run"):
            (base / d).mkdir()
        (base / "state/installed").write_text("nvidia-open 580.95.05-1\n")
        (base / "run/kmsg").write_text("")
        env = {"PATH": f"{ROOT / 'tests/shims/bin'}:/usr/bin:/bin", "GPUPROV_SYSROOT": str(base / "root"),
               "GPUPROV_SHIM_STATE": str(base / "state"), "GPUPROV_SHIM_RUN": str(base / "run"),
               "GPUPROV_SHIM_GPU": "H100", "GPUPROV_SHIM_GPU_COUNT": str(args.gpus), "GPUPROV_SHIM_UTIL": "37",
               "LANG": "C.UTF-8"}
        subprocess.run(["bash", str(script)], env=env, check=True)  # the field list cached, as after the first tick
        fields = (base / "root/var/lib/gpuprov/metrics").glob("fields.*")
        query = "index,uuid,pci.bus_id,name," + ",".join(next(fields).read_text().split())
        cursor = base / "root/var/lib/gpuprov/metrics/journal.cursor"
        cases = {
            "collector (one sample)": ["bash", str(script)],
            "  nvidia-smi --query-gpu (shim)": ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            "  journalctl -k --cursor-file (shim)": ["journalctl", "-k", "-o", "short-iso", "--no-pager",
                                                     f"--cursor-file={cursor}"],
            "bash -c true": ["bash", "-c", "true"],
        }
        load = os.getloadavg()
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; {args.gpus} GPUs; "
              f"{args.runs} runs each; CPU = children's user+sys")
        print(f"{'what':<40} {'CPU med':>9} {'CPU min':>9} {'wall med':>9}")
        figures = {}
        for label, argv in cases.items():
            figures[label] = cpu_of(argv, env, args.runs)
            med, low, wall = figures[label]
            print(f"{label:<40} {med:8.1f}ms {low:8.1f}ms {wall:8.1f}ms")
        own = figures["collector (one sample)"][0] - figures["  nvidia-smi --query-gpu (shim)"][0] \
            - figures["  journalctl -k --cursor-file (shim)"][0]
        print(f"collector's own CPU per sample (collector - the two tools): {own:.1f} ms; "
              f"at one sample per {COLLECT_SECONDS}s: {own / (COLLECT_SECONDS * 1000) * 100:.3f}% of one core")
        lines = (base / "root/var/lib/prometheus/node-exporter/gpuprov-gpu.prom").read_text().count("\n")
        print(f"one sample is {lines} lines of text format")


if __name__ == "__main__":
    main()
