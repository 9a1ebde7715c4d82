"""The provider protocol: the handful of typed operations cloud/ needs from a cloud.

A provider makes and removes machines and knows nothing of local state or SSH: cloud/ (launch.py,
node.py, cluster_up.py) records each resource (with its ClientToken or name) before it asks the provider to create it.
Every resource is tagged `gpuprov:node` / `gpuprov:owner`, so nothing it makes can be lost.

Clouds are eventually consistent: a resource created a moment ago can answer "not found".
Operations that take an id therefore accept `settle`, the seconds during which a NotFound is
looked at again (with backoff) before it counts; they raise `NotFound` after that.

`Provider` is the core every cloud implements; what only some clouds do (cluster placement, static addresses,
instance roles, reservations and blocks, object storage, image copy) is a capability in capabilities.py.

The typed records: `Instance`, `Network`, `Access`, `LaunchRequest`, `SpotPrice`, `CloudResource`, `LaunchError`
(with what the failover does next) and `NotFound`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from gpuprov.errors import GpuprovError
from gpuprov.kinds import ResourceKind as ResourceKind  # the records' kinds too: named once, on the ground floor

Market = Literal["spot", "on-demand"]
Then = Literal["next-candidate", "next-market", "stop", "retry"]
InterfaceType = Literal["interface", "efa", "efa-only"]
TAG_NODE = "gpuprov:node"
TAG_OWNER = "gpuprov:owner"
TAG_TEAM = "gpuprov:team"  # team state: the bucket/prefix whose shared records own it (cloud/tags.py)
TAG_MEMBER = "gpuprov:member"  # ... and the member (user@host/ID) who made it
SHARED = "(shared)"  # gpuprov:node value of resources several nodes use (the key pair)
GLOBAL = "global"  # the region of what a cloud keeps in no region (Alibaba Cloud's RAM role: capabilities.STOP_ROLE)
# Baked images outlive the node they were made from: their gpuprov:node is IMAGES (no node name can be it, so
# `down NODE` never takes them); the node they came from is in gpuprov:source-node.
IMAGES = "(image)"
TAG_STACK = "gpuprov:stack"  # the stack hash of the steps on a baked image (cloud/images.py `stack_hash`)
TAG_OS = "gpuprov:os"
TAG_SOURCE = "gpuprov:source-node"
TAG_IMAGE = "gpuprov:image"  # on a baked image's snapshots: the image's name (its id is not known at the call)

@dataclass(frozen=True)
class Instance:
    id: str
    region: str
    zone: str | None
    instance_type: str
    state: str  # pending | running | shutting-down | terminated | stopping | stopped
    market: Market
    public_ip: str | None
    private_ip: str | None
    launched_at: datetime | None
    state_reason: str | None = None
    node: str | None = None
    spot_request_id: str | None = None
    state_code: str | None = None  # StateReason.Code: Server.SpotInstanceShutdown, Client.UserInitiatedShutdown …
    volume_ids: tuple[str, ...] = ()
    owner: str | None = None  # its gpuprov:owner tag
    ipv6: str | None = None  # the primary interface's IPv6 address, when it has one
    primary_interface: str | None = None  # the interface at network card 0, device 0 (an Elastic IP goes there)
    team: str | None = None  # its gpuprov:team tag: a team's records own it, not this install's file
    member: str | None = None  # its gpuprov:member tag: who of the team made it
    subnet_id: str | None = None  # where it was launched: a move goes to a subnet of the same VPC (cloud/move.py)
    vpc_id: str | None = None


@dataclass(frozen=True)
class Network:
    """Where a node launches: the VPC (and its CIDR), and the subnet's zone when one is pinned."""

    vpc_id: str
    vpc_cidr: str
    subnet_id: str | None = None
    zone: str | None = None
    maps_public_ip: bool = True  # the subnet gives new instances a public address by itself
    ipv6: bool = False  # the subnet (without one pinned: every default subnet) has an IPv6 CIDR block
    default_for_az: bool = False  # the subnet is its zone's default one (of the default VPC)
    free_addresses: int = 0  # the subnet's AvailableIpAddressCount
    own: bool = False  # the region has no default VPC: gpuprov's own is found or made (capabilities.OWN_NETWORK)
    zones: tuple[str, ...] = ()  # own: the zones the launch may try, each to get its own subnet before the launch


