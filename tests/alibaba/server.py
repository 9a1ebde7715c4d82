"""An imitation of Alibaba Cloud ECS's API (2014-05-26) as the official SDK sends it, as strict as tests/aws.

The SDK (alibabacloud-ecs20140526 over alibabacloud-tea-openapi) sends each call as an ACS3-signed request: the
action in the `x-acs-action` header, the parameters flattened into the query string (Tag.1.Key, SystemDisk.Size).
Each request is checked against the SDK's own `<Action>Request` model: the parameters are folded back into the
model's map, read by `from_map`, written out again by `to_map` and flattened as the SDK flattens them; a parameter
that does not survive is one the model does not have, refused as ECS refuses a parameter it does not take. A
missing required parameter is refused as MissingParameter. Every answer is recorded (`answers`) so that the
contract test reads each through `<Action>ResponseBody().from_map`.

Rules and their sources (read 2026-12-03):
  - errors are JSON {RequestId, HostId, Code, Message, Recommend} with the HTTP status ("Troubleshoot API error
    codes", alibabacloud.com/help/en/ecs/developer-reference/error-code-error-code-troubleshooting-ideas);
  - RunInstances' error table (API reference; read whole in a copy of Alibaba's English API documents kept in a
    public repository): 403 OperationDenied.NoStock, 403 Zone.NotOnSale, 403 InvalidInstanceType.ZoneNotSupported,
    403 InvalidAccountStatus.NotEnoughBalance, 400 InvalidSpotPriceLimit.LowerThanPublicPrice, 403
    IncorrectInstanceStatus, with their messages; NoStock's newer wording ("The requested resource is sold out in
    the specified zone; try other types of resources or other regions and zones.") and QuotaExceed.ElasticQuota's
    as gardener/machine-controller-manager-provider-alicloud pkg/alicloud/errors lists them;
  - Throttling.User 400 "Request was denied due to user flow control." (Alibaba Cloud common error codes;
    unverified wording);
  - MissingParameter 400, UnsupportedParameter 400, InvalidParameter 400 for a value that is not of its field's
    type (public error codes as other Alibaba products list them);
  - RunInstances' ClientToken: the same token and parameters answer the first call's instances, the same token with
    other parameters is IdempotentParameterMismatch ("How to ensure idempotence",
    alibabacloud.com/help/en/doc-detail/25693.html);
  - stock per zone: DescribeAvailableResource's Status Available / SoldOut and StatusCategory WithStock /
    WithoutStock (DescribeAvailableResource API reference);
  - DescribePrice (API reference, "DescribePrice", help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-
    describeprice; its Chinese edition help.aliyun.com/document_detail/107829.html): ResourceType defaults to
    instance, which needs InstanceType; the price is pay-as-you-go's (PostPaid) by default, per PriceUnit (Hour);
    PriceInfo.Price holds OriginalPrice, DiscountPrice, TradePrice and Currency, and DetailInfos one row per
    priced part (Resource instanceType, systemDisk, ...); ResourceType disk prices DataDisk.1 (Category and Size
    required) per Hour, pay-as-you-go only; an InstanceType it does not sell in the region is refused
    as InvalidInstanceType.ValueNotSupported (unverified wording: the page's error table was not read whole);
  - RunInstances' Amount and MinAmount, 1 to 100 each: below MinAmount in stock (MinAmount absent: below Amount)
    nothing is created, else min(stock, Amount) (RunInstances' request model in alibabacloud-ecs20140526 7.11.8, its
    API reference's words); the vCPU quota is counted for what is created;
  - deployment sets (CreateDeploymentSet, DescribeDeploymentSets, DeleteDeploymentSet: their request models, and the
    "Deployment sets" user guide, doc-detail/91258 and 130139): strategy Availability, AvailabilityGroup or
    LowLatency; a LowLatency set holds instances of one zone only, at most 20 (403
    QuotaExceed.DeploymentSetInstanceQuotaFull "instance quota in one deployment set exceeded.", as ECS's
    ModifyInstanceDeployment reference lists it; the zone refusal's code is unverified: InvalidParameter); no spot
    instance in a deployment set (the Chinese user guide; the code unverified: InvalidParameter); an unknown set is
    404 InvalidDeploymentSetId.NotFound "The specified DeploymentSetId does not exist." (RunInstances' error table)
    and 400 for DeleteDeploymentSet (as ModifyDeploymentSetAttribute's reference lists it); a set that holds
    instances is 403 DependencyViolation.NotEmpty "There are still instance(s) in the specified DeploymentSetId."
    (DeleteDeploymentSet API reference, doc-detail/91311, 2026-01-28); DescribeDeploymentSets pages by 50 at most;
    ECS tags no deployment set (no Tag on CreateDeploymentSet, no `deploymentset` in ListTagResources' types);
  - a new instance is Pending, then Running; DescribeInstances may not list it for a moment after RunInstances
    answers (`listing_delay`); StopInstances' StoppedMode=StopCharging keeps the disks and stops the billing of
    compute ("economical mode", StopInstances API reference), and releases the system-assigned public address, a
    start giving a new one ("Economical mode for pay-as-you-go instances (including spot instances)",
    alibabacloud.com/help/en/ecs/user-guide/economical-mode, updated 2025-09-15).

RAM's requests (their `x-acs-version` 2015-05-01) are answered by RAM's imitation beside it (ram.py, `ecs.ram`), and
RunInstances' RamRoleName is checked against it (404 InvalidRamRole.NotFound 'The specified parameter "RAMRoleName"
does not exist.', 401 InvalidRamRole.NotEcsRole: RunInstances' error table, read whole as above).

A request signed with ECS's RPC signature instead (`Signature` in the query: a node's `ecs-stop` with its RAM
role's STS credentials) is taken only from credentials granted by `grant_sts`, its common parameters, signature (the
SDK's own `Utils.get_rpcsignature`), nonce and allowed actions checked first (`check_rpc`, `RPC_COMMON`'s sources).

Faults (`faults`, each a `Fault` for the next matching calls): a refusal with ECS's code, a lost answer (the work
done, the connection closed), or a held one (the work done, the answer kept until `release()`: a test kills the
client meanwhile).

A seam for real SSH hosts: `address_for(instance) -> (public_ip, private_ip)` picks each new instance's addresses
(and a new public one when an instance stopped in economical mode starts); the default hands out documentation
addresses, a test can hand out a real sshd host's.
"""

from __future__ import annotations

import inspect
import ipaddress
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from alibabacloud_ecs20140526 import models
from alibabacloud_tea_openapi.utils import Utils

