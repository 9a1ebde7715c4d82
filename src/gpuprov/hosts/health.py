"""`gpuprov doctor`'s health findings: the Xid lines of this boot's kernel log, judged with NVIDIA's meaning of
each code (data/xid.yaml, the table the health watch on the node renders too), and what the node's health watch
has found (hosts/findings.py), newest first, one check per finding."""

from __future__ import annotations

import re

from gpuprov.hosts.doctor_facts import DoctorFacts
from gpuprov.hosts.findings import Finding, parse_lines
from gpuprov.hosts.verify import Check
from gpuprov.plan.monitoring import xid_table

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),")


def xid_events(lines: list[str]) -> list[tuple[str, int]]:
    """(GPU bus as the kernel prints it, Xid code) per kernel-log line, in log order."""
    return [(m.group(1), int(m.group(2))) for line in lines if (m := _XID.search(line))]


def health_checks(f: DoctorFacts, host: str) -> list[Check]:
    """One check per (GPU, Xid code) in the kernel log, one per distinct watch finding, and whether the watch runs."""
    table = xid_table()
    out: list[Check] = []
    seen: dict[tuple[str, int], int] = {}
    for event in xid_events(f.xid_lines):
        seen[event] = seen.get(event, 0) + 1
    for (bus, code), times in seen.items():
        xid = table.xids.get(code)
        action = table.actions[xid.action] if xid else "see NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)"
        meaning = xid.meaning if xid else "not in gpuprov's table"
        out.append(Check(name=f"xid {code}", ok=False, severity="fail" if xid is None or xid.fatal else "warn",
                         detail=f"GPU {bus}: Xid {code} ({meaning}), {times}× in this boot's kernel log",
                         fix=action))
    findings = _latest_per_key(parse_lines("\n".join(f.health)))
    for found in findings:
        if found.kind == "xid" and any(found.key.endswith(f"-{code}") for _, code in seen):
            continue  # the kernel log's own line says it already
        out.append(Check(name=f"health: {found.kind}", ok=False, severity="warn",
                         detail=f"{found.time or '?'}: {found.message}", fix=_fix(found, host)))
    watch = f.units.get("gpuprov-health")
    if watch is not None and watch.enabled == "enabled" and watch.active != "active":
        out.append(Check(name="health watch", ok=False, severity="warn",
                         detail=f"gpuprov-health.service is {watch.active or 'not running'}: nothing watches this node",
                         fix="systemctl restart gpuprov-health; journalctl -u gpuprov-health says why it stopped"))
    elif watch is not None and watch.active == "active":
        out.append(Check(name="health watch", ok=True, detail="gpuprov-health.service running"
                         + (f"; {len(findings)} finding(s) on record" if findings else "; nothing found")))
    return out


def _latest_per_key(found: list[Finding]) -> list[Finding]:
    latest: dict[str, Finding] = {}
    for finding in found:
        latest[finding.key] = finding
    return sorted(latest.values(), key=lambda x: x.time, reverse=True)


def _fix(found: Finding, host: str) -> str:
    return {
        "gpus-missing": f"reboot the node (`gpuprov exec {host} --sudo -- reboot`); replace the instance if the GPU stays gone",
        "ecc": "stop the GPU's processes and reset it (nvidia-smi -r), or reboot; replace the instance if it repeats",
        "thermal": "check the load and the cooling; a datacenter GPU that slows down for heat on EC2 is a hardware case for AWS",
        "process-exited": "look at the process's own log; the health watch only saw it go",
    }.get(found.kind, "see the message")
