"""`gpuprov facts refresh`: each refreshable family read again from its sources, compared with what gpuprov uses
now, and written to the user's facts folder as an overlay on the shipped snapshot (plan/facts.py). A family
whose source does not answer keeps what it had; the others still refresh. tools/refresh_facts.py runs the same
code and writes the result into data/*.yaml instead.

`read_all` (each family from its sources; one failing leaves the others), `changes` (what a user would notice, one
line each), `write` (each overlay replaced whole, files.write_atomic, under a lock), `forget` (the cached facts
dropped).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import yaml

from gpuprov.cloud.providers.base import Provider
from gpuprov.errors import GpuprovError
from gpuprov.files import locked, write_atomic
from gpuprov.paths import facts_dir
from gpuprov.plan import facts, wheel_lock
from gpuprov.plan import sources as source_map
from gpuprov.sources import http
from gpuprov.sources import installers as installer_pins
from gpuprov.sources import nvidia as nvidia_repo
from gpuprov.sources import torch as torch_index
from gpuprov.sources import wheel_lock as locking

REFRESHABLE = ("torch", "drivers", "instance-types")  # the families of the shipped snapshot (tools/refresh_facts.py)
# and what only a user's facts folder keeps: the wheel locks (plan/wheel_lock.py)
USER_ONLY = ("wheels",)
# and on request only: uv's and Miniforge's pins, from their newest releases (a new pin changes what every env
# step downloads)
ON_REQUEST = ("installers",)


@dataclass
class Result:
    family: str
    overlay: facts.Overlay | None = None
    changes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _read_torch(now: datetime) -> facts.Overlay:
    snap = facts.snapshot("stack.yaml")
    read = torch_index.read(http.base_url(http.PYPI), http.base_url(http.PYTORCH_INDEX))
    rows = torch_index.releases(read, snap["torch_releases"], now)
    values: dict[str, Any] = {"torch_releases": rows,
                              "wheel_archs": torch_index.carried_archs(rows, snap["wheel_archs"]),
                              "torch_plans": [p for p in snap.get("torch_plans") or [] if p["release"] not in rows],
                              "python_ranges_unverified": None}
    return facts.Overlay(family="torch", read=now, sources=tuple(map(http.described, read.sources)), values=values,
                         unverified=tuple(read.notes))


def _read_drivers(now: datetime) -> facts.Overlay:
    values, urls = nvidia_repo.values(http.base_url(http.NVIDIA_REPOS), facts.snapshot("stack.yaml"))
    return facts.Overlay(family="drivers", read=now, sources=tuple(map(http.described, urls)), values=values)


def _read_instance_types(now: datetime, provider: Provider, regions: Sequence[str]) -> facts.Overlay:
    from gpuprov.cloud import instance_facts
    from gpuprov.plan import catalog

    cat = catalog.load()
    read: dict[str, dict[str, Any]] = {}
    offerings: dict[str, tuple[str, ...]] = {}
    for region in regions:
        for name, row in instance_facts.rows(cat, provider.gpu_instance_types(region)).items():
            read.setdefault(name, row)
        offered = provider.offerings(region, sorted(read))
        offerings[region] = tuple(sorted(offered))
    return facts.Overlay(family="instance-types", read=now,
                         sources=tuple(f"EC2 DescribeInstanceTypes and DescribeInstanceTypeOfferings in {r}" for r in regions),
                         values={"instance_types": read}, offerings=offerings)


def _read_wheels(now: datetime, torch: facts.Overlay | None, pythons: Sequence[str]) -> facts.Overlay:
    """The locks of the newest torch release's wheels (this run's torch facts when it read them), from the origin
    PyTorch wheel index; none made is a failure saying why."""
    releases = torch.values["torch_releases"] if torch else facts.merged("stack.yaml")["torch_releases"]
    base = http.base_url(http.PYTORCH_INDEX)
    made, missed = locking.make_all(base, locking.wanted(releases), pythons, now)
    if not made:
        raise GpuprovError("; ".join(missed) or "nothing to lock")
    notes = [f"{lock.requirement} {lock.variant} Python {lock.python} {lock.arch}: {lock.unverified}"
             for lock in made if lock.unverified]
    return facts.Overlay(family="wheels", read=now, sources=tuple(sorted({http.described(m.index) for m in made})),
                         values={"locks": [m.model_dump(mode="json") for m in made]},
                         unverified=(*(f"not locked: {m}" for m in missed), *notes))


def _read_installers(now: datetime) -> facts.Overlay:
    """uv's and Miniforge's pins from their GitHub releases; one not reachable keeps its pin and says so."""
    pinned = source_map.installers()
    readings = [installer_pins.read(key, pinned[key], now) for key in installer_pins.RELEASES]
    read = {r.key: r.installer.model_dump(mode="json") for r in readings if r.installer}
    return facts.Overlay(family="installers", read=now,
                         sources=tuple(r.installer.source.split(" (", 1)[0] for r in readings if r.installer),
                         values={"installers": read}, unverified=tuple(r.note for r in readings if r.note))


def _installer_changes(new: facts.Overlay) -> list[str]:
    pinned = source_map.installers()
    out = []
    for key, data in new.values["installers"].items():
        now, was = source_map.Installer.model_validate(data), pinned[key]
        if now.version != was.version:
            out.append(f"{key}: {was.version} -> {now.version}")
        out += [f"{key} {now.version} {arch}: sha256 {was.sha256.get(arch)} -> {sha}" for arch, sha in now.sha256.items()
                if now.version == was.version and was.sha256.get(arch) != sha]
    return out


def _write_installers(overlay: facts.Overlay) -> None:
    """installers.yaml: the pins just read, the file's others kept (none read: the file as it was)."""
    if not overlay.values["installers"]:
        return
    path = facts_dir() / "installers.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else {}
    data = {**(data if isinstance(data, dict) else {}), **overlay.values["installers"]}
    write_atomic(path, f"# written by `gpuprov facts refresh --only installers` ({overlay.read.isoformat()}): each "
                 "installer's release and sha256 per CPU, read at its origin (plan/sources.py)\n"
                 + yaml.safe_dump(data, sort_keys=False, width=200))