HOST_ID = "ecs.imitation.local"
RAM_VERSION = "2015-05-01"  # RAM's API version: its requests go to tests/alibaba/ram.py
# RegionId is required by every action whose model has it (each action's API reference marks it so); the rest:
REQUIRED = {
    "ImportKeyPair": ("KeyPairName", "PublicKeyBody"),
    "AuthorizeSecurityGroup": ("SecurityGroupId",),
    "DescribeSecurityGroupAttribute": ("SecurityGroupId",),
    "DeleteSecurityGroup": ("SecurityGroupId",),
    "StopInstances": ("InstanceId.1",),
    "StartInstances": ("InstanceId.1",),
    "DeleteInstances": ("InstanceId.1",),
    "ModifyInstanceSpec": ("InstanceId",),
    "ListTagResources": ("ResourceType",),
    "DescribeAvailableResource": ("DestinationResource",),
    "DeleteImage": ("ImageId",),
    "DeleteSnapshot": ("SnapshotId",),
    "DeleteKeyPairs": ("KeyPairNames",),
    "CreateImage": ("RegionId",),
    "DeleteDeploymentSet": ("DeploymentSetId",),
}
# an RPC-signed request's common parameters ("Signature mechanism", help.aliyun.com/en/cmn/developer-reference/
# signature-mechanism: SignatureMethod HMAC-SHA1, SignatureVersion 1.0, a SignatureNonce used once); SecurityToken
# comes with STS credentials. The refusals' codes and words: "Troubleshoot API error codes" and ECS's common errors
# (InvalidSecurityToken.MismatchWithAccessKey's and Forbidden.RAM's wording unverified)
RPC_COMMON = ("Format", "Version", "AccessKeyId", "SignatureMethod", "Timestamp", "SignatureVersion",
              "SignatureNonce", "Signature")
STRATEGIES = ("Availability", "AvailabilityGroup", "LowLatency")
SET_LIMIT = 20  # instances of one zone in a LowLatency set
UBUNTU_IMAGES = (("ubuntu_22_04_x64_20G_alibase_20240130.vhd", "x86_64", "2024-01-30T00:00:00Z"),
                 ("ubuntu_22_04_x64_20G_alibase_20250101.vhd", "x86_64", "2025-01-01T00:00:00Z"),
                 ("ubuntu_24_04_x64_20G_alibase_20250101.vhd", "x86_64", "2025-01-01T00:00:00Z"),
                 ("ubuntu_22_04_arm64_20G_alibase_20250101.vhd", "arm64", "2025-01-01T00:00:00Z"))


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message


@dataclass
class Fault:
    """What the next matching call meets: `code` (a refusal), or `lose` (the work is done, the answer dropped)."""

    action: str
    code: str | None = None
    message: str = ""
    status: int = 400
    lose: bool = False
    hold: bool = False  # the work is done, the answer waits until `release()` (a kill lands meanwhile)
    times: int = 1


def meet(faults: list[Fault], action: str) -> tuple[bool, bool]:
    """The first fault left for `action`, spent: its refusal raised, or (lose, hold) for the answer."""
    for fault in faults:
        if fault.action == action and fault.times > 0:
            fault.times -= 1
            if fault.code:
                raise Refused(fault.status, fault.code, fault.message or fault.code)
            return fault.lose, fault.hold
    return False, False


@dataclass
class InstanceRow:
    raw: dict[str, Any]
    listed_at: float
    changes_at: float = 0.0
    next_status: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    role: str | None = None  # its instance RAM role (RunInstances' RamRoleName)


def flatten(value: Any) -> set[str]:
    return set(Utils.query(value).keys()) if value else set()


def fold(flat: dict[str, str]) -> dict[str, Any]:
    """Tag.1.Key=a, SystemDisk.Size=40 back into {"Tag": [{"Key": "a"}], "SystemDisk": {"Size": "40"}}."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node: Any = out
        for at, part in enumerate(parts):
            last = at == len(parts) - 1
            nxt = parts[at + 1] if not last else None
            if isinstance(node, list):
                index = int(part) - 1
                while len(node) <= index:
                    node.append({} if nxt is not None and not nxt.isdigit() else [])
                if last:
                    node[index] = value
                else:
                    node = node[index]
                continue
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, [] if nxt is not None and nxt.isdigit() else {})
    return out


def _typed(model: Any, key: str, value: str) -> bool:
    """Whether a top-level value reads as the type the model's field has (int, float, bool; str takes anything)."""
    made = model().from_map({key: value})
    field_name = next((name for name, got in vars(made).items() if got is not None), None)
    kind = inspect.signature(model.__init__).parameters[field_name].annotation if field_name else "str"
    try:
        if kind == "int":
            int(value)
        elif kind == "float":
            float(value)
        elif kind == "bool":
            return value.lower() in ("true", "false")
    except ValueError:
        return False
    return True


def check_request(action: str, flat: dict[str, str], sdk: Any = models,
                  required: dict[str, tuple[str, ...]] = REQUIRED) -> Any:
    """The request as the SDK's model reads it (`sdk`'s models: ECS's, or RAM's for tests/alibaba/ram.py, whose
    `<Action>ShrinkRequest` is what its client sends where it has one); an unknown parameter (one the model loses) or
    a missing required one is refused."""
    model = getattr(sdk, f"{action}ShrinkRequest", None) or getattr(sdk, f"{action}Request", None)
    if model is None:
        raise Refused(400, "InvalidAction.NotFound", "Specified api is not found, please check your url and method.")
    request = model().from_map(fold(flat))
    kept = flatten(request.to_map())
    unknown = sorted(set(flat) - kept)
    if unknown:
        raise Refused(400, "UnsupportedParameter", f"The parameter {unknown[0]} is not supported by {action}.")
    for key, value in flat.items():
        if "." not in key and not _typed(model, key, value):
            raise Refused(400, "InvalidParameter", f"The specified parameter \"{key}\" is not valid.")
    has_region = "region_id" in model.__init__.__code__.co_varnames
    for name in (("RegionId",) if has_region else ()) + required.get(action, ()):
        if name not in flat:
            raise Refused(400, "MissingParameter",
                          f"The input parameter \"{name.split('.')[0]}\" that is mandatory for processing this "
                          "request is not supplied.")
    return request


def _flag(p: dict[str, Any], name: str, matches: bool, default: bool | None = None) -> bool:
    """A boolean parameter (the SDK sends True as "True"): absent matches anything unless `default` is given."""
    if name not in p or p[name] is None:
        return default is None or default == matches
    return (str(p[name]).lower() == "true") == matches


