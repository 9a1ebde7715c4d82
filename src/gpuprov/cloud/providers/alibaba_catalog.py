"""What Alibaba Cloud documents of its GPU instance families, regions and zones: the facts gpuprov plans with where
DescribeInstanceTypes does not answer (no credentials yet, `gpus` without --live).

Each fact carries its source and the day it was read. `verified` is False where the number could not be read at
the source on that day (the source is where to check it); docs/alibaba.md lists the same table. The GPU types'
rows were read in the family pages' instance tables (the live page could not be fetched whole; its tables were read
in copies of Alibaba's documents kept in public repositories, English and Chinese editions agreeing).
"""

from __future__ import annotations

from dataclasses import dataclass

READ = "2026-12-03"
FAMILIES_DOC = "https://www.alibabacloud.com/help/en/egs/gpu-accelerated-compute-optimized-instance-families"
# the family names (gn5 … gn8is) as the Elastic Container Instance guide lists the GPU-accelerated
# compute-optimized families: read at this address on READ
FAMILY_LIST_DOC = "https://help.aliyun.com/en/eci/user-guide/create-an-instance-by-specifying-the-gpu-type"
# gn: NVIDIA GPU-accelerated compute-optimized; a `v` suffix is V100 16 GB each, `6e` the V100 32 GB: read on READ
NAMING_DOC = "https://help.aliyun.com/en/egs/instance-naming-conventions"


@dataclass(frozen=True)
class GpuType:
    """One ECS instance type of a GPU family: ECS's own names (InstanceTypeId, GPUSpec, GPUAmount, GPUMemorySize)."""

    instance_type: str
    family: str
    gpu: str
    gpus: int
    gpu_memory_gib: int  # each GPU's
    vcpu: int
    memory_gib: float
    source: str = FAMILIES_DOC
    read: str = READ
    verified: bool = True


GPU_TYPES: tuple[GpuType, ...] = (
    GpuType("ecs.gn6i-c4g1.xlarge", "gn6i", "T4", 1, 16, 4, 15),
    GpuType("ecs.gn6i-c24g1.24xlarge", "gn6i", "T4", 4, 16, 96, 372),
    GpuType("ecs.gn6v-c8g1.2xlarge", "gn6v", "V100", 1, 16, 8, 32),
    GpuType("ecs.gn6v-c8g1.16xlarge", "gn6v", "V100", 8, 16, 64, 256),
    GpuType("ecs.gn6e-c12g1.3xlarge", "gn6e", "V100", 1, 32, 12, 92),
    GpuType("ecs.gn6e-c12g1.24xlarge", "gn6e", "V100", 8, 32, 96, 736),
    GpuType("ecs.gn7i-c8g1.2xlarge", "gn7i", "A10", 1, 24, 8, 30),
    GpuType("ecs.gn7i-c32g1.32xlarge", "gn7i", "A10", 4, 24, 128, 752),
    GpuType("ecs.gn7-c12g1.3xlarge", "gn7", "A100", 1, 40, 12, 94),
    GpuType("ecs.gn7-c13g1.26xlarge", "gn7", "A100", 8, 40, 104, 756),  # 760 in an older edition
    GpuType("ecs.gn7e-c16g1.4xlarge", "gn7e", "A100", 1, 80, 16, 125),
    GpuType("ecs.gn7e-c16g1.32xlarge", "gn7e", "A100", 8, 80, 128, 1000),
    GpuType("ecs.gn8is.2xlarge", "gn8is", "L20", 1, 48, 8, 64),
    GpuType("ecs.gn8is-8x.32xlarge", "gn8is", "L20", 8, 48, 128, 1024),
)

# regions and a few of their zones (ECS's RegionId and ZoneId), not verified at the source; DescribeRegions and
# DescribeZones answer for the account
REGIONS_DOC = "https://www.alibabacloud.com/help/en/ecs/product-overview/regions-and-zones"
ZONES: dict[str, tuple[str, ...]] = {
    "cn-hangzhou": ("cn-hangzhou-h", "cn-hangzhou-i", "cn-hangzhou-j", "cn-hangzhou-k"),
    "cn-shanghai": ("cn-shanghai-e", "cn-shanghai-f", "cn-shanghai-g", "cn-shanghai-l"),
    "cn-beijing": ("cn-beijing-g", "cn-beijing-h", "cn-beijing-i", "cn-beijing-l"),
    "ap-southeast-1": ("ap-southeast-1a", "ap-southeast-1b", "ap-southeast-1c"),
    "us-west-1": ("us-west-1a", "us-west-1b"),
    "eu-central-1": ("eu-central-1a", "eu-central-1b"),
}
