"""Instance types from EC2 itself: DescribeInstanceTypes in the catalog's terms (GPUs, vCPUs, memory, EFA and the
network cards that carry it), for `gpuprov facts refresh` (the instance-types overlay) and for `plan --live` and
`up`, which lay them over the catalog so a new or changed type is right without a release of gpuprov. What `up`
read is kept a day per region in the facts folder, beside the overlays.

`rows` keeps the CPU-only types of the catalog's `cpu_families` beside the GPU types, and maps EC2's GPUs to
catalog names (the A100's by its memory; a GPU the catalog lacks keeps EC2's name, for
plan/gpu_names.py's table); `live_catalog` lays the region's GPU types over the catalog (a type EC2 no longer
describes there is retired), read at most once a day (`facts_dir()/ec2-REGION.yaml`). EC2 not answering leaves
the catalog as it is (the snapshot is the fallback), said in one line.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import yaml

from gpuprov.cloud.providers.base import InstanceTypeInfo, Provider
from gpuprov.cloud.providers.capabilities import title
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.files import write_atomic
from gpuprov.paths import facts_dir
from gpuprov.plan.catalog import Catalog, normalise_name

if TYPE_CHECKING:
    from gpuprov.say import Say

CACHE_SECONDS = 24 * 3600


def catalog_gpu(cat: Catalog, info: InstanceTypeInfo) -> str | None:
    """The catalog's GPU for EC2's name, the memory deciding between models of one name (A100 40/80 GB)."""
    if info.gpu_manufacturer and info.gpu_manufacturer.upper() != "NVIDIA":
        return None
    key = normalise_name(info.gpu)
    named = [g for g in cat.gpus if key in (normalise_name(g.name), *map(normalise_name, g.aliases))
             or normalise_name(g.name).startswith(key + "-")]
    if not named:
        return None
    return min(named, key=lambda g: abs(g.memory_mib - info.gpu_memory_mib)).name


def row(cat: Catalog, info: InstanceTypeInfo) -> dict[str, Any]:
    """The catalog's fields for one type, as EC2 states them (and its catalog GPU, when there is one)."""
    cards = info.efa_card_indexes
    out: dict[str, Any] = {"gpus": info.gpus, "vcpu": info.vcpu, "ram_gib": info.memory_mib // 1024,
                           "gpu_memory_mib": info.gpu_memory_mib, "efa": info.efa,
                           "efa_interfaces": info.efa_interfaces if info.efa else None,
                           "network_cards": info.network_cards, "efa_cards": len(cards) or 1,
                           "efa_card0": not cards or cards[0] == 0, "efa_card_list": list(cards) if info.efa else []}
    if info.cpu_archs:
        out["cpu_archs"] = list(info.cpu_archs)
        out["arch"] = "x86_64" if "x86_64" in info.cpu_archs else "arm64"  # the catalog's `arch`: what gpuprov plans for
    if cpu_only(info):  # no GPU fields: what a CPU-only node plans with is its vCPUs and memory
        return {**out, "gpus": 0, "gpu_memory_mib": None}
    if info.gpu_partition < 1:  # a fraction of one GPU: named, never planned (plan/facts.py merge_ec2)
        return {**out, "ec2_gpu": info.gpu, "gpu_fraction": info.gpu_partition}
    if gpu := catalog_gpu(cat, info):
        out["gpu"] = gpu
    elif info.gpu_manufacturer.upper() in ("NVIDIA", ""):
        out["ec2_gpu"] = info.gpu  # planned with gpu_names' table when it has it, else refused by name
    return out


def cpu_only(info: InstanceTypeInfo) -> bool:
    return info.gpus == 0 and info.gpu_partition >= 1


def rows(cat: Catalog, infos: list[InstanceTypeInfo]) -> dict[str, dict[str, Any]]:
    """The GPU types, and the CPU-only x86_64 types of the families the catalog names (`cpu_families`)."""
    return {info.name: row(cat, info) for info in infos
            if info.gpus > 0 or info.gpu_partition < 1
            or (cpu_only(info) and info.name.split(".")[0] in cat.cpu_families and "x86_64" in info.cpu_archs)}


def _cache_path(region: str) -> Any:
    return facts_dir() / f"ec2-{region}.yaml"


def live_catalog(cat: Catalog, provider: Provider, region: str, say: Say, fallback: bool = True) -> Catalog:
    """The catalog with EC2's own facts of every GPU type in `region` (read at most once a day, kept in the facts
    folder). EC2 not answering leaves the catalog as it is, and says so; without `fallback` its error is raised
    (`gpus --live`, which shows what EC2 says and nothing else)."""
    path = _cache_path(region)
    cached: dict[str, Any] | None = None
    if path.is_file():
        try:
            cached = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            cached = None
    if not (isinstance(cached, dict) and time.time() - float(cached.get("at", 0)) < CACHE_SECONDS):
        try:
            read = rows(cat, provider.gpu_instance_types(region))
        except GpuprovError as exc:
            if not fallback or isinstance(exc, UserInputError):  # the user's to fix (credentials, an endpoint)
                raise
            say(f"instance types from the catalog: {title(provider)} did not describe its instance types ({exc})")
            return cat
        cached = {"at": time.time(), "region": region, "rows": read}
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(path, yaml.safe_dump(cached, sort_keys=True))
    return cat.with_instance_facts(cached["rows"], datetime.fromtimestamp(float(cached["at"]), timezone.utc), region)
