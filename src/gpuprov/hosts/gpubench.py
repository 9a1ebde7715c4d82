"""`gpuprov bench`: did I get what I pay for? Measure each GPU and judge it against NVIDIA's figures.

The probe (templates/bench.py.j2) runs on the host and prints raw measurements (sizes, iterations,
milliseconds timed with CUDA events) between GPUPROV_BENCH_BEGIN / END. Here they become rates
(`parse`), each set beside the GPU's published figure from the catalog and given a verdict (`judge`):
"ok" at or above the catalog's threshold fraction of it, "slow" below; "no figure" where NVIDIA
publishes none, "skipped" where the GPU lacks the precision, "failed" where the measurement broke.

Rates:
  matmul    2·n³ floating-point operations per n×n @ n×n product
  memory    a device-to-device copy reads and writes its buffer: 2 × bytes per copy (as BabelStream's Copy)
  host      bytes per copy, one direction (compared with the PCIe link's per-direction rate)
  all-reduce bus bandwidth as nccl-tests defines it (doc/PERFORMANCE.md): algbw = bytes / time per
            all-reduce, busbw = algbw × 2(n−1)/n, comparable with the per-direction hardware peak;
            the best over the message sizes is judged, since the largest messages reach it

The probe measures each GPU in turn, so no two share PCIe or host memory while measured: n x n matmuls (n = 8192,
halved until three matrices fit in half the free memory) in fp16, bf16 (only where
`torch.cuda.is_bf16_supported(including_emulation=False)`, i.e. compute capability 8.0+: torch's default counts
emulation and says yes on a T4), tf32 (8.0+, `allow_tf32` on) and fp32 (`allow_tf32` off); a 1 GiB
device-to-device copy; 256 MiB pinned host->device and device->host copies. Each: a first call, one timed call to
size the loop, warm-up, then as many calls as fit in its share of `--seconds`, between two CUDA events; past 1.5 x
the budget the rest is skipped. With two or more GPUs it starts one process per GPU (itself, `--allreduce-worker`)
joining an NCCL group over tcp://127.0.0.1:<free port>, checks one all-reduce whose answer is known, then times
8, 64 and 256 MiB float32 all-reduces, 5 warm-up and 20 timed (nccl-tests' defaults).

The published figures (catalog.yaml `gpus[].published`) are NVIDIA's per GPU variant AWS sells: dense TFLOP/s
(datasheets print tensor rates with 2:4 sparsity; the dense figure, half, is stored), memory bandwidth, NVLink
(both directions, as NVIDIA quotes it), PCIe generation, each with its datasheet and read date, `unverified` where
only a reproduction was read; the A10G has no datasheet, so no TFLOP/s. Verdicts: ok at >= 70 % (matmul), 60 %
(memory, host copies), 50 % (all-reduce busbw, against NVLink or the PCIe link per direction); the why is in
catalog.yaml `bench:`. The GPU's figures are found from torch's device name (`detect.gpu_from_name`) or `--gpu`.

The probe is pushed and run as `check` runs its own, with the env from the host's manifest, else `--env`, else
`python3`; cli/report_hosts.bench_tables prints the figures at 80 columns.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuprov.errors import GpuprovError
from gpuprov.hosts.fanout import run_parallel
from gpuprov.hosts.remote import CommandTimeout, HostOutcome, HostSettings, Remote, on_host
from gpuprov.plan import catalog
from gpuprov.plan.inventory import Target
from gpuprov.plan.render import environment, host_path

BEGIN, END = "GPUPROV_BENCH_BEGIN", "GPUPROV_BENCH_END"
DEFAULT_SECONDS = 60.0

Kind = Literal["matmul", "memory", "host", "allreduce"]
Verdict = Literal["ok", "slow", "no figure", "skipped", "failed"]


class BenchProbeError(GpuprovError):
    """The bench probe's output could not be read."""


# --- what the probe prints, typed ---------------------------------------------------------------


