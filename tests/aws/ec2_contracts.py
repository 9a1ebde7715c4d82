"""EC2 contracts moto 5.2 does not keep, played by the fault proxy (issue 21). Sources, with quotes, in the issue's
research notes (ec2-contracts.md, sections 2, 3, 6, 7, 10, 11, 12); every error text marked *observed* was copied from
a real EC2 reply quoted in a public report (AWS documents few message texts), *unverified* where none was found.

In both kinds (EC2's contract, not timing):
* AssociateAddress by InstanceId of an instance launched with more than one network interface is refused:
  InvalidInstanceID (400, observed: NixOS/nixops-aws#55, cilium/cilium#39654) "There are multiple interfaces attached
  to instance '{id}'. Please specify an interface ID for the operation instead." botocore's AssociateAddress.InstanceId:
  "The instance must have exactly one attached network interface". moto never refuses, and sees the primary interface
  only (ec2_cluster.py forwards just that one), so the proxy remembers how many interfaces each launch asked for.
* AllocateAddress beyond the region's Elastic IP quota: AddressLimitExceeded (400, observed: opstrace/opstrace#273,
  scylladb/scylla-cluster-tests#9503) "The maximum number of addresses has been reached." The quota is "EC2-VPC
  Elastic IPs" (L-0263D0A3), 5 by default (EC2 user guide, "Elastic IP address quota"), shared with the addresses the
  account already holds. The proxy's limit is the canned GetServiceQuota answer for L-0263D0A3 (fixture set_quota)
  where there is one, else 5, or the `address_limit` setting; moto allocates without limit.
* RunInstances whose root volume is smaller than the image's root snapshot: InvalidBlockDeviceMapping (400, observed,
  newest form: splunk/attack_range#1340) "Volume of size {n}GB is smaller than snapshot '{snap}', expect size>= {m}GB";
  moto accepts it. And an image's root snapshot has the size EC2 gives it: CreateImage's, the instance's root volume
  (the snapshot is of that volume); RegisterImage's, the mapping's VolumeSize, else its snapshot's size. moto gives
  every image a 15 GB snapshot of its own; the proxy answers DescribeImages with the sizes EC2 would.
* IPv6 at launch (botocore RunInstances.Ipv6AddressCount: "You cannot specify this option and the network interfaces
  option in the same request"): both at once is InvalidParameterCombination (code as for the observed "Network
  interfaces and an instance-level subnet ID may not be specified on the same request", aws/aws-cli#613; this text
  unverified); a count on a subnet without an IPv6 CIDR block is refused (InvalidParameterValue; code and text
  unverified: moto silently assigns nothing). moto honours only the instance-level count, so a primary interface's
  Ipv6AddressCount is forwarded as that. moto's DescribeSubnets writes an IPv6 block's state as
  "{'State': 'associated'}"; the proxy answers "associated", as EC2 does.
* RunInstances with a security group of another VPC than the subnet it launches into (the one named, or, with none
  named, the default subnet of the zone asked for): InvalidParameter (400, observed: QT-DevOps/DevOpsIssues#256 for a
  launch that named no subnet, kubernetes-sigs/cluster-api-provider-aws#3399, ansible/ansible-modules-core#347; read
  2026-12-02)
  "Security group {sg} and subnet {subnet} belong to different networks."; moto launches it.
* An unknown IamInstanceProfile at RunInstances: EC2 answers InvalidParameterValue (400, observed: aws/aws-sdk-js-v3#5253,
  hashicorp/terraform#9474) "Value ({name}) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance
  Profile name"; moto answers IAM's NoSuchEntity (404). The proxy answers EC2's.
* A Describe call whose filters carry more than 200 values in all: FilterLimitExceeded (400, observed:
  gjbae1212/gossm#47 and convox/rack#2205, DescribeInstances) "The maximum number of filter values specified on a
  single call is 200"; moto answers it.
* Pages: DescribeSpotPriceHistory, DescribeSpotInstanceRequests, DescribeVolumes, DescribeImages and DescribeSnapshots
  answer at most MaxResults items and a NextToken for the rest (botocore's paginators-1.json has a paginator for each;
  moto ignores both). The `page_size` setting (0: off) caps every page as EC2's own page limit would, so a caller
  that reads page 1 only misses items. A NextToken the proxy did not hand out is InvalidParameterValue (wording
  unverified).

In the realistic kind only (timing):
* DescribeImages still lists a deregistered image, state `deregistered`, for its next `deregistered_listed` (3)
  answers that would show it (botocore DescribeImages: "Recently deregistered images appear in the returned results
  for a short interval and then return empty results"); moto forgets it at once.
* An instance profile created through the proxy is refused by RunInstances (the InvalidParameterValue above) for its
  first `fresh_lookups` launches naming it (EC2 user guide, "IAM roles for Amazon EC2": "it might take several
  seconds for the permissions to propagate. If your first attempt to launch an instance with a role fails, wait a
  few seconds before trying again").

Settings (GET/POST /__faults__/contracts): page_size, deregistered_listed, address_limit (None: as above). DELETE
/__faults__ restores them and forgets the timing state; DELETE /__faults__/tokens (moto's reset) forgets what EC2
would know (interfaces per instance). Methods may be called from several handler threads: state sits behind a lock.
"""

