"""Commands for machines reached over SSH: bootstrap, check, doctor."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from gpuprov.cli.common import (
    guard_options,
    host_settings,
    main,
    make_console,
    pin_options,
    pins_from,
    ssh_options,
    targets_from,
)


@main.command()
@ssh_options
@pin_options
@guard_options
@click.option("--gpu", default=None, help="The GPU the hosts carry; default: what each host reports. A mismatch stops that host.")
@click.option("--force", is_flag=True, help="Rerun every step, even those whose marker says they are done.")
@click.option("--reboot-timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for a host to come back.")
@click.option("-v", "--verbose", is_flag=True, help="Stream every host's remote output (it always goes to the log).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def bootstrap(force: bool, reboot_timeout: float, verbose: bool, as_json: bool, gpu: str | None, **kw: Any) -> None:
    """Install the playbook's stack on existing hosts over SSH, then verify it.

    Runs on all hosts at once (bounded by --parallel). Each step leaves a marker with its
    script's sha256 on the host, so a rerun skips what is done and resumes where a failure
    or a dropped connection stopped it. A fresh driver install reboots the host and waits.
    Exit code 0 only when every host ended ok.
    """
    from gpuprov import bootstrap as engine
    from gpuprov.compat import check_pins
    from gpuprov.plan import GuardRequest, make_host_plan, with_jupyter
    from gpuprov.report import LiveHosts, bootstrap_summary
    from gpuprov.spec import load_playbook, parse_duration

    pins = pins_from(kw)
    check_pins(pins)
    with_jupyter(load_playbook(kw["playbook"]), kw["jupyter"])
    guard = GuardRequest(autostop_seconds=parse_duration(kw["autostop"], "--autostop"),
                         ttl_seconds=parse_duration(kw["ttl"], "--ttl"), on_interrupt=kw["on_interrupt"] or None)
    if gpu:  # an impossible stack is refused before any host is touched
        make_host_plan(gpu, kw["playbook"], kw["os_name"] or "ubuntu-24.04", pins, guard=guard, jupyter=kw["jupyter"])
    targets = targets_from(kw)
    console = make_console()
    options = engine.Options(force=force, parallel=kw["parallel"], reboot_timeout=reboot_timeout,
                             echo=(lambda line: console.print(line, markup=False)) if verbose else None)
    plan_for = engine.planner(gpu, kw["playbook"], kw["os_name"], pins, guard, jupyter=kw["jupyter"])
    with LiveHosts(console, [t.name for t in targets], enabled=not as_json and not verbose) as live:
        results = engine.bootstrap(targets, host_settings(kw), plan_for, options, reporter=live)
    if as_json:
        click.echo(json.dumps([_host_json(r) for r in results], indent=2))
    else:
        console.print(bootstrap_summary(results))
    sys.exit(0 if all(r.status in ("ok", "changed") for r in results) else 1)


def _host_json(r: Any) -> dict[str, Any]:
    return {
        "host": r.target.name, "result": r.summary, "status": r.status, "failed_step": r.failed_step, "error": r.error,
        "seconds": round(r.seconds, 2), "log": str(r.log_path),
        "steps": [{"name": s.name, "outcome": s.outcome, "seconds": round(s.seconds, 2), "message": s.message}
                  for s in r.steps],
        "report": r.report.model_dump(mode="json") if r.report else None,
    }


@main.command()
@ssh_options
@click.option("--gpu", default=None, help="The GPU model the hosts should show.")
@click.option("--env", "env_path", default="/opt/gpuprov/env", show_default=True, help="Python env whose torch to check.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
def check(gpu: str | None, env_path: str, as_json: bool, **kw: Any) -> None:
    """Verify hosts: nvidia-smi, /dev/nvidia*, torch.cuda and a matmul on every GPU, judged.

    The expected stack comes from what gpuprov installed there (its manifest), else from --gpu
    and the GPUs on the PCI bus. Each failed check names the reason and the fix.
    Exit code 0 only when every host passes.
    """
    from gpuprov.check import check as run_check
    from gpuprov.report import check_tables

    results = run_check(targets_from(kw), host_settings(kw), gpu=gpu, env_path=env_path, parallel=kw["parallel"])
    _finish(results, as_json, lambda r: {"report": r.report.model_dump(mode="json") if r.report else None}, check_tables)


def _finish(results: list[Any], as_json: bool, fields: Callable[[Any], dict[str, Any]],
            tables: Callable[[list[Any]], list[Any]]) -> None:
    """Print per-host outcomes (JSON or tables) and exit 0 only when every host passed."""
    if as_json:
        click.echo(json.dumps([{"host": r.target.name, "ok": r.ok, "unreachable": r.unreachable, "error": r.error,
                                "seconds": round(r.seconds, 2), **fields(r)} for r in results], indent=2))
    else:
        console = make_console()
        for renderable in tables(results):
            console.print(renderable)
    sys.exit(0 if all(r.ok for r in results) else 1)


@main.command()
@ssh_options
@click.option("--gpu", default=None, help="Judge against this GPU's published figures [default: the model each GPU reports].")
@click.option("--seconds", type=click.FloatRange(5, 3600), default=60.0, show_default=True,
              help="Time budget per host for the measurements (the all-reduce adds a few seconds).")
@click.option("--env", "env_path", default="/opt/gpuprov/env", show_default=True, help="Python env whose torch to use.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures (and where the published ones come from) as JSON.")
def bench(gpu: str | None, seconds: float, env_path: str, as_json: bool, **kw: Any) -> None:
    """Did I get what I pay for: measure each GPU and judge it against NVIDIA's published figures.

    Per GPU: dense matmul TFLOP/s in fp16, bf16, tf32 and fp32 (those the GPU runs natively),
    device memory bandwidth, pinned host-to-device and device-to-host bandwidth; per node: the
    NCCL all-reduce bus bandwidth across its GPUs. Timed with CUDA events after warm-up. Each
    figure is shown beside the catalog's published one with a verdict: ok, or slow (a throttled,
    shared or smaller GPU than the one paid for). Exit code 0 only when every figure is ok.
    """
    from gpuprov.gpubench import bench as run_bench
    from gpuprov.gpubench import to_json
    from gpuprov.report import bench_tables

    results = run_bench(targets_from(kw), host_settings(kw), gpu=gpu, env_path=env_path, seconds=seconds,
                        parallel=kw["parallel"])
    _finish(results, as_json, lambda r: {"report": to_json(r.report) if r.report else None}, bench_tables)


# --- diagnosis --------------------------------------------------------------------------------


@main.command()
@ssh_options
@click.option("--env", "env_path", default="/opt/gpuprov/env", show_default=True, help="Python env whose torch to check.")
@click.option("--min-free-gb", type=float, default=10.0, show_default=True,
              help="Warn when / or the env's filesystem has less free space than this.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings (and the facts behind them) as JSON.")
def doctor(env_path: str, min_free_gb: float, as_json: bool, **kw: Any) -> None:
    """Find why a host's GPU stack is broken: each finding names the cause and the fix.

    One command per host (as root) gathers the facts: OS, GPUs on the PCI bus, nouveau, kernel
    headers, the apt lock, the driver package and its hold, Secure Boot, the kernel module,
    nvidia-smi, Fabric Manager on NVSwitch hosts, nvidia-persistenced, /dev/nvidia*, torch's CUDA
    build against the driver, free disk. Findings run from root cause to symptom; passes show as ok.
    Exit code 0 when no host has a failure (warnings allowed).
    """
    from gpuprov.doctor import doctor as run_doctor
    from gpuprov.report import doctor_tables

    results = run_doctor(targets_from(kw), host_settings(kw), env_path=env_path, min_free_gb=min_free_gb, parallel=kw["parallel"])
    _finish(results, as_json, lambda r: {
        "findings": [c.model_dump(mode="json") for c in r.report.findings] if r.report else None,
        "facts": r.report.facts.model_dump(mode="json") if r.report else None,
    }, doctor_tables)
