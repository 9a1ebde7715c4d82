"""The provider protocol: the handful of typed operations lifecycle.py needs from a cloud.

Every operation that creates something records it in the Store first (with its ClientToken or
name) and tags it `gpuprov:node` / `gpuprov:owner`, so nothing it makes can be lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from gpuprov.errors import GpuprovError

Market = Literal["spot", "on-demand"]
TAG_NODE = "gpuprov:node"
TAG_OWNER = "gpuprov:owner"
SHARED = "(shared)"  # gpuprov:node value of resources several nodes use (the key pair)


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
    volume_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Access:
    """What a node needs before launch: the key pair's name and the node's security group."""

    key_name: str
    key_path: str
    security_group_id: str
    subnet_id: str | None


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


class LaunchError(GpuprovError):
    """A refused launch, with the cloud's own error code and message."""

    def __init__(self, kind: Literal["capacity", "quota", "auth", "input", "other"], code: str, message: str) -> None:
        self.kind = kind
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


class Provider(Protocol):
    name: str

    def offerings(self, region: str, instance_types: Sequence[str]) -> dict[str, list[str]]:
        """Zones that offer each instance type (types offered nowhere are absent)."""
        ...

    def image(self, region: str, os_name: str) -> str: ...

    def network(self, region: str, subnet: str | None) -> tuple[str, str | None]:
        """(VPC id, zone the subnet pins or None) for a launch."""
        ...

    def prepare(self, node: str, region: str, vpc: str, subnet: str | None, ssh_cidr: str) -> Access:
        """Key pair (shared per user and region) and the node's own security group."""
        ...

    def launch(self, request: LaunchRequest) -> Instance: ...

    def describe(self, region: str, *, ids: Sequence[str] = (), node: str | None = None) -> list[Instance]: ...

    def wait_running(self, region: str, instance_id: str, timeout: float) -> Instance: ...

    def terminate(self, node: str, region: str) -> list[str]:
        """Terminate the node's instances and remove everything else it owns; returns what was removed."""
        ...

    def release_key(self, region: str) -> None:
        """Delete the shared key pair (when no node in the region uses it any more)."""
        ...

    def tagged(self, region: str) -> list[CloudResource]:
        """Every live resource in the region tagged with this user's gpuprov:owner."""
        ...

    def delete(self, resource: CloudResource) -> None: ...

    def prices(self, region: str, instance_types: Sequence[str]) -> list[SpotPrice]: ...

    def quota(self, region: str, code: str) -> float | None: ...