from __future__ import annotations

import fnmatch
import json
import re
import threading
from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree as ET
from xml.sax.saxutils import escape

Ask = Callable[[dict[str, str]], tuple[int, bytes, Any]]  # a query to moto with the caller's headers
Refusal = tuple[int, str, str]  # HTTP status, code, message
EIP_QUOTA = "L-0263D0A3"
DEFAULT_ADDRESSES = 5
CONTRACT_DEFAULTS: dict[str, Any] = {"page_size": 0, "deregistered_listed": 3, "address_limit": None}
# the paginated Describe calls gpuprov reads, and the list element of their answers
PAGED = {"DescribeSpotPriceHistory": "spotPriceHistorySet", "DescribeSpotInstanceRequests": "spotInstanceRequestSet",
         "DescribeVolumes": "volumeSet", "DescribeImages": "imagesSet", "DescribeSnapshots": "snapshotSet"}
TOKEN = "fault-proxy-page-"


FILTER_VALUES = 200  # values in all of one call's filters (FilterLimitExceeded beyond)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(el: ET.Element, name: str) -> ET.Element | None:
    return next((c for c in el if _local(c.tag) == name), None)


def _kids(el: ET.Element, name: str) -> list[ET.Element]:
    """The children of `el`'s child `name` (none when it has no such child)."""
    found = _child(el, name)
    return [] if found is None else list(found)


def _text(el: ET.Element, *path: str) -> str:
    for name in path:
        found = _child(el, name)
        if found is None:
            return ""
        el = found
    return (el.text or "").strip()


def _parse(body: bytes) -> ET.Element | None:
    try:
        return ET.fromstring(body)
    except ET.ParseError:
        return None


def _dump(root: ET.Element) -> bytes:
    if root.tag.startswith("{"):
        ET.register_namespace("", root.tag[1:].split("}")[0])  # keep the default namespace (no ns0:) for botocore
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _listed(form: dict[str, str], prefix: str) -> list[str]:
    return [form[k] for k in sorted((k for k in form if re.fullmatch(re.escape(prefix) + r"\.\d+", k)),
                                    key=lambda k: int(k.rsplit(".", 1)[1]))]


def _filters(form: dict[str, str]) -> dict[str, list[str]]:
    return {v: _listed(form, f"Filter.{m.group(1)}.Value") for k, v in form.items()
            if (m := re.fullmatch(r"Filter\.(\d+)\.Name", k))}


