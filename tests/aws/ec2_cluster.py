"""What EC2 does for clusters and moto 5.2 does not, played by the fault proxy (in both kinds: EC2's contract).

* Placement groups: moto has no CreatePlacementGroup/DescribePlacementGroups/DeletePlacementGroup at all. In realistic
  kind a new group is unknown (InvalidPlacementGroup.Unknown) to its first ``fresh_lookups`` look-ups by name
  (RunInstances, DescribePlacementGroups, DeletePlacementGroup), as any fresh resource is. The proxy
  keeps them (per region: name, id, strategy, tags from TagSpecification, the instances launched into each) and
  answers in EC2's XML. EC2's refusals: a duplicate name (InvalidPlacementGroup.Duplicate), an unknown name
  (InvalidPlacementGroup.Unknown) on delete or launch, a group with live instances on delete
  (InvalidPlacementGroup.InUse; the proxy asks moto for the instances' states), a spot instance that stops on
  interruption launched into a group (EC2 guide, "Placement group rules and limitations"), a cluster group for a
  type of a family that cannot use one (T2, Mac1: same page). The group name is removed before moto sees the launch.
* MinCount/MaxCount: EC2 launches at least MinCount or nothing, up to MaxCount as capacity allows (RunInstances API
  reference); moto launches MinCount and ignores MaxCount. The proxy forwards MinCount = what EC2 would launch: MaxCount,
  or fewer when a ``capacity`` rule says so (see fault_proxy "capacity").
* Network cards and EFA: moto has no network cards and files interfaces by device index only. The proxy checks what
  EC2 checks -- EFA interface types only on EFA types (EC2 DescribeInstanceTypes EfaSupported), network card index
  below the type's card count, no EFA-only primary interface ("You can't use an EFA-only network interface as the
  primary network interface", EC2 guide "Maximize network bandwidth ... with multiple network cards"), one
  interface per (card, device), and no AssociatePublicIpAddress with more than one interface ("The
  associatePublicIPAddress parameter cannot be specified when launching with multiple network interfaces") -- then
  forwards the primary interface only. The log keeps the request as the tool sent it.

Error codes whose exact text was not confirmed against EC2 are marked so below; tests assert the code, not the text.
"""

from __future__ import annotations

import fnmatch
import http.client
import re
import urllib.parse
import uuid
from typing import Any
from xml.etree import ElementTree as ET
from xml.sax.saxutils import escape

NS = "http://ec2.amazonaws.com/doc/2016-11-15/"


