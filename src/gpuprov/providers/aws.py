"""AWS EC2 behind the provider protocol. boto3 is imported here only, when a command needs AWS.

Credentials, profile, region and endpoint come from the standard AWS chain (AWS_PROFILE,
AWS_REGION, ~/.aws, AWS_ENDPOINT_URL). Throttling and transient errors are retried by botocore's
retry modes (standard by default; AWS_RETRY_MODE / AWS_MAX_ATTEMPTS override it).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

from gpuprov.errors import GpuprovError, UserInputError
from gpuprov.paths import region_key
from gpuprov.providers.base import (
    SHARED,
    TAG_NODE,
    TAG_OWNER,
    Access,
    CloudResource,
    Instance,
    LaunchError,
    LaunchRequest,
    SpotPrice,
)
from gpuprov.state import Store

T = TypeVar("T")

CAPACITY = {"InsufficientInstanceCapacity", "InsufficientCapacity", "UnfulfillableCapacity", "SpotMaxPriceTooLow",
            "Unsupported", "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity"}
QUOTA = {"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded", "SpotInstanceLimitExceeded"}
AUTH = {"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "ExpiredToken", "SignatureDoesNotMatch",
        "AccessDenied", "AccessDeniedException", "OptInRequired", "Blocked"}
UBUNTU_SSM_PREFIX = "/aws/service/canonical/ubuntu/server"


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "Unknown"))


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", str(exc)))


def credentials_hint() -> str:
    return ("configure AWS credentials: `aws configure`, or AWS_PROFILE=<profile>, or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment")


class AwsProvider:
    name = "aws"

    def __init__(self, store: Store, owner: str, keys_dir: Path, *, poll: float = 2.0) -> None:
        self.store = store
        self.owner = owner
        self.keys_dir = keys_dir
        self.poll = poll
        self._lock = threading.Lock()
        self._session: Any = None
        self._clients: dict[tuple[str, str], Any] = {}

    # --- plumbing ------------------------------------------------------------------------

    def _client(self, service: str, region: str) -> Any:
        # boto3 clients are thread-safe, sessions are not: build clients under a lock, then share them
        key = (service, region)
        with self._lock:
            if key not in self._clients:
                if self._session is None:
                    self._session = boto3.session.Session()
                retries = {"mode": os.environ.get("AWS_RETRY_MODE", "standard"),
                           "max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS", "5"))}
                config = Config(retries=retries, connect_timeout=10, read_timeout=60)  # type: ignore[arg-type]
                self._clients[key] = self._session.client(service, region_name=region, config=config)
            return self._clients[key]

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one AWS call; turn credential and permission problems into a clear stop."""
        try:
            return fn()
        except NoCredentialsError:
            raise UserInputError("AWS credentials", "none found", credentials_hint()) from None
        except NoRegionError:
            raise UserInputError("--region", "no AWS region set", "pass --region or set AWS_REGION") from None
        except ClientError as exc:
            code = _code(exc)
            if code in AUTH:
                raise GpuprovError(f"AWS refused {what}: {code}: {_message(exc)}\n  fix: check the credentials and "
                                   f"that the IAM identity may call {what} ({credentials_hint()})") from None
            raise
        except BotoCoreError as exc:
            raise GpuprovError(f"AWS call {what} failed: {exc}") from None

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
            except ClientError as exc:
                if _code(exc) != "ParameterNotFound":
                    raise
        raise UserInputError("--image", f"no Ubuntu {release} image published in {region} (looked up {tried[0]})",
                             "pass --image ami-... explicitly")

    def _root_device(self, region: str, image_id: str) -> str:
        ec2 = self._client("ec2", region)
        try:
            images = self._call("DescribeImages", lambda: ec2.describe_images(ImageIds=[image_id]))["Images"]
        except ClientError as exc:
            raise UserInputError("--image", f"{image_id}: {_code(exc)}: {_message(exc)}") from None
        if not images:
            raise UserInputError("--image", f"image {image_id} not found in {region}")
        return str(images[0].get("RootDeviceName") or "/dev/sda1")

    # --- access: key pair and security group ----------------------------------------------

    def _key_files(self, region: str) -> tuple[Path, str]:
        """This user's private key for the region (created once, 0600) and its public line."""
        private = region_key(self.keys_dir, region)
        public = private.with_suffix(".pub")
        folder = private.parent
        if not private.exists():
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            key = Ed25519PrivateKey.generate()
            pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption())
            fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
            line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            public.write_text(line.decode() + f" gpuprov {self.owner}\n")
        private.chmod(0o600)
        return private, public.read_text().strip()

    def key_name(self) -> str:
        return "gpuprov-" + "".join(c if c.isalnum() or c in "-_." else "-" for c in self.owner)

    def _ensure_key_pair(self, region: str) -> tuple[str, str]:
        """Import this user's key for the region once. Serialised across threads and processes
        (a file lock), since concurrent `up`s would otherwise race to import or replace it."""
        import fcntl

        folder = self.keys_dir / region
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        with (folder / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            private, public = self._key_files(region)
            return self._import_key(region, private, public)

    def _import_key(self, region: str, private: Path, public: str) -> tuple[str, str]:
        ec2 = self._client("ec2", region)
        name = self.key_name()
        try:
            existing = self._call("DescribeKeyPairs", lambda: ec2.describe_key_pairs(KeyNames=[name]))["KeyPairs"]
        except ClientError as exc:
            if _code(exc) != "InvalidKeyPair.NotFound":
                raise
            existing = []
        if existing and self.store.resources(None, region=region, kind="key-pair"):
            return name, str(private)
        if existing:  # ours by name, but from a lost local state: replace it with the local key
            self._call("DeleteKeyPair", lambda: ec2.delete_key_pair(KeyName=name))
        rid = self.store.intend(None, "key-pair", region, name)
        result = self._call("ImportKeyPair", lambda: ec2.import_key_pair(
            KeyName=name, PublicKeyMaterial=public.encode(),
            TagSpecifications=[{"ResourceType": "key-pair", "Tags": self._tags(SHARED)}]))
        self.store.created(rid, str(result.get("KeyPairId") or name))
        return name, str(private)

    def network(self, region: str, subnet: str | None) -> tuple[str, str | None]:
        """(VPC id, zone): the pinned subnet's, or the region's default VPC (any zone)."""
        ec2 = self._client("ec2", region)
        if subnet:
            try:
                found = self._call("DescribeSubnets", lambda: ec2.describe_subnets(SubnetIds=[subnet]))["Subnets"]
            except ClientError as exc:
                raise UserInputError("--subnet", f"{subnet}: {_code(exc)}: {_message(exc)}") from None
            return str(found[0]["VpcId"]), str(found[0]["AvailabilityZone"])
        vpcs = self._call("DescribeVpcs", lambda: ec2.describe_vpcs(
            Filters=[{"Name": "is-default", "Values": ["true"]}]))["Vpcs"]
        if not vpcs:
            raise UserInputError("--subnet", f"{region} has no default VPC", "pass --subnet subnet-... to launch into")
        return str(vpcs[0]["VpcId"]), None

    def prepare(self, node: str, region: str, vpc: str, subnet: str | None, ssh_cidr: str) -> Access:
        key_name, key_path = self._ensure_key_pair(region)
        ec2 = self._client("ec2", region)
        group_name = f"gpuprov-{node}-{int(time.time())}"
        rid = self.store.intend(node, "security-group", region, group_name)
        kwargs: dict[str, Any] = {"GroupName": group_name, "Description": f"gpuprov node {node}: SSH from {ssh_cidr}",
                                  "VpcId": vpc,
                                  "TagSpecifications": [{"ResourceType": "security-group", "Tags": self._tags(node)}]}
        group = self._call("CreateSecurityGroup", lambda: ec2.create_security_group(**kwargs))["GroupId"]
        self.store.created(rid, group)
        self._call("AuthorizeSecurityGroupIngress", lambda: ec2.authorize_security_group_ingress(
            GroupId=group, IpPermissions=[{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                                           "IpRanges": [{"CidrIp": ssh_cidr, "Description": "gpuprov: SSH"}]}]))
        return Access(key_name=key_name, key_path=key_path, security_group_id=group, subnet_id=subnet)

    # --- instances -----------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Instance:
        ec2 = self._client("ec2", request.region)
        specs = [
            {"ResourceType": "instance", "Tags": self._tags(request.node, dict(request.tags))},
            {"ResourceType": "volume", "Tags": self._tags(request.node)},
        ]
        kwargs: dict[str, Any] = {
            "ImageId": request.image_id, "InstanceType": request.instance_type, "MinCount": 1, "MaxCount": 1,
            "KeyName": request.access.key_name, "SecurityGroupIds": [request.access.security_group_id],
            "ClientToken": request.client_token,
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "InstanceInitiatedShutdownBehavior": "terminate",
            "BlockDeviceMappings": [{"DeviceName": self._root_device(request.region, request.image_id), "Ebs": {
                "VolumeSize": request.disk_gb, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}],
        }
        if request.access.subnet_id:
            kwargs["SubnetId"] = request.access.subnet_id
        else:
            kwargs["Placement"] = {"AvailabilityZone": request.zone}
        if request.market == "spot":
            spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if request.max_price is not None:
                spot["MaxPrice"] = f"{request.max_price:.4f}"
            kwargs["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
            specs.append({"ResourceType": "spot-instances-request", "Tags": self._tags(request.node)})
        kwargs["TagSpecifications"] = specs
        rid = self.store.intend(request.node, "instance", request.region, request.client_token)
        try:
            reply = self._call("RunInstances", lambda: ec2.run_instances(**kwargs))
        except ClientError as exc:
            self.store.deleted(rid)  # refused: nothing was created
            code = _code(exc)
            kind = ("capacity" if code in CAPACITY else "quota" if code in QUOTA
                    else "input" if code.startswith("Invalid") else "other")
            raise LaunchError(kind, code, _message(exc)) from None  # type: ignore[arg-type]
        raw = reply["Instances"][0]
        self.store.created(rid, raw["InstanceId"])
        instance = _instance(raw, request.region)
        if instance.spot_request_id:
            self.store.add_resource(request.node, "spot-request", request.region, instance.spot_request_id)
        return instance

    def describe(self, region: str, *, ids: Sequence[str] = (), node: str | None = None) -> list[Instance]:
        ec2 = self._client("ec2", region)
        kwargs: dict[str, Any] = {}
        if ids:
            kwargs["InstanceIds"] = list(ids)
        filters = self._owned()
        if node:
            filters.append({"Name": f"tag:{TAG_NODE}", "Values": [node]})
        if not ids:
            kwargs["Filters"] = filters
        pages = self._call("DescribeInstances", lambda: list(ec2.get_paginator("describe_instances").paginate(**kwargs)))
        return [_instance(raw, region) for page in pages for res in page["Reservations"] for raw in res["Instances"]]

    def wait_running(self, region: str, instance_id: str, timeout: float) -> Instance:
        deadline = time.monotonic() + timeout
        while True:
            (instance,) = self.describe(region, ids=[instance_id])
            if instance.state == "running":
                return instance
            if instance.state in ("shutting-down", "terminated", "stopped", "stopping"):
                raise GpuprovError(f"{instance_id} went {instance.state} while starting: {instance.state_reason}")
            if time.monotonic() > deadline:
                raise GpuprovError(f"{instance_id} still {instance.state} after {timeout:.0f}s")
            time.sleep(self.poll)

    def terminate(self, node: str, region: str) -> list[str]:
        """Terminate the node's instances, wait, then delete its spot requests, group and volumes."""
        ec2 = self._client("ec2", region)
        removed: list[str] = []
        recorded = [r for r in self.store.resources(node, region=region, kind="instance") if r.cloud_id]
        live = {i.id: i for i in self.describe(region, node=node) if i.state != "terminated"}
        for r in recorded:  # also those whose tags never landed
            cid = r.cloud_id
            if cid is not None and cid not in live:
                try:
                    for i in self.describe(region, ids=[cid]):
                        if i.state != "terminated":
                            live[i.id] = i
                except ClientError as exc:
                    if _code(exc) != "InvalidInstanceID.NotFound":
                        raise
        if live:
            self._call("TerminateInstances", lambda: ec2.terminate_instances(InstanceIds=list(live)))
            self._wait_terminated(region, list(live))
            removed += [f"instance {i}" for i in live]
        for r in recorded:
            self.store.deleted(r.id)
        for r in self.store.resources(node, region=region, kind="instance"):
            self.store.deleted(r.id)  # intents whose launch never returned: covered by the tag search above
        removed += self._delete_tagged(region, node)
        return removed

    def _wait_terminated(self, region: str, ids: list[str], timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = {i.id: i.state for i in self.describe(region, ids=ids)}
            if all(s == "terminated" for s in states.values()):
                return
            time.sleep(self.poll)
        raise GpuprovError(f"instances {', '.join(ids)} not terminated after {timeout:.0f}s; run `gpuprov down` again")

    def _delete_tagged(self, region: str, node: str) -> list[str]:
        removed = []
        for res in self.tagged(region):
            if res.node == node and res.kind != "instance":
                self.delete(res)
                removed.append(f"{res.kind} {res.id}")
        for r in self.store.resources(node, region=region):
            if r.kind != "instance":
                self.store.deleted(r.id)
        return removed

    def release_key(self, region: str) -> None:
        ec2 = self._client("ec2", region)
        name = self.key_name()
        try:
            self._call("DeleteKeyPair", lambda: ec2.delete_key_pair(KeyName=name))
        except ClientError as exc:
            if _code(exc) != "InvalidKeyPair.NotFound":
                raise
        for r in self.store.resources(None, region=region, kind="key-pair"):
            self.store.deleted(r.id)

    # --- everything tagged as ours (gc) ----------------------------------------------------

    def tagged(self, region: str) -> list[CloudResource]:
        ec2 = self._client("ec2", region)
        owned = self._owned()
        found: list[CloudResource] = []
        for i in self.describe(region):
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
        return found

    def delete(self, resource: CloudResource) -> None:
        ec2 = self._client("ec2", resource.region)
        kind, rid = resource.kind, resource.id
        if kind == "instance":
            self._call("TerminateInstances", lambda: ec2.terminate_instances(InstanceIds=[rid]))
            self._wait_terminated(resource.region, [rid])
        elif kind == "spot-request":
            self._call("CancelSpotInstanceRequests", lambda: ec2.cancel_spot_instance_requests(SpotInstanceRequestIds=[rid]))
        elif kind == "security-group":
            self._retry_dependency(lambda: ec2.delete_security_group(GroupId=rid), f"security group {rid}")
        elif kind == "volume":
            self._retry_dependency(lambda: ec2.delete_volume(VolumeId=rid), f"volume {rid}")
        elif kind == "key-pair":
            self._call("DeleteKeyPair", lambda: ec2.delete_key_pair(KeyName=rid))

    def _retry_dependency(self, fn: Callable[[], Any], what: str, timeout: float = 300) -> None:
        """AWS keeps a group 'in use' for a while after its instance is gone: retry, bounded."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._call(what, fn)
                return
            except ClientError as exc:
                code = _code(exc)
                if code.endswith(".NotFound") or code == "InvalidGroup.NotFound":
                    return
                if code not in ("DependencyViolation", "VolumeInUse", "IncorrectState") or time.monotonic() > deadline:
                    raise GpuprovError(f"could not delete {what}: {code}: {_message(exc)}") from None
                time.sleep(self.poll)

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
        except (ClientError, BotoCoreError, KeyError):
            return None  # reading the quota is a courtesy; the launch error already said enough


def _tag(raw: dict[str, Any], key: str = TAG_NODE) -> str | None:
    for tag in raw.get("Tags") or []:
        if tag.get("Key") == key:
            return str(tag.get("Value"))
    return None


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