def error_body(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{escape(code)}</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors><RequestID>fault-proxy</RequestID></Response>").encode()


def canned_quota(rules: list[dict[str, Any]], region: str | None, code: str) -> float | None:
    """The value a canned GetServiceQuota answer (fixture set_quota) gives for an EC2 quota code in this region."""
    for rule in rules:
        if rule.get("target") != "ServiceQuotasV20190624.GetServiceQuota" or rule.get("body") is None:
            continue
        match = rule.get("match") or {}
        if match.get("QuotaCode") != code or match.get("ServiceCode", "ec2") != "ec2":
            continue
        if rule.get("region") not in (None, region):
            continue
        body = rule["body"] if isinstance(rule["body"], dict) else json.loads(rule["body"])
        return float(body["Quota"]["Value"])
    return None


def interfaces_asked(form: dict[str, str]) -> int:
    """How many network interfaces a RunInstances asked for (one when it names none)."""
    return len({m.group(1) for k in form if (m := re.fullmatch(r"NetworkInterface\.(\d+)\..+", k))}) or 1


def _primary_nic(form: dict[str, str]) -> str | None:
    """The N of the NetworkInterface.N that is card 0, device 0."""
    for n in sorted({m.group(1) for k in form if (m := re.fullmatch(r"NetworkInterface\.(\d+)\..+", k))}):
        if (form.get(f"NetworkInterface.{n}.NetworkCardIndex", "0"), form.get(f"NetworkInterface.{n}.DeviceIndex")) == ("0", "0"):
            return n
    return None


class Ec2Contracts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.settings: dict[str, Any] = dict(CONTRACT_DEFAULTS)
        self.interfaces: dict[tuple[str | None, str], int] = {}  # (region, instance id) -> interfaces launched with
        self.profiles: dict[str, int] = {}  # instance profile -> launches still refused (IAM propagation)
        self.deregistered: dict[tuple[str | None, str], dict[str, Any]] = {}  # (region, image id) -> {"item", "left"}
        # (region, image id) -> (root device, GB, snapshot id where RegisterImage named one)
        self.roots: dict[tuple[str | None, str], tuple[str, int, str | None]] = {}

    # -- settings and state
    def reset(self) -> None:
        """DELETE /__faults__: the settings back to their defaults, timing state forgotten."""
        with self.lock:
            self.settings = dict(CONTRACT_DEFAULTS)
            self.profiles.clear()
            self.deregistered.clear()

    def forget(self) -> None:
        """moto's reset: what EC2 knew about its instances goes with them."""
        with self.lock:
            self.interfaces.clear()
            self.roots.clear()

    def configure(self, update: dict[str, Any]) -> dict[str, Any]:
        unknown = set(update) - set(CONTRACT_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown contract settings {sorted(unknown)}")
        new = dict(self.settings, **update)
        for k in ("page_size", "deregistered_listed"):
            if isinstance(new[k], bool) or not isinstance(new[k], int) or new[k] < 0:
                raise ValueError(f"{k} must be an integer >= 0, not {new[k]!r}")
        limit = new["address_limit"]
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"address_limit must be null or an integer >= 0, not {limit!r}")
        with self.lock:
            self.settings = new
            return dict(new)

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {**self.settings, "interfaces": [{"region": r, "instance": i, "interfaces": n}
                                                     for (r, i), n in self.interfaces.items()],
                    "profiles": dict(self.profiles),
                    "deregistered": [{"region": r, "image": i, "left": d["left"]} for (r, i), d in self.deregistered.items()]}

    # -- before a request reaches moto
    def before(self, req: dict[str, Any], ask: Ask, rules: list[dict[str, Any]], realistic: bool) -> Refusal | None:
        """EC2's refusal of this request, or None to go on (moto is asked with `ask` where EC2 would know more)."""
        if req["target"] is not None or req["service"] not in (None, "ec2"):
            return None
        action, form, region = req["action"], req["form"], req["region"]
        if sum(len(values) for values in _filters(form).values()) > FILTER_VALUES:
            return 400, "FilterLimitExceeded", "The maximum number of filter values specified on a single call is 200"
        if action == "AssociateAddress" and form.get("InstanceId") and form.get("NetworkInterfaceId"):
            return 400, "InvalidParameterCombination", ("Specify either an instance ID or a network interface ID, "
                                                        "not both")  # botocore: "but not both"; text unverified
        if action == "AssociateAddress" and form.get("InstanceId"):
            with self.lock:
                many = self.interfaces.get((region, form["InstanceId"]), 1) > 1
            if many:
                return 400, "InvalidInstanceID", (f"There are multiple interfaces attached to instance '{form['InstanceId']}'. "
                                                  "Please specify an interface ID for the operation instead.")
        elif action == "AllocateAddress":
            return self._address_limit(region, ask, rules)
        elif action == "RunInstances":
            return (self._root_volume(region, form, ask) or self._ipv6(form, ask) or self._networks(form, ask)
                    or self._profile(form, realistic))
        elif action in ("CreateImage", "RegisterImage"):
            req["image_root"] = self._root_of_new_image(form, ask)
        elif action == "CopyImage":  # the copy's root snapshot is the source's size (its id: the copy's own)
            with self.lock:
                source = self.roots.get((form.get("SourceRegion"), form.get("SourceImageId", "")))
            req["image_root"] = (source[0], source[1], None) if source else None
        elif action == "DeregisterImage" and realistic:
            status, body, _ = ask({"Action": "DescribeImages", "Version": "2016-11-15", "ImageId.1": form.get("ImageId", "")})
            root = _parse(body) if status == 200 else None
            items = [] if root is None else [i for s in root if _local(s.tag) == "imagesSet" for i in s]
            if items:
                req["deregistering"] = ET.tostring(items[0], encoding="unicode")
        elif action in PAGED:
            return self._token(form)
        return None

    def _address_limit(self, region: str | None, ask: Ask, rules: list[dict[str, Any]]) -> Refusal | None:
        with self.lock:
            limit = self.settings["address_limit"]
        if limit is None:
            quota = canned_quota(rules, region, EIP_QUOTA)
            limit = int(quota) if quota is not None else DEFAULT_ADDRESSES
        status, body, _ = ask({"Action": "DescribeAddresses", "Version": "2016-11-15"})
        root = _parse(body) if status == 200 else None
        held = 0 if root is None else sum(len(s) for s in root if _local(s.tag) == "addressesSet")
        if held >= limit:
            return 400, "AddressLimitExceeded", "The maximum number of addresses has been reached."
        return None

    def _root_of_new_image(self, form: dict[str, str], ask: Ask) -> tuple[str, int, str | None] | None:
        """(root device, GB, snapshot) of the image this CreateImage or RegisterImage makes, as EC2 sizes it."""
        def one(query: dict[str, str], listing: str) -> ET.Element | None:
            status, body, _ = ask({"Version": "2016-11-15", **query})
            root = _parse(body) if status == 200 else None
            items = [] if root is None else [i for s in root.iter() if _local(s.tag) == listing for i in s]
            return items[0] if items else None

        if form.get("Action") == "RegisterImage":
            device = form.get("RootDeviceName", "")
            n = next((k.split(".")[1] for k in form if re.fullmatch(r"BlockDeviceMapping\.\d+\.DeviceName", k)
                      and form[k] == device), None)
            if n is None:
                return None
            snap_id = form.get(f"BlockDeviceMapping.{n}.Ebs.SnapshotId") or None
            if form.get(f"BlockDeviceMapping.{n}.Ebs.VolumeSize"):
                return device, int(form[f"BlockDeviceMapping.{n}.Ebs.VolumeSize"]), snap_id
            snap = one({"Action": "DescribeSnapshots", "SnapshotId.1": snap_id or ""}, "snapshotSet")
            return (device, int(_text(snap, "volumeSize")), snap_id) if snap is not None and _text(snap, "volumeSize") \
                else None
        inst = one({"Action": "DescribeInstances", "InstanceId.1": form.get("InstanceId", "")}, "instancesSet")
        if inst is None:
            return None
        device = _text(inst, "rootDeviceName")
        volume = next((_text(m, "ebs", "volumeId") for m in _kids(inst, "blockDeviceMapping")
                       if _text(m, "deviceName") == device), "")
        found = one({"Action": "DescribeVolumes", "VolumeId.1": volume}, "volumeSet") if volume else None
        return (device, int(_text(found, "size")), None) if found is not None and _text(found, "size") else None

    def _root_volume(self, region: str | None, form: dict[str, str], ask: Ask) -> Refusal | None:
        asked = {form[k]: form.get(k.replace(".DeviceName", ".Ebs.VolumeSize")) for k in form
                 if re.fullmatch(r"BlockDeviceMapping\.\d+\.DeviceName", k)}
        if not any(asked.values()):
            return None
        status, body, _ = ask({"Action": "DescribeImages", "Version": "2016-11-15", "ImageId.1": form.get("ImageId", "")})
        root = _parse(body) if status == 200 else None
        if root is not None:
            self._sized(root, region)
        for image in [] if root is None else [i for s in root if _local(s.tag) == "imagesSet" for i in s]:
            device = _text(image, "rootDeviceName")
            for mapping in _kids(image, "blockDeviceMapping"):
                if _text(mapping, "deviceName") != device or not _text(mapping, "ebs", "volumeSize"):
                    continue
                need, want = int(_text(mapping, "ebs", "volumeSize")), asked.get(device)
                if want and int(want) < need:
                    return 400, "InvalidBlockDeviceMapping", (f"Volume of size {want}GB is smaller than snapshot "
                                                              f"'{_text(mapping, 'ebs', 'snapshotId')}', expect size>= {need}GB")
        return None

    def _ipv6(self, form: dict[str, str], ask: Ask) -> Refusal | None:
        nics = any(k.startswith("NetworkInterface.") for k in form)
        if form.get("Ipv6AddressCount") and nics:
            return 400, "InvalidParameterCombination", ("Network interfaces and an instance-level IPv6 address count may "
                                                        "not be specified on the same request")
        primary = _primary_nic(form)
        count = form.get("Ipv6AddressCount") or (form.get(f"NetworkInterface.{primary}.Ipv6AddressCount") if primary else None)
        if not count or int(count) < 1:
            return None
        subnet = form.get("SubnetId") or (form.get(f"NetworkInterface.{primary}.SubnetId") if primary else None)
        query = {"Action": "DescribeSubnets", "Version": "2016-11-15"}
        if subnet:
            query["SubnetId.1"] = subnet
        else:  # the default subnet of the zone asked for
            query.update({"Filter.1.Name": "default-for-az", "Filter.1.Value.1": "true",
                          "Filter.2.Name": "availability-zone", "Filter.2.Value.1": form.get("Placement.AvailabilityZone", "")})
        status, body, _ = ask(query)
        root = _parse(body) if status == 200 else None
        subnets = [] if root is None else [i for s in root if _local(s.tag) == "subnetSet" for i in s]
        if any(_text(a, "ipv6CidrBlock") for s in subnets for a in _kids(s, "ipv6CidrBlockAssociationSet")):
            return None
        named = subnet or (_text(subnets[0], "subnetId") if subnets else "?")
        return 400, "InvalidParameterValue", (f"The subnet '{named}' has no IPv6 CIDR block: no IPv6 address can be "
                                              "assigned")  # code and text unverified

    def _networks(self, form: dict[str, str], ask: Ask) -> Refusal | None:
        """Each interface's groups (the instance-level ones go on the primary) against its subnet's VPC."""
        nics = sorted({m.group(1) for k in form if (m := re.fullmatch(r"NetworkInterface\.(\d+)\..+", k))})
        pairs = [(form.get(f"NetworkInterface.{n}.SubnetId"), _listed(form, f"NetworkInterface.{n}.SecurityGroupId"))
                 for n in nics]
        if not nics:
            pairs = [(form.get("SubnetId"), _listed(form, "SecurityGroupId"))]
        for subnet, groups in pairs:
            if not groups:
                continue  # the VPC's default group
            query = {"Action": "DescribeSubnets", "Version": "2016-11-15"}
            if subnet:
                query["SubnetId.1"] = subnet
            else:  # EC2 picks the default subnet of the zone asked for (of any zone: all are the default VPC's)
                query.update({"Filter.1.Name": "default-for-az", "Filter.1.Value.1": "true"})
                if form.get("Placement.AvailabilityZone"):
                    query.update({"Filter.2.Name": "availability-zone",
                                  "Filter.2.Value.1": form["Placement.AvailabilityZone"]})
            status, body, _ = ask(query)
            root = _parse(body) if status == 200 else None
            subnets = [] if root is None else [i for s in root if _local(s.tag) == "subnetSet" for i in s]
            if not subnets:
                continue  # moto answers an unknown subnet (or a region without a default one) itself
            vpc, named = _text(subnets[0], "vpcId"), _text(subnets[0], "subnetId")
            status, body, _ = ask({"Action": "DescribeSecurityGroups", "Version": "2016-11-15",
                                   **{f"GroupId.{i}": g for i, g in enumerate(groups, 1)}})
            root = _parse(body) if status == 200 else None
            found = [] if root is None else [i for s in root if _local(s.tag) == "securityGroupInfo" for i in s]
            for group in found:
                if _text(group, "vpcId") and _text(group, "vpcId") != vpc:
                    return 400, "InvalidParameter", (f"Security group {_text(group, 'groupId')} and subnet {named} "
                                                     "belong to different networks.")
        return None

    def _profile(self, form: dict[str, str], realistic: bool) -> Refusal | None:
        name = form.get("IamInstanceProfile.Name")
        if not name or not realistic:
            return None
        with self.lock:
            if self.profiles.get(name, 0) <= 0:
                return None
            self.profiles[name] -= 1
        return 400, "InvalidParameterValue", profile_message(name)

    def _token(self, form: dict[str, str]) -> Refusal | None:
        token = form.get("NextToken")
        if token and not re.fullmatch(re.escape(TOKEN) + r"\d+", token):
            return 400, "InvalidParameterValue", f"The value '{token}' for parameter NextToken is invalid."  # unverified
        return None

    def shape(self, req: dict[str, Any], ask: Ask) -> None:
        """The request as moto understands it (req["forward_form"]). RunInstances: the primary interface's IPv6 count
        as the instance-level one (moto applies only that, to every interface it makes: the primary is the only one
        the proxy forwards). AssociateAddress by interface: with its instance too, so that DescribeAddresses names
        the instance as EC2's does (moto leaves it out)."""
        if req["target"] is not None or req["service"] not in (None, "ec2"):
            return
        form = req.get("forward_form")
        if req["action"] == "AssociateAddress" and req["form"].get("NetworkInterfaceId") and not req["form"].get("InstanceId"):
            status, body, _ = ask({"Action": "DescribeNetworkInterfaces", "Version": "2016-11-15",
                                   "NetworkInterfaceId.1": req["form"]["NetworkInterfaceId"]})
            root = _parse(body) if status == 200 else None
            attached = [_text(i, "attachment", "instanceId") for s in ([] if root is None else root)
                        if _local(s.tag) == "networkInterfaceSet" for i in s]
            if attached and attached[0]:
                req["forward_form"] = {**req["form"], "InstanceId": attached[0]}
        elif req["action"] == "RunInstances" and form is not None:
            count = form.pop("NetworkInterface.1.Ipv6AddressCount", None)
            if count is not None:
                form["Ipv6AddressCount"] = count

    # -- after moto answered
    def after(self, req: dict[str, Any], status: int, body: bytes, realism: dict[str, Any]) -> tuple[int, bytes]:
        """Learn from the answer and make it EC2's."""
        action, form, region = req["action"], req["form"], req["region"]
        realistic = realism.get("kind") == "realistic"
        if req["service"] == "iam" and action == "CreateInstanceProfile" and status == 200 and realistic:
            with self.lock:
                self.profiles[form.get("InstanceProfileName", "")] = int(realism.get("fresh_lookups", 2))
            return status, body
        if req["target"] is not None or req["service"] not in (None, "ec2"):
            return status, body
        if action == "RunInstances":
            if status == 404 and b"NoSuchEntity" in body and form.get("IamInstanceProfile.Name"):
                return 400, error_body("InvalidParameterValue", profile_message(form["IamInstanceProfile.Name"]))
            root = _parse(body) if status == 200 else None
            many = interfaces_asked(form)
            if root is not None and many > 1:
                with self.lock:
                    for el in root.iter():
                        if _local(el.tag) == "instanceId" and el.text:
                            self.interfaces[(region, el.text.strip())] = many
            return status, body
        if status != 200:
            return status, body
        if action in ("CreateImage", "RegisterImage", "CopyImage") and req.get("image_root"):
            root = _parse(body)
            image_id = _text(root, "imageId") if root is not None else ""
            if image_id:
                with self.lock:
                    self.roots[(region, image_id)] = req["image_root"]
        if action == "DeregisterImage" and req.get("deregistering"):
            item = ET.fromstring(req["deregistering"])
            for el in item:
                if _local(el.tag) == "imageState":
                    el.text = "deregistered"
            with self.lock:
                self.deregistered[(region, form.get("ImageId", ""))] = {
                    "item": ET.tostring(item, encoding="unicode"), "left": self.settings["deregistered_listed"]}
        elif action == "DescribeSubnets":
            body = self._subnet_states(body)
        if action == "DescribeImages" and (root := _parse(body)) is not None and self._sized(root, region):
            body = _dump(root)
        if action == "DescribeImages" and realistic:
            body = self._still_listed(req, body)
        if action in PAGED:
            return self.page(req, status, body)
        return status, body

    def _sized(self, root: ET.Element, region: str | None) -> bool:
        """Each known image's root snapshot in a DescribeImages answer at the size EC2 gave it; whether any was."""
        with self.lock:
            sizes = {image: size for (r, image), size in self.roots.items() if r == region}
        changed = False
        for image in [i for s in root if _local(s.tag) == "imagesSet" for i in s]:
            known = sizes.get(_text(image, "imageId"))
            for mapping in _kids(image, "blockDeviceMapping") if known else []:
                ebs = _child(mapping, "ebs")
                if not known or ebs is None or _text(mapping, "deviceName") != known[0]:
                    continue
                for field, value in (("volumeSize", str(known[1])), ("snapshotId", known[2])):
                    el = _child(ebs, field)
                    if el is not None and value:
                        el.text, changed = value, True
        return changed

    def _subnet_states(self, body: bytes) -> bytes:
        root = _parse(body)
        if root is None:
            return body
        changed = False
        for el in root.iter():
            if _local(el.tag) == "ipv6CidrBlockState":
                state = _child(el, "state")
                if state is not None and state.text and (m := re.fullmatch(r"\{'State': '(\w+)'\}", state.text)):
                    state.text, changed = m.group(1), True
        return _dump(root) if changed else body

    def _still_listed(self, req: dict[str, Any], body: bytes) -> bytes:
        """Deregistered images this DescribeImages would still show, added with state `deregistered`."""
        with self.lock:
            mine = [(k, d) for k, d in self.deregistered.items() if k[0] == req["region"] and d["left"] > 0]
        if not mine:
            return body
        root = _parse(body)
        listing = None if root is None else _child(root, "imagesSet")
        if listing is None:
            return body
        shown = {_text(i, "imageId") for i in listing}
        added = False
        for key, rec in mine:
            item = ET.fromstring(rec["item"])
            if key[1] in shown or not _image_matches(item, req["form"]):
                continue
            listing.append(item)
            added = True
            with self.lock:
                rec["left"] -= 1
        return _dump(root) if added and root is not None else body

    def page(self, req: dict[str, Any], status: int, body: bytes) -> tuple[int, bytes]:
        """At most min(MaxResults, page_size) items from NextToken on, and the NextToken of the rest."""
        form = req["form"]
        with self.lock:
            size = self.settings["page_size"]
        limits = [int(form["MaxResults"])] if form.get("MaxResults", "").isdigit() else []
        limits += [size] if size else []
        token = form.get("NextToken") or ""
        if status != 200 or not (limits or token):
            return status, body
        root = _parse(body)
        listing = None if root is None else _child(root, PAGED[req["action"]])
        if root is None or listing is None:
            return status, body
        start = int(token[len(TOKEN):]) if token.startswith(TOKEN) else 0
        items = list(listing)
        end = start + min(limits) if limits else len(items)
        for i, item in enumerate(items):
            if not start <= i < end:
                listing.remove(item)
        old = _child(root, "nextToken")
        if old is not None:
            root.remove(old)
        if end < len(items):
            ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
            ET.SubElement(root, f"{ns}nextToken").text = f"{TOKEN}{end}"
        return status, _dump(root)


def profile_message(name: str) -> str:
    return f"Value ({name}) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"


def _image_matches(item: ET.Element, form: dict[str, str]) -> bool:
    """Whether a DescribeImages request would show this image (the filters gpuprov and its tests use)."""
    ids = _listed(form, "ImageId")
    if ids and _text(item, "imageId") not in ids:
        return False
    owners = _listed(form, "Owner")
    if owners and not ({"self", _text(item, "imageOwnerId")} & set(owners)):
        return False
    if _listed(form, "ExecutableBy"):
        return False
    tags = {_text(t, "key"): _text(t, "value") for t in _kids(item, "tagSet")}
    fields = {"name": _text(item, "name"), "image-id": _text(item, "imageId"), "state": _text(item, "imageState"),
              "owner-id": _text(item, "imageOwnerId")}
    for name, values in _filters(form).items():
        if name.startswith("tag:"):
            have: str | None = tags.get(name[4:])
        elif name == "tag-key":
            if not set(values) & set(tags):
                return False
            continue
        elif name in fields:
            have = fields[name]
        else:
            return False  # a filter not imitated here: leave the image out rather than show it wrongly
        if have is None or not any(fnmatch.fnmatchcase(have, v) for v in values):
            return False
    return True

