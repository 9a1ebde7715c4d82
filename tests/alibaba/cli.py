"""Running the real `gpuprov` CLI against the ECS imitation, its launched nodes landing on real SSH test hosts.

`ali_env` is the CLI's environment (the imitation's endpoint and test credentials, set by `ecs_cloud`, and the same
test settings as against the EC2 imitation); `ali_site` makes the next instances the imitation launches answer on
the given SSH test hosts (its `address_for` seam; started again, an instance lands on its own host), each a fresh
T4 host that trusts gpuprov's key for the region, as cloud-init would on ECS. The hosts are `aws_hosts`' two: a
launched node is a launched node to them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.alibaba.server import Ecs
from tests.aws.cli import CLI_SETTINGS

EMPTY: dict[str, list[str]] = {"instances": [], "security_groups": [], "key_pairs": [], "images": [], "snapshots": [],
                               "deployment_sets": [], "networks": [], "ram": []}
REGION = "cn-hangzhou"


@pytest.fixture
def ali_env(ecs_cloud: Ecs, gp_home: Path) -> dict[str, str]:
    return {**os.environ, "GPUPROV_HOME": str(gp_home), "GPUPROV_CLOUD": "alibaba", **CLI_SETTINGS}


def ali_site(ecs: Ecs, pool: Any, gp_home: Path, hosts: Sequence[int] = (0,), region: str = REGION) -> None:
    """The next len(hosts) instances land on those pool hosts, in order; each host starts fresh (no gpuprov state,
    a T4 behind the shims) and trusts the region's gpuprov key."""
    for i in hosts:
        pool.exec_in(i, "rm -rf /var/lib/gpuprov/* /var/lib/gpuprov-shim/* /run/gpuprov-shim/*; "
                        "install -d -m 0755 /var/lib/gpuprov-shim/root; "
                        "echo 'export GPUPROV_SHIM_GPU=T4' > /var/lib/gpuprov-shim/env", check=True)
    keys = gp_home / "keys" / region
    if not keys.exists():
        keys.mkdir(parents=True)
        shutil.copy(pool.key_path, keys / "id_ed25519")
        shutil.copy(f"{pool.key_path}.pub", keys / "id_ed25519.pub")
    order: Iterator[int] = iter(hosts)
    landed: dict[str, int] = {}  # an instance started again (economical mode gave its address back) keeps its host

    def address_for(instance: dict[str, Any]) -> tuple[str, str]:
        host = landed.get(instance["InstanceId"])
        if host is None:
            host = landed[instance["InstanceId"]] = next(order)
        at = pool[host].address
        return at, at

    ecs.address_for = address_for


def leftovers(ecs: Ecs) -> dict[str, list[str]]:
    """What of gpuprov's is still in the imitation: instances not deleted, groups, key pairs, its own images, snapshots,
    deployment sets, VPCs and vSwitches (any but the default ones), RAM's roles and policies."""
    with ecs.lock:
        return {"instances": sorted(i for i, row in ecs.instances.items() if row.raw.get("Status") != "Deleted"),
                "security_groups": sorted(ecs.groups), "key_pairs": sorted(ecs.keys),
                "images": sorted(i for i, image in ecs.images.items() if image["ImageOwnerAlias"] == "self"),
                "snapshots": sorted(ecs.snapshots), "deployment_sets": sorted(ecs.sets),
                "networks": sorted([v["VpcId"] for v in ecs.vpcs if not v["IsDefault"]]
                                   + [s["VSwitchId"] for s in ecs.switches if not s["IsDefault"]]),
                "ram": sorted([f"role {r}" for r in ecs.ram.roles] + [f"policy {p}" for p in ecs.ram.policies])}
