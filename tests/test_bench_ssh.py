"""`gpuprov bench` end to end: the real CLI, a real sshd test host bootstrapped by gpuprov, the probe
pushed and run there under the fake torch (tests/shims/pylib/torch), whose all-reduce runs one process
per GPU combining their tensors over a real TCP rendezvous on the host, and whose CUDA events read a
modelled per-GPU clock. Also: the fake torch's collectives move real values between processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests import forkcli
from tests.test_bootstrap_ssh import addrs, bootstrap, gpuprov, reset

PYLIB = Path(__file__).resolve().parent / "shims" / "pylib"


def bench(pool, hosts, *extra: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    return forkcli.run([sys.executable, "-m", "gpuprov", "bench", *addrs(pool, hosts), "-i", str(pool.key_path),
                           "--accept-new-host-key", "--seconds", "5", *extra],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1"})


def figures(host: dict) -> dict[tuple[str, str], dict]:
    return {(f["gpu"], f["name"]): f for f in host["report"]["figures"]}


def test_bench_over_ssh_prints_each_figure_beside_its_published_one(host_pool, gp_home):
    pool = host_pool
    reset(pool, [0], GPUPROV_SHIM_GPU="A100", GPUPROV_SHIM_GPU_COUNT="2")
    code, hosts = bootstrap(pool, [0])
    assert code == 0, [(h["failed_step"], h["error"]) for h in hosts]

    result = bench(pool, [0], "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    (host,) = json.loads(result.stdout)
    assert set(host) == {"host", "ok", "unreachable", "error", "seconds", "report"} and host["ok"]
    report = host["report"]
    assert report["ok"] and report["gpus"] == ["NVIDIA A100-SXM4-40GB"] * 2
    assert report["yardsticks"][0]["variant"] == "A100 SXM4 40GB" and "NVIDIA A100" in report["yardsticks"][0]["source"]
    got = figures(host)
    for gpu in ("0", "1"):
        for name, published in [("matmul fp16", 312), ("matmul bf16", 312), ("matmul tf32", 156),
                                ("matmul fp32", 19.5), ("memory", 1555), ("host→device", 31.5), ("device→host", 31.5)]:
            f = got[(gpu, name)]
            assert f["published"] == published and f["verdict"] == "ok" and f["measured"] > 0.7 * published, f
            assert set(f) == {"gpu", "name", "kind", "unit", "measured", "published", "percent", "verdict", "detail"}
    ar = got[("all", "all-reduce busbw")]
    assert ar["verdict"] == "ok" and ar["published"] == 300 and "2 GPUs, nccl" in ar["detail"]

    human = bench(pool, [0], columns=80)
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if "matmul bf16" in line)
    assert "312.0" in row and "ok" in row and "TFLOP/s" in row
    assert any("all-reduce busbw" in line and "300.0" in line for line in lines)
    assert "published A100-40GB = A100 SXM4 40GB" in human.stdout


def test_a_throttled_gpu_is_judged_below_published_and_the_command_fails(host_pool, gp_home):
    pool = host_pool
    reset(pool, [1], GPUPROV_SHIM_GPU="H100", GPUPROV_SHIM_GPU_COUNT="2")
    code, hosts = bootstrap(pool, [1])
    assert code == 0, [(h["failed_step"], h["error"]) for h in hosts]
    pool.exec_in(1, "echo 'export GPUPROV_SHIM_GPU_SPEED=1,0.4' >> /var/lib/gpuprov-shim/env", check=True)
    result = bench(pool, [1], "--json")
    assert result.returncode == 1
    (host,) = json.loads(result.stdout)
    got = figures(host)
    assert got[("1", "matmul bf16")]["verdict"] == "slow" and got[("1", "matmul bf16")]["percent"] < 70
    assert got[("0", "matmul bf16")]["verdict"] == "ok" and got[("0", "matmul bf16")]["published"] == 989.4
    assert got[("1", "memory")]["verdict"] == "ok"  # the clocks of the SMs, not of the memory
    assert not host["ok"] and not host["report"]["ok"]
    human = bench(pool, [1], columns=80)
    assert human.returncode == 1 and "4 figure(s) below published" in human.stdout
    assert any("matmul bf16" in line and "slow" in line for line in human.stdout.splitlines())


def test_bench_on_a_host_without_a_gpu_stack_says_so(host_pool, gp_home):
    pool = host_pool
    reset(pool, [2], GPUPROV_SHIM_GPU_COUNT="0")  # no bootstrap: no env, and python3 has no torch
    result = bench(pool, [2], "--json")
    assert result.returncode == 1
    (host,) = json.loads(result.stdout)
    assert host["report"]["figures"] == [] and "torch" in host["report"]["error"]


def test_bad_gpu_and_seconds_are_refused_before_connecting(gp_home):
    result = gpuprov("bench", "root@192.0.2.1", "--gpu", "H1000")
    assert result.returncode == 2 and "--gpu" in result.stderr and "H100" in result.stderr
    result = gpuprov("bench", "root@192.0.2.1", "--seconds", "0")
    assert result.returncode == 2 and "--seconds" in result.stderr


WORKER = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.cuda.set_device(rank)
    torch.manual_seed(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    small = torch.randn(3, 4, device=f"cuda:{rank}")         # values differ per rank and per element
    mine = [list(r) for r in small.rows]
    dist.all_reduce(small)
    big = torch.full((1 << 24,), float(rank * 10 + 1), device=f"cuda:{rank}")
    dist.all_reduce(big, op=dist.ReduceOp.MAX)
    try:
        dist.all_reduce(torch.zeros(4, 4))                   # a CPU tensor on nccl, refused as in torch
        cpu = "accepted"
    except RuntimeError as exc:
        cpu = str(exc)
    dist.destroy_process_group()
    print(json.dumps({"mine": mine, "sum": small.rows, "max": big.max().item(), "cpu": cpu}))
""")