class _Raw(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class MatmulRun(_Raw):
    precision: catalog.Precision
    n: int | None = None
    iterations: int | None = None
    ms: float | None = None
    skipped: str | None = None
    error: str | None = None


class CopyRun(_Raw):
    bytes: int | None = None
    iterations: int | None = None
    ms: float | None = None
    skipped: str | None = None
    error: str | None = None


class DeviceRun(_Raw):
    index: int
    name: str | None = None
    capability: tuple[int, int] | None = None
    memory_mib: int | None = None
    bf16_native: bool | None = None
    matmul: list[MatmulRun] = []
    memory: CopyRun | None = None
    h2d: CopyRun | None = None
    d2h: CopyRun | None = None
    error: str | None = None


class AllReduceSize(_Raw):
    bytes: int
    iterations: int
    ms: float


class AllReduceRun(_Raw):
    world_size: int
    backend: str = "nccl"
    correct: bool | None = None
    results: list[AllReduceSize] = []
    skipped: str | None = None
    error: str | None = None


class TorchBuild(_Raw):
    version: str | None = None
    cuda: str | None = None


class ProbeRun(_Raw):
    probe_version: int
    hostname: str = ""
    budget_s: float
    torch: TorchBuild | None = None
    devices: list[DeviceRun] = []
    allreduce: AllReduceRun | None = None
    error: str | None = None


def extract(output: str) -> ProbeRun:
    """The probe's JSON object, from between its markers in a command's stdout."""
    match = re.search(rf"^{BEGIN}\s*$(.*?)^{END}\s*$", output, re.S | re.M)
    if not match:
        raise BenchProbeError("the bench probe printed no result (was it cut off, or killed for memory?)")
    try:
        return ProbeRun.model_validate(json.loads(match.group(1)))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise BenchProbeError(f"the bench probe's JSON is unreadable: {str(exc).splitlines()[0]}") from None


# --- rates -------------------------------------------------------------------------------------


def matmul_tflops(n: int, iterations: int, ms: float) -> float:
    return 2 * n**3 * iterations / (ms / 1e3) / 1e12


def copy_gbps(nbytes: int, iterations: int, ms: float, *, read_and_write: bool) -> float:
    return (2 if read_and_write else 1) * nbytes * iterations / (ms / 1e3) / 1e9


def bus_bandwidth(nbytes: int, iterations: int, ms: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for an all-reduce of `nbytes` over `ranks` (nccl-tests' definitions)."""
    algbw = nbytes / (ms / iterations / 1e3) / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


# --- judged ------------------------------------------------------------------------------------


class Figure(BaseModel):
    """One measured figure beside its published one."""

    model_config = ConfigDict(frozen=True)

    gpu: str  # "0", "1", … or "all" for the node's all-reduce
    name: str  # "matmul bf16", "memory", "host→device", "device→host", "all-reduce busbw"
    kind: Kind
    unit: Literal["TFLOP/s", "GB/s"]
    measured: float | None
    published: float | None
    percent: float | None
    verdict: Verdict
    detail: str = ""


class GpuYardstick(BaseModel):
    """Which published figures a GPU was judged against, and where they come from."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    variant: str
    source: str
    read: str
    unverified: str | None = None


class BenchReport(BaseModel):
    host: str
    gpus: list[str]  # the device names torch reports
    torch: TorchBuild | None = None
    yardsticks: list[GpuYardstick] = []
    figures: list[Figure] = []
    error: str | None = None

    @property
    def ok(self) -> bool:
        measured = any(f.measured is not None for f in self.figures)
        return self.error is None and measured and not any(f.verdict in ("slow", "failed") for f in self.figures)

    @property
    def below(self) -> list[Figure]:
        return [f for f in self.figures if f.verdict in ("slow", "failed")]


def _verdict(measured: float, published: float | None, threshold: float) -> tuple[float | None, Verdict]:
    if published is None:
        return None, "no figure"
    percent = 100 * measured / published
    return percent, "ok" if measured >= threshold * published else "slow"


def _unmeasured(run: MatmulRun | CopyRun | None) -> tuple[Verdict, str] | None:
    if run is None:
        return "failed", "not measured"
    if run.error:
        return "failed", run.error
    if run.skipped:
        return "skipped", run.skipped
    if run.iterations is None or run.ms is None or run.ms <= 0:
        return "failed", "no timing"
    return None


def _published_for(name: str | None, gpu: str | None) -> catalog.Gpu | None:
    """The catalog GPU whose figures apply: --gpu when given, else the one torch's device name names."""
    from gpuprov.hosts.detect import gpu_from_name

    wanted = gpu or (gpu_from_name(name) if name else None)
    return catalog.load().gpu(wanted) if wanted else None


def _device_figures(dev: DeviceRun, spec: catalog.Gpu | None, rules: catalog.BenchRules) -> list[Figure]:
    pub = spec.published if spec else None
    gpu = str(dev.index)
    out: list[Figure] = []
    for run in dev.matmul:
        published = pub.dense_tflops.get(run.precision) if pub else None
        name = f"matmul {run.precision}"
        if (why := _unmeasured(run)) is not None:
            out.append(Figure(gpu=gpu, name=name, kind="matmul", unit="TFLOP/s", measured=None, published=published,
                              percent=None, verdict=why[0], detail=why[1]))
            continue
        assert run.n is not None and run.iterations is not None and run.ms is not None
        value = matmul_tflops(run.n, run.iterations, run.ms)
        percent, verdict = _verdict(value, published, rules.thresholds["matmul"])
        out.append(Figure(gpu=gpu, name=name, kind="matmul", unit="TFLOP/s", measured=value, published=published,
                          percent=percent, verdict=verdict, detail=f"n={run.n}, {run.iterations} products"))
    pcie = rules.pcie_x16_gbps.get(pub.pcie_gen) if pub else None
    copies: list[tuple[str, CopyRun | None, Kind, float | None, bool]] = [
        ("memory", dev.memory, "memory", pub.memory_gbps if pub else None, True),
        ("host→device", dev.h2d, "host", pcie, False),
        ("device→host", dev.d2h, "host", pcie, False),
    ]
    for name, copy, kind, published, both in copies:
        if (why := _unmeasured(copy)) is not None:
            out.append(Figure(gpu=gpu, name=name, kind=kind, unit="GB/s", measured=None, published=published,
                              percent=None, verdict=why[0], detail=why[1]))
            continue
        assert copy is not None and copy.bytes is not None and copy.iterations is not None and copy.ms is not None
        value = copy_gbps(copy.bytes, copy.iterations, copy.ms, read_and_write=both)
        percent, verdict = _verdict(value, published, rules.thresholds[kind])
        size = f"{copy.bytes / 2**20:.0f} MiB" + (" pinned" if kind == "host" else "")
        link = f", PCIe Gen{pub.pcie_gen} x16 per direction" if kind == "host" and pub else ""
        out.append(Figure(gpu=gpu, name=name, kind=kind, unit="GB/s", measured=value, published=published,
                          percent=percent, verdict=verdict, detail=f"{size}, {copy.iterations} copies{link}"))
    if dev.error:
        out.append(Figure(gpu=gpu, name="device", kind="matmul", unit="TFLOP/s", measured=None, published=None,
                          percent=None, verdict="failed", detail=dev.error))
    return out


def _allreduce_figure(run: AllReduceRun, spec: catalog.Gpu | None, rules: catalog.BenchRules) -> Figure | None:
    if run.skipped:
        return None  # one GPU: there is no all-reduce to judge
    pub = spec.published if spec else None
    if pub is None:
        published, link = None, ""
    elif pub.nvlink_gbps:
        published, link = pub.nvlink_gbps / 2, f"NVLink {pub.nvlink_gbps / 2:g} GB/s per direction"
    else:
        published = rules.pcie_x16_gbps.get(pub.pcie_gen)
        link = f"no NVLink: PCIe Gen{pub.pcie_gen} x16 per direction"

    def figure(measured: float | None, percent: float | None, verdict: Verdict, detail: str) -> Figure:
        return Figure(gpu="all", name="all-reduce busbw", kind="allreduce", unit="GB/s", measured=measured,
                      published=published, percent=percent, verdict=verdict, detail=detail)

    if run.error:
        return figure(None, None, "failed", run.error)
    if run.correct is False:
        return figure(None, None, "failed", f"wrong sums: the {run.backend} all-reduce across {run.world_size} GPUs "
                                            "returned values other than the sum of the ranks' tensors")
    sizes = [(s, bus_bandwidth(s.bytes, s.iterations, s.ms, run.world_size)) for s in run.results if s.ms > 0]
    if not sizes:
        return figure(None, None, "failed", "no message size was timed")
    best, (algbw, busbw) = max(sizes, key=lambda item: (round(item[1][1], 6), item[0].bytes))
    percent, verdict = _verdict(busbw, published, rules.thresholds["allreduce"])
    detail = (f"{run.world_size} GPUs, {run.backend}, best at {best.bytes / 2**20:.0f} MiB (algbw {algbw:.1f} GB/s)"
              + (f"; vs {link}" if link else ""))
    return figure(busbw, percent, verdict, detail)


def judge(host: str, run: ProbeRun, gpu: str | None = None) -> BenchReport:
    """Rates from the raw measurements, each beside its published figure with a verdict."""
    rules = catalog.load().bench
    report = BenchReport(host=host, gpus=[d.name or "?" for d in run.devices], torch=run.torch, error=run.error)
    if run.error and not run.devices:
        return report
    if not run.devices:
        report.error = "torch saw no GPU"
        return report
    yardsticks: dict[str, GpuYardstick] = {}
    for dev in run.devices:
        spec = _published_for(dev.name, gpu)
        if spec and spec.published and spec.name not in yardsticks:
            p = spec.published
            yardsticks[spec.name] = GpuYardstick(gpu=spec.name, variant=p.variant, source=p.source, read=p.read,
                                                 unverified=p.unverified)
        report.figures.extend(_device_figures(dev, spec, rules))
    if run.allreduce is not None:
        first = _published_for(run.devices[0].name, gpu)
        if (ar := _allreduce_figure(run.allreduce, first, rules)) is not None:
            report.figures.append(ar)
    report.yardsticks = list(yardsticks.values())
    if not yardsticks:
        names = ", ".join(dict.fromkeys(report.gpus))
        report.error = (f"no published figures for {names}: the catalog does not know this GPU "
                        "(pass --gpu with the model it should be, e.g. --gpu H100)")
    return report


# --- over SSH ----------------------------------------------------------------------------------

BenchResult = HostOutcome[BenchReport]


def probe_source() -> str:
    return environment().get_template("bench.py.j2").render()


def _bench(remote: Remote, target: Target, gpu: str | None, env_path: str, seconds: float) -> BenchReport:
    from gpuprov.hosts.bootstrap import BUNDLE_DIR

    raw = remote.run(f"cat {BUNDLE_DIR}/manifest.json 2>/dev/null || true", sudo=True).stdout
    manifest = json.loads(raw) if raw.strip() else None
    plan = manifest.get("gpuprov_plan") if isinstance(manifest, dict) else None
    env = plan.get("env_path") if isinstance(plan, dict) and plan.get("env_path") else env_path
    path = f"/tmp/gpuprov-bench-{time.monotonic_ns()}.py"
    remote.put_bytes(probe_source().encode(), path)
    py = host_path(f"{env}/bin/python")
    budget = shlex.quote(f"{seconds:g}")
    limit = 3 * seconds + 300  # the budget, slow first calls, the all-reduce's processes and their rendezvous
    try:
        out = remote.run(f"if [ -x {py} ]; then {py} {path} {budget}; else python3 {path} {budget}; fi; rm -f {path}",
                         sudo=True, timeout=limit)
    except CommandTimeout:
        raise BenchProbeError(f"the bench probe was still running after {limit:g}s (a hung GPU or NCCL rendezvous?); "
                              f"{path} is left on the host") from None
    return judge(target.name, extract(out.stdout), gpu or target.gpu)


def bench(targets: list[Target], settings: HostSettings, gpu: str | None = None, env_path: str = "/opt/gpuprov/env",
          seconds: float = DEFAULT_SECONDS, parallel: int = 32) -> list[BenchResult]:
    if gpu:  # a GPU name the catalog does not know is refused before any connection
        gpu = catalog.load().gpu(catalog.parse_gpu_request(gpu)[0]).name
    return run_parallel(targets, lambda t: on_host(t, settings, lambda r: _bench(r, t, gpu, env_path, seconds)),
                        parallel)


def to_json(report: BenchReport) -> dict[str, Any]:
    return {**report.model_dump(mode="json"), "ok": report.ok}
