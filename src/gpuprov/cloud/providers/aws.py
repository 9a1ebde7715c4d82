"""AWS EC2 behind the provider protocol. boto3 is imported here only, when a command needs AWS.

Credentials, profile, region and endpoint come from the standard AWS chain (AWS_PROFILE,
AWS_REGION, ~/.aws, AWS_ENDPOINT_URL). Throttling and transient errors are retried by botocore's
standard retry mode; AWS_RETRY_MODE and AWS_MAX_ATTEMPTS keep their AWS meaning (AWS_MAX_ATTEMPTS
counts every attempt, the first included). RunInstances alone goes through a client with retries
off: EC2 answers a capacity refusal with HTTP 500, which botocore would retry in the same zone.

No botocore exception leaves this module: a refusal becomes `AwsError` (code and message),
`LaunchError` (with what the failover does next) or `NotFound` (after the settle time).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError, ProfileNotFound

from gpuprov.cloud.providers.aws_refusals import classify
from gpuprov.cloud.providers.base import (
    IMAGES,
    SHARED,
    TAG_IMAGE,
    TAG_NODE,
    TAG_OS,
    TAG_OWNER,
    TAG_SOURCE,
    TAG_STACK,
    Access,
    CloudResource,
    Image,
    ImageRequest,
    Instance,
    LaunchError,
    LaunchRequest,
    Network,
    Nic,
    NotFound,
    SpotPrice,
)
from gpuprov.errors import GpuprovError, UserInputError

T = TypeVar("T")

UBUNTU_SSM_PREFIX = "/aws/service/canonical/ubuntu/server"
CREDENTIAL_CODES = {"AuthFailure", "InvalidClientTokenId", "ExpiredToken", "SignatureDoesNotMatch",
                    "UnrecognizedClientException", "InvalidAccessKeyId"}
NOT_FOUND = {"instance": "InvalidInstanceID.NotFound", "security-group": "InvalidGroup.NotFound",
             "key-pair": "InvalidKeyPair.NotFound", "volume": "InvalidVolume.NotFound",
             "spot-request": "InvalidSpotInstanceRequestID.NotFound", "image": "InvalidAMIID.NotFound",
             "snapshot": "InvalidSnapshot.NotFound", "placement-group": "InvalidPlacementGroup.Unknown",
             "address": "InvalidAllocationID.NotFound"}
LAUNCH_REFERENCES = {"InvalidGroup.NotFound", "InvalidKeyPair.NotFound"}  # a fresh group or key not yet seen
IMAGE_SETTLE = 60.0  # seconds an image seen in a listing may still answer NotFound by id
RETRY_RUN_INSTANCES = 4  # attempts of one candidate on throttling / InternalError (same ClientToken)


class AwsError(GpuprovError):
    """EC2 (or another AWS service) refused a call: its code and message, and a fix where one is known."""

    def __init__(self, what: str, code: str, message: str, fix: str = "") -> None:
        self.what = what
        self.code = code
        self.message = message
        text = f"AWS refused {what}: {code}: {message}"
        super().__init__(text + (f"\n  fix: {fix}" if fix else ""))


def credentials_hint() -> str:
    return ("configure AWS credentials: `aws configure`, or AWS_PROFILE=<profile>, or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "Unknown"))


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", str(exc)))


def retry_config(attempts: int | None = None) -> Config:
    """botocore's retries as the AWS CLI reads them from the environment; `attempts` overrides the count."""
    total = attempts if attempts is not None else int(os.environ.get("AWS_MAX_ATTEMPTS") or 5)
    retries = {"mode": os.environ.get("AWS_RETRY_MODE") or "standard", "total_max_attempts": total}
    return Config(retries=retries, connect_timeout=10, read_timeout=60)  # type: ignore[arg-type]