def network_cards(itype: str) -> tuple[int, frozenset[int]]:
    """EC2's own DescribeInstanceTypes facts for a type, as moto ships AWS's data: its network cards
    (MaximumNetworkCards) and those whose InterfaceTypes include efa (none unless EfaSupported)."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    net = (INSTANCE_TYPES.get(itype) or {}).get("NetworkInfo") or {}
    efa = frozenset(int(c["NetworkCardIndex"]) for c in net.get("NetworkCards") or []
                    if "efa" in (c.get("InterfaceTypes") or [])) if net.get("EfaSupported") else frozenset()
    return int(net.get("MaximumNetworkCards") or 1), efa
NO_CLUSTER_PLACEMENT = ("t2", "mac1")  # "Placement group rules and limitations": not for cluster placement groups

Refusal = tuple[int, str, str]  # HTTP status, code, message


def _listed(form: dict[str, str], prefix: str) -> list[str]:
    return [form[k] for k in sorted((k for k in form if re.fullmatch(re.escape(prefix) + r"\.\d+", k)),
                                    key=lambda k: int(k.rsplit(".", 1)[1]))]


def _tags(form: dict[str, str], resource_type: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    for k, v in form.items():
        m = re.fullmatch(r"TagSpecification\.(\d+)\.ResourceType", k)
        if m and v == resource_type:
            spec = f"TagSpecification.{m.group(1)}.Tag"
            for t in re.findall(re.escape(spec) + r"\.(\d+)\.Key", " ".join(form)):
                tags[form[f"{spec}.{t}.Key"]] = form.get(f"{spec}.{t}.Value", "")
    return tags


def _filters(form: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in form.items():
        m = re.fullmatch(r"Filter\.(\d+)\.Name", k)
        if m:
            out[v] = _listed(form, f"Filter.{m.group(1)}.Value")
    return out


def _response(action: str, inner: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{NS}"><requestId>fault-proxy'
            f"</requestId>{inner}</{action}Response>").encode()


class ClusterEc2:
    """Placement groups, MinCount/MaxCount and network-card checks. Methods run under the proxy state's lock,
    except `in_use`, which asks moto."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str | None, str], dict[str, Any]] = {}
        # realistic kind: a new group is unknown to its first N look-ups by name, like any fresh resource (EC2
        # developer guide, "Eventual consistency"); the proxy sets it from its realism settings
        self.fresh_lookups = 0

    def reset(self) -> None:
        self.groups.clear()

    def _fresh(self, req: dict[str, Any], name: str) -> Refusal | None:
        group = self.groups.get((req["region"], name))
        if group is None or group.get("fresh", 0) <= 0:
            return None
        group["fresh"] -= 1
        req["fresh_refused"] = name  # the proxy logs it as realism's own fresh-notfound (and holds nothing for it)
        return 400, "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."

    # -- placement group calls, answered here
    def answer(self, req: dict[str, Any]) -> tuple[int, bytes] | Refusal | None:
        action, form, region = req["action"], req["form"], req["region"]
        if action == "CreatePlacementGroup":
            name = form.get("GroupName", "")
            if (region, name) in self.groups:
                return 400, "InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists."
            group = {"name": name, "id": f"pg-{uuid.uuid4().hex[:17]}", "strategy": form.get("Strategy", "cluster"),
                     "tags": _tags(form, "placement-group"), "instances": [], "zone": None,
                     "fresh": self.fresh_lookups}
            self.groups[(region, name)] = group
            return 200, _response(action, "<return>true</return>" + self._item(group, "placementGroup"))
        if action == "DescribePlacementGroups":
            names, ids, filters = _listed(form, "GroupName"), _listed(form, "GroupId"), _filters(form)
            found = []
            for (r, name), g in self.groups.items():
                if r != region or (names and name not in names) or (ids and g["id"] not in ids):
                    continue
                if not all(self._filtered(g, k, v) for k, v in filters.items()):
                    continue
                found.append(g)
            for n in names:
                refusal = self._fresh(req, n)
                if refusal is not None:
                    return refusal
            unknown = [n for n in names if (region, n) not in self.groups]
            if unknown:
                return 400, "InvalidPlacementGroup.Unknown", f"The Placement Group '{unknown[0]}' is unknown."
            return 200, _response(action, "<placementGroupSet>" + "".join(self._item(g) for g in found)
                                  + "</placementGroupSet>")
        return None

    def delete(self, req: dict[str, Any], live: list[str]) -> tuple[int, bytes] | Refusal:
        """DeletePlacementGroup; `live` = the group's instances moto still has in a state other than terminated."""
        name = req["form"].get("GroupName", "")
        if (req["region"], name) not in self.groups:
            return 400, "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."
        fresh = self._fresh(req, name)
        if fresh is not None:
            return fresh
        if live:
            return 400, "InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use and may not be deleted."
        del self.groups[(req["region"], name)]
        return 200, _response("DeletePlacementGroup", "<return>true</return>")

    def members(self, req: dict[str, Any]) -> list[str]:
        group = self.groups.get((req["region"], req["form"].get("GroupName", "")))
        return list(group["instances"]) if group else []

    # -- RunInstances: checked here, then forwarded in the shape moto understands
    def run_instances(self, req: dict[str, Any], available: int | None) -> Refusal | dict[str, str]:
        """EC2's refusals for the request, or the form to forward to moto."""
        form = dict(req["form"])
        itype = form.get("InstanceType", "")
        family = itype.split(".")[0]
        low, high = int(form.get("MinCount", "1")), int(form.get("MaxCount", "1"))
        if low > high:
            return 400, "InvalidParameterValue", "MinCount must be less than or equal to MaxCount"
        group_name = form.pop("Placement.GroupName", None)
        if group_name is not None:
            group = self.groups.get((req["region"], group_name))
            if group is None:
                return 400, "InvalidPlacementGroup.Unknown", f"The Placement Group '{group_name}' is unknown."
            fresh = self._fresh(req, group_name)
            if fresh is not None:
                return fresh
            if group["strategy"] == "cluster" and family in NO_CLUSTER_PLACEMENT:
                # code as EC2 names such combinations; the message wording is unverified
                return 400, "InvalidParameterCombination", f"{itype} is not supported in a cluster placement group"
            if form.get("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior") in ("stop", "hibernate"):
                return 400, "InvalidParameterCombination", ("You can't launch a Spot Instance that is configured to "
                                                            "stop or hibernate on interruption in a placement group")
        refusal = self._interfaces(form, itype)
        if refusal is not None:
            return refusal
        if available is not None and available < low:
            return 500, "InsufficientInstanceCapacity", (
                f"We currently do not have sufficient {itype} capacity in the Availability Zone you requested "
                f"({form.get('Placement.AvailabilityZone', '?')}). Our system will be working on provisioning "
                "additional capacity.")
        form["MinCount"] = str(high if available is None else min(high, available))  # moto launches MinCount
        form["MaxCount"] = form["MinCount"]
        return form

    def launched(self, req: dict[str, Any], body: bytes) -> None:
        """Remember which instances went into which group (for InUse)."""
        name = req["form"].get("Placement.GroupName")
        group = self.groups.get((req["region"], name)) if name else None
        if group is None:
            return
        try:
            root = ET.fromstring(body)
        except ET.ParseError:
            return
        group["instances"] += [(el.text or "").strip() for el in root.iter() if _local(el.tag) == "instanceId"]

    def _interfaces(self, form: dict[str, str], itype: str) -> Refusal | None:
        nics: dict[str, dict[str, str]] = {}
        for k, v in form.items():
            m = re.fullmatch(r"NetworkInterface\.(\d+)\.(.+)", k)
            if m:
                nics.setdefault(m.group(1), {})[m.group(2)] = v
        if not nics:
            return None
        cards, efa_cards = network_cards(itype)
        seen = set()
        for nic in nics.values():
            kind = nic.get("InterfaceType", "interface")
            card, device = int(nic.get("NetworkCardIndex", "0")), int(nic.get("DeviceIndex", "0"))
            if kind in ("efa", "efa-only") and not efa_cards:
                # code as EC2 names an unsupported combination; wording unverified
                return 400, "InvalidParameterCombination", f"EFA interfaces are not supported on {itype}"
            if card >= cards:
                return 400, "InvalidParameterValue", (f"Network card index {card} is not valid for {itype}: it has "
                                                      f"{cards} network card(s)")  # wording unverified
            if kind in ("efa", "efa-only") and card not in efa_cards:
                return 400, "InvalidParameterCombination", (f"Network card {card} of {itype} does not support EFA "
                                                            "interfaces")  # wording unverified
            if (card, device) in seen:
                return 400, "InvalidParameterValue", f"Two interfaces at network card {card}, device index {device}"
            seen.add((card, device))
            if (card, device) == (0, 0) and kind == "efa-only":
                return 400, "InvalidParameterCombination", "An EFA-only interface cannot be the primary network interface"
            if len(nics) > 1 and nic.get("AssociatePublicIpAddress", "").lower() == "true":
                return 400, "InvalidParameterCombination", ("The associatePublicIPAddress parameter cannot be "
                                                            "specified when launching with multiple network interfaces")
        if (0, 0) not in seen:
            return 400, "InvalidParameterValue", "No primary network interface (network card 0, device index 0)"
        primary = next(n for n, nic in nics.items()
                       if (int(nic.get("NetworkCardIndex", "0")), int(nic.get("DeviceIndex", "0"))) == (0, 0))
        for k in [k for k in form if k.startswith("NetworkInterface.")]:
            del form[k]
        for key, value in nics[primary].items():  # moto has no network cards: only the primary goes on
            if key not in ("NetworkCardIndex", "InterfaceType"):
                form[f"NetworkInterface.1.{key}"] = value
        return None

    # -- helpers
    def _filtered(self, group: dict[str, Any], name: str, values: list[str]) -> bool:
        if name.startswith("tag:"):  # EC2 filter values take the wildcards * and ? (EC2 API reference, "Filters")
            have = group["tags"].get(name[4:])
            return have is not None and any(fnmatch.fnmatchcase(have, v) for v in values)
        if name == "tag-key":
            return any(k in values for k in group["tags"])
        if name == "group-name":
            return group["name"] in values
        if name == "strategy":
            return group["strategy"] in values
        if name == "state":
            return "available" in values
        return True

    def _item(self, g: dict[str, Any], tag: str = "item") -> str:
        tags = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in g["tags"].items())
        return (f"<{tag}><groupName>{escape(g['name'])}</groupName><state>available</state><strategy>"
                f"{escape(g['strategy'])}</strategy><groupId>{g['id']}</groupId><tagSet>{tags}</tagSet></{tag}>")


