"""The walk on Alibaba Cloud: the ECS imitation (tests/alibaba/server.py) served in a thread of the test process, the
CLI's subprocesses pointed at it (GPUPROV_CLOUD=alibaba, GPUPROV_ALIBABA_ENDPOINT), its state the ground truth.

`EcsGround.cloud()` says what ECS holds in the shape the world's invariants read (`world.Cloud`, EC2's words), so each
rule is written once: an instance's status as EC2's state names (Pending and Starting are `pending`), the ClientToken
of the RunInstances that made it as ECS keeps it (its idempotence table, not gpuprov's token tag), its tags, its
private address. ECS's system disk is the instance's own (the imitation keeps no disk apart from its instance), so
there are no volumes; a custom image's snapshots are its block device mappings; a deployment set (untaggable: gpuprov
writes its tags in its description) is named by its id or its name.

Faults are the imitation's `Fault`s (a refusal with ECS's code and status, a lost answer); a held answer is a `hold`
fault, given out by `release()`. The imitation plays ECS's lag: a new instance is not listed for a moment after
RunInstances answers, and is Pending, then Running.
"""

from __future__ import annotations

import threading
from typing import Any

from tests.alibaba.server import Ecs, Fault
from tests.chaos.world import OWNER_TAG, Cloud

STATES = {"Pending": "pending", "Starting": "pending", "Running": "running", "Stopping": "stopping",
          "Stopped": "stopped"}
LISTING_DELAY = 0.3  # seconds a new instance is not listed (ECS's lag after RunInstances, `listing_delay`)
BOOT = 0.3  # seconds Pending, Starting or Stopping lasts


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


class EcsGround:
    """The ECS imitation `ecs`, served at `url`."""

    name = "alibaba"
    unset = ("ALIBABA_CLOUD_REGION_ID", "ALIBABA_CLOUD_PROFILE")

    def __init__(self, ecs: Ecs, url: str) -> None:
        self.ecs = ecs
        self.url = url
        self._holds = 0

    def reset(self) -> None:
        """A fresh account, as a fresh moto: the imitation's state made anew in place (its server keeps serving it)."""
        Ecs.__init__(self.ecs)
        self.ecs.listing_delay, self.ecs.boot = LISTING_DELAY, BOOT

    def env(self) -> dict[str, str]:
        return {"GPUPROV_CLOUD": "alibaba", "GPUPROV_ALIBABA_ENDPOINT": self.url,
                "ALIBABA_CLOUD_ACCESS_KEY_ID": "testing", "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "testing",
                "ALIBABA_CLOUD_ECS_METADATA_DISABLED": "true"}

    def fault(self, rule: dict[str, Any]) -> None:
        with self.ecs.lock:
            self.ecs.faults.append(Fault(**rule))

    def hold(self, action: str) -> int:
        """The next `action` is done and its answer kept until `release()`; returns what `holding` asks about."""
        with self.ecs.lock:
            self.ecs.faults.append(Fault(action, hold=True))
            self._holds = self.ecs.held
            return self._holds + 1

    def holding(self, hold: int) -> bool:
        return self.ecs.held >= hold

    def release(self) -> None:
        """The held answer goes out; the hold, met or not, is spent; a later hold waits again."""
        with self.ecs.lock:
            for fault in self.ecs.faults:
                if fault.hold:
                    fault.times = 0
            released, self.ecs.released = self.ecs.released, threading.Event()
        released.set()

    def cloud(self) -> Cloud:
        ecs, out = self.ecs, Cloud()
        with ecs.lock:
            ecs._advance()
            made_by = {iid: token for (kind, token), answer in ecs.tokens.items() if kind == "run"
                       for iid in answer["InstanceIdSets"]["InstanceIdSet"]}
            for iid, row in ecs.instances.items():
                if OWNER_TAG not in row.tags:
                    continue
                private = row.raw["VpcAttributes"]["PrivateIpAddress"]["IpAddress"]
                out.instances[iid] = {"InstanceId": iid, "State": {"Name": STATES[row.raw["Status"]]},
                                      "ClientToken": made_by.get(iid), "Tags": _tag_list(row.tags),
                                      "PrivateIpAddress": private[0] if private else None}
            ours = {kind: {rid for (k, rid), tags in ecs.tags.items() if k == kind and OWNER_TAG in tags}
                    for kind in ("securitygroup", "keypair", "image", "snapshot")}
            out.groups.update((gid, {"GroupId": gid, "GroupName": g["SecurityGroupName"],
                                     "Tags": _tag_list(ecs.tags[("securitygroup", gid)])})
                              for gid, g in ecs.groups.items() if gid in ours["securitygroup"])
            out.keys.update((name, {"KeyName": name, "Tags": _tag_list(ecs.tags[("keypair", name)])})
                            for name in ecs.keys if name in ours["keypair"])
            for aid, image in ecs.images.items():
                if aid in ours["image"]:
                    out.images[aid] = {"ImageId": aid, "Name": image["ImageName"],
                                       "Tags": _tag_list(ecs.tags[("image", aid)]),
                                       "BlockDeviceMappings": [{"Ebs": {"SnapshotId": m["SnapshotId"]}} for m in
                                                               image["DiskDeviceMappings"]["DiskDeviceMapping"]]}
            out.snapshots.update((sid, {"SnapshotId": sid, "Tags": _tag_list(ecs.tags[("snapshot", sid)])})
                                 for sid in ecs.snapshots if sid in ours["snapshot"])
            for sid, placed in ecs.sets.items():  # gpuprov's tags are in its description (untaggable)
                words = str(placed["DeploymentSetDescription"]).split()
                tags = dict(w.split("=", 1) for w in words if "=" in w)
                if OWNER_TAG in tags:
                    out.sets[sid] = {"Name": placed["DeploymentSetName"], "Tags": _tag_list(tags)}
        return out

    def reclaim(self, which: int) -> bool:
        """ECS takes back the `which`-th (modulo) running spot instance gpuprov made; False: none runs."""
        with self.ecs.lock:
            self.ecs._advance()
            spot = sorted(iid for iid, row in self.ecs.instances.items() if OWNER_TAG in row.tags
                          and row.raw["SpotStrategy"] != "NoSpot" and row.raw["Status"] == "Running")
            if not spot:
                return False
            self.ecs.reclaim(spot[which % len(spot)])
            return True
