"""Facts that stay true: the families of facts gpuprov reasons over, where each came from and how old it is.

The shipped snapshot is data/stack.yaml and data/catalog.yaml; each records, under `families:`, the source and
read date of every family. `gpuprov facts refresh` reads some families again from their sources (sources/,
cloud/instance_facts.py) and writes each to `paths.facts_dir()/<family>.yaml`: an overlay whose values replace
the snapshot's (for instance types: field by field, per type). This module reads both and merges them; it never
reads the network, so plan/ stays pure.

A plan whose facts are older than STALE_DAYS says so once (`stale_note`), naming `gpuprov facts refresh`.

The families: torch, cuda, drivers, driver-lifecycle, instance-types. The overlay folder is `$GPUPROV_FACTS_DIR`,
else `$GPUPROV_HOME/facts`, else the user's data dir; an overlay that does not read is bad input naming it.
`merged` is the snapshot with the overlays (replaced keys; for instance types field by field, and types EC2 has
that the catalog lacks), `states` each family's origin, age and unverified notes. GPUPROV_TEST_TODAY sets the day
(tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from gpuprov.errors import UserInputError
from gpuprov.paths import facts_dir
from gpuprov.plan import gpu_names
from gpuprov.resources import data_file
from gpuprov.settings import settings

STALE_DAYS = 90
DataFile = Literal["stack.yaml", "catalog.yaml"]
# the fields of a catalog instance type that EC2's DescribeInstanceTypes states (the rest is gpuprov's own:
# price, NVSwitch, whether the EFA device does RDMA read)
EC2_FIELDS = ("gpus", "vcpu", "ram_gib", "gpu_memory_mib", "efa", "efa_interfaces", "efa_cards", "efa_card0",
              "network_cards", "arch")
# and the network cards that carry EFA, by index, as EC2 lists them (no layout is assumed from a count)
LAYOUT_FIELDS = ("efa_card_list",)


@dataclass(frozen=True)
class Family:
    name: str
    what: str
    file: DataFile
    keys: tuple[str, ...]  # the top-level keys of `file` the family owns
    refreshed_from: str  # what `gpuprov facts refresh` reads; "" when nothing machine-readable publishes it
    notes: tuple[str, ...] = ()  # top-level keys of `file` that hold an unverified note about the family


FAMILIES = (
    Family("torch", "torch releases: CUDA variants, PyPI default, Python range, SASS per wheel", "stack.yaml",
           ("torch_releases", "wheel_archs", "aarch64_wheel_archs", "torch_plans", "python_ranges_unverified"),
           "PyPI's JSON API and the PyTorch wheel index", ("python_ranges_unverified",)),
    Family("cuda", "CUDA toolkit -> minimum driver, minor-version compatibility", "stack.yaml",
           ("cuda_min_driver", "minor_version_compat"), ""),
    Family("drivers", "driver branches, releases, pinning packages and toolkits per OS in NVIDIA's repository",
           "stack.yaml", ("driver_branches", "driver_versions", "driver_versions_unverified", "driver_pinning",
                          "repo_toolkits", "repo_toolkits_unverified"),
           "NVIDIA's CUDA repository (the Packages index per OS)",
           ("driver_versions_unverified", "repo_toolkits_unverified")),
    Family("driver-lifecycle", "driver branch types and end-of-life dates", "stack.yaml", ("driver_lifecycle",), ""),
    Family("instance-types", "AWS instance types: GPUs, vCPUs, memory, EFA interfaces and network cards",
           "catalog.yaml", ("instance_types",), "EC2 DescribeInstanceTypes and the region's offerings"),
)
BY_NAME = {f.name: f for f in FAMILIES}


class SnapshotFamily(BaseModel):
    """A family's record in a shipped data file (`families:`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    read: date
    source: str
    unverified: str | None = None