@dataclass(frozen=True)
class ImageRoot:
    """An image's root device and the size of its root snapshot (a root volume is at least that big)."""

    device: str
    size_gb: int | None
    architecture: str | None = None  # EC2's Architecture: x86_64, arm64 (None: not said)


@dataclass(frozen=True)
class InstanceStore:
    """A type's instance-store disks (NVMe on the GPU types that have them): lost when the instance stops."""

    total_gb: int
    disks: tuple[tuple[int, int], ...]  # (count, GB each)


@dataclass(frozen=True)
class Access:
    """What a node needs before launch: the key pair's name and the node's security group."""

    key_name: str
    security_group_id: str
    subnet_id: str | None
    public_ip: bool = False  # ask for a public address (the subnet does not give one by itself)
    ipv6: bool = False  # ask for an IPv6 address on the primary interface (SSH is open to an IPv6 CIDR)


@dataclass(frozen=True)
class InstanceTypeInfo:
    """What EC2's DescribeInstanceTypes says of one instance type (the fields gpuprov plans with)."""

    name: str
    gpu: str  # EC2's GPU name ("H100", "A100", "B200"); "" for a CPU-only type (gpus 0)
    gpu_manufacturer: str
    gpus: int
    gpu_memory_mib: int
    vcpu: int
    memory_mib: int
    efa: bool
    efa_interfaces: int | None
    network_cards: int
    efa_card_indexes: tuple[int, ...]  # the cards whose InterfaceTypes include "efa"
    network_performance: str
    cpu_archs: tuple[str, ...] = ()  # ProcessorInfo.SupportedArchitectures: x86_64, arm64
    gpu_partition: float = 1.0  # GpuPartitionSize: below 1 a fraction of one GPU (g6f, gr6f), Count 0


@dataclass(frozen=True)
class Nic:
    """One network interface asked for at launch: its network card, device index and type (ENA, EFA, EFA-only)."""

    card: int
    device: int
    kind: InterfaceType


@dataclass(frozen=True)
class LaunchRequest:
    node: str
    region: str
    zone: str
    instance_type: str
    market: Market
    image_id: str
    access: Access
    disk_gb: int
    client_token: str
    max_price: float | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    persistent: bool = False  # spot: a persistent request whose interruption behaviour is stop (so it can stop)
    spot_duration: int | None = None  # spot on Alibaba Cloud: the protection period in hours (None: the cloud's own)
    shutdown_behavior: str = "terminate"  # what `shutdown` on the node does: "stop" keeps the disk
    count: int = 1  # a cluster: this many instances of the type in the zone ...
    min_count: int = 1  # ... and at least this many, or none at all (EC2's MinCount)
    placement_group: str | None = None  # a cluster placement group's name
    interfaces: tuple[Nic, ...] = ()  # EFA interfaces; empty: one ENA interface as before
    instance_profile: str | None = None  # an IAM instance profile's name: the node's AWS credentials
    reservation: str | None = None  # a Capacity Reservation: "cr-…" (targeted) or "open" (any open one that matches)
    capacity_block: bool = False  # the reservation is a Capacity Block for ML (MarketType capacity-block)


@dataclass(frozen=True)
class Reservation:
    """A Capacity Reservation (DescribeCapacityReservations), a Capacity Block's included (kind "capacity-block")."""

    id: str
    instance_type: str
    zone: str
    total: int
    available: int
    state: str  # active | scheduled | expired | payment-pending | cancelled | … (EC2's CapacityReservationState)
    start: datetime | None
    end: datetime | None
    match: str = "open"  # InstanceMatchCriteria: open | targeted
    kind: str = "default"  # ReservationType: default | capacity-block
    block_id: str | None = None  # CapacityBlockId (cb-…)
    placement_group: str | None = None  # the cluster placement group it was made in (PlacementGroupArn's name)


class BlockUnknown(GpuprovError):
    """A Capacity Block purchase whose answer was lost, and no block of it listed yet: it may have been bought."""

    def __init__(self, offering: str, lost: str, settle: float) -> None:
        super().__init__(f"PurchaseCapacityBlock of {offering} got {lost}, and no block it bought is listed after "
                         f"{settle:.0f}s: it may not have been bought, or EC2 may list it later; it is not asked for "
                         "again\n  look: `gpuprov capacity list`; `gpuprov capacity buy` of it again looks first")


@dataclass(frozen=True)
class Purchase:
    """What PurchaseCapacityBlock bought; `lost` is set when its answer was lost and the block was found by its
    tags among the account's reservations (what was lost, said to the user)."""

    reservation: Reservation
    lost: str | None = None