def live_instances(upstream: urllib.parse.SplitResult, headers: dict[str, str], ids: list[str]) -> list[str]:
    """Which of `ids` moto still has in a state other than terminated (asked with the caller's own headers)."""
    return [i for i, state in instance_states(upstream, headers, ids).items() if state != "terminated"]


def terminate_form(upstream: urllib.parse.SplitResult, headers: dict[str, str],
                   form: dict[str, str]) -> dict[str, str] | bytes | None:
    """TerminateInstances as EC2 answers it for an instance that is already terminated: success (the call is
    idempotent). moto 5.2 fails it with InvalidNetworkInterfaceID.NotFound when the instance was launched with
    NetworkInterfaces (it deletes the interface again), so such ids are not forwarded: the form without them, an
    answer of its own when none is left, or None (nothing to change). Ids moto does not list go on as they are."""
    ids = [v for k, v in sorted(form.items()) if re.fullmatch(r"InstanceId\.\d+", k)]
    done = [i for i, state in instance_states(upstream, headers, ids).items() if state == "terminated"]
    if not done:
        return None
    rest = [i for i in ids if i not in done]
    if not rest:
        items = "".join(f"<item><instanceId>{escape(i)}</instanceId><currentState><code>48</code><name>terminated</name>"
                        "</currentState><previousState><code>48</code><name>terminated</name></previousState></item>"
                        for i in done)
        return (f'<TerminateInstancesResponse xmlns="{NS}"><requestId>{uuid.uuid4()}</requestId>'
                f"<instancesSet>{items}</instancesSet></TerminateInstancesResponse>").encode()
    kept = {k: v for k, v in form.items() if not re.fullmatch(r"InstanceId\.\d+", k)}
    return {**kept, **{f"InstanceId.{n}": i for n, i in enumerate(rest, 1)}}


def instance_states(upstream: urllib.parse.SplitResult, headers: dict[str, str], ids: list[str]) -> dict[str, str]:
    """The state moto lists for each of `ids` it knows (asked with the caller's own headers)."""
    if not ids:
        return {}
    form = {"Action": "DescribeInstances", "Version": "2016-11-15",
            **{f"InstanceId.{i}": v for i, v in enumerate(ids, 1)}}
    c = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
    try:
        hdrs = {k: v for k, v in headers.items() if k.lower() in ("authorization", "x-amz-date", "user-agent")}
        hdrs["Content-Type"] = "application/x-www-form-urlencoded; charset=utf-8"
        c.request("POST", "/", body=urllib.parse.urlencode(form).encode(), headers=hdrs)
        body = c.getresponse().read()
    finally:
        c.close()
    states: dict[str, str] = {}
    for item in ET.fromstring(body).iter():
        children = {_local(c.tag): c for c in item}
        if _local(item.tag) != "item" or "instanceId" not in children or "instanceState" not in children:
            continue
        state = next((c.text for c in children["instanceState"] if _local(c.tag) == "name"), None)
        states[(children["instanceId"].text or "").strip()] = state or ""
    return states


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]
