"""The user's Prometheus reaches the nodes' exporters through SSH tunnels (`gpuprov metrics targets | serve`).

The exporters listen on each node's 127.0.0.1 only (the metrics step checks it); the security group opens SSH
alone. `serve` holds one SSH connection per machine and forwards a local port per exporter to it
(hosts/access.LocalForward), reconnecting when a connection drops; `targets` prints the same ports as a
Prometheus file_sd list without connecting (https://prometheus.io/docs/prometheus/latest/configuration/
configuration/#file_sd_config: a JSON list of {"targets": [...], "labels": {...}}; Prometheus re-reads the file
when it changes, so serve rewrites it whole, temp file + rename, when it learns something new).

Ports are kept in the state folder (metrics-ports.json): a machine and exporter keep their port across runs, so
the file_sd list stays true while serve restarts. Each machine's labels: node, cluster, instance_type, gpu_model,
owner, exporter. Not `gpu`: dcgm-exporter's own `gpu` label is the GPU's index, and a target label of that name
would rename it to exported_gpu.

Serve also reads each node's last health finding (hosts/findings.py) every `poll` seconds and keeps it for
`gpuprov status`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpuprov.errors import GpuprovError
from gpuprov.files import locked, write_atomic
from gpuprov.hosts import findings
from gpuprov.hosts.access import ForwardSpec, LocalForward
from gpuprov.hosts.remote import HostSettings, Remote
from gpuprov.paths import state_dir
from gpuprov.plan.inventory import Target
from gpuprov.plan.monitoring import facts
from gpuprov.plan.render import host_path

if TYPE_CHECKING:
    from gpuprov.say import Say

BASE_PORT = 19100
MANIFEST = "/var/lib/gpuprov/bundle/manifest.json"


@dataclass(frozen=True)
class Machine:
    """One machine to scrape: how to reach it, its exporters (None: read from its manifest when serve connects),
    and the labels its targets carry (node first)."""

    name: str
    target: Target
    exporters: tuple[str, ...] | None
    labels: dict[str, str] = field(default_factory=dict)


def remote_port(exporter: str) -> int:
    return facts().dcgm.port if exporter == "dcgm" else facts().node_exporter.port


# --- ports and the file_sd list ----------------------------------------------------------------


def _ports_file() -> Path:
    return state_dir() / "metrics-ports.json"


def _read() -> dict[str, dict[str, object]]:
    try:
        data = json.loads(_ports_file().read_text())
    except (OSError, ValueError):
        return {"ports": {}, "learned": {}}
    return {"ports": dict(data.get("ports", {})), "learned": dict(data.get("learned", {}))}


def exporters_of(machine: Machine) -> tuple[str, ...]:
    """What the machine runs: its plan's, else what serve last read from it, else the node exporter."""
    if machine.exporters is not None:
        return machine.exporters
    learned = _read()["learned"].get(machine.name)
    return tuple(learned) if isinstance(learned, list) else ("node",)  # type: ignore[arg-type]


def assign_ports(machines: Sequence[Machine], base: int = BASE_PORT, learned: dict[str, tuple[str, ...]] | None = None
                 ) -> dict[tuple[str, str], int]:
    """(machine, exporter) -> local port: the recorded one, else the lowest free one from `base` (recorded under
    a lock, so two gpuprovs never hand out one port twice). `learned` records exporters read from hosts."""
    path = _ports_file()
    with locked(path.with_name(path.name + ".lock")):
        data = _read()
        ports: dict[str, int] = {k: int(v) for k, v in data["ports"].items()}  # type: ignore[call-overload]
        if learned:
            data["learned"].update({k: list(v) for k, v in learned.items()})
        taken = set(ports.values())
        out: dict[tuple[str, str], int] = {}
        for machine in machines:
            for exporter in exporters_of(machine) if not learned or machine.name not in learned else learned[machine.name]:
                key = f"{machine.name}/{exporter}"
                if key not in ports:
                    port = base
                    while port in taken:
                        port += 1
                    ports[key] = port
                    taken.add(port)
                out[(machine.name, exporter)] = ports[key]
        data["ports"] = ports  # type: ignore[assignment]
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return out


