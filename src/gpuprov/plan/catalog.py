"""GPU facts and the AWS instance types that carry each GPU, read from data/catalog.yaml.

GPUs: architecture, compute capability, memory, PCI ids, and `published` (NVIDIA's dense TFLOP/s per precision,
memory and NVLink bandwidth, PCIe generation, each with its source and read date). Instance types: GPUs, vCPUs,
memory, $/h, NVSwitch, EFA. Also regions, `storage` (gp3 $/GB-month: what a stopped node's disk costs),
`bench` (what `gpuprov bench` calls ok, and why; PCIe per-direction rates), `interconnect` (EFA Gbit/s per type and
the all-reduce floor `check --cluster` judges against) and `cluster_network` (which families take a cluster
placement group, AWS's interface layout, where RDMA read per type comes from). Rows marked `unverified` say why.

A few CPU-only types (no `gpu`, `gpus` 0: c7i, m7i, r7i sizes, for the data preparation around GPU work) are
rows like the others; `cpu_families` names the families whose CPU types `plan --live` and `up` read from EC2.

Each instance type's GPUs, vCPUs, memory and network (EFA, its interfaces, the network cards that carry it) are
EC2's own DescribeInstanceTypes facts (tests/test_instance_facts.py compares them with moto's copy); price,
NVSwitch and `efa_rdma` (the EFA device does RDMA read) are gpuprov's. `with_instance_facts` lays EC2's answer
over the catalog (`plan --live`, `up`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from gpuprov.errors import UserInputError
from gpuprov.plan import facts, gpu_names

if TYPE_CHECKING:
    from gpuprov.plan.stack import CpuArch

Precision = Literal["fp16", "bf16", "tf32", "fp32"]

# Every model here is defer_build: its validator is built when load() first reads catalog.yaml, not when a
# command merely imports the types (bootstrap, exec and check import them and mostly never read the file).


class Published(BaseModel):
    """NVIDIA's published figures for a GPU, the yardstick of `gpuprov bench`. TFLOP/s are dense (NVIDIA
    quotes tensor rates with 2:4 sparsity, marked *, at twice the dense rate); a precision missing from
    `dense_tflops` has no published figure. `nvlink_gbps` is NVIDIA's both-directions total per GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    variant: str
    dense_tflops: dict[Precision, float]
    memory_gbps: float
    nvlink_gbps: float | None = None
    pcie_gen: int
    source: str
    read: str
    unverified: str | None = None


class BenchRules(BaseModel):
    """What `gpuprov bench` calls ok: a fraction of the published figure per kind of measurement."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    thresholds: dict[Literal["matmul", "memory", "host", "allreduce"], float]
    pcie_x16_gbps: dict[int, float]
    pcie_source: str
    pcie_unverified: str | None = None


class Gpu(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    aliases: tuple[str, ...] = ()
    pci_device_ids: tuple[str, ...] = ()
    arch: str
    compute_capability: str
    memory_mib: int
    good_for: str
    unverified: str | None = None
    published: Published | None = None
    cpu_arch: Literal["x86_64", "aarch64"] | None = None  # the only CPU it comes with (GH200: Grace's aarch64)

    @property
    def sm(self) -> str:
        return "sm_" + self.compute_capability.replace(".", "")


class InstanceType(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    gpu: str | None = None  # None: a CPU-only type (EC2 describes no GpuInfo for it)
    gpus: int = 0
    vcpu: int
    ram_gib: int
    price_usd_hour: float | None
    nvswitch: bool | None = False  # None: not known (a type read from EC2 the catalog lacks): FM follows the host
    gpu_memory_mib: int | None = None
    # EC2's network facts (DescribeInstanceTypes NetworkInfo): EFA supported, its most interfaces, the network
    # cards, how many of them carry EFA and whether card 0 is one of them
    efa: bool = False
    efa_interfaces: int | None = None
    network_cards: int = 1
    efa_cards: int = 1
    efa_card0: bool = True
    efa_card_list: tuple[int, ...] | None = None  # EC2's own list of the cards with EFA (None: the count above)
    efa_rdma: bool = False  # the EFA device does RDMA read (catalog.yaml cluster_network.rdma_source)
    retired: str | None = None  # EC2 no longer describes it (why, with the source and date): never chosen
    arch: Literal["x86_64", "arm64"] = "x86_64"  # EC2's ProcessorInfo.SupportedArchitectures, as EC2 spells it
    # sold only inside this UltraServer, through Capacity Blocks (p6e-gb200: u-p6e-gb200x72): never on demand or spot
    ultraserver: str | None = None
    unverified: str | None = None

    @property
    def cpu_only(self) -> bool:
        return self.gpu is None

    def fits(self, vcpu: int, ram_gib: float) -> bool:
        """At least this many vCPUs and GiB of memory (what `--cpu N --memory GIB` asks for)."""
        return self.vcpu >= vcpu and self.ram_gib >= ram_gib

    @property
    def host_arch(self) -> CpuArch:
        """The architecture as the host's `uname -m` says it (aarch64 where EC2 says arm64)."""
        return "aarch64" if self.arch == "arm64" else self.arch

    def efa_card_indexes(self) -> tuple[int, ...]:
        """The network cards that carry an EFA interface, in order (none without EFA): EC2's list when it was read,
        else the snapshot's count from card 0 or 1."""
        if not self.efa:
            return ()
        if self.efa_card_list is not None:
            return tuple(sorted(self.efa_card_list))
        first = 0 if self.efa_card0 else 1
        return tuple(range(first, first + self.efa_cards))

    @property
    def family(self) -> str:
        """EC2 quota family: P instances and G/VT instances are counted separately."""
        return "P" if self.name.startswith("p") else "G"


