"""`gpuprov bench`'s parser and judge on probe outputs (tests/fixtures/bench/: derived from published
figures and public reports, not yet recorded on real GPUs — see the README there), its arithmetic,
and its table at 80 columns."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from gpuprov.cli.report_hosts import bench_tables
from gpuprov.hosts.gpubench import (
    BenchProbeError,
    BenchReport,
    Figure,
    bus_bandwidth,
    copy_gbps,
    extract,
    judge,
    matmul_tflops,
)
from gpuprov.hosts.remote import HostOutcome
from gpuprov.plan import catalog
from gpuprov.plan.inventory import Target

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench"


def report(name: str, gpu: str | None = None) -> BenchReport:
    return judge("host", extract((FIXTURES / name).read_text()), gpu)


def figure(rep: BenchReport, gpu: str, name: str) -> Figure:
    (found,) = [f for f in rep.figures if f.gpu == gpu and f.name == name]
    return found


def test_the_rates_are_the_textbook_formulas() -> None:
    # one 8192³ product in 1 ms: 2·8192³ = 1.0995e12 operations → 1099.5 TFLOP/s
    assert matmul_tflops(8192, 1, 1.0) == pytest.approx(1099.51, rel=1e-4)
    assert matmul_tflops(8192, 10, 10.0) == pytest.approx(matmul_tflops(8192, 1, 1.0))
    # a device copy moves the buffer twice (read + write, as BabelStream's Copy); a host copy once
    assert copy_gbps(1 << 30, 1, 1.0, read_and_write=True) == pytest.approx(2 * 1.073741824e3)
    assert copy_gbps(1 << 30, 1, 1.0, read_and_write=False) == pytest.approx(1.073741824e3)
    # nccl-tests: busbw = algbw × 2(n−1)/n; 8 ranks → ×1.75, 2 ranks → ×1
    algbw, busbw = bus_bandwidth(256 << 20, 20, 20 * 1.0, 8)
    assert algbw == pytest.approx(268.435456) and busbw == pytest.approx(268.435456 * 1.75)
    assert bus_bandwidth(256 << 20, 20, 20.0, 2)[1] == pytest.approx(268.435456)


def test_a_healthy_h100_node_is_as_published_on_every_figure() -> None:
    rep = report("h100-sxm-8gpu.txt")
    assert rep.ok and rep.error is None
    assert [y.variant for y in rep.yardsticks] == ["H100 SXM5"] and "NVIDIA H100" in rep.yardsticks[0].source
    assert {f.verdict for f in rep.figures} == {"ok"}
    # 8 GPUs × (4 precisions + memory + 2 host directions) + the node's all-reduce
    assert len(rep.figures) == 8 * 7 + 1
    bf16 = figure(rep, "0", "matmul bf16")
    assert bf16.measured == pytest.approx(792.1, rel=1e-3) and bf16.published == 989.4
    assert bf16.percent == pytest.approx(80.1, abs=0.1)
    assert figure(rep, "3", "memory").published == 3350
    assert figure(rep, "3", "host→device").published == 63.0  # Gen5 x16, one direction
    ar = figure(rep, "all", "all-reduce busbw")
    assert ar.published == 450  # NVLink's 900 GB/s is both directions
    assert ar.measured == pytest.approx(360.0, rel=1e-3) and "256 MiB" in ar.detail


def test_the_busbw_is_the_best_size_times_2n_minus_1_over_n() -> None:
    raw = extract((FIXTURES / "h100-sxm-8gpu.txt").read_text())
    assert raw.allreduce is not None
    largest = raw.allreduce.results[-1]
    algbw = largest.bytes / (largest.ms / largest.iterations / 1e3) / 1e9
    assert figure(judge("h", raw), "all", "all-reduce busbw").measured == pytest.approx(algbw * 2 * 7 / 8)


def test_one_throttled_gpu_is_judged_slow_and_only_its_matmuls() -> None:
    rep = report("a100-40gb-8gpu-gpu5-throttled.txt")
    assert not rep.ok
    slow = {(f.gpu, f.name) for f in rep.below}
    assert slow == {("5", f"matmul {p}") for p in ("fp16", "bf16", "tf32", "fp32")}
    f = figure(rep, "5", "matmul bf16")
    assert f.verdict == "slow" and f.percent is not None and f.percent < 70 and f.published == 312
    assert figure(rep, "4", "matmul bf16").verdict == "ok"
    assert figure(rep, "5", "memory").verdict == "ok"


def test_an_h100_pcie_sold_as_h100_is_far_below_the_sxm_figures() -> None:
    rep = report("h100-pcie-2gpu.txt")
    assert not rep.ok and rep.yardsticks[0].variant == "H100 SXM5"
    assert figure(rep, "0", "matmul bf16").verdict == "slow"
    assert figure(rep, "0", "memory").verdict == "slow"
    ar = figure(rep, "all", "all-reduce busbw")
    assert ar.verdict == "slow" and ar.percent is not None and ar.percent < 10


def test_a_t4_skips_what_it_cannot_do_natively_and_has_no_all_reduce() -> None:
    rep = report("t4-1gpu.txt")
    assert rep.ok
    assert figure(rep, "0", "matmul bf16").verdict == "skipped"
    assert "7.5" in figure(rep, "0", "matmul bf16").detail
    assert figure(rep, "0", "matmul tf32").verdict == "skipped"
    assert figure(rep, "0", "matmul fp16").published == 65.0
    assert figure(rep, "0", "host→device").published == 15.75  # Gen3 x16, one direction
    assert not [f for f in rep.figures if f.gpu == "all"]


def test_wrong_all_reduce_sums_fail_the_node() -> None:
    rep = report("a100-40gb-2gpu-wrong-sums.txt")
    ar = figure(rep, "all", "all-reduce busbw")
    assert ar.verdict == "failed" and "wrong sums" in ar.detail and ar.measured is None
    assert not rep.ok


def test_no_cuda_is_an_error_not_a_verdict() -> None:
    rep = report("no-cuda.txt")
    assert not rep.ok and rep.figures == [] and "not available" in (rep.error or "")


def test_a_gpu_the_catalog_lacks_asks_for_gpu_and_gpu_overrides_the_name() -> None:
    text = (FIXTURES / "t4-1gpu.txt").read_text().replace("Tesla T4", "NVIDIA RTX 6000 Ada Generation")
    rep = judge("h", extract(text))
    assert not rep.ok and "--gpu" in (rep.error or "")
    assert {f.verdict for f in rep.figures} <= {"no figure", "skipped"}
    rep = judge("h", extract(text), "T4")
    assert rep.ok and figure(rep, "0", "matmul fp16").published == 65.0


def test_a_gpu_without_published_tflops_is_no_figure_not_a_failure() -> None:
    text = (FIXTURES / "t4-1gpu.txt").read_text().replace("Tesla T4", "NVIDIA A10G")
    rep = judge("h", extract(text))
    assert figure(rep, "0", "matmul fp16").verdict == "no figure"
    assert figure(rep, "0", "memory").published == 600
    assert not [f for f in rep.below if f.kind == "matmul"] and rep.yardsticks[0].unverified
    # (the T4's numbers under an A10G's name: its memory and Gen3 link are below an A10G's, and judged so)
    assert {f.name for f in rep.below} == {"memory", "host→device", "device→host"}


@pytest.mark.parametrize("cut", ["", "GPUPROV_BENCH_BEGIN\n{\"probe_version\": 1",
                                 "GPUPROV_BENCH_BEGIN\n[]\nGPUPROV_BENCH_END\n"])
def test_a_cut_or_garbled_output_is_a_probe_error(cut: str) -> None:
    with pytest.raises(BenchProbeError):
        extract("some noise\n" + cut)


def test_every_published_figure_is_dense_with_a_source() -> None:
    cat = catalog.load()
    for gpu in cat.gpus:
        pub = gpu.published
        if pub is None:  # a GPU added without NVIDIA's figures (B300, RTX PRO 4500) says so
            assert "published figures not read" in (gpu.unverified or ""), gpu.name
            continue
        assert pub.source and pub.read, gpu.name
        # tensor rates are at least the fp32 rate; a sparse figure would be twice a dense one of its generation
        for p in ("fp16", "bf16", "tf32"):
            if p in pub.dense_tflops and "fp32" in pub.dense_tflops:
                assert pub.dense_tflops[p] >= pub.dense_tflops["fp32"], (gpu.name, p)
    assert cat.gpu("H100").published.dense_tflops["bf16"] == 989.4  # type: ignore[union-attr]  # 1,979* halved
    assert set(cat.bench.thresholds) == {"matmul", "memory", "host", "allreduce"}


def test_the_table_fits_80_columns_with_each_figure_beside_its_published_one() -> None:
    results = [HostOutcome(Target(host="10.0.0.1", label="gpu-node"), report(name))
               for name in ("a100-40gb-8gpu-gpu5-throttled.txt", "t4-1gpu.txt")]
    console = Console(width=80, record=True, no_color=True)
    for renderable in bench_tables(results):
        console.print(renderable)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    rows = [line for line in text.splitlines() if "matmul bf16" in line and " 5 " in line]
    assert rows and "119.6" in rows[0] and "312.0" in rows[0] and "38%" in rows[0] and "slow" in rows[0]
    assert "published A100-40GB = A100 SXM4 40GB: NVIDIA A100" in " ".join(text.split())
    assert "8 figure(s) below published" not in text and "4 figure(s) below published" in text


@pytest.mark.parametrize(("measured", "published", "want"), [
    (70.0, 100.0, ("ok", 70.0)), (69.99, 100.0, ("slow", 69.99)), (150.0, 100.0, ("ok", 150.0)),
    (5.0, None, ("no figure", None)),
])
def test_the_verdict_is_ok_at_the_threshold_and_slow_below(measured: float, published: float | None, want) -> None:
    from gpuprov.hosts.gpubench import _verdict

    percent, verdict = _verdict(measured, published, 0.70)
    assert (verdict, percent if percent is None else pytest.approx(percent)) == (want[0], want[1])
