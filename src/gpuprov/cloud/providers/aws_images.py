"""Baked images and public ones: the SSM parameters that name AMIs, CreateImage with its tags, listing,
waiting and removal (image and snapshots). cloud/images.py decides; this makes the calls.

`create_image` tags the image and its snapshots; `images` by id or name (a `deregistered` one EC2 still lists is
left out); `wait_image` through pending; `delete_image` is DeregisterImage then DeleteSnapshot; `public_image` and
`os_image` read SSM parameters or the publisher's account and name pattern.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuprov.cloud.providers.aws_base import NOT_FOUND, AwsBase, AwsError, tag_value
from gpuprov.cloud.providers.base import (
    IMAGES,
    TAG_IMAGE,
    TAG_MEMBER,
    TAG_OS,
    TAG_OWNER,
    TAG_SOURCE,
    TAG_STACK,
    Image,
    ImageCopy,
    ImageRequest,
    NotFound,
)
from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.settings import settings

IMAGE_SETTLE = 60.0  # seconds an image seen in a listing may still answer NotFound by id


class AwsImages(AwsBase):
    def public_image(self, region: str, parameter: str) -> str | None:
        ssm = self._client("ssm", region)
        try:
            reply = self._call("ssm:GetParameter", functools.partial(ssm.get_parameter, Name=parameter))
        except AwsError as exc:
            if exc.code != "ParameterNotFound":
                raise
            return None
        return str(reply["Parameter"]["Value"])

    def os_image(self, region: str, os_name: str, arch: str = "x86_64") -> str:
        """The current image of a non-Ubuntu OS (data/os.yaml `aws`) for `arch` (x86_64, arm64): its public SSM
        parameter (the arm64 one named as its publisher names it: oses.ssm_for_arch), else the newest available image
        of that architecture of its publisher's account whose name matches. GPUPROV_TEST_PUBLIC_SSM_ROOT stands in for
        /aws/service (the tests' fake AWS, where no one may write under /aws)."""
        from gpuprov.plan import oses

        image = oses.info(os_name).aws
        hint = "pass --image ami-... of that OS, and its login user with --ssh-user"
        if image is None:
            raise UserInputError("--os", f"gpuprov knows no EC2 image of {os_name}", hint)
        if image.ssm:
            root = settings().test_public_ssm_root or "/aws/service"
            name = root + oses.ssm_for_arch(image.ssm, arch).removeprefix("/aws/service")
            found = self.public_image(region, name)
            if found is None:
                raise UserInputError("--os", f"no {os_name} {arch} image published in {region} (looked up {name})", hint)
            return found
        ec2 = self._client("ec2", region)
        filters = [{"Name": "name", "Values": [str(image.name)]}, {"Name": "architecture", "Values": [arch]},
                   {"Name": "state", "Values": ["available"]}]
        reply = self._call("DescribeImages", lambda: ec2.describe_images(Owners=[str(image.owner)], Filters=filters))
        newest = sorted(reply["Images"], key=lambda i: str(i.get("CreationDate", "")))
        if not newest:
            raise UserInputError("--os", f"no {os_name} {arch} image in {region} (account {image.owner}, name {image.name})",
                                 hint)
        return str(newest[-1]["ImageId"])

    def image_architecture(self, region: str, image_id: str) -> str | None:
        ec2 = self._client("ec2", region)
        try:
            images = self._call("DescribeImages", lambda: ec2.describe_images(ImageIds=[image_id]))["Images"]
        except AwsError as exc:
            raise UserInputError("--image", f"{image_id}: {exc.code}: {exc.message}") from None
        return str(images[0].get("Architecture")) if images else None

    def create_image(self, request: ImageRequest) -> str:
        """CreateImage with NoReboot false unless asked: EC2 then stops the instance, snapshots its volumes at
        rest and starts it again; with NoReboot EC2 "can't guarantee the file system integrity of the created
        image" (EC2 API reference, CreateImage). No ClientToken exists for CreateImage: a retry whose first
        answer was lost meets InvalidAMIName.Duplicate, and the name (unique per account and region) finds it."""
        ec2 = self._client("ec2", request.region)
        extra = {TAG_STACK: request.stack, TAG_OS: request.os, TAG_SOURCE: request.source_node}
        specs = [{"ResourceType": "image", "Tags": self._tags(IMAGES, {**extra, "Name": request.name})},
                 {"ResourceType": "snapshot", "Tags": self._tags(IMAGES, {TAG_IMAGE: request.name, "Name": request.name})}]
        try:
            reply = self._call("CreateImage", lambda: ec2.create_image(
                InstanceId=request.instance_id, Name=request.name, Description=request.description,
                NoReboot=request.no_reboot, TagSpecifications=specs))
        except AwsError as exc:
            if exc.code != "InvalidAMIName.Duplicate":
                raise
            mine = self.images(request.region, name=request.name)
            if not mine:
                raise UserInputError("--name", f"an image called {request.name!r} already exists in {request.region} "
                                     "and is not one of yours", "pick another --name") from None
            return mine[0].id
        return str(reply["ImageId"])

    def copy_image(self, request: ImageCopy) -> str:
        """CopyImage, asked in the destination region ("The copy operation must be initiated in the destination
        Region"), with TagSpecifications for the new AMI and its new snapshots (user tags are not copied unless
        CopyImageTags) and a ClientToken: a retry whose first answer was lost gets the first copy's id (EC2 API
        reference, CopyImage, and SDK docs of CopyImageRequest)."""
        ec2 = self._client("ec2", request.region)
        extra = {TAG_STACK: "start-move", TAG_SOURCE: request.source_node}
        specs = [{"ResourceType": "image", "Tags": self._tags(IMAGES, {**extra, "Name": request.name})},
                 {"ResourceType": "snapshot", "Tags": self._tags(IMAGES, {TAG_IMAGE: request.name, "Name": request.name})}]
        reply = self._call("CopyImage", lambda: ec2.copy_image(
            SourceRegion=request.source_region, SourceImageId=request.source_image_id, Name=request.name,
            Description=request.description, ClientToken=request.client_token, TagSpecifications=specs))
        return str(reply["ImageId"])

    def images(self, region: str, *, ids: Sequence[str] = (), name: str | None = None,
               everyone: bool = False) -> list[Image]:
        """Every page of them; a deregistered image is left out: EC2 still lists one for a while (DescribeImages:
        "Recently deregistered images appear in the returned results for a short interval")."""
        ec2 = self._client("ec2", region)
        filters = self._owned(everyone)
        if ids:
            filters = [*filters, {"Name": "image-id", "Values": list(ids)}]
        if name is not None:
            filters = [*filters, {"Name": "name", "Values": [name]}]
        raws = self._pages(ec2, "DescribeImages", "Images", Owners=["self"], Filters=filters)
        found = (_image(raw, region) for raw in raws)
        return sorted((i for i in found if i.state != "deregistered"), key=lambda i: i.created or "")

    def wait_image(self, region: str, image_id: str, timeout: float, settle: float,
                   progress: Callable[[Image, float], None] | None = None) -> Image:
        """Poll DescribeImages by id (a fresh id may answer NotFound for `settle` seconds) until available."""
        ec2 = self._client("ec2", region)
        started = time.monotonic()
        while True:
            reply = self._settle("DescribeImages", lambda: ec2.describe_images(ImageIds=[image_id]), "image",
                                 image_id, settle)
            if not reply["Images"]:
                raise NotFound("image", image_id, NOT_FOUND["image"])
            image = _image(reply["Images"][0], region)
            waited = time.monotonic() - started
            if progress is not None:
                progress(image, waited)
            if image.state == "available":
                return image
            if image.state in ("failed", "error", "invalid", "deregistered", "disabled"):
                raise GpuprovError(f"image {image_id} is {image.state}: {image.state_reason or 'no reason given'}")
            if waited > timeout:
                raise GpuprovError(f"image {image_id} still {image.state} after {timeout:.0f}s; "
                                   f"`gpuprov image list` shows when it is ready")
            time.sleep(self.poll)

    def delete_image(self, region: str, image_id: str, settle: float = 0) -> list[str]:
        """Deregister first (a registered image's snapshots cannot be deleted), then its snapshots. The image is
        found by a filter (an unknown id is absent, not an error); one listed there that answers NotFound by id
        is too new for EC2's by-id look-ups yet, and is asked again for IMAGE_SETTLE seconds."""
        ec2 = self._client("ec2", region)
        listed = self.images(region, ids=[image_id])
        if not listed:
            raise NotFound("image", image_id, NOT_FOUND["image"])
        self._settle("DeregisterImage", lambda: ec2.deregister_image(ImageId=image_id), "image", image_id,
                     max(settle, IMAGE_SETTLE))
        removed = [f"image {image_id}"]
        for snap in listed[0].snapshot_ids:
            try:
                self._while_in_use(lambda snap=snap: self._settle(  # type: ignore[misc]
                    "DeleteSnapshot", lambda: ec2.delete_snapshot(SnapshotId=snap), "snapshot", snap, settle))
            except NotFound:
                continue
            removed.append(f"snapshot {snap}")
        return removed


def _image(raw: dict[str, Any], region: str) -> Image:
    ebs = [m["Ebs"] for m in raw.get("BlockDeviceMappings") or [] if "Ebs" in m]
    sizes = [int(e["VolumeSize"]) for e in ebs if e.get("VolumeSize") is not None]
    return Image(
        id=raw["ImageId"], name=str(raw.get("Name") or ""), region=region, state=str(raw.get("State") or "unknown"),
        architecture=raw.get("Architecture"), created=raw.get("CreationDate"),
        snapshot_ids=tuple(e["SnapshotId"] for e in ebs if e.get("SnapshotId")), size_gb=sum(sizes) if sizes else None,
        stack=tag_value(raw, TAG_STACK), os=tag_value(raw, TAG_OS), source_node=tag_value(raw, TAG_SOURCE),
        owner=tag_value(raw, TAG_OWNER), member=tag_value(raw, TAG_MEMBER),
        state_reason=(raw.get("StateReason") or {}).get("Message"),
    )
