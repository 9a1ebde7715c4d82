"""What `stop` loses: the instance store. EBS volumes survive a stop; the NVMe disks of the instance store do not
(EC2 user guide, "Instance store": "data in the instance store is lost under any of the following circumstances:
... The instance stops"). Most GPU types have them (g4dn, g5, g6, g6e, p4d, p5 ...; the Deep Learning AMIs mount
them at /opt/dlami/nvme, per their release notes' `nvme_location`), so `stop` says so, with the disks EC2's
DescribeInstanceTypes states (InstanceStorageInfo). A type's disks do not change: they are asked for once and kept
in the cache folder, with the date they were read.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from gpuprov.cloud.providers.base import InstanceStore, Provider
from gpuprov.cloud.providers.capabilities import title
from gpuprov.errors import GpuprovError
from gpuprov.files import locked, write_atomic
from gpuprov.paths import cache_dir

if TYPE_CHECKING:
    from gpuprov.say import Say

CACHE = "instance-store.json"  # {type: Kept}
DLAMI_MOUNT = "/opt/dlami/nvme"


class Kept(BaseModel):
    """One type's instance store as EC2 stated it (total 0: none), and the day it was read."""

    total_gb: int
    disks: list[tuple[int, int]]  # (count, GB each)
    read: str


def instance_store(provider: Provider, region: str, instance_type: str) -> InstanceStore | None:
    """The type's instance-store disks (None: it has none), from the cache or EC2."""
    folder = cache_dir()
    path = folder / CACHE if folder is not None else None
    known = _read(path) if path is not None else {}
    try:
        kept = Kept.model_validate(known[instance_type]) if instance_type in known else None
    except ValidationError:
        kept = None  # a damaged entry is asked for again
    if kept is not None:
        return InstanceStore(kept.total_gb, tuple(kept.disks)) if kept.total_gb else None
    found = provider.instance_store(instance_type, region)
    if path is not None:
        try:
            with locked(path.with_suffix(".lock")):
                rows = _read(path)
                rows[instance_type] = Kept(total_gb=found.total_gb if found else 0, disks=list(found.disks) if found else [],
                                           read=time.strftime("%Y-%m-%d")).model_dump()
                write_atomic(path, json.dumps(rows, indent=1, sort_keys=True))
        except OSError:
            pass  # a cache is never worth an error
    return found


def _read(path: Path) -> dict[str, Any]:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return rows if isinstance(rows, dict) else {}


def say_what_stop_loses(provider: Provider, name: str, region: str, instance_type: str | None,
                        say: Say) -> None:
    """One line before a stop: the type's instance store and that its data goes (nothing for a type without)."""
    if not instance_type:
        return
    try:
        found = instance_store(provider, region, instance_type)
    except GpuprovError as exc:
        say(f"{name}: could not ask {title(provider)} whether {instance_type} has instance-store NVMe ({exc}); if it "
            "has, what is on it is lost at stop")
        return
    if found is None:
        return
    disks = " + ".join(f"{count} × {gb} GB" for count, gb in found.disks)
    say(f"{name}: {instance_type} has {found.total_gb} GB of instance-store NVMe ({disks}): what is on it (the DLAMI "
        f"mounts it at {DLAMI_MOUNT}) is lost at stop; the EBS disk is kept")
