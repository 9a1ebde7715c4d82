"""Commands for machines reached over SSH: bootstrap, check, doctor."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from gpuprov.cli.common import (
    cache_options,
    guard_options,
    host_settings,
    line_echo,
    main,
    make_console,
    pin_options,
    pins_from,
    quiet,
    sources_flag,
    ssh_options,
    step_silence_option,
    targets_from,
    warn,
)
from gpuprov.cli.monitoring_options import monitor_options, monitoring_from
from gpuprov.cli.params import Number
from gpuprov.errors import Interrupted

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from typing_extensions import Unpack

    from gpuprov.cli.option_sets import BootstrapOptions, ReachOptions, SshOptions
    from gpuprov.cluster import Cluster, WireResult
    from gpuprov.hosts.bootstrap import HostResult
    from gpuprov.hosts.detect import HostFacts
    from gpuprov.hosts.remote import HostOutcome, Judged
    from gpuprov.hosts.site_cache import Running
    from gpuprov.plan.inventory import Target
    from gpuprov.plan.offline import Manifest
    from gpuprov.plan.plan import Plan
    from gpuprov.plan.sources import Sources

R = TypeVar("R", bound="Judged")  # what a host's outcome reports: check's, bench's or doctor's


@main.command()
@ssh_options
@pin_options
@guard_options
@monitor_options
@click.option("--gpu", default=None, help="The GPU the hosts carry; default: what each host reports. A mismatch stops that host.")
@click.option("--force", is_flag=True, help="Rerun every step, even those whose marker says they are done.")
@click.option("--keep-driver", is_flag=True,
              help="Use the host's installed NVIDIA driver as it is (a rented box, a shared server): no kernel, "
                   "driver, Fabric Manager or reboot steps; torch is the newest wheel that runs on that driver.")
@click.option("--takeover", is_flag=True,
              help="Stop a bootstrap of the same host that another gpuprov is running and take over (without it, "
                   "that host is refused while the other run is alive).")
@click.option("--reboot-timeout", type=Number(1, 86400), default=600.0, show_default=True,
              help="Seconds to wait for a host to come back (1 to 86400).")
@step_silence_option
@click.option("-v", "--verbose", is_flag=True, help="Stream every host's remote output (it always goes to the log).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--cluster", "cluster_name", default=None, metavar="NAME",
              help="Then wire the hosts as one cluster NAME, in the order given (the first is node 0): "
                   "/etc/gpuprov/cluster.env and /etc/gpuprov/hostfile on each, recorded for ssh/exec/torchrun.")
@click.option("--master-addr", default=None, metavar="IP",
              help="With --cluster: node 0's address as the others reach it [the source address node 0 uses "
                   "toward node 1, from `ip route get`].")
@click.option("--master-port", type=Number(1, 65535, whole=True), default=29500, show_default=True,
              help="With --cluster: the rendezvous port (MASTER_PORT).")
@cache_options
@click.option("--offline", "offline_dir", default=None, metavar="DIR",
              help="Install from a bundle made by `gpuprov bundle --offline` (for hosts with no route out): the "
                   "plan is checked against DIR/manifest.json first, DIR is sent over SSH, and apt/dnf and pip "
                   "read only it.")
def bootstrap(verbose: bool, as_json: bool, gpu: str | None, force: bool, keep_driver: bool, takeover: bool,
              reboot_timeout: float, step_silence: float, cluster_name: str | None, master_addr: str | None,
              master_port: int, cache_host: str | None, cache_port: int, keep_cache: bool, offline_dir: str | None,
              **kw: Unpack[BootstrapOptions]) -> None:
    """Install the playbook's stack on existing hosts over SSH, then verify it.

    Runs on all hosts at once (bounded by --parallel). Each step leaves a marker with its
    script's sha256 on the host, so a rerun skips what is done and resumes where a failure
    or a dropped connection stopped it. A fresh driver install reboots the host and waits.
    A host that stops answering (SSH keepalives, --step-silence) is reported lost; the others
    go on. Exit code 0 only when every host ended ok. With --offline DIR, a plan the bundle
    does not serve is refused before anything is sent, naming what the bundle lacks.
    """
    from gpuprov.hosts import bootstrap as engine
    from gpuprov.hosts.planner import Planner
    from gpuprov.plan.pins import check_pins
    from gpuprov.plan.plan import GuardRequest, make_host_plan, with_jupyter, with_monitoring
    from gpuprov.plan.spec import load_playbook, parse_duration

    if cluster_name is not None:
        from gpuprov.cluster import check_master_addr, check_name, check_not_a_node

        check_not_a_node(check_name(cluster_name))
        master_addr = check_master_addr(master_addr) if master_addr else None
    elif master_addr:
        raise click.UsageError("--master-addr needs --cluster NAME")
    pins = pins_from(kw)
    sources = sources_flag(kw)
    if not gpu:  # with --gpu, make_host_plan below checks them against the GPU, whose own limits come first
        check_pins(pins)
    with_jupyter(load_playbook(kw["playbook"]), kw["jupyter"])
    guard = GuardRequest(autostop_seconds=parse_duration(kw["autostop"], "--autostop"),
                         ttl_seconds=parse_duration(kw["ttl"], "--ttl"), on_interrupt=kw["on_interrupt"] or None)
    monitoring = with_monitoring(monitoring_from(kw), load_playbook(kw["playbook"]))
    if offline_dir and cache_host:
        raise click.UsageError("--cache-host with --offline: an offline bundle downloads nothing")
    bundle = _offline_bundle(offline_dir, keep_driver)
    if gpu and not keep_driver:  # an impossible stack is refused before any host is touched; warnings said once
        served = {"arch": bundle[1].plan.arch} if bundle else {}  # the bundle's OS and CPU, unless told otherwise
        ahead = make_host_plan(gpu, kw["playbook"], kw["os_name"] or (bundle[1].plan.os if bundle else "ubuntu-24.04"),
                               pins, guard=guard, jupyter=kw["jupyter"], monitoring=monitoring, docker=kw["docker"],
                               sources_flag=sources, **served)  # type: ignore[arg-type]
        if bundle is not None:  # a bundle that lacks what the plan needs: refused before any host is touched
            from gpuprov.plan.offline import check

            check(ahead, bundle[1], "--offline")
        for note in ahead.warnings:
            warn(f"warning: {note}")
    elif pins.driver:
        from gpuprov.plan.stack import facts as stack_facts

        if ended := stack_facts().branch_ended(int(pins.driver.split(".")[0])):
            warn(f"warning: driver {ended}")
    targets = targets_from(kw["hosts"], kw["inventory"], kw["ssh_config"])
    if guard.autostop_seconds is not None or guard.ttl_seconds is not None:
        _refuse_locked(targets)
    cache = start_cache(cache_host, cache_port, keep_cache, kw, kw["playbook"], sources,
                        _rebooted_among(targets, kw["playbook"], keep_driver))
    if cache is not None:  # every key of the map through the proxy, as a mirror
        sources = cache.layer
    plan_for = Planner(gpu, kw["playbook"], kw["os_name"], pins, guard, jupyter=kw["jupyter"], monitoring=monitoring,
                       keep_driver=keep_driver, docker=kw["docker"], sources=sources)
    if bundle is not None:
        plan_for = _OfflinePlans(plan_for, *bundle)  # type: ignore[assignment]  # a PlanFor, with no `ahead`
    options = engine.Options(force=force, parallel=kw["parallel"], reboot_timeout=reboot_timeout,
                             step_silence=step_silence or None, takeover=takeover, offline=bundle)
    console: Console | None = None
    try:
        if as_json and not verbose:  # JSON for a script: no progress, and none of rich's import time
            results = engine.bootstrap(targets, host_settings(kw), plan_for, options)
        else:
            from gpuprov.cli.report_hosts import LiveHosts, bootstrap_summary

            console = make_console()
            options = dataclasses.replace(options, echo=line_echo(console) if verbose else None)
            with LiveHosts(console, [t.name for t in targets], enabled=not as_json and not verbose and not quiet()) as live:
                results = engine.bootstrap(targets, host_settings(kw), plan_for, options, reporter=live)
            if not as_json:
                console.print(bootstrap_summary(results))
    except Interrupted as exc:  # the last line: what is left, and the command that finishes it
        named = " ".join(kw["hosts"]) + (f" --inventory {kw['inventory']}" if kw["inventory"] else "")
        exc.note = (f"the bootstrap of {', '.join(t.name for t in targets)} stopped where it was; the steps done "
                    f"are kept: run `gpuprov bootstrap {named.strip()}` again, with the same options, to finish")
        raise
    finally:
        stop_cache(cache, keep_cache)
    ok = all(r.status in ("ok", "changed") for r in results)
    if cluster_name is None:
        if as_json:
            click.echo(json.dumps([_host_json(r) for r in results], indent=2))
        sys.exit(0 if ok else 1)
    wired: tuple[Cluster | None, list[WireResult]] | None = None
    if ok:
        from gpuprov.cluster import wire

        wired = wire(cluster_name, targets, host_settings(kw), master_addr=master_addr, port=master_port,
                     parallel=kw["parallel"])
    _cluster_out(cluster_name, results, wired, as_json, console)


def start_cache(host: str | None, port: int, keep: bool, reach: ReachOptions, playbook: str,
                sources: tuple[Sources, str] | None,
                refused: Callable[[Target], tuple[str, str] | None]) -> Running | None:
    """--cache-host: the site's proxy started on its host, for the map the hosts would use without it (bootstrap's,
    and up's for the nodes it launches). `refused` says why the host may not hold the cache (one that the bootstrap
    reboots) and what to do, before anything is done."""
    if host is None:
        if keep:
            raise click.UsageError("--keep-cache needs --cache-host HOST")
        return None
    from gpuprov.errors import UserInputError
    from gpuprov.hosts import site_cache
    from gpuprov.plan.site_cache import effective_for

    target = targets_from((host,), None, reach["ssh_config"])[0]
    if why := refused(target):
        raise UserInputError("--cache-host", f"{target.name} {why[0]}, taking the cache away from the other hosts; "
                             "nothing was done", why[1])
    running = site_cache.start(target, host_settings(reach), effective_for(playbook, sources), port)
    if not quiet():
        click.echo(f"cache {running.cache.base} on {target.name}: the hosts download through it", err=True)
    return running


def stop_cache(running: Running | None, keep: bool) -> None:
    """The proxy `start_cache` started, ended (or left, with --keep-cache); a host that did not answer is a warning:
    the bootstrap's own outcome stands."""
    if running is None:
        return
    from gpuprov.hosts import site_cache

    if problem := site_cache.stop(running, keep=keep):
        warn(f"warning: {problem}")