def _lock_key(lock: wheel_lock.WheelLock) -> tuple[str, str, str, str]:
    return lock.requirement, lock.variant, lock.python, lock.arch


def _wheel_changes(new: facts.Overlay) -> list[str]:
    """Per lock: new, or the wheels whose version or sha256 changed since the kept one."""
    old = {_lock_key(lock): lock for lock in wheel_lock.locks()}
    out = []
    for data in new.values["locks"]:
        lock = wheel_lock.WheelLock.model_validate(data)
        what = f"{lock.requirement} {lock.variant} Python {lock.python} {lock.arch}"
        before = old.get(_lock_key(lock))
        if before is None:
            out.append(f"{what}: new lock (torch {lock.torch_version}, {len(lock.wheels)} wheels)")
            continue
        was = {w.name: w for w in before.wheels}
        for w in lock.wheels:
            if w.name not in was:
                out.append(f"{what}: + {w.name} {w.version}")
            elif (was[w.name].version, was[w.name].sha256) != (w.version, w.sha256):
                out.append(f"{what}: {w.name} {was[w.name].version} -> {w.version}"
                           + (" (sha256 changed)" if was[w.name].version == w.version else ""))
        out += [f"{what}: - {name}" for name in sorted(set(was) - {w.name for w in lock.wheels})]
    return out


def _write_wheels(overlay: facts.Overlay) -> None:
    """wheel-locks.yaml: the locks just made, with those of other Pythons and CPUs kept as they were."""
    made = [wheel_lock.WheelLock.model_validate(d) for d in overlay.values["locks"]]
    keys = {_lock_key(lock) for lock in made}
    kept = [lock for lock in wheel_lock.locks() if _lock_key(lock) not in keys]
    data = wheel_lock.LockFile(locks=(*kept, *made)).model_dump(mode="json", exclude_none=True)
    write_atomic(wheel_lock.path(), f"# written by `gpuprov facts refresh` ({overlay.read.isoformat()}): each lock's wheels "
                 "with the sha256 the origin index lists (plan/wheel_lock.py)\n"
                 + yaml.safe_dump(data, sort_keys=False, width=200))


def changes(family: str, old: dict[str, Any], new: facts.Overlay) -> list[str]:
    """What a user would notice, one line each: releases, toolkits, driver releases, instance types that came,
    went or changed (notes and sources aside)."""
    out: list[str] = []
    for key, value in new.values.items():
        before = old.get(key)
        if key == "instance_types":
            rows = {r["name"]: r for r in before or []}
            for name, row in sorted(value.items()):
                if name not in rows:
                    if row.get("gpu_fraction"):
                        out.append(f"{name}: new ({row['gpu_fraction']:g} of one {row.get('ec2_gpu')}, not planned)")
                    elif gpu := row.get("gpu") or row.get("ec2_gpu"):
                        out.append(f"{name}: new ({row['gpus']}× {gpu}, EFA {'yes' if row['efa'] else 'no'})")
                    continue
                diff = [f"{k} {rows[name].get(k, _DEFAULTS.get(k))} -> {row[k]}" for k in facts.EC2_FIELDS
                        if k in row and rows[name].get(k, _DEFAULTS.get(k)) != row[k]]
                if diff:
                    out.append(f"{name}: {', '.join(diff)}")
            out += [f"{name}: gone (EC2 did not describe it)" for name in sorted(rows) if name not in value]
        elif isinstance(value, list) and isinstance(before, list):
            known = [_plain(_facts_only(b)) for b in before]
            out += [f"{key}: + {_short(v)}" for v in value if _plain(_facts_only(v)) not in known]
            now = [_plain(_facts_only(v)) for v in value]
            out += [f"{key}: - {_short(b)}" for b in before if _plain(_facts_only(b)) not in now]
        elif isinstance(value, dict) and isinstance(before, dict):
            for name in sorted(set(value) | set(before), key=str):
                if name in ("source", "unverified"):
                    continue
                if name not in before:
                    out.append(f"{key} {name}: new {_short(value[name])}")
                elif name not in value:
                    out.append(f"{key} {name}: gone")
                elif _plain(_facts_only(value[name])) != _plain(_facts_only(before[name])):
                    out.append(f"{key} {name}: {_short(before[name])} -> {_short(value[name])}")
        elif not key.endswith("_unverified") and _plain(value) != _plain(before):
            out.append(f"{key}: {_short(before)} -> {_short(value)}")
    return out


