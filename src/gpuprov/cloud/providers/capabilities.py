"""What some clouds do and others do not: each capability a small Protocol, asked for through `need`.

The core protocol (base.py `Provider`) is what every cloud implements. A capability is declared twice, on purpose:
by name in the provider's `capabilities` (what it offers) and by having the Protocol's methods (what mypy and
`isinstance` check). `need(provider, PLACEMENT, what="--nodes")` gives the provider back typed as `Placement`, or
refuses with one line saying that this cloud lacks it; `offered` gives None instead of refusing; `has(provider,
RDMA)` asks of a capability that is a flag, not methods (an RDMA fabric, stop modes). Live offers (stock per zone
and the pay-as-you-go price read from the cloud) are for a cloud whose shipped catalog has no price: Alibaba Cloud's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast, runtime_checkable

from gpuprov.errors import UserInputError

if TYPE_CHECKING:
    from gpuprov.cloud.providers.base import (
        BlockOffering,
        CloudResource,
        ImageCopy,
        Instance,
        LaunchRequest,
        Provider,
        Purchase,
        Reservation,
    )

@runtime_checkable
class Placement(Protocol):
    """Cluster placement: several instances launched together close to each other, talking freely."""

    def create_placement_group(self, region: str, node: str, name: str) -> str:
        """A cluster placement group called `name`, tagged with the node; returns its name."""
        ...

    def authorize_self(self, region: str, group_id: str, settle: float) -> None:
        """All traffic between members of the group, both ways (a cluster's nodes talk to each other)."""
        ...

    def launch_group(self, request: LaunchRequest, settle: float) -> list[Instance]:
        """One launch request for `count` instances in one zone: at least `min_count` of them, or none
        (LaunchError with what to do next)."""
        ...


@runtime_checkable
class Addresses(Protocol):
    """Static public addresses, held apart from any instance and put on one."""

    address_name: str  # what the cloud calls one, in what gpuprov says ("Elastic IP")

    def allocate_address(self, region: str, node: str, name: str) -> str:
        """An address tagged with the node and `name`; returns its allocation id."""
        ...

    def find_address(self, region: str, name: str) -> str | None:
        """An address's allocation id by its recorded name (an allocation whose answer was lost)."""
        ...

    def associate_address(self, region: str, allocation_id: str, instance_id: str, settle: float) -> str:
        """Put the address on the instance's primary interface; returns the public address."""
        ...

    def address_count(self, region: str) -> int:
        """Addresses the account holds in the region (they count against its quota)."""
        ...

    def check_room(self, region: str, nodes: int, types: Sequence[str]) -> None:
        """Refuse `nodes` more addresses (one a node of one of `types`) where they do not fit in the region's quota
        beside those the account holds: one line with the quota and the increase to ask for."""
        ...


@runtime_checkable
class Roles(Protocol):
    """Instance roles: the node's own cloud credentials, scoped by a policy."""

    def instance_profile_exists(self, region: str, name: str) -> bool | None:
        """Whether an instance profile of this name exists (None: the cloud would not say)."""
        ...

    def create_node_role(self, region: str, node: str, name: str, policy: dict[str, Any]) -> None:
        """A role the node's instances may assume, with this inline policy (`up --s3-access`)."""
        ...

    def create_node_profile(self, region: str, node: str, name: str, role: str) -> None:
        """An instance profile holding the role."""
        ...

    def tagged_iam(self, region: str, everyone: bool = False) -> list[CloudResource]:
        """Roles and instance profiles tagged as this owner's (`up --s3-access`), listed under `region`."""
        ...


@runtime_checkable
class Blocks(Protocol):
    """Capacity reserved ahead: reservations, and blocks bought for a fixed time."""

    def reservations(self, region: str, ids: Sequence[str] = ()) -> list[Reservation]:
        """The account's reservations (every page; by id: an unknown one is a UserInputError naming it)."""
        ...

    def block_offerings(self, region: str, instance_type: str, count: int, hours: int, start_after: datetime | None,
                        end_before: datetime | None) -> list[BlockOffering]:
        """The blocks offered, every page."""
        ...

    def purchase_block(self, region: str, offering_id: str, node: str, settle: float) -> Purchase:
        """Buy a block, tagged with `node`; it cannot be cancelled, so it is sent once: after a lost answer the block
        is looked for by its tags for up to `settle` seconds, and never asked for again here."""
        ...

    def find_block(self, region: str, node: str) -> Reservation | None:
        """The block a purchase tagged `node` bought, if the account has it."""
        ...


@runtime_checkable
class Storage(Protocol):
    """The cloud's object storage, as a playbook's `data:` entries name it."""

    def prefix_size(self, region: str, bucket: str, prefix: str) -> tuple[int, int]:
        """(objects, bytes) under the prefix (`plan --live` sizes a playbook's `data:` downloads)."""
        ...

    def bucket_key(self, region: str, bucket: str) -> str | None:
        """The customer-managed key the bucket encrypts new objects with by default (its id, for the role's
        policy); None when the bucket's encryption needs no grant."""
        ...


@runtime_checkable
class ImageCopying(Protocol):
    """An image copied into another region (`move --region`)."""

    def copy_image(self, request: ImageCopy) -> str:
        """The copy into request.region, it and its snapshots tagged as create_image tags; the new id."""
        ...


@dataclass(frozen=True)
class ListPrice:
    """A type's pay-as-you-go price as the cloud answered it when asked: the compute's and the system disk's, per
    hour, in the cloud's currency; `usd_hour` and `disk_usd_hour` are those in US dollars (None in another
    currency, or where the cloud priced no disk)."""

    instance_type: str
    price: float
    currency: str
    disk_price: float | None
    source: str  # the call that answered it ("Alibaba Cloud DescribePrice")
    at: datetime

    @property
    def usd_hour(self) -> float | None:
        return self.price if self.currency == "USD" else None

    @property
    def disk_usd_hour(self) -> float | None:
        return self.disk_price if self.currency == "USD" else None


@dataclass(frozen=True)
class DiskPrice:
    """What a disk of `gb` costs an hour as the cloud answered it when asked (compute or not: a stopped node's bill),
    in the cloud's currency; `usd_hour` is that in US dollars (None in another currency)."""

    gb: int
    price: float
    currency: str
    source: str  # the call that answered it ("Alibaba Cloud DescribePrice")
    at: datetime

    @property
    def usd_hour(self) -> float | None:
        return self.price if self.currency == "USD" else None


@dataclass(frozen=True)
class ZoneStock:
    """Whether a zone sells a type now, as the cloud says it (Alibaba's DescribeAvailableResource: Available with
    stock, or SoldOut)."""

    instance_type: str
    zone: str
    available: bool
    status: str  # the cloud's own word: "Available", "SoldOut"


@runtime_checkable
class LiveOffers(Protocol):
    """Stock and the pay-as-you-go price read from the cloud itself, where the shipped catalog has no price (the
    cloud is asked at launch and by `gpus --live`)."""

    def list_price(self, region: str, instance_type: str, *, zone: str | None = None,
                   disk_gb: int | None = None) -> ListPrice:
        """The type's price per hour now (with a system disk of `disk_gb`, priced apart)."""
        ...

    def disk_price(self, region: str, disk_gb: int, *, zone: str | None = None) -> DiskPrice:
        """A node's disk of `disk_gb` alone, per hour now: what a stopped node still costs."""
        ...

    def zone_stock(self, region: str, instance_types: Sequence[str]) -> list[ZoneStock]:
        """Each zone that lists one of the types, with its stock now (a zone that lists none is absent)."""
        ...


@runtime_checkable
class OwnNetwork(Protocol):
    """A network of gpuprov's own where the region has no default one: a VPC per owner and region and a subnet per
    zone, each named before it is made (the name the launch records, and the create's idempotency token), deleted
    through `Provider.delete` (kinds "vswitch", then "vpc") with the region's last node."""

    def own_vpc_name(self) -> str:
        ...

    def own_switch_name(self, zone: str) -> str:
        ...

    def create_own_vpc(self, region: str) -> tuple[str, str]:
        """The VPC (found by its name, else made), once usable: (its id, its CIDR)."""
        ...

    def create_own_switch(self, region: str, vpc_id: str, vpc_cidr: str, zone: str) -> str:
        """The zone's subnet of that VPC (found by its name, else made), once usable: its id."""
        ...

    def zones_without_default_subnet(self, region: str, zones: Sequence[str]) -> list[str]:
        """Those of `zones` with no default subnet (of the default VPC)."""
        ...


@runtime_checkable
class StopRole(Protocol):
    """An instance role of gpuprov's own, one per owner and shared by every node of the cloud, that lets a node's guards
    ask the cloud itself to stop its instance (Alibaba Cloud: a RAM role allowed StopInstances, for economical mode);
    deleted through `Provider.delete` (kind "ram-role") with the last node that uses it."""

    def stop_role_name(self) -> str:
        """The role's name: the launch records it before the role is made."""
        ...

    def has_stop_role(self) -> bool:
        """Whether the role is there now (a record of it may outlive it: deleted by hand)."""
        ...

    def create_stop_role(self) -> str:
        """The role and its policy, each found or made (a lost answer is looked for before it is asked again); its
        name."""
        ...

    def tagged_stop_roles(self, everyone: bool = False) -> list[CloudResource]:
        """This owner's stop roles (`everyone`: every install's with its user and host name), by their tags."""
        ...


C = TypeVar("C")


@dataclass(frozen=True)
class Capability(Generic[C]):
    """One capability: the name a provider declares in `capabilities`, how a refusal says it, and its Protocol
    (None: a flag with no methods of its own)."""

    flag: str
    words: str  # "error: --nodes: Alibaba Cloud has no cluster placement in gpuprov yet"
    protocol: type[Any] | None = None


PLACEMENT = Capability[Placement]("placement", "cluster placement", Placement)
RDMA = Capability[None]("rdma", "RDMA fabric")  # EFA interfaces in LaunchRequest.interfaces
ADDRESSES = Capability[Addresses]("addresses", "static public addresses", Addresses)
ROLES = Capability[Roles]("roles", "instance roles", Roles)
BLOCKS = Capability[Blocks]("reservations", "capacity reservations or blocks", Blocks)
STORAGE = Capability[Storage]("object-storage", "object storage for a playbook's data", Storage)
IMAGE_COPY = Capability[ImageCopying]("image-copy", "image copy across regions", ImageCopying)
STOP_MODES = Capability[None]("stop-modes", "stop modes")  # a spot request that stops on interruption
ALL = (PLACEMENT, RDMA, ADDRESSES, ROLES, BLOCKS, STORAGE, IMAGE_COPY, STOP_MODES)
# not in ALL, which AWS declares whole: AWS's list prices are its catalog's, read offline
LIVE_OFFERS = Capability[LiveOffers]("live-offers", "stock and list prices read from the cloud", LiveOffers)
# Not one of ALL, which AWS has every one of: every spot instance may be stopped, its disk kept, whatever it does
# when interrupted (ECS: a preemptible instance stops in economical mode as a pay-as-you-go one does). Without it
# only a spot request that stops on interruption can (STOP_MODES); EC2 only terminates a one-time spot instance.
SPOT_STOP = Capability[None]("spot-stop", "a stop of any spot instance")
# Not one of ALL: AWS launches into the default VPC or a subnet named, and refuses a region without one
OWN_NETWORK = Capability[OwnNetwork]("own-network", "network of gpuprov's own", OwnNetwork)
# Not one of ALL: on AWS a guard's shutdown is the stop itself (InstanceInitiatedShutdownBehavior), no role needed
STOP_ROLE = Capability[StopRole]("stop-role", "role for its guards' stop", StopRole)


def has(provider: Provider, capability: Capability[Any]) -> bool:
    """Whether the provider declares this capability (and, where it has methods, has them)."""
    if capability.flag not in getattr(provider, "capabilities", ()):  # a provider that says nothing declares none
        return False
    return capability.protocol is None or isinstance(provider, capability.protocol)


def need(provider: Provider, capability: Capability[C], *, what: str) -> C:
    """The provider as the capability, or one line naming `what` asked for it: this cloud lacks it."""
    if not has(provider, capability):
        raise UserInputError(what, f"{title(provider)} has no {capability.words} in gpuprov yet",
                             "choose a cloud that has it (--cloud), or leave the option out")
    return cast(C, provider)


def offered(provider: Provider, capability: Capability[C]) -> C | None:
    """The provider as the capability where it declares it, else None (for what is skipped, not refused, without
    it: gc's instance roles, `gpus --live`'s reservations)."""
    return cast(C, provider) if has(provider, capability) else None


def title(provider: Provider | str) -> str:
    """The cloud's name as people write it ("AWS", "Alibaba Cloud"), of a provider or of the name a node records."""
    from gpuprov.cloud.providers import title as named

    return named(provider if isinstance(provider, str) else provider.name)


def service(provider: Provider | str) -> str:
    """The cloud's machines' service as the cloud names it in its own rules ("EC2", "ECS")."""
    from gpuprov.cloud.providers import service as named

    return named(provider if isinstance(provider, str) else provider.name)