@dataclass(frozen=True)
class BlockOffering:
    """A Capacity Block offering (DescribeCapacityBlockOfferings): what `capacity buy` purchases."""

    id: str
    instance_type: str
    zone: str
    count: int
    start: datetime
    end: datetime
    hours: int
    upfront_usd: float
    currency: str = "USD"


@dataclass(frozen=True)
class SpotPrice:
    instance_type: str
    zone: str
    price: float
    at: datetime | None


@dataclass(frozen=True)
class CloudResource:
    """Something tagged as ours in the cloud (for gc)."""

    kind: str
    id: str
    region: str
    node: str | None
    state: str = ""
    owner: str | None = None  # its gpuprov:owner tag (cloud/tags.py), where the listing read one
    team: str | None = None  # its gpuprov:team tag (team state), where the listing read one
    member: str | None = None  # its gpuprov:member tag (team state): who made it, as `gc` shows


@dataclass(frozen=True)
class Image:
    """An AMI as gpuprov sees it: a baked one (tags say its stack and OS) or a public one."""

    id: str
    name: str
    region: str
    state: str  # pending | available | failed | deregistered ...
    architecture: str | None = None  # x86_64 | arm64
    created: str | None = None  # EC2's CreationDate (ISO 8601)
    snapshot_ids: tuple[str, ...] = ()
    size_gb: int | None = None  # the sum of its snapshots' volume sizes
    stack: str | None = None
    os: str | None = None
    source_node: str | None = None
    owner: str | None = None
    state_reason: str | None = None
    member: str | None = None  # its gpuprov:member tag (team state)


@dataclass(frozen=True)
class ImageRequest:
    """One CreateImage: EC2 has no ClientToken for it; the name (unique per account and region) finds a lost one."""

    region: str
    instance_id: str
    name: str
    description: str
    source_node: str
    stack: str
    os: str
    no_reboot: bool = False


@dataclass(frozen=True)
class ImageCopy:
    """One CopyImage, asked in the destination region (EC2 API reference, CopyImage); the ClientToken makes a
    retry return the first copy, not a second one."""

    region: str  # where the copy goes
    source_region: str
    source_image_id: str
    name: str
    description: str
    source_node: str
    client_token: str


class LaunchError(GpuprovError):
    """A refused launch: the cloud's own error code and message, and what the failover does next."""

    def __init__(self, then: Then, code: str, message: str, fix: str = "", quota: bool = False) -> None:
        self.then = then
        self.code = code
        self.message = message
        self.fix = fix
        self.quota = quota
        super().__init__(f"{code}: {message}")


class NotFound(GpuprovError):
    """The cloud still says this resource does not exist after the settle time."""

    def __init__(self, kind: str, cloud_id: str, code: str) -> None:
        self.kind = kind
        self.cloud_id = cloud_id
        self.code = code
        super().__init__(f"{kind} {cloud_id}: {code}")