_DEFAULTS = {"efa": False, "network_cards": 1, "efa_cards": 1, "efa_card0": True, "efa_interfaces": None,
             "arch": "x86_64"}


def _facts_only(value: Any) -> Any:
    return {k: v for k, v in value.items() if k not in ("source", "unverified")} if isinstance(value, dict) else value


def _plain(value: Any) -> Any:
    return yaml.safe_load(yaml.safe_dump(value, sort_keys=True))


def _short(value: Any) -> str:
    text = yaml.safe_dump(_facts_only(value), default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text if len(text) <= 120 else text[:117] + "..."


def check_sources(families: Sequence[str]) -> None:
    """The sources' URLs a refresh of these families reads, checked before anything is read (bad input: exit 2)."""
    if "wheels" in families:
        http.base_url(http.PYTORCH_INDEX)
    if "installers" in families:
        http.base_url(installer_pins.GITHUB)
        http.base_url(installer_pins.GITHUB_API)
    if "torch" in families:
        http.base_url(http.PYPI)
        http.base_url(http.PYTORCH_INDEX)
    if "drivers" in families:
        http.base_url(http.NVIDIA_REPOS)


def read_all(families: Sequence[str], provider_for: Callable[[], Provider] | None, regions: Sequence[str],
             now: datetime | None = None, pythons: Sequence[str] = (locking.PYTHON,)) -> list[Result]:
    """Each family read from its sources (nothing written): its overlay and what it changes, or why not.

    :param pythons: the Pythons the wheels are locked for."""
    check_sources(families)
    now = now or datetime.now(timezone.utc).replace(microsecond=0)
    results: list[Result] = []
    for name in families:
        result = Result(name)
        try:
            if name == "torch":
                result.overlay = _read_torch(now)
            elif name == "drivers":
                result.overlay = _read_drivers(now)
            elif name == "wheels":
                torch = next((r.overlay for r in results if r.family == "torch"), None)
                result.overlay = _read_wheels(now, torch, pythons)
            elif name == "installers":
                result.overlay = _read_installers(now)
            elif provider_for is None:
                result.error = "no AWS access to read EC2 with"
            else:
                result.overlay = _read_instance_types(now, provider_for(), regions)
        except (GpuprovError, ValueError, KeyError, TypeError) as exc:  # a source that answered nonsense, too
            result.error = str(exc) or type(exc).__name__
        if result.overlay is not None and name == "wheels":
            result.changes = _wheel_changes(result.overlay)
        elif result.overlay is not None and name == "installers":
            result.changes = _installer_changes(result.overlay)
        elif result.overlay is not None:
            family = facts.BY_NAME[name]
            result.changes = changes(name, facts.merged(family.file), result.overlay)
        results.append(result)
    return results


def write(results: Sequence[Result]) -> None:
    """The overlays that were read, each replacing its file whole (a failed family keeps the one it had)."""
    folder = facts_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with locked(folder / ".refresh.lock"):
        for result in results:
            if result.overlay is not None and result.family == "wheels":
                _write_wheels(result.overlay)
            elif result.overlay is not None and result.family == "installers":
                _write_installers(result.overlay)
            elif result.overlay is not None:
                data = result.overlay.model_dump(mode="json")
                write_atomic(facts.overlay_path(result.family),
                             f"# written by `gpuprov facts refresh` ({result.overlay.read.isoformat()}); an overlay on "
                             f"gpuprov's shipped {facts.BY_NAME[result.family].file}\n"
                             + yaml.safe_dump(data, sort_keys=False, width=120))
    forget()


def forget() -> None:
    """Drop every cached reading of the facts, so this process plans with what was just written."""
    from gpuprov.plan import catalog, stack

    facts.clear_caches()
    stack.facts.cache_clear()
    catalog.load.cache_clear()