class AwsProvider:
    name = "aws"

    def __init__(self, owner: str, *, poll: float = 2.0) -> None:
        self.owner = owner
        self.poll = poll
        self._lock = threading.Lock()
        self._session: Any = None
        self._clients: dict[tuple[str, str, bool], Any] = {}

    # --- plumbing ------------------------------------------------------------------------

    def _client(self, service: str, region: str, *, retries: bool = True) -> Any:
        # boto3 clients are thread-safe, sessions are not: build clients under a lock, then share them
        key = (service, region, retries)
        with self._lock:
            if key not in self._clients:
                if self._session is None:
                    try:
                        self._session = boto3.session.Session()
                    except ProfileNotFound as exc:
                        from gpuprov.cloud.region import profile_not_found

                        raise profile_not_found(str(exc.kwargs.get("profile", "?"))) from None
                config = retry_config() if retries else retry_config(attempts=1)
                self._clients[key] = self._session.client(service, region_name=region, config=config)
            return self._clients[key]

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one AWS call; every failure becomes a GpuprovError that says what to do."""
        try:
            return fn()
        except NoCredentialsError:
            raise UserInputError("AWS credentials", "none found", credentials_hint()) from None
        except NoRegionError:
            raise UserInputError("--region", "no AWS region set", "pass --region or set AWS_REGION") from None
        except ProfileNotFound as exc:
            from gpuprov.cloud.region import profile_not_found

            raise profile_not_found(str(exc.kwargs.get("profile", "?"))) from None
        except ClientError as exc:
            code, message = _code(exc), _message(exc)
            fix = credentials_hint() if code in CREDENTIAL_CODES else classify(code, message, "on-demand").fix
            raise AwsError(what, code, message, fix) from None
        except BotoCoreError as exc:  # no answer at all: endpoint unreachable, timeouts, bad config
            raise GpuprovError(f"AWS call {what} failed: {exc}") from None

    def _settle(self, what: str, fn: Callable[[], T], kind: str, cloud_id: str, settle: float) -> T:
        """`fn`, looking again (with backoff) while the resource answers NotFound within `settle` seconds:
        right after a create EC2 may not know the id yet (EC2 guide, "Eventual consistency")."""
        deadline = time.monotonic() + settle
        wait = self.poll
        while True:
            try:
                return self._call(what, fn)
            except AwsError as exc:
                if exc.code != NOT_FOUND.get(kind):
                    raise
                if time.monotonic() + wait > deadline:
                    raise NotFound(kind, cloud_id, exc.code) from None
                time.sleep(wait)
                wait = min(wait * 2, self.poll * 8)

    def _tags(self, node: str, extra: dict[str, str] | None = None) -> list[dict[str, str]]:
        tags = {TAG_NODE: node, TAG_OWNER: self.owner, "Name": f"gpuprov-{node}", **(extra or {})}
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    def _owned(self) -> list[dict[str, Any]]:
        return [{"Name": f"tag:{TAG_OWNER}", "Values": [self.owner]}]

    # --- discovery -----------------------------------------------------------------------

    def offerings(self, region: str, instance_types: Sequence[str]) -> dict[str, list[str]]:
        ec2 = self._client("ec2", region)
        found: dict[str, list[str]] = {}
        pages = self._call("DescribeInstanceTypeOfferings", lambda: list(
            ec2.get_paginator("describe_instance_type_offerings").paginate(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": list(instance_types)}])))
        for page in pages:
            for offer in page["InstanceTypeOfferings"]:
                found.setdefault(offer["InstanceType"], []).append(offer["Location"])
        return {t: sorted(zones) for t, zones in found.items()}

    def image(self, region: str, os_name: str) -> str:
        release = os_name.removeprefix("ubuntu-")
        prefix = os.environ.get("GPUPROV_UBUNTU_SSM_PREFIX", UBUNTU_SSM_PREFIX)
        ssm = self._client("ssm", region)
        tried = []
        for volume in ("ebs-gp3", "ebs-gp2"):
            name = f"{prefix}/{release}/stable/current/amd64/hvm/{volume}/ami-id"
            tried.append(name)
            try:
                reply = self._call("ssm:GetParameter", functools.partial(ssm.get_parameter, Name=name))
                return str(reply["Parameter"]["Value"])
            except AwsError as exc:
                if exc.code != "ParameterNotFound":
                    raise
        raise UserInputError("--image", f"no Ubuntu {release} image published in {region} (looked up {tried[0]})",
                             "pass --image ami-... explicitly")

    def _root_device(self, region: str, image_id: str) -> str:
        ec2 = self._client("ec2", region)
        try:
            images = self._call("DescribeImages", lambda: ec2.describe_images(ImageIds=[image_id]))["Images"]
        except AwsError as exc:
            raise UserInputError("--image", f"{image_id}: {exc.code}: {exc.message}") from None
        if not images:
            raise UserInputError("--image", f"image {image_id} not found in {region}")
        return str(images[0].get("RootDeviceName") or "/dev/sda1")

    def network(self, region: str, subnet: str | None) -> Network:
        """The pinned subnet's VPC and zone, or the region's default VPC (any zone)."""
        ec2 = self._client("ec2", region)
        if subnet:
            try:
                (found,) = self._call("DescribeSubnets", lambda: ec2.describe_subnets(SubnetIds=[subnet]))["Subnets"]
            except AwsError as exc:
                raise UserInputError("--subnet", f"{subnet}: {exc.code}: {exc.message}",
                                     "list subnets with `aws ec2 describe-subnets`") from None
            vpc = self._call("DescribeVpcs", lambda: ec2.describe_vpcs(VpcIds=[found["VpcId"]]))["Vpcs"][0]
            return Network(vpc_id=str(vpc["VpcId"]), vpc_cidr=str(vpc["CidrBlock"]), subnet_id=subnet,
                           zone=str(found["AvailabilityZone"]), maps_public_ip=bool(found.get("MapPublicIpOnLaunch")))
        vpcs = self._call("DescribeVpcs", lambda: ec2.describe_vpcs(
            Filters=[{"Name": "is-default", "Values": ["true"]}]))["Vpcs"]
        if not vpcs:
            raise UserInputError("--subnet", f"{region} has no default VPC", "pass --subnet subnet-... to launch into")
        # default subnets give instances a public address (EC2 guide, "Default VPCs")
        return Network(vpc_id=str(vpcs[0]["VpcId"]), vpc_cidr=str(vpcs[0]["CidrBlock"]))

    # --- key pair and security group -------------------------------------------------------

    def key_pair_exists(self, region: str, name: str) -> bool:
        ec2 = self._client("ec2", region)
        try:
            return bool(self._call("DescribeKeyPairs", lambda: ec2.describe_key_pairs(KeyNames=[name]))["KeyPairs"])
        except AwsError as exc:
            if exc.code != NOT_FOUND["key-pair"]:
                raise
            return False

    def import_key_pair(self, region: str, name: str, public_key: str) -> str:
        ec2 = self._client("ec2", region)
        result = self._call("ImportKeyPair", lambda: ec2.import_key_pair(
            KeyName=name, PublicKeyMaterial=public_key.encode(),
            TagSpecifications=[{"ResourceType": "key-pair", "Tags": self._tags(SHARED)}]))
        return str(result.get("KeyPairId") or name)

    def delete_key_pair(self, region: str, name: str, settle: float = 0) -> None:
        ec2 = self._client("ec2", region)
        self._settle("DeleteKeyPair", lambda: ec2.delete_key_pair(KeyName=name), "key-pair", name, settle)

    def create_security_group(self, region: str, node: str, vpc: str, name: str, description: str) -> str:
        ec2 = self._client("ec2", region)
        return str(self._call("CreateSecurityGroup", lambda: ec2.create_security_group(
            GroupName=name, Description=description, VpcId=vpc,
            TagSpecifications=[{"ResourceType": "security-group", "Tags": self._tags(node)}]))["GroupId"])

    def find_security_group(self, region: str, name: str) -> str | None:
        """A group by name (for a create whose answer was lost); a name filter, which does not wait for tags."""
        ec2 = self._client("ec2", region)
        groups = self._call("DescribeSecurityGroups", lambda: ec2.describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [name]}]))["SecurityGroups"]
        return str(groups[0]["GroupId"]) if groups else None

    def authorize_ssh(self, region: str, group_id: str, cidr: str, settle: float) -> None:
        ec2 = self._client("ec2", region)
        ranges: dict[str, Any] = ({"Ipv6Ranges": [{"CidrIpv6": cidr, "Description": "gpuprov: SSH"}]} if ":" in cidr
                                  else {"IpRanges": [{"CidrIp": cidr, "Description": "gpuprov: SSH"}]})
        self._settle("AuthorizeSecurityGroupIngress", lambda: ec2.authorize_security_group_ingress(
            GroupId=group_id, IpPermissions=[{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges}]),
            "security-group", group_id, settle)

    def authorize_self(self, region: str, group_id: str, settle: float) -> None:
        """All protocols and ports from and to the group itself: a cluster's nodes reach each other on any port
        (NCCL's, the rendezvous). EFA needs both directions (EC2 guide, "Get started with EFA and NCCL": "allows
        all inbound and outbound traffic to and from the security group itself")."""
        ec2 = self._client("ec2", region)
        rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id, "Description": "gpuprov: cluster"}]}]
        self._settle("AuthorizeSecurityGroupIngress", lambda: ec2.authorize_security_group_ingress(
            GroupId=group_id, IpPermissions=rule), "security-group", group_id, settle)
        self._settle("AuthorizeSecurityGroupEgress", lambda: ec2.authorize_security_group_egress(
            GroupId=group_id, IpPermissions=rule), "security-group", group_id, settle)

    def create_placement_group(self, region: str, node: str, name: str) -> str:
        ec2 = self._client("ec2", region)
        self._call("CreatePlacementGroup", lambda: ec2.create_placement_group(
            GroupName=name, Strategy="cluster",
            TagSpecifications=[{"ResourceType": "placement-group", "Tags": self._tags(node)}]))
        return name

    def allocate_address(self, region: str, node: str, name: str) -> str:
        ec2 = self._client("ec2", region)
        return str(self._call("AllocateAddress", lambda: ec2.allocate_address(
            Domain="vpc", TagSpecifications=[{"ResourceType": "elastic-ip", "Tags": self._tags(
                node, {"Name": name})}]))["AllocationId"])

    def find_address(self, region: str, name: str) -> str | None:
        ec2 = self._client("ec2", region)
        found = self._call("DescribeAddresses", lambda: ec2.describe_addresses(
            Filters=[{"Name": "tag:Name", "Values": [name]}, *self._owned()]))["Addresses"]
        return str(found[0]["AllocationId"]) if found else None

    def associate_address(self, region: str, allocation_id: str, instance_id: str, settle: float) -> str:
        ec2 = self._client("ec2", region)
        self._settle("AssociateAddress", lambda: ec2.associate_address(
            AllocationId=allocation_id, InstanceId=instance_id), "instance", instance_id, settle)
        (found,) = self._call("DescribeAddresses", lambda: ec2.describe_addresses(
            AllocationIds=[allocation_id]))["Addresses"]
        return str(found["PublicIp"])

    # --- instances -----------------------------------------------------------------------

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
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "InstanceInitiatedShutdownBehavior": request.shutdown_behavior,
            "BlockDeviceMappings": [{"DeviceName": self._root_device(request.region, request.image_id), "Ebs": {
                "VolumeSize": request.disk_gb, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}],
        }
        if request.interfaces:  # EFA: every interface named (one card each); see catalog.yaml cluster_network
            kwargs["NetworkInterfaces"] = [_nic(nic, access, len(request.interfaces)) for nic in request.interfaces]
        elif access.public_ip:  # the subnet gives no public address by itself: ask for one on the interface
            kwargs["NetworkInterfaces"] = [{"DeviceIndex": 0, "SubnetId": access.subnet_id, "AssociatePublicIpAddress": True,
                                            "Groups": [access.security_group_id], "DeleteOnTermination": True}]
        else:
            kwargs["SecurityGroupIds"] = [access.security_group_id]
            if access.subnet_id:
                kwargs["SubnetId"] = access.subnet_id
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
            except AwsError as exc:
                refusal = classify(exc.code, exc.message, request.market)
                fresh = exc.code in LAUNCH_REFERENCES and time.monotonic() + wait < deadline
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

    def instances(self, region: str, *, ids: Sequence[str] = (), node: str | None = None) -> list[Instance]:
        ec2 = self._client("ec2", region)
        if ids:  # by id as a filter: an id EC2 does not know is absent instead of failing the whole call
            filters = [{"Name": "instance-id", "Values": list(ids)}]
        else:
            filters = self._owned() + ([{"Name": f"tag:{TAG_NODE}", "Values": [node]}] if node else [])
        pages = self._call("DescribeInstances", lambda: list(ec2.get_paginator("describe_instances").paginate(
            Filters=filters)))
        return [_instance(raw, region) for page in pages for res in page["Reservations"] for raw in res["Instances"]]

    def wait_running(self, region: str, instance_id: str, timeout: float, settle: float) -> Instance:
        deadline = time.monotonic() + timeout
        while True:
            (instance,) = self.describe(region, [instance_id], settle=settle)
            if instance.state == "running":
                return instance
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

    # --- everything tagged as ours (gc) ----------------------------------------------------

    def tagged(self, region: str) -> list[CloudResource]:
        ec2 = self._client("ec2", region)
        owned = self._owned()
        found: list[CloudResource] = []
        for i in self.instances(region):
            if i.state != "terminated":
                found.append(CloudResource("instance", i.id, region, i.node, i.state))
        for req in self._call("DescribeSpotInstanceRequests", lambda: ec2.describe_spot_instance_requests(
                Filters=owned))["SpotInstanceRequests"]:
            if req.get("State") in ("open", "active"):
                found.append(CloudResource("spot-request", req["SpotInstanceRequestId"], region, _tag(req), req["State"]))
        for group in self._call("DescribeSecurityGroups", lambda: ec2.describe_security_groups(
                Filters=owned))["SecurityGroups"]:
            found.append(CloudResource("security-group", group["GroupId"], region, _tag(group)))
        for vol in self._call("DescribeVolumes", lambda: ec2.describe_volumes(Filters=owned))["Volumes"]:
            if vol.get("State") not in ("deleting", "deleted"):
                found.append(CloudResource("volume", vol["VolumeId"], region, _tag(vol), vol.get("State", "")))
        for key in self._call("DescribeKeyPairs", lambda: ec2.describe_key_pairs(Filters=owned))["KeyPairs"]:
            found.append(CloudResource("key-pair", key["KeyName"], region, _tag(key)))
        for pg in self._call("DescribePlacementGroups", lambda: ec2.describe_placement_groups(
                Filters=owned))["PlacementGroups"]:
            if pg.get("State") not in ("deleting", "deleted"):
                found.append(CloudResource("placement-group", pg["GroupName"], region, _tag(pg), pg.get("State", "")))
        for eip in self._call("DescribeAddresses", lambda: ec2.describe_addresses(Filters=owned))["Addresses"]:
            found.append(CloudResource("address", eip["AllocationId"], region, _tag(eip), eip.get("PublicIp", "")))
        images = self.images(region)
        for image in images:
            found.append(CloudResource("image", image.id, region, IMAGES, f"{image.name} | {image.state}"))
        # a snapshot whose image is gone (a DeregisterImage whose DeleteSnapshot never came); its image's
        # name is its tag, since CreateImage tags the snapshots before the image id is known
        names = {i.name for i in images}
        for snap in self._call("DescribeSnapshots", lambda: ec2.describe_snapshots(
                OwnerIds=["self"], Filters=owned))["Snapshots"]:
            if _tag(snap, TAG_IMAGE) not in names:
                found.append(CloudResource("snapshot", snap["SnapshotId"], region, IMAGES,
                                           f"of image {_tag(snap, TAG_IMAGE)} (gone)"))
        return found

    def delete(self, resource: CloudResource, settle: float = 0) -> None:
        ec2 = self._client("ec2", resource.region)
        if resource.kind == "image":
            self.delete_image(resource.region, resource.id, settle)
            return
        if resource.kind == "snapshot":
            self._settle("DeleteSnapshot", lambda: ec2.delete_snapshot(SnapshotId=resource.id), "snapshot",
                         resource.id, settle)
            return
        kind, rid, region = resource.kind, resource.id, resource.region
        if kind == "instance":
            self.terminate(region, [rid], settle)
            self.wait_terminated(region, [rid])
        elif kind == "spot-request":
            self._settle("CancelSpotInstanceRequests", lambda: ec2.cancel_spot_instance_requests(
                SpotInstanceRequestIds=[rid]), kind, rid, settle)
        elif kind == "security-group":
            self._while_in_use(lambda: self._settle("DeleteSecurityGroup", lambda: ec2.delete_security_group(GroupId=rid),
                                                    kind, rid, settle))
        elif kind == "volume":
            self._while_in_use(lambda: self._settle("DeleteVolume", lambda: ec2.delete_volume(VolumeId=rid),
                                                    kind, rid, settle))
        elif kind == "key-pair":
            self.delete_key_pair(region, rid, settle)
        elif kind == "placement-group":  # refused while an instance is in it (terminating ones too)
            self._while_in_use(lambda: self._settle("DeletePlacementGroup", lambda: ec2.delete_placement_group(
                GroupName=rid), kind, rid, settle))
        elif kind == "address":  # an association goes with its instance; a released address is gone for good
            self._while_in_use(lambda: self._settle("ReleaseAddress", lambda: ec2.release_address(AllocationId=rid),
                                                    kind, rid, settle))

    def _while_in_use(self, fn: Callable[[], Any], timeout: float = 300) -> None:
        """EC2 keeps a group or volume 'in use' for a while after its instance is gone: retry, bounded."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                fn()
                return
            except AwsError as exc:
                if exc.code not in ("DependencyViolation", "VolumeInUse", "IncorrectState", "InvalidSnapshot.InUse",
                                    "InvalidPlacementGroup.InUse", "InvalidIPAddress.InUse") \
                        or time.monotonic() > deadline:
                    raise
                time.sleep(self.poll)

    # --- images (cloud/images.py decides; this makes the calls) ----------------------------

    def public_image(self, region: str, parameter: str) -> str | None:
        ssm = self._client("ssm", region)
        try:
            reply = self._call("ssm:GetParameter", functools.partial(ssm.get_parameter, Name=parameter))
        except AwsError as exc:
            if exc.code != "ParameterNotFound":
                raise
            return None
        return str(reply["Parameter"]["Value"])

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

    def images(self, region: str, *, ids: Sequence[str] = (), name: str | None = None) -> list[Image]:
        ec2 = self._client("ec2", region)
        filters = self._owned()
        if ids:
            filters = [*filters, {"Name": "image-id", "Values": list(ids)}]
        if name is not None:
            filters = [*filters, {"Name": "name", "Values": [name]}]
        reply = self._call("DescribeImages", lambda: ec2.describe_images(Owners=["self"], Filters=filters))
        return sorted((_image(raw, region) for raw in reply["Images"]), key=lambda i: i.created or "")

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

    # --- prices and quotas -----------------------------------------------------------------

    def prices(self, region: str, instance_types: Sequence[str]) -> list[SpotPrice]:
        ec2 = self._client("ec2", region)
        reply = self._call("DescribeSpotPriceHistory", lambda: ec2.describe_spot_price_history(
            InstanceTypes=list(instance_types), ProductDescriptions=["Linux/UNIX"],
            StartTime=datetime.now(timezone.utc)))
        latest: dict[tuple[str, str], SpotPrice] = {}
        for row in reply["SpotPriceHistory"]:
            price = SpotPrice(row["InstanceType"], row["AvailabilityZone"], float(row["SpotPrice"]), row.get("Timestamp"))
            key = (price.instance_type, price.zone)
            if key not in latest or (price.at and latest[key].at and price.at > latest[key].at):  # type: ignore[operator]
                latest[key] = price
        return sorted(latest.values(), key=lambda p: p.price)

    def quota(self, region: str, code: str) -> float | None:
        try:
            reply = self._client("service-quotas", region).get_service_quota(ServiceCode="ec2", QuotaCode=code)
            return float(reply["Quota"]["Value"])
        except (ClientError, BotoCoreError, KeyError):  # reading the quota is a courtesy; the refusal said enough
            return None


def _nic(nic: Nic, access: Access, count: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"NetworkCardIndex": nic.card, "DeviceIndex": nic.device, "InterfaceType": nic.kind,
                            "SubnetId": access.subnet_id, "Groups": [access.security_group_id],
                            "DeleteOnTermination": True}
    if access.public_ip and count == 1:  # EC2 refuses a public address when more than one interface is launched
        spec["AssociatePublicIpAddress"] = True
    return {k: v for k, v in spec.items() if v is not None}


def _tag(raw: dict[str, Any], key: str = TAG_NODE) -> str | None:
    for tag in raw.get("Tags") or []:
        if tag.get("Key") == key:
            return str(tag.get("Value"))
    return None


def _image(raw: dict[str, Any], region: str) -> Image:
    ebs = [m["Ebs"] for m in raw.get("BlockDeviceMappings") or [] if "Ebs" in m]
    sizes = [int(e["VolumeSize"]) for e in ebs if e.get("VolumeSize") is not None]
    return Image(
        id=raw["ImageId"], name=str(raw.get("Name") or ""), region=region, state=str(raw.get("State") or "unknown"),
        architecture=raw.get("Architecture"), created=raw.get("CreationDate"),
        snapshot_ids=tuple(e["SnapshotId"] for e in ebs if e.get("SnapshotId")), size_gb=sum(sizes) if sizes else None,
        stack=_tag(raw, TAG_STACK), os=_tag(raw, TAG_OS), source_node=_tag(raw, TAG_SOURCE), owner=_tag(raw, TAG_OWNER),
        state_reason=(raw.get("StateReason") or {}).get("Message"),
    )


def _instance(raw: dict[str, Any], region: str) -> Instance:
    volumes = tuple(m["Ebs"]["VolumeId"] for m in raw.get("BlockDeviceMappings") or [] if "Ebs" in m)
    return Instance(
        id=raw["InstanceId"], region=region, zone=(raw.get("Placement") or {}).get("AvailabilityZone"),
        instance_type=raw["InstanceType"], state=(raw.get("State") or {}).get("Name", "unknown"),
        market="spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand",
        public_ip=raw.get("PublicIpAddress"), private_ip=raw.get("PrivateIpAddress"), launched_at=raw.get("LaunchTime"),
        state_reason=(raw.get("StateReason") or {}).get("Message"), node=_tag(raw),
        spot_request_id=raw.get("SpotInstanceRequestId"), volume_ids=volumes,
    )