class Provider(Protocol):
    """The core every cloud implements; what only some clouds do is in capabilities.py, declared by name in
    `capabilities` and asked for through `capabilities.need`."""

    name: str  # the registry's name (providers/__init__.py CLOUDS), recorded with each node
    capabilities: frozenset[str]  # capabilities.py's flags this provider declares

    def offerings(self, region: str, instance_types: Sequence[str]) -> dict[str, list[str]]:
        """Zones that offer each instance type (types offered nowhere are absent)."""
        ...

    def image(self, region: str, os_name: str, arch: str = "x86_64") -> str:
        """The current public image of an OS for instances of this architecture (EC2's spelling: x86_64, arm64)."""
        ...

    def enabled_regions(self, region: str) -> list[str]:
        """The regions enabled for the account (opt-in regions it has not enabled left out), asked in `region`."""
        ...

    def network(self, region: str, subnet: str | None) -> Network: ...

    def subnets(self, region: str, vpc_id: str, zones: Sequence[str]) -> list[Network]:
        """The VPC's subnets in these zones, one Network each (subnet_id and zone set)."""
        ...

    def key_pair_exists(self, region: str, name: str) -> bool: ...

    def import_key_pair(self, region: str, name: str, public_key: str) -> str:
        """Import this user's public key (tagged as shared by the user's nodes); returns its id."""
        ...

    def delete_key_pair(self, region: str, name: str, settle: float = 0) -> None: ...

    def create_security_group(self, region: str, node: str, vpc: str, name: str, description: str) -> str: ...

    def find_security_group(self, region: str, name: str) -> str | None:
        """A group's id by its name (for a create whose answer was lost)."""
        ...

    def ssh_cidrs(self, region: str, group_id: str) -> list[str]:
        """The CIDRs a security group opens SSH (TCP 22) to."""
        ...

    def authorize_ssh(self, region: str, group_id: str, cidr: str, settle: float) -> None:
        """Open TCP 22 to `cidr` (IPv4 or IPv6)."""
        ...

    def launch(self, request: LaunchRequest, settle: float) -> Instance:
        """One launch request (raises LaunchError with what to do next)."""
        ...

    def image_root(self, region: str, image_id: str) -> ImageRoot:
        """The image's root device and root snapshot size (an unknown image is bad input)."""
        ...

    def instance_store(self, instance_type: str, region: str) -> InstanceStore | None:
        """The type's instance-store disks (None: it has none)."""
        ...

    def find_launched(self, region: str, client_token: str) -> list[Instance]:
        """Instances a launch with this ClientToken made (for a request whose answer was lost)."""
        ...

    def describe(self, region: str, ids: Sequence[str], settle: float = 0) -> list[Instance]: ...

    def instances(self, region: str, *, ids: Sequence[str] = (), node: str | None = None,
                  everyone: bool = False) -> list[Instance]:
        """Live instances by id or node tag (a filter: an unknown id is simply absent)."""
        ...

    def wait_running(self, region: str, instance_id: str, timeout: float, settle: float) -> Instance: ...

    def terminate(self, region: str, ids: Sequence[str], settle: float) -> None:
        """Ask for termination; raises NotFound when an id is unknown after `settle`."""
        ...

    def wait_terminated(self, region: str, ids: Sequence[str], timeout: float = 900) -> None: ...

    def stop(self, region: str, ids: Sequence[str], settle: float) -> None:
        """Ask for a stop (EBS kept); raises NotFound when an id is unknown after `settle`."""
        ...

    def wait_stopped(self, region: str, ids: Sequence[str], timeout: float = 900) -> list[Instance]: ...

    def start(self, region: str, ids: Sequence[str], settle: float) -> None:
        """Start stopped instances; a refusal (capacity, quota) raises LaunchError with the cloud's code."""
        ...

    def set_instance_type(self, region: str, instance_id: str, instance_type: str, settle: float) -> None:
        """Change a stopped instance's type (NotFound after `settle`; other refusals as GpuprovError)."""
        ...

    def delete(self, resource: CloudResource, settle: float = 0) -> None:
        """Delete one resource and return once the cloud accepted it; NotFound when already gone."""
        ...

    def tagged(self, region: str, everyone: bool = False) -> list[CloudResource]:
        """Every live resource in the region tagged with this install's gpuprov:owner (or the legacy one);
        `everyone`: also those of other installs with the same user and host name (for gc to set apart)."""
        ...

    def prices(self, region: str, instance_types: Sequence[str]) -> list[SpotPrice]: ...

    def gpu_instance_types(self, region: str) -> list[InstanceTypeInfo]:
        """Every instance type in the region, as DescribeInstanceTypes describes it: those with GPUs, and the CPU-only
        ones (no GPU name, 0 GPUs) that CPU-only nodes choose among (cloud/instance_facts.py keeps the families the
        catalog names)."""
        ...

    def public_image(self, region: str, parameter: str) -> str | None:
        """The AMI id a public SSM parameter names (None when the region has no such parameter)."""
        ...

    def create_image(self, request: ImageRequest) -> str:
        """CreateImage, the image and its snapshots tagged; returns the image id (a duplicate name: the
        existing image of that name, when it is this owner's)."""
        ...

    def images(self, region: str, *, ids: Sequence[str] = (), name: str | None = None,
               everyone: bool = False) -> list[Image]:
        """This owner's baked images (by id or name; an unknown id is simply absent)."""
        ...

    def wait_image(self, region: str, image_id: str, timeout: float, settle: float,
                   progress: Callable[[Image, float], None] | None = None) -> Image:
        """Until the image is available (raises on failed, or after `timeout`)."""
        ...

    def delete_image(self, region: str, image_id: str, settle: float = 0) -> list[str]:
        """DeregisterImage, then DeleteSnapshot of each of its snapshots; returns what was removed."""
        ...

    def quota(self, region: str, code: str) -> float | None: ...
