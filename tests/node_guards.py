"""What guards an SSH test host has in place, read off the host: each guard step's unit (its file under the
shims' sysroot and enabled in their fake systemd), the TTL deadline the node keeps, the autostop window, the
node exporter set up by gpuprov's metrics step. For any test that checks that a running node has the guards its
record shows (cloud/guards.recorded_guards says which): tests/test_guards_survive.py, tests/test_aws_images.py."""

from __future__ import annotations

from dataclasses import dataclass

SYSROOT = "/var/lib/gpuprov-shim/root"  # the node's `/` for the shims (tests/conftest.py HOST_ENV)
# each guard step, by the unit it leaves enabled (the shim's systemctl drops `.service`)
UNITS = {"autostop": "gpuprov-autostop.timer", "ttl": "gpuprov-ttl.timer", "spot-interrupt": "gpuprov-interrupt",
         "metrics": "gpuprov-gpu-metrics.timer", "health": "gpuprov-health"}


@dataclass(frozen=True)
class OnNode:
    steps: frozenset[str]  # the guard steps whose unit file is there and enabled
    deadline: int | None  # the TTL deadline the node keeps (ttl-deadline), epoch seconds
    idle_seconds: int | None  # autostop.conf's window
    exporter: bool  # the node exporter enabled with gpuprov's settings (metrics.sh.j2)


def on_node(pool, i: int) -> OnNode:
    """What host i has in place: each guard's unit (its file and enabled), the TTL deadline, the autostop window."""
    out = pool.exec_in(i, f"""cd /var/lib/gpuprov-shim && ls enabled; echo ---; ls {SYSROOT}/etc/systemd/system
        echo ---; cat {SYSROOT}/var/lib/gpuprov/ttl-deadline 2>/dev/null; echo ---
        sed -n 's/^IDLE_SECONDS=//p' {SYSROOT}/etc/gpuprov/autostop.conf 2>/dev/null; echo ---
        ls {SYSROOT}/etc/gpuprov/node-exporter.env 2>/dev/null; true""", check=True).stdout
    enabled, files, deadline, idle, env_file = (part.split() for part in out.split("---"))
    steps = frozenset(step for step, unit in UNITS.items()
                      if unit in enabled and (unit if "." in unit else f"{unit}.service") in files)
    return OnNode(steps, int(deadline[1]) if deadline else None, int(idle[0]) if idle else None,
                  bool(env_file) and "prometheus-node-exporter" in enabled)