def _rebooted_among(targets: list[Target], playbook: str,
                    keep_driver: bool) -> Callable[[Target], tuple[str, str] | None]:
    """bootstrap's refusal of a cache host: one of the hosts whose driver install reboots it."""
    from gpuprov.plan.spec import load_playbook

    book = load_playbook(playbook)
    rebooted = not (keep_driver or book.driver == "keep") and book.stack != "none"

    def refused(cache: Target) -> tuple[str, str] | None:
        if rebooted and any((t.host, t.port or 22) == (cache.host, cache.port or 22) for t in targets):
            return ("is bootstrapped too, and its driver install reboots it",
                    "run the cache on a host outside the list, or bootstrap it apart first")
        return None

    return refused


def _doctor_sources(targets: list[Target], kw: SshOptions, timeout: float, as_json: bool) -> None:
    """doctor --sources: each source timed from each host; exit 0 when every key has one that works."""
    from gpuprov.cli.report_hosts import sources_tables
    from gpuprov.hosts.doctor_sources import time_sources
    from gpuprov.paths import config_path
    from gpuprov.plan import config, sources

    configured = sources.effective((config.load().sources, f"{config_path()}: [sources]"))
    results = time_sources(targets, host_settings(kw), configured, timeout, kw["parallel"])
    _finish(results, as_json, lambda r: {
        "sources": [t.model_dump(mode="json") for t in r.report.timed] if r.report else None,
        "fastest": {k: f.source for k in sources.KEYS if r.report and (f := r.report.fastest(k))},
    }, sources_tables)