class Overlay(BaseModel):
    """One family as `gpuprov facts refresh` read it (a file in `paths.facts_dir()`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: str
    read: datetime
    sources: tuple[str, ...]
    values: dict[str, Any]
    unverified: tuple[str, ...] = ()
    offerings: dict[str, tuple[str, ...]] = {}  # instance types: region -> the types it offers


@dataclass(frozen=True)
class FamilyState:
    family: Family
    read: date
    source: str
    origin: Literal["snapshot", "refreshed"]
    unverified: tuple[str, ...]
    overlay: Overlay | None = None

    def age_days(self, on: date | None = None) -> int:
        return ((on or today()) - self.read).days


def today() -> date:
    """The date ages are counted to: $GPUPROV_TEST_TODAY (YYYY-MM-DD, the tests' clock) or the system's."""
    given = settings().test_today
    if given is None:
        return date.today()
    try:
        return date.fromisoformat(given.text)
    except ValueError:
        raise UserInputError(given.where, f"{given.text!r} is not a date", "YYYY-MM-DD, or unset it") from None


def _load_yaml(path: Path) -> Any:
    with path.open() as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@cache
def snapshot(file: DataFile) -> dict[str, Any]:
    data = _load_yaml(data_file(file))
    if not isinstance(data, dict):
        raise ValueError(f"{file}: not a mapping")
    return data


def snapshot_families(file: DataFile) -> dict[str, SnapshotFamily]:
    raw = snapshot(file).get("families") or {}
    return {name: SnapshotFamily.model_validate(value) for name, value in raw.items()}


def overlay_path(family: str) -> Path:
    return facts_dir() / f"{family}.yaml"


@cache
def overlays() -> dict[str, Overlay]:
    """The families a refresh wrote, by name. A file that does not read is bad input naming its path."""
    found: dict[str, Overlay] = {}
    for family in FAMILIES:
        path = overlay_path(family.name)
        if not path.is_file():
            continue
        hint = "run `gpuprov facts refresh` again, or delete the file to use the shipped facts"
        try:
            overlay = Overlay.model_validate(_load_yaml(path))
        except (OSError, yaml.YAMLError) as exc:
            raise UserInputError(str(path), f"cannot read it: {exc}", hint) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise UserInputError(f"{path}: {where}", first["msg"], hint) from None
        if overlay.family != family.name:
            raise UserInputError(str(path), f"holds family {overlay.family!r}, not {family.name!r}", hint)
        unknown = set(overlay.values) - set(family.keys)
        if unknown:
            raise UserInputError(str(path), f"{', '.join(sorted(unknown))} is not part of family {family.name}", hint)
        found[family.name] = overlay
    return found


def merged(file: DataFile) -> dict[str, Any]:
    """The data file as the models read it: the snapshot with every overlay of its families applied."""
    data = {k: v for k, v in snapshot(file).items() if k != "families"}
    for name, overlay in overlays().items():
        if BY_NAME[name].file != file:
            continue
        for key, value in overlay.values.items():
            if key == "instance_types":
                data = merge_ec2(data, value, overlay.read, " or ".join(sorted(overlay.offerings)))
            else:
                data[key] = value
    return data


def merge_ec2(data: dict[str, Any], read: dict[str, dict[str, Any]], when: datetime, where: str) -> dict[str, Any]:
    """catalog.yaml's data with EC2's answer laid over it: each type's own fields; a type EC2 describes whose GPU
    the catalog lacks planned with the GPU from gpu_names' table (or kept in `unplannable`, to be refused by name);
    a type EC2 did not describe in `where` (its regions; "" when not known) marked `retired` there."""
    on = when.date().isoformat()
    gpus = list(data["gpus"])
    have = {g["name"] for g in gpus}
    unplannable = dict(data.get("unplannable") or {})
    fractional = dict(data.get("fractional") or {})
    named_rows: dict[str, dict[str, Any]] = {}
    for name, fresh in sorted(read.items()):
        if fresh.get("gpu_fraction"):  # part of one GPU (g6f, gr6f): NVIDIA's vGPU driver, which gpuprov does not install
            fractional[name] = f"{fresh['gpu_fraction']:g} of one {fresh.get('ec2_gpu') or 'GPU'}"
            continue
        if fresh.get("gpu") or not fresh.get("ec2_gpu"):
            continue
        found = gpu_names.named(str(fresh["ec2_gpu"]))
        if found is None:
            unplannable[name] = str(fresh["ec2_gpu"])
            continue
        if found.catalog_name not in have:
            have.add(found.catalog_name)
            gpus.append(gpu_names.catalog_row(found, int(fresh.get("gpu_memory_mib") or 0), name, on))
        named_rows[name] = {**fresh, "gpu": found.catalog_name}
    whole = {name: fresh for name, fresh in read.items() if not fresh.get("gpu_fraction")}
    rows = merge_instance_types(data["instance_types"], {**whole, **named_rows}, when)
    if where and read:
        gone = f"EC2 DescribeInstanceTypes in {where} did not describe it on {on}"
        # a CPU-only row only by an answer that holds CPU-only types (one cached before they were read holds none)
        cpu_read = any(r.get("gpus") == 0 for r in read.values())
        rows = [r if r["name"] in read or not (r.get("gpu") or cpu_read) else
                {**r, "retired": r.get("retired") or gone} for r in rows]
    return {**data, "gpus": gpus, "instance_types": rows, "unplannable": unplannable, "fractional": fractional}


def merge_instance_types(rows: list[dict[str, Any]], read: dict[str, dict[str, Any]], when: datetime) -> list[dict[str, Any]]:
    """The catalog's rows with EC2's own fields per type; a GPU type EC2 has and the catalog lacks is added (and a
    CPU-only one of the families read)
    (no price, NVSwitch unknown: Fabric Manager then follows what the host shows), when its GPU is one the
    catalog knows."""
    out = []
    for row in rows:
        fresh = read.get(row["name"])  # a type EC2 describes is not retired, whatever the snapshot said
        out.append({**row, **{k: fresh[k] for k in EC2_FIELDS + LAYOUT_FIELDS if k in fresh}, "retired": None}
                   if fresh else row)
    known = {row["name"] for row in rows}
    for name, fresh in sorted(read.items()):
        if name in known or not (fresh.get("gpu") or fresh.get("gpus") == 0):  # a GPU the catalog knows, or none
            continue
        out.append({"name": name, "gpu": fresh.get("gpu"), "price_usd_hour": None, "nvswitch": None,
                    **{k: fresh[k] for k in EC2_FIELDS + LAYOUT_FIELDS if k in fresh},
                    "unverified": f"read from EC2 DescribeInstanceTypes on {when.date().isoformat()}; not in gpuprov's "
                                  "catalog: no list price, NVSwitch not known (Fabric Manager follows the host)"})
    return out


def _unverified_in(value: Any, path: str) -> list[str]:
    """Every `unverified` note under `value` (and `*_unverified` keys), with where it sits."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str) and (key == "unverified" or str(key).endswith("_unverified")):
                found.append(f"{path}: {item}" if key == "unverified" else f"{path}.{key}: {item}")
            else:
                found += _unverified_in(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            label = (item.get("name") or item.get("release")) if isinstance(item, dict) else None
            found += _unverified_in(item, f"{path}[{label or i}]")
    return found


def states() -> list[FamilyState]:
    """Each family: where its facts come from, when they were read, what is marked unverified."""
    out = []
    for family in FAMILIES:
        snap = snapshot_families(family.file).get(family.name)
        if snap is None:
            raise ValueError(f"{family.file}: families.{family.name} is missing")
        data = merged(family.file)
        notes = [n for key in family.keys for n in _unverified_in(data.get(key), key)]
        notes += [f"{key}: {data[key]}" for key in family.notes if data.get(key)]
        overlay = overlays().get(family.name)
        if overlay is not None:
            kept = [k for k in family.keys if k not in overlay.values]
            source = "; ".join(overlay.sources) + (f" (kept from the snapshot: {', '.join(kept)})" if kept else "")
            out.append(FamilyState(family, overlay.read.astimezone(timezone.utc).date(), source, "refreshed",
                                   (*overlay.unverified, *notes), overlay))
        else:
            out.append(FamilyState(family, snap.read, snap.source, "snapshot",
                                   ((f"{family.name}: {snap.unverified}",) if snap.unverified else ()) + tuple(notes)))
    return out


def stale_note(names: tuple[str, ...] | None = None, on: date | None = None) -> str | None:
    """One line when any of these families (all by default) is older than STALE_DAYS, naming the oldest; else None."""
    names = names or tuple(BY_NAME)
    on = on or today()
    old = sorted((s for s in states() if s.family.name in names and s.age_days(on) > STALE_DAYS), key=lambda s: s.read)
    if not old:
        return None
    where = "the shipped snapshot" if old[0].origin == "snapshot" else "your last refresh"
    return (f"the facts are {old[0].age_days(on)} days old ({len(old)} of {len(names)} families past {STALE_DAYS} days, "
            f"the oldest read {old[0].read.isoformat()} from {where}): `gpuprov facts refresh` reads them again")


def clear_caches() -> None:
    """Forget what was read (after a refresh in the same process, and in tests)."""
    snapshot.cache_clear()
    overlays.cache_clear()
