"""Alibaba Cloud ECS's GPU instance types, regions and zones, read from data/catalog-alibaba.yaml: what `gpus --cloud
alibaba` lists, what the provider falls back on where DescribeInstanceTypes lists no GPU type, and the catalog
`plan --cloud alibaba` plans on (`catalog()`: the Catalog of plan/catalog.py with Alibaba's types, GPUs and regions).

Each type row keeps Alibaba's own names (InstanceTypeId, GPUSpec, GPUAmount, GPUMemorySize) with its source and the
day it was read. No price is known (DescribePrice is not read): the catalog says why in `prices_unknown`, and a plan
on it shows that instead of a figure.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict

from gpuprov.plan import catalog as aws
from gpuprov.resources import load_data

FILE = "catalog-alibaba.yaml"


class GpuType(BaseModel):
    """One ECS instance type of a GPU family, as its documentation lists it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_type: str
    family: str
    gpu: str  # GPUSpec less "NVIDIA "
    gpus: int
    gpu_memory_gib: int  # each GPU's
    vcpu: int
    memory_gib: float
    source: str
    read: str
    verified: bool = True


class Facts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    read: str
    families_doc: str
    family_list_doc: str
    naming_doc: str
    prices_unknown: str
    disk_price_unknown: str
    oses: tuple[str, ...]
    gpu_types: tuple[GpuType, ...]
    gpus: tuple[aws.Gpu, ...]
    regions_doc: str
    zones: dict[str, tuple[str, ...]]

    @property
    def default_region(self) -> str:
        return next(iter(self.zones))

    def plan_gpu(self, row: GpuType) -> str:
        """The name the plan gives a row's GPU: `<gpu>-<memory>GB` where the file has one (A100-80GB), else `<gpu>`."""
        names = {g.name for g in self.gpus}
        sized = f"{row.gpu}-{row.gpu_memory_gib}GB"
        return sized if sized in names else row.gpu


@cache
def facts() -> Facts:
    """The file, each row given the file's source and read date where it names none of its own."""
    raw = load_data(FILE)
    raw["gpu_types"] = [{"source": raw["families_doc"], "read": raw["read"], **row} for row in raw["gpu_types"]]
    return Facts.model_validate(raw)


@cache
def catalog() -> aws.Catalog:
    """The catalog `plan --cloud alibaba` plans on: Alibaba's GPU types (no price), its GPUs and regions. What only
    AWS has (storage prices, EFA, cluster placement, bench rules) stays the shipped catalog's and is not read for a
    plan here: plan/ refuses --nodes, --live and the estimates on this cloud before they would be."""
    found = facts()
    types = tuple(aws.InstanceType(name=t.instance_type, gpu=found.plan_gpu(t), gpus=t.gpus, vcpu=t.vcpu,
                                   ram_gib=int(t.memory_gib), price_usd_hour=None,
                                   nvswitch=None if t.gpus >= 8 else False,
                                   gpu_memory_mib=t.gpu_memory_gib * 1024)
                  for t in found.gpu_types)
    return aws.load().model_copy(update={
        "cloud": "alibaba", "cloud_title": "Alibaba Cloud", "prices_as_of": "", "price_region": "",
        "gpus": found.gpus, "instance_types": types, "regions": tuple(found.zones),
        "default_region": found.default_region, "oses": found.oses, "prices_unknown": found.prices_unknown,
        "default_branch_why": "gpuprov's default branch",
        "storage": None, "storage_unknown": found.disk_price_unknown,
        "unplannable": {}, "fractional": {}, "cpu_families": ()})