class Ecs:
    """The cloud's state: one account, its regions, zones, stock, and what it made."""

    def __init__(self, region: str = "cn-hangzhou", zones: tuple[str, ...] = ("cn-hangzhou-h", "cn-hangzhou-i"),
                 types: dict[str, tuple[str, int, float, int, int]] | None = None) -> None:
        self.region = region
        self.zones = list(zones)
        # InstanceTypeId -> (GPUSpec, GPUAmount, GPUMemorySize GiB, CpuCoreCount, MemorySize GiB)
        self.types = types or {"ecs.gn7i-c8g1.2xlarge": ("NVIDIA A10", 1, 24.0, 8, 30),
                               "ecs.gn6i-c4g1.xlarge": ("NVIDIA T4", 1, 16.0, 4, 15),
                               "ecs.g7.large": ("", 0, 0.0, 2, 8)}
        self.stock: dict[tuple[str, str], int] = {(z, t): 10 for z in zones for t in self.types}
        self.not_on_sale: set[str] = set()
        self.spot_price: dict[tuple[str, str], float] = {(z, t): 0.5 for z in zones for t in self.types}
        # DescribePrice's pay-as-you-go price per hour, and the system disk's per GB-hour
        self.list_price: dict[str, float] = {t: 1.5 for t in self.types}
        self.disk_price_gb_hour = 0.0001
        self.currency = "USD"  # the international site's; the China site answers CNY
        self.vcpu_quota = {"PostPaid": 1000, "Spot": 1000}
        self.balance_ok = True
        self.listing_delay = 0.0
        self.boot = 0.0
        self.faults: list[Fault] = []
        self.held = 0  # answers a `hold` fault has kept waiting so far
        self.released = threading.Event()
        self.answers: list[tuple[str, dict[str, Any]]] = []
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.address_for: Callable[[dict[str, Any]], tuple[str, str]] = self._addresses
        self.lock = threading.RLock()
        self.ids = itertools.count(1)
        self.instances: dict[str, InstanceRow] = {}
        self.tokens: dict[tuple[str, str], dict[str, Any]] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, dict[str, Any]] = {}
        self.images: dict[str, dict[str, Any]] = {}
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.sets: dict[str, dict[str, Any]] = {}  # deployment sets by id
        self.tags: dict[tuple[str, str], dict[str, str]] = {}  # (ResourceType, id) -> tags
        # STS credentials (an instance RAM role's) by AccessKeyId: (secret, security token, actions allowed)
        from tests.alibaba.ram import Ram

        self.ram = Ram()  # RAM's imitation, served at the same endpoint (tests/alibaba/ram.py)
        self.sts: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        self.nonces: set[str] = set()
        self.signed: list[tuple[str, str]] = []  # (action, AccessKeyId) of each RPC-signed request taken
        self.vpc = {"VpcId": "vpc-default", "CidrBlock": "172.16.0.0/12", "IsDefault": True, "Status": "Available",
                    "RegionId": region, "VpcName": "default", "Description": ""}
        self.vpcs: list[dict[str, Any]] = [self.vpc]  # the default one first, then those CreateVpc made
        self.switches = [{"VSwitchId": f"vsw-{z}", "VpcId": "vpc-default", "ZoneId": z, "IsDefault": True,
                          "CidrBlock": f"172.16.{n * 16}.0/20", "AvailableIpAddressCount": 4000, "Status": "Available",
                          "VSwitchName": "", "Description": ""}
                         for n, z in enumerate(zones)]
        self.pending = 0  # Describe calls a new VPC or vSwitch answers Pending to before it is Available
        for n, (name, arch, created) in enumerate(UBUNTU_IMAGES):
            self.images[f"ubuntu-{n}"] = {"ImageId": name, "ImageName": name, "ImageOwnerAlias": "system",
                                          "Architecture": arch, "CreationTime": created, "Status": "Available",
                                          "Size": 20, "OSType": "linux"}

    def _id(self, prefix: str) -> str:
        return f"{prefix}-{next(self.ids):08x}"

    def _addresses(self, raw: dict[str, Any]) -> tuple[str, str]:
        n = next(self.ids) % 250 + 1
        return f"203.0.113.{n}", f"172.16.0.{n}"

    # --- the server side of every call --------------------------------------------------------

    def handle(self, action: str, flat: dict[str, str]) -> tuple[dict[str, Any], bool]:
        """The answer, and whether it is lost after the work is done (a held answer waits here, outside the lock,
        until `release`)."""
        with self.lock:
            self.calls.append((action, flat))
            request = check_request(action, flat)
            lose, hold = meet(self.faults, action)
            body = getattr(self, action)(request.to_map())
            body["RequestId"] = str(uuid.uuid4()).upper()
            self.answers.append((action, body))
            if hold:
                self.held += 1
        if hold:
            self.released.wait(60)
        return body, lose

    def role_credentials(self, iid: str) -> tuple[str, str, str, str]:
        """The STS credentials ECS's metadata hands the instance for its RAM role: (role, AccessKeyId, secret, token),
        granted here the ECS actions the role's policies allow."""
        with self.lock:
            role = self.instances[iid].role
            assert role is not None, f"{iid} has no RAM role"
            n = next(self.ids)
            key, secret, token = f"STS.{role}.{n}", f"secret/{n}+=", f"CAIS+token/{n}=="
            self.grant_sts(key, secret, token, self.ram.allowed(role))
            return role, key, secret, token

    def grant_sts(self, key_id: str, secret: str, token: str, actions: tuple[str, ...] = ("StopInstances",)) -> None:
        """STS credentials ECS takes from now on (an instance RAM role's), allowed only `actions` (its policy)."""
        self.sts[key_id] = (secret, token, actions)

    def check_rpc(self, method: str, flat: dict[str, str]) -> dict[str, str]:
        """An RPC-signed request's own parameters, once its common ones and its signature are checked (each refusal
        as ECS answers it); what it signed with is recorded in `signed`."""
        with self.lock:
            for name in RPC_COMMON:
                if not flat.get(name):
                    raise Refused(400, "MissingParameter", f"The input parameter \"{name}\" that is mandatory for "
                                  "processing this request is not supplied.")
            if flat["SignatureMethod"] != "HMAC-SHA1" or flat["SignatureVersion"] != "1.0":
                raise Refused(400, "InvalidParameter", "The specified parameter \"SignatureMethod\" is not valid.")
            if flat["Version"] != "2014-05-26" or flat["Format"] not in ("JSON", "XML"):
                raise Refused(400, "InvalidParameter", "The specified parameter \"Version\" is not valid.")
            try:
                time.strptime(flat["Timestamp"], "%Y-%m-%dT%H:%M:%SZ")
            except ValueError:
                raise Refused(400, "InvalidTimeStamp.Format", "Specified time stamp or date value is not well "
                              "formatted.") from None
            key = self.sts.get(flat["AccessKeyId"])
            if key is None:
                raise Refused(404, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
            secret, token, actions = key
            if flat.get("SecurityToken") != token:
                raise Refused(400, "InvalidSecurityToken.MismatchWithAccessKey", "The Security Token does not match "
                              "the AccessKey.")
            unsigned = {k: v for k, v in flat.items() if k != "Signature"}
            if Utils.get_rpcsignature(unsigned, method, secret) != flat["Signature"]:
                raise Refused(400, "SignatureDoesNotMatch", "Specified signature is not matched with our calculation.")
            if flat["SignatureNonce"] in self.nonces:
                raise Refused(400, "SignatureNonceUsed", "Specified signature nonce was used already.")
            self.nonces.add(flat["SignatureNonce"])
            if flat.get("Action") not in actions:
                raise Refused(403, "Forbidden.RAM", "User not authorized to operate on the specified resource, or "
                              "this API doesn't support RAM.")
            self.signed.append((flat["Action"], flat["AccessKeyId"]))
            return {k: v for k, v in unsigned.items() if k not in (*RPC_COMMON, "SecurityToken")}

    def release(self) -> None:
        """Every held answer goes out (to a client that may be gone); a later `hold` no longer waits."""
        self.released.set()

    def _tag(self, kind: str, rid: str, tags: list[dict[str, str]] | None) -> None:
        self.tags[(kind, rid)] = {t["Key"]: t["Value"] for t in tags or []}

    # regions, zones, network
    def DescribeRegions(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"Regions": {"Region": [{"RegionId": self.region, "LocalName": self.region,
                                        "RegionEndpoint": f"ecs.{self.region}.aliyuncs.com", "Status": "available"}]}}

    def no_default_vpc(self) -> None:
        """A region with no default VPC (one deleted, or a region that never made one): no default vSwitch either."""
        self.vpcs = [v for v in self.vpcs if not v["IsDefault"]]
        self.switches = [s for s in self.switches if not s["IsDefault"]]

    def _shown(self, row: dict[str, Any]) -> dict[str, Any]:
        """A VPC or vSwitch as Describe lists it: Pending for its first `pending` looks after its create."""
        if row.get("looks", 0) > 0:
            row["looks"] -= 1
            return {**{k: v for k, v in row.items() if k != "looks"}, "Status": "Pending"}
        return {k: v for k, v in row.items() if k != "looks"}

    def DescribeVpcs(self, p: dict[str, Any]) -> dict[str, Any]:
        vpcs = [self._shown(v) for v in self.vpcs
                if p.get("VpcId") in (None, v["VpcId"]) and _flag(p, "IsDefault", v["IsDefault"])]
        return {"Vpcs": {"Vpc": vpcs}, "TotalCount": len(vpcs), "PageNumber": 1, "PageSize": 100}

    def DescribeVSwitches(self, p: dict[str, Any]) -> dict[str, Any]:
        found = [self._shown(s) for s in self.switches
                 if p.get("VSwitchId") in (None, s["VSwitchId"]) and p.get("ZoneId") in (None, s["ZoneId"])
                 and p.get("VpcId") in (None, s["VpcId"]) and _flag(p, "IsDefault", s["IsDefault"])]
        return {"VSwitches": {"VSwitch": found}, "TotalCount": len(found), "PageNumber": 1, "PageSize": 100}

    def CreateVpc(self, p: dict[str, Any]) -> dict[str, Any]:
        """A VPC, Pending for a while ("CreateVpc", alibabacloud.com/help/doc-detail/35737.htm, read 2026-12-04: "The
        CIDR block must be 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, or their subnets, and the subnet mask must be
        8 to 24 bits"; asynchronous, Creating/Created in VPC's own API, Pending/Available as ECS's DescribeVpcs lists
        Status); the same ClientToken answers the first VPC ("How to ensure idempotence", doc-detail/25693)."""
        token = p.get("ClientToken")
        if token and ("vpc", token) in self.tokens:
            return dict(self.tokens[("vpc", token)])
        cidr = ipaddress.ip_network(str(p.get("CidrBlock") or "172.16.0.0/12"), strict=False)
        if not (any(cidr.subnet_of(ipaddress.ip_network(b)) for b in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
                and 8 <= cidr.prefixlen <= 24):
            raise Refused(400, "InvalidCidrBlock.Malformed", "Specified CIDR block is not valid.")  # code unverified
        vid = self._id("vpc")
        self.vpcs.append({"VpcId": vid, "CidrBlock": str(cidr), "IsDefault": False, "Status": "Available",
                          "RegionId": self.region, "VpcName": p.get("VpcName", ""),
                          "Description": p.get("Description", ""), "looks": self.pending})
        answer = {"VpcId": vid, "VRouterId": self._id("vrt"), "RouteTableId": self._id("vtb")}
        if token:
            self.tokens[("vpc", token)] = answer
        return dict(answer)

    def CreateVSwitch(self, p: dict[str, Any]) -> dict[str, Any]:
        """A vSwitch of the VPC in the zone, its block inside the VPC's and overlapping no other vSwitch's; Pending for
        a while ("CreateVSwitch", doc-detail/35745.htm, updated 2024-03-04: "CreateVSwitch is an asynchronous
        operation ... Pending ... Available"; the block rules from its request table; the refusals' codes are
        unverified)."""
        token = p.get("ClientToken")
        if token and ("vsw", token) in self.tokens:
            return dict(self.tokens[("vsw", token)])
        vpc = self._vpc(p["VpcId"])
        if p["ZoneId"] not in self.zones:
            raise Refused(400, "InvalidZoneId.NotFound", "The specified zone does not exist.")
        cidr = ipaddress.ip_network(str(p["CidrBlock"]), strict=False)
        if not cidr.subnet_of(ipaddress.ip_network(vpc["CidrBlock"])):  # type: ignore[arg-type]
            raise Refused(400, "InvalidCidrBlock.Malformed", "Specified CIDR block is not valid.")
        if any(cidr.overlaps(ipaddress.ip_network(s["CidrBlock"])) for s in self.switches if s["VpcId"] == vpc["VpcId"]):
            raise Refused(400, "InvalidCidrBlock.Overlapped", "Specified CIDR block overlapped with other subnet.")
        sid = self._id("vsw")
        self.switches.append({"VSwitchId": sid, "VpcId": vpc["VpcId"], "ZoneId": p["ZoneId"], "IsDefault": False,
                              "CidrBlock": str(cidr), "AvailableIpAddressCount": cidr.num_addresses - 4,
                              "Status": "Available", "VSwitchName": p.get("VSwitchName", ""),
                              "Description": p.get("Description", ""), "looks": self.pending})
        answer = {"VSwitchId": sid}
        if token:
            self.tokens[("vsw", token)] = answer
        return dict(answer)

    def _vpc(self, vid: str) -> dict[str, Any]:
        found = [v for v in self.vpcs if v["VpcId"] == vid]
        if not found:
            raise Refused(404, "InvalidVpcId.NotFound", "Specified VPC does not exist.")
        return found[0]

    def DeleteVSwitch(self, p: dict[str, Any]) -> dict[str, Any]:
        """Refused while an instance is in it ("DeleteVSwitch", doc-detail/35746, updated 2024-03-04: 400
        DependencyViolation "Specified object has dependent resources.")."""
        sid = p["VSwitchId"]
        if not any(s["VSwitchId"] == sid for s in self.switches):
            raise Refused(404, "InvalidVSwitchId.NotFound", "Specified virtual switch does not exist.")
        if any((r.raw.get("VpcAttributes") or {}).get("VSwitchId") == sid for r in self.instances.values()):
            raise Refused(400, "DependencyViolation", "Specified object has dependent resources.")
        self.switches = [s for s in self.switches if s["VSwitchId"] != sid]
        return {}

    def DeleteVpc(self, p: dict[str, Any]) -> dict[str, Any]:
        """Refused while a vSwitch or a security group is in it (DependencyViolation, as DeleteVSwitch words it; the
        VPC API reference's DeleteVpc lists its own DependencyViolation.* codes: unverified here)."""
        vpc = self._vpc(p["VpcId"])
        if any(s["VpcId"] == vpc["VpcId"] for s in self.switches) or \
                any(g["VpcId"] == vpc["VpcId"] for g in self.groups.values()):
            raise Refused(400, "DependencyViolation", "Specified object has dependent resources.")
        self.vpcs = [v for v in self.vpcs if v["VpcId"] != vpc["VpcId"]]
        return {}

    def DescribeAvailableResource(self, p: dict[str, Any]) -> dict[str, Any]:
        zones = []
        for zone in self.zones:
            supported = [{"Value": t, "Status": "Available" if self.stock[(zone, t)] > 0 and zone not in
                          self.not_on_sale else "SoldOut",
                          "StatusCategory": "WithStock" if self.stock[(zone, t)] > 0 else "WithoutStock"}
                         for t in self.types]
            zones.append({"ZoneId": zone, "RegionId": self.region, "Status": "Available",
                          "StatusCategory": "WithStock", "AvailableResources": {"AvailableResource": [
                              {"Type": "InstanceType", "SupportedResources": {"SupportedResource": supported}}]}})
        return {"AvailableZones": {"AvailableZone": zones}}

    def DescribeInstanceTypes(self, p: dict[str, Any]) -> dict[str, Any]:
        wanted = set(p.get("InstanceTypes") or self.types)
        rows = [{"InstanceTypeId": t, "GPUSpec": spec, "GPUAmount": n, "GPUMemorySize": mem, "CpuCoreCount": cpu,
                 "MemorySize": ram, "CpuArchitecture": "X86", "InstanceTypeFamily": t.split(".")[1].split("-")[0]}
                for t, (spec, n, mem, cpu, ram) in self.types.items() if t in wanted]
        return {"InstanceTypes": {"InstanceType": rows}}

    def DescribeSpotPriceHistory(self, p: dict[str, Any]) -> dict[str, Any]:
        rows = [{"ZoneId": z, "InstanceType": t, "SpotPrice": price, "OriginPrice": price * 3,
                 "Timestamp": "2026-12-03T00:00:00Z", "NetworkType": "vpc", "IoOptimized": "optimized"}
                for (z, t), price in self.spot_price.items() if t == p.get("InstanceType")]
        return {"SpotPrices": {"SpotPriceType": rows}, "Currency": "USD", "NextOffset": 0}

    def DescribePrice(self, p: dict[str, Any]) -> dict[str, Any]:
        kind = p.get("ResourceType") or "instance"
        if kind == "disk":
            return self._disk_price(p)
        if kind != "instance":  # gpuprov asks instances' and disks' prices only; the rest is not imitated
            raise Refused(400, "InvalidResourceType.NotSupported", f"The ResourceType {kind} is not imitated.")
        if not p.get("InstanceType"):
            raise Refused(400, "MissingParameter", "The input parameter \"InstanceType\" that is mandatory for "
                          "processing this request is not supplied.")
        if p["InstanceType"] not in self.types or p.get("ZoneId") not in (None, *self.zones):
            raise Refused(403, "InvalidInstanceType.ValueNotSupported",
                          "The specified InstanceType does not exist or beyond the permitted range.")
        if (p.get("PriceUnit") or "Hour") != "Hour":  # monthly and yearly prices: subscriptions, not imitated
            raise Refused(400, "InvalidPriceUnit.NotSupported", "The PriceUnit is not imitated.")
        parts = [("instanceType", self.list_price[p["InstanceType"]])]
        disk = p.get("SystemDisk") or {}
        if disk.get("Size"):
            parts.append(("systemDisk", round(int(disk["Size"]) * self.disk_price_gb_hour, 6)))
        total = round(sum(price for _, price in parts), 6)
        return {"PriceInfo": {"Price": {"OriginalPrice": total, "DiscountPrice": 0.0, "TradePrice": total,
                                        "Currency": self.currency, "DetailInfos": {"DetailInfo": [
                                            {"Resource": name, "OriginalPrice": price, "DiscountPrice": 0.0,
                                             "TradePrice": price} for name, price in parts]}},
                              "Rules": {"Rule": []}}}

    def _disk_price(self, p: dict[str, Any]) -> dict[str, Any]:
        """ResourceType disk: DataDisk.1.Category and DataDisk.1.Size are required, the price is pay-as-you-go's per
        Hour only (DescribePrice API reference, "Operation description", read 2026-12-04); the row's Resource name
        for a disk (dataDisk) is unverified."""
        disk = (p.get("DataDisk") or [{}])[0]
        for name in ("Category", "Size"):
            if not disk.get(name):
                raise Refused(400, "MissingParameter", f"The input parameter \"DataDisk.1.{name}\" that is mandatory "
                              "for processing this request is not supplied.")
        if (p.get("PriceUnit") or "Hour") != "Hour":
            raise Refused(400, "InvalidPriceUnit.ValueNotSupported", "A disk's price is asked per Hour only.")
        price = round(int(disk["Size"]) * self.disk_price_gb_hour, 6)
        return {"PriceInfo": {"Price": {"OriginalPrice": price, "DiscountPrice": 0.0, "TradePrice": price,
                                        "Currency": self.currency, "DetailInfos": {"DetailInfo": [
                                            {"Resource": "dataDisk", "OriginalPrice": price, "DiscountPrice": 0.0,
                                             "TradePrice": price}]}},
                              "Rules": {"Rule": []}}}

    def DescribeAccountAttributes(self, p: dict[str, Any]) -> dict[str, Any]:
        names = {"max-postpaid-instance-vcpu-count": self.vcpu_quota["PostPaid"],
                 "max-spot-instance-vcpu-count": self.vcpu_quota["Spot"]}
        items = [{"AttributeName": n, "AttributeValues": {"ValueItem": [{"Value": str(v), "Count": 1}]}}
                 for n, v in names.items() if n in (p.get("AttributeName") or names)]
        return {"AccountAttributeItems": {"AccountAttributeItem": items}}

    # SSH access
    def ImportKeyPair(self, p: dict[str, Any]) -> dict[str, Any]:
        name = p["KeyPairName"]
        if name in self.keys:
            raise Refused(400, "KeyPair.AlreadyExist", "The key pair already exist.")
        self.keys[name] = {"KeyPairName": name, "KeyPairFingerPrint": "00:" * 15 + "00"}
        self._tag("keypair", name, p.get("Tag"))
        return {"KeyPairName": name, "KeyPairFingerPrint": self.keys[name]["KeyPairFingerPrint"]}

    def DescribeKeyPairs(self, p: dict[str, Any]) -> dict[str, Any]:
        found = [k for n, k in self.keys.items() if p.get("KeyPairName") in (None, n)]
        return {"KeyPairs": {"KeyPair": found}, "TotalCount": len(found), "PageNumber": 1, "PageSize": 100}

    def DeleteKeyPairs(self, p: dict[str, Any]) -> dict[str, Any]:
        for name in json.loads(p["KeyPairNames"]):
            self.keys.pop(name, None)
            self.tags.pop(("keypair", name), None)
        return {}

    def CreateSecurityGroup(self, p: dict[str, Any]) -> dict[str, Any]:
        token = p.get("ClientToken")
        if token and ("sg", token) in self.tokens:
            return dict(self.tokens[("sg", token)])
        gid = self._id("sg")
        self.groups[gid] = {"SecurityGroupId": gid, "SecurityGroupName": p.get("SecurityGroupName", ""),
                            "VpcId": p.get("VpcId", ""), "Description": p.get("Description", ""), "rules": []}
        self._tag("securitygroup", gid, p.get("Tag"))
        answer = {"SecurityGroupId": gid}
        if token:
            self.tokens[("sg", token)] = answer
        return dict(answer)

    def _group(self, gid: str) -> dict[str, Any]:
        if gid not in self.groups:
            raise Refused(404, "InvalidSecurityGroupId.NotFound", "The specified SecurityGroupId does not exist.")
        return self.groups[gid]

    def DescribeSecurityGroups(self, p: dict[str, Any]) -> dict[str, Any]:
        found = [{k: v for k, v in g.items() if k != "rules"} for g in self.groups.values()
                 if p.get("SecurityGroupName") in (None, g["SecurityGroupName"])]
        return {"SecurityGroups": {"SecurityGroup": found}, "TotalCount": len(found), "PageNumber": 1,
                "PageSize": 100}

    def AuthorizeSecurityGroup(self, p: dict[str, Any]) -> dict[str, Any]:
        rule = {"IpProtocol": str(p.get("IpProtocol", "")).upper(), "PortRange": p.get("PortRange"),
                "SourceCidrIp": p.get("SourceCidrIp", ""), "Ipv6SourceCidrIp": p.get("Ipv6SourceCidrIp", ""),
                "SourceGroupId": p.get("SourceGroupId", ""), "Direction": "ingress", "Policy": "Accept"}
        if rule["SourceGroupId"]:
            self._group(rule["SourceGroupId"])
        rules = self._group(p["SecurityGroupId"])["rules"]
        if rule not in rules:
            rules.append(rule)
        return {}

    def DescribeSecurityGroupAttribute(self, p: dict[str, Any]) -> dict[str, Any]:
        group = self._group(p["SecurityGroupId"])
        return {"SecurityGroupId": group["SecurityGroupId"], "VpcId": group["VpcId"],
                "Permissions": {"Permission": list(group["rules"])}}

    def DeleteSecurityGroup(self, p: dict[str, Any]) -> dict[str, Any]:
        gid = p["SecurityGroupId"]
        self._group(gid)
        if any(gid in (r.raw.get("SecurityGroupIds") or {}).get("SecurityGroupId", []) for r in self.instances.values()):
            raise Refused(403, "DependencyViolation", "There is still instance(s) in the specified security group.")
        del self.groups[gid]
        self.tags.pop(("securitygroup", gid), None)
        return {}

    # instances
    def RunInstances(self, p: dict[str, Any]) -> dict[str, Any]:
        token = p.get("ClientToken")
        if token and ("run", token) in self.tokens:
            # "How to ensure idempotence": the same token and parameters answer the first call's result; the same
            # token with other parameters is refused
            if self.tokens[("run-params", token)] != p:
                raise Refused(400, "IdempotentParameterMismatch", "Request uses a client token in a previous request "
                              "but is not identical to that request.")
            return dict(self.tokens[("run", token)])
        zone, kind = p.get("ZoneId"), p.get("InstanceType", "")
        amount, least = int(p.get("Amount") or 1), int(p.get("MinAmount") or p.get("Amount") or 1)
        strategy = p.get("SpotStrategy") or "NoSpot"
        if not (1 <= amount <= 100 and 1 <= least <= 100):
            raise Refused(400, "InvalidParameter", "The specified parameter \"Amount\" is not valid.")
        into = p.get("DeploymentSetId")
        if into:
            self._place(into, zone, amount, strategy)
        if zone in self.not_on_sale:
            raise Refused(403, "Zone.NotOnSale", "The resource in the specified zone is no longer available for sale. "
                          "Please try other regions and zones.")
        if kind not in self.types or zone not in self.zones or (zone, kind) not in self.stock:
            raise Refused(403, "InvalidInstanceType.ZoneNotSupported",
                          "The specified zone does not support this instancetype.")
        switch = next((s for s in self.switches if s["VSwitchId"] == p.get("VSwitchId")), None)
        if switch is None or switch["ZoneId"] != zone:
            # the vSwitch must be the zone's (RunInstances' VSwitchId: "the vSwitch ... in the zone specified by
            # ZoneId"); the code is unverified
            raise Refused(404, "InvalidVSwitchId.NotFound", "The specified VSwitchId does not exist.")
        if p.get("RamRoleName"):  # RAM's role, known to ECS and trusting it (tests/alibaba/ram.py `for_ecs`)
            self.ram.for_ecs(str(p["RamRoleName"]))
        if not self.balance_ok:
            raise Refused(403, "InvalidAccountStatus.NotEnoughBalance", "Your account does not have enough balance.")
        if p.get("SpotDuration") is not None and (strategy == "NoSpot" or str(p["SpotDuration"]) not in ("0", "1")):
            # a spot instance's protection period: 1 hour (the default) or none, 0 ("Create a spot instance",
            # alibabacloud.com/help/doc-detail/58613.htm, read 2026-12-04: "Instance Usage Duration: 1 Hour ... None";
            # ECI's "Create a spot elastic container instance", updated 2026-02-28: "Set SpotDuration to 0 to disable
            # the protection period, or keep the default of 1 hour"); the refusal's code is unverified
            raise Refused(400, "InvalidParameter", "The specified parameter \"SpotDuration\" is not valid.")
        if len(str(p.get("SpotPriceLimit") or "").partition(".")[2]) > 3:  # "precise up to three decimal places"
            raise Refused(400, "InvalidSpotPriceLimit", "The specified SpotPriceLimitis not valid.")
        if strategy == "SpotWithPriceLimit" and float(p.get("SpotPriceLimit") or 0) < self.spot_price[(zone, kind)]:
            raise Refused(400, "InvalidSpotPriceLimit.LowerThanPublicPrice",
                          "The specified parameter \"spotPriceLimit\" can't be lower than current public price.")
        market = "PostPaid" if strategy == "NoSpot" else "Spot"
        used = sum(self.types[r.raw["InstanceType"]][3] for r in self.instances.values()
                   if (r.raw["SpotStrategy"] == "NoSpot") == (market == "PostPaid"))
        count = min(amount, self.stock.get((zone, kind), 0))
        if used + self.types[kind][3] * max(count, least) > self.vcpu_quota[market]:
            raise Refused(403, "QuotaExceed.ElasticQuota", "The number of vCPUs assigned to the ECS instances has "
                          "exceeded the quota in the zone. Please sign-on to Alibaba Cloud Console, and submit a "
                          "quota increase application.")
        if count < least:
            raise Refused(403, "OperationDenied.NoStock", "The requested resource is sold out in the specified zone; "
                          "try other types of resources or other regions and zones.")
        self.stock[(zone, kind)] -= count
        now, ids = time.monotonic(), []
        for _ in range(count):
            iid = self._id("i")
            raw = {"InstanceId": iid, "InstanceName": p.get("InstanceName", iid), "InstanceType": kind,
                   "ZoneId": zone, "RegionId": self.region, "ImageId": p.get("ImageId"), "Status": "Pending",
                   "InstanceChargeType": "PostPaid", "SpotStrategy": strategy,
                   "SpotPriceLimit": float(p.get("SpotPriceLimit") or 0),
                   "SpotInterruptionBehavior": p.get("SpotInterruptionBehavior") or "Terminate",
                   **({"SpotDuration": int(p.get("SpotDuration", 1))} if strategy != "NoSpot" else {}),
                   "KeyPairName": p.get("KeyPairName", ""), "CreationTime": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                   "InternetMaxBandwidthOut": int(p.get("InternetMaxBandwidthOut") or 0),
                   "SecurityGroupIds": {"SecurityGroupId": [p.get("SecurityGroupId", "")]},
                   "Cpu": self.types[kind][3], "Memory": self.types[kind][4] * 1024,
                   "GPUAmount": self.types[kind][1], "GPUSpec": self.types[kind][0],
                   "StoppedMode": "Not-applicable", "OperationLocks": {"LockReason": []},
                   "DeploymentSetId": into or ""}
            public, private = self.address_for(raw)
            raw["PublicIpAddress"] = {"IpAddress": [public] if raw["InternetMaxBandwidthOut"] > 0 else []}
            raw["VpcAttributes"] = {"VpcId": switch["VpcId"], "VSwitchId": p.get("VSwitchId", ""),
                                    "PrivateIpAddress": {"IpAddress": [private]}}
            tags = {t["Key"]: t["Value"] for t in p.get("Tag") or []}
            raw["Tags"] = {"Tag": [{"TagKey": k, "TagValue": v} for k, v in tags.items()]}
            self.instances[iid] = InstanceRow(raw, listed_at=now + self.listing_delay, changes_at=now + self.boot,
                                              next_status="Running", tags=tags, role=p.get("RamRoleName") or None)
            self.tags[("instance", iid)] = tags
            ids.append(iid)
        answer = {"InstanceIdSets": {"InstanceIdSet": ids}, "OrderId": "", "TradePrice": 0.0}
        if token:
            self.tokens[("run", token)], self.tokens[("run-params", token)] = answer, p
        return dict(answer)

    def _place(self, set_id: str, zone: str | None, amount: int, strategy: str) -> None:
        """A launch into a deployment set: the set must be there, take no spot instance, and (LowLatency) hold one
        zone's instances only, at most SET_LIMIT of them."""
        found = self.sets.get(set_id)
        if found is None:
            raise Refused(404, "InvalidDeploymentSetId.NotFound", "The specified DeploymentSetId does not exist.")
        if strategy != "NoSpot":
            raise Refused(400, "InvalidParameter", "The specified parameter \"DeploymentSetId\" is not valid.")
        members = [r.raw for r in self.instances.values() if r.raw.get("DeploymentSetId") == set_id]
        if found["Strategy"] == "LowLatency":
            if any(m["ZoneId"] != zone for m in members):
                raise Refused(400, "InvalidParameter", "The specified parameter \"ZoneId\" is not valid.")
            if len(members) + amount > SET_LIMIT:
                raise Refused(403, "QuotaExceed.DeploymentSetInstanceQuotaFull",
                              "instance quota in one deployment set exceeded.")

    def _advance(self) -> None:
        now = time.monotonic()
        for row in self.instances.values():
            if row.next_status and now >= row.changes_at:
                row.raw["Status"], row.next_status = row.next_status, None

    def _row(self, iid: str) -> InstanceRow:
        row = self.instances.get(iid)
        if row is None or row.listed_at > time.monotonic():
            raise Refused(404, "InvalidInstanceId.NotFound", "The specified InstanceId does not exist.")
        return row

    def DescribeInstances(self, p: dict[str, Any]) -> dict[str, Any]:
        self._advance()
        now = time.monotonic()
        ids = json.loads(p["InstanceIds"]) if p.get("InstanceIds") else None
        want = {t["Key"]: t["Value"] for t in p.get("Tag") or []}
        found = [r.raw for iid, r in self.instances.items() if r.listed_at <= now and (ids is None or iid in ids)
                 and all(r.tags.get(k) == v for k, v in want.items())]
        size, number = int(p.get("PageSize") or 10), int(p.get("PageNumber") or 1)
        page = found[(number - 1) * size:number * size]
        return {"Instances": {"Instance": [json.loads(json.dumps(r)) for r in page]}, "TotalCount": len(found),
                "PageNumber": number, "PageSize": size}

    def _change(self, p: dict[str, Any], ok: tuple[str, ...], between: str, to: str,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
        self._advance()
        rows = [self._row(iid) for iid in p["InstanceId"]]
        for row in rows:
            if row.raw["Status"] == to:
                continue
            if row.raw["Status"] not in ok:
                raise Refused(403, "IncorrectInstanceStatus", "The current status of the resource does not support "
                              "this operation.")
            row.raw["Status"], row.next_status, row.changes_at = between, to, time.monotonic() + self.boot
            row.raw.update(extra or {})
        return {"InstanceResponses": {"InstanceResponse": [
            {"InstanceId": r.raw["InstanceId"], "Code": "200", "Message": "success", "PreviousStatus": between,
             "CurrentStatus": r.raw["Status"]} for r in rows]}}

    def StopInstances(self, p: dict[str, Any]) -> dict[str, Any]:
        mode = p.get("StoppedMode") or "KeepCharging"
        answer = self._change(p, ("Running",), "Stopping", "Stopped", {"StoppedMode": mode})
        if mode == "StopCharging":  # economical mode releases the system-assigned public address ("Economical mode")
            for iid in p["InstanceId"]:
                self._row(iid).raw["PublicIpAddress"] = {"IpAddress": []}
        return answer

    def StartInstances(self, p: dict[str, Any]) -> dict[str, Any]:
        for iid in p["InstanceId"]:
            row = self._row(iid)
            key = (row.raw["ZoneId"], row.raw["InstanceType"])
            if row.raw.get("StoppedMode") == "StopCharging" and self.stock[key] <= 0:
                raise Refused(403, "OperationDenied.NoStock", "The requested resource is sold out in the specified "
                              "zone; try other types of resources or other regions and zones.")
        for iid in p["InstanceId"]:  # a new system-assigned public address for one stopped in economical mode
            row = self._row(iid)
            if row.raw.get("StoppedMode") == "StopCharging" and row.raw["InternetMaxBandwidthOut"] > 0:
                row.raw["PublicIpAddress"] = {"IpAddress": [self.address_for(row.raw)[0]]}
        return self._change(p, ("Stopped",), "Starting", "Running", {"StoppedMode": "Not-applicable"})

    def DeleteInstances(self, p: dict[str, Any]) -> dict[str, Any]:
        self._advance()
        rows = [self._row(iid) for iid in p["InstanceId"]]
        for row in rows:
            if row.raw["Status"] != "Stopped" and not _flag(p, "Force", True, default=False):
                raise Refused(403, "IncorrectInstanceStatus", "The current status of the resource does not support "
                              "this operation.")
        for row in rows:
            iid = row.raw["InstanceId"]
            self.stock[(row.raw["ZoneId"], row.raw["InstanceType"])] += 1
            del self.instances[iid]
            self.tags.pop(("instance", iid), None)
        return {}

    # deployment sets
    def CreateDeploymentSet(self, p: dict[str, Any]) -> dict[str, Any]:
        token = p.get("ClientToken")
        if token and ("set", token) in self.tokens:
            return dict(self.tokens[("set", token)])
        if (p.get("Strategy") or "Availability") not in STRATEGIES:
            raise Refused(400, "InvalidParameter", "The specified parameter \"Strategy\" is not valid.")
        sid = self._id("ds")
        self.sets[sid] = {"DeploymentSetId": sid, "DeploymentSetName": p.get("DeploymentSetName", ""),
                          "DeploymentSetDescription": p.get("Description", ""),
                          "Strategy": p.get("Strategy") or "Availability",
                          "DeploymentStrategy": p.get("Strategy") or "Availability",
                          "CreationTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        answer = {"DeploymentSetId": sid}
        if token:
            self.tokens[("set", token)] = answer
        return dict(answer)

    def DescribeDeploymentSets(self, p: dict[str, Any]) -> dict[str, Any]:
        size, number = int(p.get("PageSize") or 10), int(p.get("PageNumber") or 1)
        if not 1 <= size <= 50:
            raise Refused(400, "InvalidParameter", "The specified parameter \"PageSize\" is not valid.")
        ids = json.loads(p["DeploymentSetIds"]) if p.get("DeploymentSetIds") else None
        found = []
        for sid, row in self.sets.items():
            if (ids is not None and sid not in ids) or p.get("DeploymentSetName") not in (None, row["DeploymentSetName"]) \
                    or p.get("Strategy") not in (None, row["Strategy"]):
                continue
            members = sorted(i for i, r in self.instances.items() if r.raw.get("DeploymentSetId") == sid)
            found.append({**row, "InstanceAmount": len(members), "InstanceIds": {"InstanceId": members}})
        page = found[(number - 1) * size:number * size]
        return {"DeploymentSets": {"DeploymentSet": page}, "TotalCount": len(found), "PageNumber": number,
                "PageSize": size, "RegionId": self.region}

    def DeleteDeploymentSet(self, p: dict[str, Any]) -> dict[str, Any]:
        sid = p["DeploymentSetId"]
        if sid not in self.sets:
            raise Refused(400, "InvalidDeploymentSetId.NotFound", "The specified DeploymentSetId does not exist.")
        if any(r.raw.get("DeploymentSetId") == sid for r in self.instances.values()):
            raise Refused(403, "DependencyViolation.NotEmpty", "There are still instance(s) in the specified "
                          "DeploymentSetId.")
        del self.sets[sid]
        return {}

    def ModifyInstanceSpec(self, p: dict[str, Any]) -> dict[str, Any]:
        row = self._row(p["InstanceId"])
        if row.raw["Status"] != "Stopped":
            raise Refused(403, "IncorrectInstanceStatus", "The current status of the resource does not support "
                          "this operation.")
        row.raw["InstanceType"] = p.get("InstanceType", row.raw["InstanceType"])
        return {}

    def reclaim(self, iid: str) -> None:
        """A spot instance taken back: released (SpotInterruptionBehavior Terminate) or stopped (Stop)."""
        with self.lock:
            row = self.instances[iid]
            if row.raw["SpotInterruptionBehavior"] == "Stop":
                row.raw["Status"], row.raw["StoppedMode"] = "Stopped", "StopCharging"
            else:
                del self.instances[iid]

    # images
    def CreateImage(self, p: dict[str, Any]) -> dict[str, Any]:
        token = p.get("ClientToken")
        if token and ("image", token) in self.tokens:
            return dict(self.tokens[("image", token)])
        row = self._row(p["InstanceId"])
        if any(i["ImageName"] == p.get("ImageName") for i in self.images.values()):
            raise Refused(400, "InvalidImageName.Duplicated", "The specified Image name has already been used.")
        image, snapshot = self._id("m"), self._id("s")
        self.snapshots[snapshot] = {"SnapshotId": snapshot}
        self.images[image] = {"ImageId": image, "ImageName": p.get("ImageName", image), "ImageOwnerAlias": "self",
                              "Architecture": "x86_64", "CreationTime": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                              "Status": "Available", "Size": 40, "OSType": "linux",
                              "Description": p.get("Description", ""), "SourceInstance": row.raw["InstanceId"],
                              "DiskDeviceMappings": {"DiskDeviceMapping": [{"SnapshotId": snapshot, "Size": "40",
                                                                            "Type": "system"}]}}
        self._tag("image", image, p.get("Tag"))
        self._tag("snapshot", snapshot, p.get("Tag"))
        answer = {"ImageId": image}
        if token:
            self.tokens[("image", token)] = answer
        return dict(answer)

    def DescribeImages(self, p: dict[str, Any]) -> dict[str, Any]:
        ids = str(p["ImageId"]).split(",") if p.get("ImageId") else None
        found = []
        for image in self.images.values():
            if ids is not None and image["ImageId"] not in ids:
                continue
            if ids is None and p.get("ImageOwnerAlias") not in (None, image["ImageOwnerAlias"]):
                continue
            if p.get("ImageName") not in (None, image["ImageName"]):
                continue
            tags = self.tags.get(("image", image["ImageId"]), {})
            found.append({**{k: v for k, v in image.items() if k != "SourceInstance"},
                          "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in tags.items()]}})
        return {"Images": {"Image": found}, "TotalCount": len(found), "PageNumber": 1, "PageSize": 100}

    def DeleteImage(self, p: dict[str, Any]) -> dict[str, Any]:
        if p["ImageId"] not in self.images:
            raise Refused(404, "InvalidImageId.NotFound", "The specified ImageId does not exist.")
        del self.images[p["ImageId"]]
        self.tags.pop(("image", p["ImageId"]), None)
        return {}

    def DeleteSnapshot(self, p: dict[str, Any]) -> dict[str, Any]:
        if p["SnapshotId"] not in self.snapshots:
            raise Refused(404, "InvalidSnapshotId.NotFound", "The specified SnapshotId does not exist.")
        del self.snapshots[p["SnapshotId"]]
        self.tags.pop(("snapshot", p["SnapshotId"]), None)
        return {}

    # tags
    def ListTagResources(self, p: dict[str, Any]) -> dict[str, Any]:
        keys = [f["TagKey"] for f in p.get("TagFilter") or []]
        rows = [{"ResourceId": rid, "ResourceType": kind, "TagKey": k, "TagValue": v}
                for (kind, rid), tags in self.tags.items() if kind == p["ResourceType"]
                and all(key in tags for key in keys) for k, v in tags.items()]
        return {"TagResources": {"TagResource": rows}, "NextToken": ""}


class Handler(BaseHTTPRequestHandler):
    ecs: Ecs

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        flat = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
        flat.update(parse_qsl(body, keep_blank_values=True))
        try:
            if "Signature" in flat:  # an RPC-signed request (the node's ecs-stop), not the SDK's ACS3 one
                flat = self.ecs.check_rpc(self.command, flat)
            action = self.headers.get("x-acs-action") or flat.pop("Action", "")
            if self.headers.get("x-acs-version") == RAM_VERSION:  # RAM's SDK at the same endpoint
                with self.ecs.lock:
                    answer, lose, hold = self.ecs.ram.handle(action, flat)
                    self.ecs.held += hold
                if hold:
                    self.ecs.released.wait(60)
            else:
                answer, lose = self.ecs.handle(action, flat)
            status = 200
        except Refused as exc:
            answer, lose, status = {"RequestId": str(uuid.uuid4()).upper(), "HostId": HOST_ID, "Code": exc.code,
                                    "Message": exc.message,
                                    "Recommend": f"https://api.aliyun.com/troubleshoot?q={exc.code}"}, False, exc.status
        if lose:  # the work is done, the answer never arrives
            self.close_connection = True
            self.connection.close()
            return
        out = json.dumps(answer).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json;charset=utf-8")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        except OSError:  # a held answer's client was killed meanwhile
            self.close_connection = True

    do_GET = do_POST = _serve

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serve(ecs: Ecs | None = None) -> Iterator[tuple[Ecs, str]]:
    """The imitation on a loopback port, in a thread: (its state, its endpoint URL)."""
    cloud = ecs or Ecs()
    handler = type("BoundHandler", (Handler,), {"ecs": cloud})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield cloud, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    """`python -m tests.alibaba.server [PORT]`: the imitation in the foreground (a sandbox points
    GPUPROV_ALIBABA_ENDPOINT at the URL it prints)."""
    import sys

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), type("BoundHandler", (Handler,), {"ecs": Ecs()}))
    print(f"http://127.0.0.1:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