def _offline_bundle(folder: str | None, keep_driver: bool) -> tuple[Path, Manifest] | None:
    """--offline DIR: the bundle's folder and manifest (a folder that is not a bundle is refused here)."""
    if folder is None:
        return None
    from gpuprov.plan.offline import load

    if keep_driver:
        raise click.UsageError("--offline installs the bundle's driver: drop --keep-driver")
    path = Path(folder).expanduser()
    return path, load(path)


class _OfflinePlans:
    """Each host's plan, checked against the bundle (a host whose plan it does not serve is refused before anything
    is sent to it), with its sources map on the bundle's copy on the host (plan/offline.py). Hosts alike still share
    one plan object, and so one rendered bundle."""

    def __init__(self, inner: Callable[[Target, HostFacts], Plan], folder: Path, manifest: Manifest) -> None:
        self.inner, self.folder, self.manifest = inner, folder, manifest
        self._made: dict[int, tuple[Plan, Plan]] = {}
        self._lock = threading.Lock()

    def __call__(self, target: Target, facts: HostFacts) -> Plan:
        from gpuprov.plan.offline import check, for_bundle

        plan = self.inner(target, facts)
        check(plan, self.manifest, f"--offline {self.folder}")
        with self._lock:
            if id(plan) not in self._made:
                self._made[id(plan)] = (plan, for_bundle(plan, self.manifest))
            return self._made[id(plan)][1]


