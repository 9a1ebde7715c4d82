"""`gpuprov check`: run the verify probe on hosts and judge what it reports.

The expectation comes from the host itself where gpuprov bootstrapped it (the plan recorded in
/var/lib/gpuprov/bundle/manifest.json: GPU, torch's CUDA build), else from the flags and from the
GPUs the PCI bus shows, so a GPU that fell off the bus is noticed even when nvidia-smi hides it. A node launched
on a CPU-only type (its plan says `cpu_only`) is judged without GPU checks: torch imports, on the CPU.
"""

from __future__ import annotations

import json
import time

from gpuprov.hosts.detect import FACTS_COMMAND, parse_facts
from gpuprov.hosts.fanout import run_parallel
from gpuprov.hosts.remote import HostOutcome, HostSettings, Remote, on_host
from gpuprov.hosts.runner import BUNDLE_DIR
from gpuprov.hosts.verify import CheckReport, Expectation, extract_probe, judge, parse_probe
from gpuprov.plan.inventory import Target
from gpuprov.plan.render import environment, host_path

DEFAULT_ENV = "/opt/gpuprov/env"


CheckResult = HostOutcome[CheckReport]


def probe_source() -> str:
    return environment().get_template("probe.py.j2").render()


def _expectation(target: Target, gpu: str | None, manifest: dict[str, object] | None, pci_count: int | None) -> Expectation:
    from gpuprov.plan import catalog

    plan = manifest.get("gpuprov_plan") if isinstance(manifest, dict) else None
    stack = plan.get("stack") if isinstance(plan, dict) else None
    torch = stack.get("torch") if isinstance(stack, dict) else None
    wanted = target.gpu or gpu or (plan.get("gpu") if isinstance(plan, dict) else None)
    name = catalog.load().gpu(catalog.parse_gpu_request(str(wanted))[0]).name if wanted else None
    instance_type = plan.get("instance_type") if isinstance(plan, dict) else None
    cpu_only = plan.get("cpu_only") if isinstance(plan, dict) else None
    if isinstance(cpu_only, dict) and not target.gpu and not gpu:  # launched on a CPU-only type (plan/cpu.py)
        return Expectation(gpu_count=0, torch=isinstance(cpu_only.get("torch"), dict), cpu_only=True)
    # a launched node should show every GPU its instance type has; elsewhere, every GPU on the PCI bus
    count = catalog.load().instance_type(str(instance_type)).gpus if instance_type else pci_count
    return Expectation(
        gpu=name, gpu_count=count, torch=isinstance(torch, dict),
        torch_cuda=str(torch["cuda"]) if isinstance(torch, dict) else None,
    )


def _check(remote: Remote, target: Target, gpu: str | None, env_path: str) -> CheckReport:
    facts = parse_facts(remote.run(FACTS_COMMAND, sudo=True).stdout)
    raw = remote.run(f"cat {BUNDLE_DIR}/manifest.json 2>/dev/null || true", sudo=True).stdout
    manifest = json.loads(raw) if raw.strip() else None
    path = f"/tmp/gpuprov-probe-{time.monotonic_ns()}.py"
    remote.put_bytes(probe_source().encode(), path)
    plan = manifest.get("gpuprov_plan") if isinstance(manifest, dict) else None
    env = plan.get("env_path") if isinstance(plan, dict) and plan.get("env_path") else env_path
    py = host_path(f"{env}/bin/python")
    out = remote.run(f"if [ -x {py} ]; then {py} {path}; else python3 {path}; fi; rm -f {path}", sudo=True)
    report = parse_probe(target.name, extract_probe(out.stdout))
    return judge(report, _expectation(target, gpu, manifest, facts.pci_gpu_count))


def check(targets: list[Target], settings: HostSettings, gpu: str | None = None, env_path: str = DEFAULT_ENV,
          parallel: int = 32) -> list[CheckResult]:
    if gpu:  # a GPU name the catalog does not know is refused before any connection
        from gpuprov.plan import catalog

        catalog.load().gpu(catalog.parse_gpu_request(gpu)[0])
    return run_parallel(targets, lambda t: on_host(t, settings, lambda r: _check(r, t, gpu, env_path)), parallel)