class Storage(BaseModel):
    """What a stopped node's disk costs (EBS root volume), with where the number comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    volume_type: str
    usd_per_gb_month: float
    region: str
    source: str
    unverified: str | None = None

    def month(self, gb: int) -> float:
        return gb * self.usd_per_gb_month


class Interconnect(BaseModel):
    """What the all-reduce across nodes is judged against (cluster/check.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    efa_gbps: dict[str, int]  # instance type -> aggregate EFA bandwidth, Gbit/s
    efa_source: str
    efa_unverified: str | None = None
    min_fraction: float  # bus bandwidth at the largest message below this share of the line rate: far below
    min_fraction_unverified: str | None = None

class ClusterNetwork(BaseModel):
    """What `up --nodes N` needs to know per type: cluster placement group support and the EFA layout."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    read: str
    placement_source: str
    cluster_placement_families: tuple[str, ...]
    cluster_placement_unverified: dict[str, str] = {}
    interface_source: str
    rdma_source: str
    rdma_unverified: str | None = None

    def cluster_placement(self, instance_type: str) -> bool:
        return instance_type.split(".")[0] in self.cluster_placement_families


class Catalog(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    prices_as_of: str
    price_region: str
    gpus: tuple[Gpu, ...]
    instance_types: tuple[InstanceType, ...]
    regions: tuple[str, ...]
    storage: Storage | None  # None: no disk price is known on this cloud (`storage_unknown` says why)
    interconnect: Interconnect
    bench: BenchRules
    cluster_network: ClusterNetwork
    # types EC2 describes whose GPU is in neither the catalog nor gpu_names' table: type -> EC2's GPU name
    unplannable: dict[str, str] = {}
    # types EC2 describes with a fraction of one GPU (g6f, gr6f): type -> what it carries; never planned
    fractional: dict[str, str] = {}
    # CPU-only families whose types EC2's answer brings in (`--cpu`, `--instance-type c7i.8xlarge`)
    cpu_families: tuple[str, ...] = ()
    # the cloud whose types these are (plan/catalog_alibaba.py makes Alibaba Cloud's), its default region, the OSes
    # its images give (none: any gpuprov knows), and why no price is known (None: the types' prices are the list's)
    cloud: str = "aws"
    cloud_title: str = "AWS"
    default_region: str = "us-east-1"
    oses: tuple[str, ...] = ()
    prices_unknown: str | None = None
    # why the default driver branch is the default, in this cloud's words (None: AWS's, compat.DEFAULT_BRANCH_WHY)
    default_branch_why: str | None = None
    storage_unknown: str | None = None

    @model_validator(mode="after")
    def _known_gpus(self) -> Catalog:
        names = {g.name for g in self.gpus}
        if unknown := sorted({it.gpu for it in self.instance_types if it.gpu is not None} - names):
            raise ValueError(f"instance types name GPUs the catalog lacks: {', '.join(unknown)}")
        return self

    def with_instance_facts(self, read: dict[str, dict[str, Any]], when: datetime, where: str = "") -> Catalog:
        """This catalog with EC2's own facts per type laid over it (what `plan --live` and `up` read from EC2 in
        the region `where`): new GPUs from gpu_names' table, and the types EC2 did not describe there retired."""
        data = facts.merge_ec2(self.model_dump(), read, when, where)
        return self.model_copy(update={
            "gpus": tuple(Gpu.model_validate(g) for g in data["gpus"]),
            "instance_types": tuple(InstanceType.model_validate(r) for r in data["instance_types"]),
            "unplannable": data["unplannable"], "fractional": data["fractional"]})

    def check_region(self, region: str) -> str:
        if region in self.regions:
            return region
        close = difflib.get_close_matches(region, self.regions, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        examples = ", ".join(self.regions[:3]) if self.cloud != "aws" else "us-east-1, us-west-2, eu-west-1"
        raise UserInputError("--region", f"unknown {self.cloud_title} region {region!r}", f"{hint}e.g. {examples}")

    def gpu(self, name: str) -> Gpu:
        """The GPU called `name` (case-insensitive, aliases allowed), or a UserInputError naming close ones."""
        key = normalise_name(name)
        for gpu in self.gpus:
            if key == normalise_name(gpu.name) or key in (normalise_name(a) for a in gpu.aliases):
                return gpu
        if carried := sorted(t for t, g in self.unplannable.items() if normalise_name(g) == key):
            raise UserInputError("--gpu", gpu_names.refusal(", ".join(carried), self.unplannable[carried[0]]))
        known = [g.name for g in self.gpus]
        close = difflib.get_close_matches(name.upper(), known, n=3, cutoff=0.4)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise UserInputError("--gpu", f"unknown GPU {name!r}", f"{hint}Known GPUs: {', '.join(known)}.")

    def only(self, names: Sequence[str]) -> Catalog:
        """This catalog narrowed to the GPUs named (each as `gpu` takes it, count allowed: H100:8); all when none."""
        if not names:
            return self
        try:
            wanted = {self.gpu(parse_gpu_request(name)[0]).name for name in names}
        except UserInputError as exc:
            raise UserInputError("GPU", exc.problem, exc.hint) from None
        gpus = tuple(g for g in self.gpus if g.name in wanted)
        return self.model_copy(update={"gpus": gpus,
                                       "instance_types": tuple(it for it in self.instance_types if it.gpu in wanted)})

    def instance_types_for(self, gpu: Gpu) -> list[InstanceType]:
        return [it for it in self.instance_types if it.gpu == gpu.name]

    def launchable_for(self, gpu: Gpu) -> list[InstanceType]:
        """The types carrying this GPU that EC2 still describes: a retired type is never chosen."""
        return [it for it in self.instance_types_for(gpu) if not it.retired]

    def cpu_types(self) -> list[InstanceType]:
        """The CPU-only types EC2 still describes (`up --cpu N --memory GIB` chooses among them)."""
        return [it for it in self.instance_types if it.cpu_only and not it.retired]

    def instance_type(self, name: str) -> InstanceType:
        for it in self.instance_types:
            if it.name == name:
                return it
        if name in self.unplannable:
            raise UserInputError("--instance-type", gpu_names.refusal(name, self.unplannable[name]))
        if name in self.fractional:
            raise UserInputError("--instance-type", f"{name} carries {self.fractional[name]}: a fractional GPU needs "
                                 "NVIDIA's vGPU (GRID) driver, which gpuprov does not install", "a type with whole GPUs")
        close = difflib.get_close_matches(name, [it.name for it in self.instance_types], n=3)
        raise UserInputError(
            "--instance-type", f"unknown instance type {name!r}", f"close: {', '.join(close) or 'none'}"
        )


def normalise_name(name: str) -> str:
    return re.sub(r"[\s_]", "-", name.strip().lower())


def parse_gpu_request(text: str) -> tuple[str, int]:
    """Split 'A100:8' into ('A100', 8); a bare name means one GPU."""
    name, sep, count = text.partition(":")
    if not sep:
        return name, 1
    if not count.isdigit() or int(count) < 1:
        raise UserInputError("--gpu", f"{text!r}: the count after ':' must be a whole number ≥ 1", "e.g. A100:8")
    return name, int(count)


@cache
def load() -> Catalog:
    """catalog.yaml with the instance types `gpuprov facts refresh` read from EC2 laid over it (plan/facts.py)."""
    return Catalog.model_validate(facts.merged("catalog.yaml"))