def _refuse_locked(targets: list[Target]) -> None:
    """`bootstrap NODE --ttl/--autostop` rewrites a launched node's guardrails: refused, before any host is
    touched, where another member locked them (`up --locked`), as `gpuprov ttl` is."""
    from gpuprov.paths import state_folder
    from gpuprov.state.url import configured

    if configured() is None and not (state_folder() / "state.sqlite").exists():
        return  # no records: no launched node among them (and none made by asking)
    from gpuprov.cloud.guards import check_lock
    from gpuprov.state import open_store

    store = open_store()
    for target in targets:
        node = store.find_node(target.label) if target.label else None
        if node is not None and node.live and node.address == target.host:
            check_lock(node, "bootstrap --ttl/--autostop")


def _cluster_out(name: str, results: list[HostResult], wired: tuple[Cluster | None, list[WireResult]] | None,
                 as_json: bool, console: Console | None) -> None:
    """The cluster's nodes after bootstrap --cluster, and the exit code (0 when every node is wired)."""
    cluster, nodes = wired if wired else (None, [])
    ok = bool(nodes) and all(n.outcome != "failed" for n in nodes)
    if as_json:
        click.echo(json.dumps({
            "hosts": [_host_json(r) for r in results],
            "cluster": cluster.model_dump(mode="json") if cluster else None,
            "wiring": [{"node": n.target.name, "host": n.target.host, "outcome": n.outcome, "error": n.error}
                       for n in nodes]}, indent=2))
        sys.exit(0 if ok else 1)
    from gpuprov.cli.cluster_report import cluster_table

    assert console is not None  # made whenever the output is not JSON
    if wired is None:
        console.print(f"cluster {name}: not wired, since not every host was bootstrapped")
    elif cluster is None:
        for n in nodes:
            console.print(f"cluster {name}: {n.target.name}: {n.error}", markup=False)
    else:
        console.print(cluster_table(cluster, nodes))
    sys.exit(0 if ok else 1)


