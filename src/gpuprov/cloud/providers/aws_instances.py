"""EC2 instances: launch (RunInstances with the failover's request), describe, wait, terminate, stop, start,
resize. RunInstances goes through a client with retries off: EC2 answers a capacity refusal with HTTP 500,
which botocore would retry in the same zone; a throttled or failed request is sent again here with the
same ClientToken, which EC2 answers with the same instances instead of more.

Every instance gets IMDSv2 only, with a PUT response hop limit of 2: with the default 1 a container on the node
(the DLAMI ships Docker) gets no token, since the container's network is one more hop (EC2 user guide, "Retrieve
instance metadata": "in a container environment we recommend that you set the hop limit to 2").

RunInstances: spot one-time/terminate, or persistent/stop with `--persistent`, with a ClientToken; for a cluster
`launch_group` (MinCount/MaxCount, Placement.GroupName, the EFA NetworkInterfaces with NetworkCardIndex and
InterfaceType, and no public-IP request when there are several); tags on the instance, its volume and its spot
request; encrypted gp3 at least the image's root snapshot; InstanceInitiatedShutdownBehavior = the node's shutdown
action; a public IP on the interface when the subnet gives none; an instance profile looked up in IAM and passed
as IamInstanceProfile (InvalidParameterValue "Invalid IAM Instance Profile name" within the settle time is IAM's
propagation: sent again). Instances are also found by ClientToken. StartInstances has retries off like
RunInstances (capacity is a 500; a refusal is a `LaunchError` with AWS's code); resize is ModifyInstanceAttribute.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from gpuprov.cloud.providers.aws_base import AwsBase, AwsError, NoAnswer, tag_value
from gpuprov.cloud.providers.aws_refusals import classify
from gpuprov.cloud.providers.base import (
    TAG_MEMBER,
    TAG_NODE,
    TAG_OWNER,
    TAG_TEAM,
    Access,
    ImageRoot,
    Instance,
    LaunchError,
    LaunchRequest,
    Nic,
)
from gpuprov.errors import GpuprovError, UserInputError

# a fresh security group, key pair or placement group EC2 does not know yet (eventual consistency)
LAUNCH_REFERENCES = {"InvalidGroup.NotFound", "InvalidKeyPair.NotFound", "InvalidPlacementGroup.Unknown"}
# a launch that dies on its way (pending -> terminated) for want of capacity (botocore's StateReason codes)
CAPACITY_REASONS = ("Server.InsufficientInstanceCapacity", "Server.SpotInstanceTermination")
# IAM is eventually consistent: EC2 may not see a profile created moments ago yet (EC2 user guide, "IAM roles for
# Amazon EC2": "If your first attempt to launch an instance with a role fails, wait a few seconds before trying again")
FRESH_PROFILE = "Invalid IAM Instance Profile name"
RETRY_RUN_INSTANCES = 4  # attempts of one candidate on throttling / InternalError (same ClientToken)


class AwsInstances(AwsBase):
    def image_root(self, region: str, image_id: str) -> ImageRoot:
        ec2 = self._client("ec2", region)
        try:
            images = self._call("DescribeImages", lambda: ec2.describe_images(ImageIds=[image_id]))["Images"]
        except AwsError as exc:
            raise UserInputError("--image", f"{image_id}: {exc.code}: {exc.message}") from None
        if not images:
            raise UserInputError("--image", f"image {image_id} not found in {region}")
        device = str(images[0].get("RootDeviceName") or "/dev/sda1")
        sizes = [m["Ebs"].get("VolumeSize") for m in images[0].get("BlockDeviceMappings") or []
                 if m.get("DeviceName") == device and "Ebs" in m]
        return ImageRoot(device, int(sizes[0]) if sizes and sizes[0] is not None else None,
                         str(images[0]["Architecture"]) if images[0].get("Architecture") else None)

    def _run_kwargs(self, request: LaunchRequest) -> dict[str, Any]:
        specs = [
            {"ResourceType": "instance", "Tags": self._tags(request.node, dict(request.tags))},
            {"ResourceType": "volume", "Tags": self._tags(request.node)},
        ]
        access = request.access
        kwargs: dict[str, Any] = {
            "ImageId": request.image_id, "InstanceType": request.instance_type,
            # EC2 launches at least MinCount or nothing ("If you specify a value that is more capacity than Amazon
            # EC2 can provide in the target Availability Zone, Amazon EC2 does not launch any instances")
            "MinCount": request.min_count, "MaxCount": request.count,
            "KeyName": access.key_name, "ClientToken": request.client_token,
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 2},
            "InstanceInitiatedShutdownBehavior": request.shutdown_behavior,
            "BlockDeviceMappings": [{"DeviceName": self.image_root(request.region, request.image_id).device, "Ebs": {
                "VolumeSize": request.disk_gb, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}],
        }
        if request.instance_profile:
            kwargs["IamInstanceProfile"] = {"Name": request.instance_profile}
        if request.interfaces:  # EFA: every interface named (one card each); see catalog.yaml cluster_network
            kwargs["NetworkInterfaces"] = [_nic(nic, access, len(request.interfaces)) for nic in request.interfaces]
        elif access.public_ip:  # the subnet gives no public address by itself: ask for one on the interface
            kwargs["NetworkInterfaces"] = [{"DeviceIndex": 0, "SubnetId": access.subnet_id, "AssociatePublicIpAddress": True,
                                            "Groups": [access.security_group_id], "DeleteOnTermination": True}]
        else:
            kwargs["SecurityGroupIds"] = [access.security_group_id]
            if access.subnet_id:
                kwargs["SubnetId"] = access.subnet_id
        if access.ipv6:  # on the primary interface; EC2 takes the instance-level count only without interfaces
            primary = next((n for n in kwargs.get("NetworkInterfaces", []) if n.get("NetworkCardIndex", 0) == 0
                            and n["DeviceIndex"] == 0), None)
            (primary if primary is not None else kwargs)["Ipv6AddressCount"] = 1
        if not access.subnet_id:
            kwargs["Placement"] = {"AvailabilityZone": request.zone}
        if request.placement_group:
            kwargs.setdefault("Placement", {})["GroupName"] = request.placement_group
        if request.market == "spot":
            # one-time requests cannot stop (EC2 refuses StopInstances); persistent ones with interruption
            # behaviour stop can (EC2 guide, "Stop a Spot Instance")
            spot: dict[str, Any] = ({"SpotInstanceType": "persistent", "InstanceInterruptionBehavior": "stop"}
                                    if request.persistent else
                                    {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"})
            if request.max_price is not None:
                spot["MaxPrice"] = f"{request.max_price:.4f}"
            kwargs["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
            specs.append({"ResourceType": "spot-instances-request", "Tags": self._tags(request.node)})
        if request.reservation == "open":  # EC2's default, said out loud: any open reservation that matches
            kwargs["CapacityReservationSpecification"] = {"CapacityReservationPreference": "open"}
        elif request.reservation:  # targeted: the Target alone (a Preference beside it only as reservations-only)
            kwargs["CapacityReservationSpecification"] = {
                "CapacityReservationTarget": {"CapacityReservationId": request.reservation}}
        if request.capacity_block:  # EC2 guide, "Launch instances into Capacity Blocks": this market type + the id
            kwargs["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
        kwargs["TagSpecifications"] = specs
        return kwargs

    def launch(self, request: LaunchRequest, settle: float) -> Instance:
        return self.launch_group(request, settle)[0]

    def launch_group(self, request: LaunchRequest, settle: float) -> list[Instance]:
        """One RunInstances for one candidate, with retries off (see the module's docstring). A request
        naming a group or key EC2 does not know yet, and a throttled or failed request, is sent again with
        the same ClientToken, which EC2 answers with the same instances instead of more."""
        ec2 = self._client("ec2", request.region, retries=False)
        kwargs = self._run_kwargs(request)
        deadline = time.monotonic() + settle
        wait, tries = self.poll, 0
        while True:
            tries += 1
            try:
                reply = self._call("RunInstances", lambda: ec2.run_instances(**kwargs))
                return [_instance(raw, request.region) for raw in reply["Instances"]]
            except NoAnswer as exc:  # "If timeouts or connection errors occur, you can repeat the request" (EC2
                # API reference, idempotency): the same token makes nothing more; after the last try it stays in
                # doubt, and its record (intent kept) has teardown look for what it may have launched
                if tries >= RETRY_RUN_INSTANCES:
                    raise LaunchError("retry", "NoAnswer", str(exc)) from None
            except AwsError as exc:
                refusal = classify(exc.code, exc.message, request.market)
                fresh = _fresh_reference(exc) and time.monotonic() + wait < deadline
                if not (fresh or (refusal.then == "retry" and tries < RETRY_RUN_INSTANCES)):
                    raise LaunchError(refusal.then, exc.code, exc.message, refusal.fix, refusal.quota) from None
            time.sleep(wait)
            wait = min(wait * 2, self.poll * 8)

    def find_launched(self, region: str, client_token: str) -> list[Instance]:
        ec2 = self._client("ec2", region)
        pages = self._call("DescribeInstances", lambda: list(ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "client-token", "Values": [client_token]}])))
        return [_instance(raw, region) for page in pages for res in page["Reservations"] for raw in res["Instances"]]

    def describe(self, region: str, ids: Sequence[str], settle: float = 0) -> list[Instance]:
        ec2 = self._client("ec2", region)
        reply = self._settle("DescribeInstances", lambda: ec2.describe_instances(InstanceIds=list(ids)),
                             "instance", ", ".join(ids), settle)
        return [_instance(raw, region) for res in reply["Reservations"] for raw in res["Instances"]]

    def instances(self, region: str, *, ids: Sequence[str] = (), node: str | None = None,
                  everyone: bool = False) -> list[Instance]:
        ec2 = self._client("ec2", region)
        if ids:  # by id as a filter: an id EC2 does not know is absent instead of failing the whole call
            filters = [{"Name": "instance-id", "Values": list(ids)}]
        else:
            filters = self._owned(everyone) + ([{"Name": f"tag:{TAG_NODE}", "Values": [node]}] if node else [])
        reservations = self._pages(ec2, "DescribeInstances", "Reservations", Filters=filters)
        return [_instance(raw, region) for res in reservations for raw in res["Instances"]]

    def wait_running(self, region: str, instance_id: str, timeout: float, settle: float) -> Instance:
        deadline = time.monotonic() + timeout
        while True:
            (instance,) = self.describe(region, [instance_id], settle=settle)
            if instance.state == "running":
                return instance
            if instance.state in ("shutting-down", "terminated") and instance.state_code in CAPACITY_REASONS:
                # a spot instance EC2 had no capacity for after all: a refusal of this candidate, not a failure
                raise LaunchError("next-candidate", instance.state_code or "", instance.state_reason or "")
            if instance.state in ("shutting-down", "terminated", "stopped", "stopping"):
                raise GpuprovError(f"{instance_id} went {instance.state} while starting: {instance.state_reason}")
            if time.monotonic() > deadline:
                raise GpuprovError(f"{instance_id} still {instance.state} after {timeout:.0f}s")
            time.sleep(self.poll)

    def terminate(self, region: str, ids: Sequence[str], settle: float) -> None:
        ec2 = self._client("ec2", region)
        self._settle("TerminateInstances", lambda: ec2.terminate_instances(InstanceIds=list(ids)),
                     "instance", ", ".join(ids), settle)

    def wait_terminated(self, region: str, ids: Sequence[str], timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = {i.id: i.state for i in self.instances(region, ids=ids)}
            if all(states.get(i, "terminated") == "terminated" for i in ids):
                return
            if time.monotonic() > deadline:
                raise GpuprovError(f"instances {', '.join(ids)} not terminated after {timeout:.0f}s")
            time.sleep(self.poll)

    def stop(self, region: str, ids: Sequence[str], settle: float) -> None:
        ec2 = self._client("ec2", region)
        self._settle("StopInstances", lambda: ec2.stop_instances(InstanceIds=list(ids)),
                     "instance", ", ".join(ids), settle)

    def wait_stopped(self, region: str, ids: Sequence[str], timeout: float = 900) -> list[Instance]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.instances(region, ids=ids)
            if found and all(i.state in ("stopped", "terminated") for i in found):
                return found
            if time.monotonic() > deadline:
                states = ", ".join(f"{i.id} {i.state}" for i in found)
                raise GpuprovError(f"instances not stopped after {timeout:.0f}s: {states}")
            time.sleep(self.poll)

    def start(self, region: str, ids: Sequence[str], settle: float) -> None:
        """StartInstances with retries off, like RunInstances: EC2 answers capacity with HTTP 500, which
        botocore would retry; throttling and InternalError are asked again here (starting twice is harmless)."""
        ec2 = self._client("ec2", region, retries=False)
        tries = 0
        while True:
            tries += 1
            try:
                self._settle("StartInstances", lambda: ec2.start_instances(InstanceIds=list(ids)),
                             "instance", ", ".join(ids), settle)
                return
            except AwsError as exc:
                refusal = classify(exc.code, exc.message, "on-demand")
                if refusal.then != "retry" or tries >= RETRY_RUN_INSTANCES:
                    raise LaunchError(refusal.then, exc.code, exc.message, refusal.fix, refusal.quota) from None
            time.sleep(self.poll * tries)

    def set_instance_type(self, region: str, instance_id: str, instance_type: str, settle: float) -> None:
        ec2 = self._client("ec2", region)
        self._settle("ModifyInstanceAttribute", lambda: ec2.modify_instance_attribute(
            InstanceId=instance_id, InstanceType={"Value": instance_type}), "instance", instance_id, settle)


def _fresh_reference(exc: AwsError) -> bool:
    """A refusal that names something created moments ago that EC2 does not see yet: retried within the settle time."""
    return exc.code in LAUNCH_REFERENCES or (exc.code == "InvalidParameterValue" and FRESH_PROFILE in exc.message)


def _nic(nic: Nic, access: Access, count: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"NetworkCardIndex": nic.card, "DeviceIndex": nic.device, "InterfaceType": nic.kind,
                            "SubnetId": access.subnet_id, "Groups": [access.security_group_id],
                            "DeleteOnTermination": True}
    if access.public_ip and count == 1:  # EC2 refuses a public address when more than one interface is launched
        spec["AssociatePublicIpAddress"] = True
    return {k: v for k, v in spec.items() if v is not None}


def _instance(raw: dict[str, Any], region: str) -> Instance:
    volumes = tuple(m["Ebs"]["VolumeId"] for m in raw.get("BlockDeviceMappings") or [] if "Ebs" in m)
    # the primary interface is at network card 0, device 0 (EC2 API reference, InstanceNetworkInterfaceSpecification);
    # its IPv6 address from its own list (the instance-level Ipv6Address is filled only for a primary IPv6)
    primary = next((n for n in raw.get("NetworkInterfaces") or []
                    if ((n.get("Attachment") or {}).get("NetworkCardIndex", 0), (n.get("Attachment") or {}).get("DeviceIndex"))
                    == (0, 0)), None)
    v6 = sorted((primary or {}).get("Ipv6Addresses") or [], key=lambda a: not a.get("IsPrimaryIpv6"))
    return Instance(
        id=raw["InstanceId"], region=region, zone=(raw.get("Placement") or {}).get("AvailabilityZone"),
        instance_type=raw["InstanceType"], state=(raw.get("State") or {}).get("Name", "unknown"),
        market="spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand",
        public_ip=raw.get("PublicIpAddress"), private_ip=raw.get("PrivateIpAddress"), launched_at=raw.get("LaunchTime"),
        state_reason=(raw.get("StateReason") or {}).get("Message"), node=tag_value(raw),
        state_code=(raw.get("StateReason") or {}).get("Code"),
        spot_request_id=raw.get("SpotInstanceRequestId"), volume_ids=volumes, owner=tag_value(raw, TAG_OWNER),
        ipv6=raw.get("Ipv6Address") or (v6[0].get("Ipv6Address") if v6 else None),
        primary_interface=primary.get("NetworkInterfaceId") if primary else None, team=tag_value(raw, TAG_TEAM),
        member=tag_value(raw, TAG_MEMBER), subnet_id=raw.get("SubnetId"), vpc_id=raw.get("VpcId"),
    )
