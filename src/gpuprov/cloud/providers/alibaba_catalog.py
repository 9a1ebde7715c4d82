"""What Alibaba Cloud documents of its GPU instance families, regions and zones: the facts the provider falls back on
where DescribeInstanceTypes does not answer. They are data (data/catalog-alibaba.yaml, read by
plan/catalog_alibaba.py, which `plan --cloud alibaba` and `gpus --cloud alibaba` read too); each row carries its
source and the day it was read, and docs/alibaba.md lists the same table.
"""

from __future__ import annotations

from gpuprov.plan.catalog_alibaba import GpuType, facts

__all__ = ["FAMILIES_DOC", "GPU_TYPES", "READ", "REGIONS_DOC", "ZONES", "GpuType"]

READ = facts().read
FAMILIES_DOC = facts().families_doc
GPU_TYPES: tuple[GpuType, ...] = facts().gpu_types
REGIONS_DOC = facts().regions_doc
ZONES: dict[str, tuple[str, ...]] = facts().zones