def _host_json(r: HostResult) -> dict[str, object]:
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
@click.option("--cluster", "as_cluster", is_flag=True,
              help="Check a cluster's fabric instead: every node reaches every other (real data on MASTER_PORT and "
                   "sampled NCCL ports), then an all-reduce across all GPUs, judged.")
@click.option("--sizes", default="1M,64M,256M,1G", show_default=True,
              help="With --cluster: all-reduce message sizes.")
@click.option("--sample-ports", type=Number(0, 64, whole=True), default=4, show_default=True,
              help="With --cluster: ephemeral ports sampled per node, 0 to 64 (where NCCL's sockets listen).")
@click.option("--port-timeout", type=Number(0.1, 600), default=3.0, show_default=True,
              help="With --cluster: seconds (0.1 to 600) a connection may take before the port counts as dropped.")
@click.option("--no-allreduce", is_flag=True, help="With --cluster: only the connectivity part.")
def check(gpu: str | None, env_path: str, as_json: bool, as_cluster: bool, sizes: str, sample_ports: int,
          port_timeout: float, no_allreduce: bool, **kw: Unpack[SshOptions]) -> None:
    """Verify hosts: nvidia-smi, /dev/nvidia*, torch.cuda and a matmul on every GPU, judged.

    The expected stack comes from what gpuprov installed there (its manifest), else from --gpu
    and the GPUs on the PCI bus. Each failed check names the reason and the fix.
    Exit code 0 only when every host passes. With --cluster NAME: the cluster's network and
    all-reduce instead (see `gpuprov bootstrap --cluster`).
    """
    if as_cluster:
        _check_cluster(kw, env_path, as_json, sizes, sample_ports, port_timeout, not no_allreduce)
        return
    from gpuprov.cli.report_hosts import check_tables
    from gpuprov.hosts.check import check as run_check

    targets = targets_from(kw["hosts"], kw["inventory"], kw["ssh_config"])
    results = run_check(targets, host_settings(kw), gpu=gpu, env_path=env_path, parallel=kw["parallel"])
    _finish(results, as_json, lambda r: {"report": r.report.model_dump(mode="json") if r.report else None}, check_tables)


def _check_cluster(kw: SshOptions, env_path: str, as_json: bool, sizes: str, sample: int, timeout: float,
                   run_allreduce: bool) -> None:
    from gpuprov.cli.cluster_report import cluster_check_json, cluster_check_tables
    from gpuprov.cluster import load, names
    from gpuprov.cluster.check import check_cluster, parse_sizes
    from gpuprov.errors import UserInputError

    byte_sizes = parse_sizes(sizes)
    if len(kw["hosts"]) != 1 or kw.get("inventory"):
        raise UserInputError("NAME", "--cluster checks one cluster, named alone", "e.g. gpuprov check train --cluster")
    cluster = load(kw["hosts"][0])
    if cluster is None:
        known = names()
        raise UserInputError("NAME", f"no cluster called {kw['hosts'][0]!r}",
                             f"clusters: {', '.join(known)}" if known else
                             "make one with gpuprov bootstrap --cluster NAME HOST1 HOST2 ...")
    result = check_cluster(cluster, host_settings(kw), sizes=byte_sizes, sample=sample, timeout=timeout,
                           run_allreduce=run_allreduce, env_path=env_path)
    if as_json:
        click.echo(json.dumps(cluster_check_json(result), indent=2))
    else:
        console = make_console()
        for renderable in cluster_check_tables(result):
            console.print(renderable)
    sys.exit(0 if result.ok else 1)


