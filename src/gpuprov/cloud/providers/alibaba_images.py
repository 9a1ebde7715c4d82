"""ECS images: a baked node's custom image (CreateImage with a ClientToken, tagged), listed, waited for and deleted
with its snapshots; the public images gpuprov launches from, found by name."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuprov.cloud.providers.alibaba_base import NOT_FOUND, EcsBase, EcsError, tags_of
from gpuprov.cloud.providers.base import (
    IMAGES,
    TAG_IMAGE,
    TAG_OS,
    TAG_OWNER,
    TAG_SOURCE,
    TAG_STACK,
    Image,
    ImageRequest,
    ImageRoot,
    NotFound,
)
from gpuprov.errors import GpuprovError, UserInputError

UBUNTU = {"ubuntu-22.04": "ubuntu_22_04", "ubuntu-24.04": "ubuntu_24_04"}  # ECS's public image names start so
# DescribeImages' Status, in the protocol's words
IMAGE_STATES = {"Available": "available", "Creating": "pending", "Waiting": "pending", "CreateFailed": "failed",
                "UnAvailable": "failed", "Deprecated": "deregistered"}


class EcsImages(EcsBase):

    def image(self, region: str, os_name: str, arch: str = "x86_64") -> str:
        prefix = UBUNTU.get(os_name)
        if prefix is None:
            raise UserInputError("--os", f"{os_name!r} has no Alibaba Cloud public image gpuprov knows",
                                 f"one of {', '.join(UBUNTU)}, or pass --image m-... explicitly")
        name = f"{prefix}_{'arm64' if arch == 'arm64' else 'x64'}"
        images = [i for i in self._pages(region, "DescribeImages", ("Images", "Image"), ImageOwnerAlias="system",
                                         OSType="linux", Status="Available")
                  if str(i.get("ImageName", "")).startswith(name)]
        if not images:
            raise UserInputError("--image", f"no public {name}* image in {region}", "pass --image m-... explicitly")
        return str(max(images, key=lambda i: str(i.get("CreationTime", "")))["ImageId"])

    def image_root(self, region: str, image_id: str) -> ImageRoot:
        images = self._pages(region, "DescribeImages", ("Images", "Image"), ImageId=image_id)
        if not images:
            raise UserInputError("--image", f"no image {image_id} in {region}", "an image id (m-... or a public one)")
        raw = images[0]
        arch = {"x86_64": "x86_64", "arm64": "arm64"}.get(str(raw.get("Architecture")))
        return ImageRoot(device="/dev/xvda", size_gb=int(raw.get("Size") or 0) or None, architecture=arch)

    def public_image(self, region: str, parameter: str) -> str | None:
        """ECS has no public parameter store: a public image's name (prefix) is looked up instead."""
        images = [i for i in self._pages(region, "DescribeImages", ("Images", "Image"), ImageOwnerAlias="system",
                                         Status="Available") if str(i.get("ImageName", "")).startswith(parameter)]
        return str(max(images, key=lambda i: str(i.get("CreationTime", "")))["ImageId"]) if images else None

    def create_image(self, request: ImageRequest) -> str:
        """CreateImage with a ClientToken made of its name (unique per account and region): a resend returns it.
        Then, unless `no_reboot`, the instance is stopped in standard mode (KeepCharging: its compute and public
        address kept) and started again. EC2's CreateImage reboots the instance and ECS's does not: it snapshots a
        running instance as it is ("Data cached in memory on a running instance may not be written to disk",
        CreateImage API reference, alibabacloud.com/help/en/ecs/api-createimage), and a bake relies on that boot
        (its clean-up ran `cloud-init clean` and `sync`: the next boot is a first boot, new host keys and the
        launch key back). A stopped instance (a `start --move` images its disk) is left stopped: its disk holds all it
        wrote, and a start would run, and bill, the instance its node's record calls stopped."""
        tags = self._tag_list(IMAGES, {TAG_STACK: request.stack, TAG_OS: request.os, TAG_SOURCE: request.source_node,
                                       TAG_IMAGE: request.name})
        reply = self._settle("instance", request.instance_id, 60, lambda: self._call(
            request.region, "CreateImage", InstanceId=request.instance_id, ImageName=request.name,
            Description=request.description, ClientToken=f"img-{request.name}"[:64], Tag=tags))
        if not request.no_reboot and self._status(request.region, request.instance_id) != "Stopped":
            self._reboot(request.region, request.instance_id)
        return str(reply["ImageId"])

    def _reboot(self, region: str, instance_id: str, timeout: float = 900) -> None:
        """Stopped in standard mode and started again, each seen in DescribeInstances (a RebootInstances answers
        at once, with nothing to say when the old boot is gone)."""
        self._call(region, "StopInstances", InstanceId=[instance_id], StoppedMode="KeepCharging")
        self._until(region, instance_id, "Stopped", timeout)
        self._call(region, "StartInstances", InstanceId=[instance_id])
        self._until(region, instance_id, "Running", timeout)

    def _status(self, region: str, instance_id: str) -> str | None:
        found = self._pages(region, "DescribeInstances", ("Instances", "Instance"), InstanceIds=f'["{instance_id}"]')
        return str(found[0].get("Status")) if found else None

    def _until(self, region: str, instance_id: str, status: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._status(region, instance_id) == status:
                return
            if time.monotonic() > deadline:
                raise GpuprovError(f"{instance_id} not {status.lower()} after {timeout:.0f}s")
            time.sleep(self.poll)

    def _image(self, region: str, raw: dict[str, Any]) -> Image:
        tags = tags_of(raw)
        disks = (raw.get("DiskDeviceMappings") or {}).get("DiskDeviceMapping") or []
        return Image(id=str(raw["ImageId"]), name=str(raw.get("ImageName", "")), region=region,
                     state=IMAGE_STATES.get(str(raw.get("Status")), str(raw.get("Status", "")).lower()),
                     architecture=raw.get("Architecture"), created=raw.get("CreationTime"),
                     snapshot_ids=tuple(str(d["SnapshotId"]) for d in disks if d.get("SnapshotId")),
                     size_gb=int(raw.get("Size") or 0) or None, stack=tags.get(TAG_STACK), os=tags.get(TAG_OS),
                     source_node=tags.get(TAG_SOURCE), owner=tags.get(TAG_OWNER), member=tags.get("gpuprov:member"))

    def images(self, region: str, *, ids: Sequence[str] = (), name: str | None = None,
               everyone: bool = False) -> list[Image]:
        params: dict[str, Any] = {"ImageOwnerAlias": "self", "Status": "Creating,Waiting,Available,CreateFailed"}
        if ids:
            params["ImageId"] = ",".join(ids)
        if name:
            params["ImageName"] = name
        found = self._pages(region, "DescribeImages", ("Images", "Image"), **params)
        # mine by all its tags: a team's by gpuprov:team, as every other resource of the team
        return [self._image(region, raw) for raw in found if ids or self._mine(tags_of(raw), everyone)]

    def wait_image(self, region: str, image_id: str, timeout: float, settle: float,
                   progress: Callable[[Image, float], None] | None = None) -> Image:
        start = time.monotonic()
        while True:
            found = self.images(region, ids=[image_id])
            if not found and time.monotonic() - start > settle:
                raise NotFound("image", image_id, "InvalidImageId.NotFound")
            if found:
                if progress:
                    progress(found[0], time.monotonic() - start)
                if found[0].state == "available":
                    return found[0]
                if found[0].state == "failed":
                    raise GpuprovError(f"image {image_id} failed: {found[0].state_reason or 'ECS gave no reason'}")
            if time.monotonic() - start > timeout:
                raise GpuprovError(f"image {image_id} not available after {timeout:.0f}s")
            time.sleep(self.poll)

    def delete_image(self, region: str, image_id: str, settle: float = 0) -> list[str]:
        """DeleteImage, then DeleteSnapshot of each of its snapshots (ECS keeps them otherwise)."""
        found = self.images(region, ids=[image_id])
        if not found:
            raise NotFound("image", image_id, "InvalidImageId.NotFound")
        self._call(region, "DeleteImage", ImageId=image_id, Force=True)
        removed = [image_id]
        for snapshot in found[0].snapshot_ids:
            try:
                self._call(region, "DeleteSnapshot", SnapshotId=snapshot)
                removed.append(snapshot)
            except EcsError as exc:
                if exc.code not in NOT_FOUND["snapshot"]:
                    raise
        return removed