def file_sd(machines: Sequence[Machine], ports: dict[tuple[str, str], int]) -> list[dict[str, object]]:
    """Prometheus' file_sd list: one target group per machine and exporter, at the local end of its tunnel."""
    groups: list[dict[str, object]] = []
    for machine in machines:
        for exporter in exporters_of(machine):
            if (machine.name, exporter) in ports:
                labels = {"node": machine.name, **{k: v for k, v in machine.labels.items() if v}, "exporter": exporter}
                groups.append({"targets": [f"127.0.0.1:{ports[(machine.name, exporter)]}"], "labels": labels})
    return groups


def write_file_sd(path: Path, groups: list[dict[str, object]]) -> None:
    """Whole or not at all: Prometheus watches the file and must never read half of it. Its folder is made if
    missing (the README's `--file-sd ~/prometheus/gpuprov.json`, before Prometheus was set up)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(groups, indent=2) + "\n", mode=0o644)
    except OSError as exc:
        raise GpuprovError(f"cannot write {path}: {exc.strerror or exc}") from None


# --- serve ---------------------------------------------------------------------------------------


class Serve:
    """Hold a tunnel per exporter of every machine, reconnecting (1 s, doubling to 30 s) when a connection
    drops; `stop()` ends it. `on_learned(name, exporters)` hears what a machine without a recorded plan runs."""

    def __init__(self, machines: Sequence[Machine], settings: HostSettings, ports: dict[tuple[str, str], int],
                 say: Say, *, poll: float = 60.0, on_learned: Callable[[str, tuple[str, ...]], None] | None = None) -> None:
        self.machines, self.settings, self.ports, self.say = list(machines), settings, dict(ports), say
        self.poll, self.on_learned = poll, on_learned
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.connected: dict[str, bool] = {}

    def start(self) -> None:
        for machine in self.machines:
            thread = threading.Thread(target=self._hold, args=(machine,), name=f"gpuprov-serve-{machine.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def _hold(self, machine: Machine) -> None:
        delay = 1.0
        while not self._stop.is_set():
            try:
                self._session(machine)
                delay = 1.0
            except GpuprovError as exc:
                self.say(f"{machine.name}: {exc}; trying again in {delay:g}s")
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, 30.0)

    def _session(self, machine: Machine) -> None:
        remote = Remote(machine.target, self.settings)
        forwards: list[LocalForward] = []
        try:
            remote.open()
            exporters = machine.exporters if machine.exporters is not None else self._learn(machine, remote)
            for exporter in exporters:
                port = self.ports.get((machine.name, exporter))
                if port is None:
                    continue
                forward = LocalForward(remote, ForwardSpec(port, "127.0.0.1", remote_port(exporter)),
                                       on_error=self._prefixed(machine.name))
                forward.start()
                forwards.append(forward)
            self.connected[machine.name] = True
            self.say(f"{machine.name}: serving " + ", ".join(
                f"{f.spec.remote_port} on 127.0.0.1:{f.port}" for f in forwards))
            next_poll = 0.0
            while not self._stop.is_set() and all(f.alive for f in forwards) and remote.conn.is_connected:
                if time.monotonic() >= next_poll:
                    self._read_health(machine, remote)
                    next_poll = time.monotonic() + self.poll
                self._stop.wait(0.5)
            if not self._stop.is_set():
                raise GpuprovError("the SSH connection dropped")
        finally:
            self.connected[machine.name] = False
            for forward in forwards:
                forward.stop()
            remote.close()

    def _prefixed(self, name: str) -> Callable[[str], None]:
        return lambda text: self.say(f"{name}: {text}")

    def _learn(self, machine: Machine, remote: Remote) -> tuple[str, ...]:
        """The exporters the host's last bootstrap installed, from its manifest (root only: sudo)."""
        result = remote.run(f"cat {host_path(MANIFEST)}", sudo=True)
        exporters: tuple[str, ...] = ("node",)
        try:
            monitoring = json.loads(result.stdout)["gpuprov_plan"].get("monitoring") or {}
            exporter = monitoring.get("exporter")
            exporters = ("node", "dcgm") if exporter == "dcgm" else ("node",) if exporter else ()
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        if self.on_learned:
            self.on_learned(machine.name, exporters)
        return exporters

    def _read_health(self, machine: Machine, remote: Remote) -> None:
        try:
            result = remote.run(f"cat {host_path(findings.LAST)} 2>/dev/null || true", timeout=30)
        except GpuprovError:
            return
        found = findings.parse_lines(result.stdout)
        if found and found[-1] != findings.last(machine.name):
            findings.record(machine.name, found[-1])
            self.say(f"{machine.name}: health: {found[-1].kind}: {found[-1].message}")