def _finish(results: list[HostOutcome[R]], as_json: bool, fields: Callable[[HostOutcome[R]], dict[str, object]],
            tables: Callable[[list[HostOutcome[R]]], Sequence[RenderableType]]) -> None:
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
@click.option("--seconds", type=Number(5, 3600), default=60.0, show_default=True,
              help="Time budget per host for the measurements (the all-reduce adds a few seconds).")
@click.option("--env", "env_path", default="/opt/gpuprov/env", show_default=True, help="Python env whose torch to use.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures (and where the published ones come from) as JSON.")
def bench(gpu: str | None, seconds: float, env_path: str, as_json: bool, **kw: Unpack[SshOptions]) -> None:
    """Did I get what I pay for: measure each GPU and judge it against NVIDIA's published figures.

    Per GPU: dense matmul TFLOP/s in fp16, bf16, tf32 and fp32 (those the GPU runs natively),
    device memory bandwidth, pinned host-to-device and device-to-host bandwidth; per node: the
    NCCL all-reduce bus bandwidth across its GPUs. Timed with CUDA events after warm-up. Each
    figure is shown beside the catalog's published one with a verdict: ok, or slow (a throttled,
    shared or smaller GPU than the one paid for). Exit code 0 only when every figure is ok.
    """
    from gpuprov.cli.report_hosts import bench_tables
    from gpuprov.hosts.gpubench import bench as run_bench
    from gpuprov.hosts.gpubench import to_json

    targets = targets_from(kw["hosts"], kw["inventory"], kw["ssh_config"])
    results = run_bench(targets, host_settings(kw), gpu=gpu, env_path=env_path, seconds=seconds, parallel=kw["parallel"])
    _finish(results, as_json, lambda r: {"report": to_json(r.report) if r.report else None}, bench_tables)


# --- diagnosis --------------------------------------------------------------------------------


@main.command()
@ssh_options
@click.option("--env", "env_path", default="/opt/gpuprov/env", show_default=True, help="Python env whose torch to check.")
@click.option("--min-free-gb", type=Number(0, 1_000_000), default=10.0, show_default=True,
              help="Warn when / or the env's filesystem has less free space than this (0 to 1_000_000).")
@click.option("--json", "as_json", is_flag=True, help="Print the findings (and the facts behind them) as JSON.")
@click.option("--sources", "time_sources", is_flag=True,
              help="Instead: from each host, time a small fetch from each configured source and each preset's "
                   "(docs/mirrors.md), and name the fastest that works for each key.")
@click.option("--timeout", type=Number(0.5, 120), default=5.0, show_default=True,
              help="With --sources: seconds (0.5 to 120) a fetch may take before its source counts as unreachable.")
def doctor(env_path: str, min_free_gb: float, as_json: bool, time_sources: bool, timeout: float,
           **kw: Unpack[SshOptions]) -> None:
    """Find why a host's GPU stack is broken: each finding names the cause and the fix.

    One command per host (as root) gathers the facts: OS, GPUs on the PCI bus, nouveau, kernel
    headers, the apt lock, the driver package and its hold, Secure Boot, the kernel module,
    nvidia-smi, Fabric Manager on NVSwitch hosts, nvidia-persistenced, /dev/nvidia*, torch's CUDA
    build against the driver, free disk. Findings run from root cause to symptom; passes show as ok.
    Exit code 0 when no host has a failure (warnings allowed).
    """
    from gpuprov.cli.report_hosts import doctor_tables
    from gpuprov.hosts.doctor import doctor as run_doctor

    targets = targets_from(kw["hosts"], kw["inventory"], kw["ssh_config"])
    if time_sources:
        _doctor_sources(targets, kw, timeout, as_json)
        return
    results = run_doctor(targets, host_settings(kw), env_path=env_path, min_free_gb=min_free_gb, parallel=kw["parallel"])
    _finish(results, as_json, lambda r: {
        "findings": [c.model_dump(mode="json") for c in r.report.findings] if r.report else None,
        "facts": r.report.facts.model_dump(mode="json") if r.report else None,
    }, doctor_tables)