def test_the_fake_torch_all_reduce_combines_the_ranks_tensors_between_processes(tmp_path):
    from tests.shimrun import ShimHost

    host = ShimHost(tmp_path / "host", gpu="A100", count=3)
    (host.state / "installed").write_text("nvidia-open 595.91.07-0ubuntu1\n")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**host.env(), "PYTHONPATH": str(PYLIB)}
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "3", port], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(3)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    want = [[sum(o["mine"][i][j] for o in outs) for j in range(4)] for i in range(3)]
    for o in outs:
        assert o["sum"] == want  # every rank holds the element-wise sum of all three ranks' values
        assert o["max"] == 21.0
        assert "No backend type associated with device type cpu" in o["cpu"]
    assert outs[0]["mine"] != outs[1]["mine"]  # the ranks really contributed different tensors


def test_the_fake_torch_refuses_what_torch_refuses(tmp_path):
    from tests.shimrun import ShimHost

    host = ShimHost(tmp_path / "host", gpu="T4", count=1)
    (host.state / "installed").write_text("nvidia-open 595.91.07-0ubuntu1\n")
    code = textwrap.dedent("""
        import json, torch
        out = {"bf16": torch.cuda.is_bf16_supported(), "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False),
               "tf32": torch.cuda.is_tf32_supported()}
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        try:
            a.elapsed_time(b)
        except RuntimeError as exc:
            out["unrecorded"] = str(exc)
        x = torch.randn(8192, 8192, dtype=torch.float16, device="cuda:0")
        try:
            torch.matmul(x, torch.randn(8192, 8192, device="cuda:0"))
        except RuntimeError as exc:
            out["mixed"] = str(exc)
        try:
            torch.empty(64 << 30, dtype=torch.uint8, device="cuda:0")
        except torch.cuda.OutOfMemoryError as exc:
            out["oom"] = str(exc)
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code], env={**host.env(), "PYTHONPATH": str(PYLIB)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # torch on a T4 (7.5): bf16 "supported" by emulation, not natively; TF32 needs 8.0
    assert out["bf16"] is True and out["bf16_native"] is False and out["tf32"] is False
    assert "must be recorded" in out["unrecorded"]
    assert "same dtype" in out["mixed"]
    assert "CUDA out of memory" in out["oom"]
