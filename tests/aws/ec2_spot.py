"""Spot requests as EC2 keeps them for RunInstances and moto 5.2 does not, played by the fault proxy (in both kinds:
EC2's contract, not timing). Sources: EC2 user guide "Spot Instance requests" and "Spot request status" (the
awsdocs snapshot of 2023), botocore's EC2 model (CancelSpotInstanceRequests, StateReason), observed replies quoted
in public issues (/tmp research notes, ec2-contracts.md section 1).

* RunInstances with InstanceMarketOptions.MarketType=spot makes one request per instance (moto makes none): its id
  goes into the reply and into every DescribeInstances answer (SpotInstanceRequestId), its tags are the
  spot-instances-request TagSpecification, its type and interruption behaviour those of SpotOptions.
* DescribeSpotInstanceRequests and CancelSpotInstanceRequests are answered here. A cancelled request stays visible as
  `cancelled` (moto deletes it); cancelling does not terminate a running instance, but does terminate a stopped one
  ("If you cancel a disabled Spot Instance request that has a stopped Spot Instance, the stopped Spot Instance is
  automatically terminated"). An unknown id is InvalidSpotInstanceRequestID.NotFound.
* Terminating the instance of a persistent request that was not cancelled opens the request again and EC2 launches a
  new instance for it, with the same tags ("If you terminate a running or stopped Spot Instance that was launched by a
  persistent Spot Instance request, the Spot Instance request transitions to the open state so that a new Spot
  Instance can be launched"); the proxy launches it in moto at once. A one-time request's instance terminated: the
  request is `closed`.
* StopInstances of a one-time request's instance is refused (UnsupportedOperation, text observed); a stopped
  persistent request is `disabled`, and `active` again once started.
* Interruptions (control API POST /__faults__/spot/interrupt {"region", "instance_id"}): a persistent request's
  instance (behaviour stop) is stopped with StateReason Server.SpotInstanceShutdown and its request is `disabled`; a
  one-time one is terminated with Server.SpotInstanceTermination and its request `closed`.
* A RunInstances rule with ``spot_dies: CODE`` (e.g. Server.InsufficientInstanceCapacity): the instance goes from
  pending to terminated at once, with that StateReason (botocore's StateReason doc lists the codes).
moto sets StateReason Client.UserInitiatedShutdown on every stop and terminate; the proxy's reasons replace it.
"""

from __future__ import annotations

import http.client
import time
import urllib.parse
import uuid
from typing import Any
from xml.etree import ElementTree as ET
from xml.sax.saxutils import escape

try:  # as a module (tests) or beside fault_proxy.py run as a script
    from tests.aws.ec2_cluster import NS, _filters, _listed, _local, _response, _tags
except ImportError:  # pragma: no cover - script mode
    from ec2_cluster import NS, _filters, _listed, _local, _response, _tags  # type: ignore[no-redef]

REASONS = {  # botocore's StateReason.Message documentation
    "Server.SpotInstanceShutdown": "Server.SpotInstanceShutdown: The instance was stopped because the number of Spot "
                                   "requests with a maximum price equal to or higher than the Spot price exceeded "
                                   "available capacity or because of an increase in the Spot price.",
    "Server.SpotInstanceTermination": "Server.SpotInstanceTermination: The instance was terminated because the number "
                                      "of Spot requests with a maximum price equal to or higher than the Spot price "
                                      "exceeded available capacity or because of an increase in the Spot price.",
    "Server.InsufficientInstanceCapacity": "Server.InsufficientInstanceCapacity: There was insufficient capacity "
                                           "available to satisfy the launch request.",
}

Upstream = tuple[urllib.parse.SplitResult, dict[str, str]]  # moto's address, the caller's signing headers


def ec2_call(upstream: Upstream, form: dict[str, str]) -> bytes:
    """One EC2 call straight to moto, signed with the caller's headers (moto reads the region from them)."""
    where, headers = upstream
    c = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    try:
        hdrs = {k: v for k, v in headers.items() if k.lower() in ("authorization", "x-amz-date", "user-agent")}
        hdrs["Content-Type"] = "application/x-www-form-urlencoded; charset=utf-8"
        c.request("POST", "/", body=urllib.parse.urlencode({"Version": "2016-11-15", **form}).encode(), headers=hdrs)
        return c.getresponse().read()
    finally:
        c.close()


def _ids(body: bytes) -> list[str]:
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return []
    return [(el.text or "").strip() for item in root.iter() if _local(item.tag) == "item"
            for el in item if _local(el.tag) == "instanceId"]


class SpotEc2:
    """Spot requests of RunInstances, per region. Methods run under the proxy state's lock, except those that take
    an `upstream` (they call moto and must not hold it)."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str | None, str], dict[str, Any]] = {}
        self.by_instance: dict[tuple[str | None, str], str] = {}
        self.reasons: dict[tuple[str | None, str], str] = {}  # instance -> StateReason code

    def reset(self) -> None:
        self.requests.clear()
        self.by_instance.clear()
        self.reasons.clear()

    # -- after a RunInstances moto answered
    def launched(self, req: dict[str, Any], body: bytes) -> bytes:
        """Make the launch's requests and put their ids into the reply."""
        form = req.get("forward_form") or req["form"]
        if req["form"].get("InstanceMarketOptions.MarketType") != "spot":
            return body
        kind = req["form"].get("InstanceMarketOptions.SpotOptions.SpotInstanceType", "one-time")
        behaviour = req["form"].get("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior", "terminate")
        for iid in _ids(body):
            sir = f"sir-{uuid.uuid4().hex[:8]}"
            relaunch = {k: v for k, v in form.items() if k not in ("ClientToken", "MinCount", "MaxCount")}
            self.requests[(req["region"], sir)] = {
                "id": sir, "type": kind, "behaviour": behaviour, "state": "active", "status": "fulfilled",
                "instance": iid, "tags": _tags(req["form"], "spot-instances-request"), "form": relaunch,
                "price": req["form"].get("InstanceMarketOptions.SpotOptions.MaxPrice", ""),
                "zone": req["form"].get("Placement.AvailabilityZone", "")}
            self.by_instance[(req["region"], iid)] = sir
        return self.rewrite(req["region"], body)

    def rewrite(self, region: str | None, body: bytes) -> bytes:
        """An instance reply (RunInstances, DescribeInstances) with each instance's request id and the reasons the
        proxy gave stops and terminations."""
        try:
            root = ET.fromstring(body)
        except ET.ParseError:
            return body
        ns = root.tag.partition("}")[0].lstrip("{") if root.tag.startswith("{") else ""
        q = (lambda tag: f"{{{ns}}}{tag}") if ns else (lambda tag: tag)
        changed = False
        for instances in root.iter(q("instancesSet")):
            for item in instances.findall(q("item")):
                iid = (item.findtext(q("instanceId")) or "").strip()
                sir = self.by_instance.get((region, iid))
                if sir and item.find(q("spotInstanceRequestId")) is None:
                    ET.SubElement(item, q("spotInstanceRequestId")).text = sir
                    changed = True
                code = self.reasons.get((region, iid))
                if code:
                    for old in item.findall(q("stateReason")):
                        item.remove(old)
                    reason = ET.SubElement(item, q("stateReason"))
                    ET.SubElement(reason, q("code")).text = code
                    ET.SubElement(reason, q("message")).text = REASONS[code]
                    transition = item.find(q("reason"))
                    if transition is not None:
                        transition.text = REASONS[code]
                    changed = True
        if not changed:
            return body
        if ns:
            ET.register_namespace("", ns)
        return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root)

    # -- answered here
    def answer(self, req: dict[str, Any]) -> tuple[int, bytes] | tuple[int, str, str] | None:
        action, form, region = req["action"], req["form"], req["region"]
        if action == "DescribeSpotInstanceRequests":  # by id, ours only (else moto answers, merge() adds ours)
            wanted = _listed(form, "SpotInstanceRequestId")
            if not wanted or not all((region, w) in self.requests for w in wanted):
                return None
            found = [self.requests[(region, w)] for w in wanted]
            found = [r for r in found if all(self._filtered(r, k, v) for k, v in _filters(form).items())]
            return 200, _response(action, "<spotInstanceRequestSet>" + "".join(self._item(r) for r in found)
                                  + "</spotInstanceRequestSet>")
        if action == "StopInstances":
            for iid in _listed(form, "InstanceId"):
                sir = self.by_instance.get((region, iid))
                if sir and self.requests[(region, sir)]["type"] == "one-time":
                    return 400, "UnsupportedOperation", (
                        f"You can't stop the Spot Instance '{iid}' because it is associated with a one-time Spot "
                        "Instance request. You can only stop Spot Instances associated with persistent Spot Instance "
                        "requests.")
        return None

    def merge(self, req: dict[str, Any], body: bytes) -> bytes:
        """moto's DescribeSpotInstanceRequests answer (its RequestSpotInstances requests) with ours added."""
        form, region = req["form"], req["region"]
        if _listed(form, "SpotInstanceRequestId"):
            return body
        filters = _filters(form)
        ours = "".join(self._item(r) for (reg, _s), r in self.requests.items()
                       if reg == region and all(self._filtered(r, k, v) for k, v in filters.items()))
        text = body.decode()
        if "<spotInstanceRequestSet/>" in text:
            text = text.replace("<spotInstanceRequestSet/>", f"<spotInstanceRequestSet>{ours}</spotInstanceRequestSet>")
        else:
            text = text.replace("</spotInstanceRequestSet>", ours + "</spotInstanceRequestSet>", 1)
        return text.encode()

    def mine(self, req: dict[str, Any]) -> bool:
        """A CancelSpotInstanceRequests whose ids are all the proxy's (others go to moto)."""
        wanted = _listed(req["form"], "SpotInstanceRequestId")
        return bool(wanted) and all((req["region"], w) in self.requests for w in wanted)

    def cancel(self, req: dict[str, Any], upstream: Upstream, lock: Any) -> tuple[int, bytes] | tuple[int, str, str]:
        """CancelSpotInstanceRequests: each request `cancelled` and kept; a stopped instance of one terminated."""
        region = req["region"]
        with lock:
            wanted = _listed(req["form"], "SpotInstanceRequestId")
            stopped = []
            for sid in wanted:
                r = self.requests[(region, sid)]
                if r["state"] == "disabled" and r["instance"]:
                    stopped.append(r["instance"])
                r["state"], r["status"] = "cancelled", "request-canceled-and-instance-running"
        if stopped:
            ec2_call(upstream, {"Action": "TerminateInstances", **{f"InstanceId.{i}": v for i, v in enumerate(stopped, 1)}})
        items = "".join(f"<item><spotInstanceRequestId>{s}</spotInstanceRequestId><state>cancelled</state></item>"
                        for s in wanted)
        return 200, _response("CancelSpotInstanceRequests", f"<spotInstanceRequestSet>{items}</spotInstanceRequestSet>")

    # -- after an instance call moto answered
    def after(self, req: dict[str, Any], status: int, upstream: Upstream, lock: Any) -> None:
        """Stop, start and terminate as EC2 carries them to the instances' requests; a persistent request whose
        instance was terminated launches a new one."""
        action, region = req["action"], req["region"]
        if status != 200 or action not in ("TerminateInstances", "StopInstances", "StartInstances"):
            return
        relaunch = []
        with lock:
            for iid in _listed(req["form"], "InstanceId"):
                sir = self.by_instance.get((region, iid))
                if sir is None:
                    continue
                r = self.requests[(region, sir)]
                if action == "StopInstances" and r["state"] == "active":
                    r["state"], r["status"] = "disabled", "instance-stopped-by-user"
                elif action == "StartInstances" and r["state"] == "disabled":
                    r["state"], r["status"] = "active", "fulfilled"
                elif action == "TerminateInstances" and r["state"] in ("active", "disabled", "open"):
                    if r["type"] == "persistent":
                        r["state"], r["status"], r["instance"] = "open", "pending-evaluation", None
                        relaunch.append(r)
                    else:
                        r["state"], r["status"] = "closed", "instance-terminated-by-user"
        for r in relaunch:  # EC2 launches a new instance for the open request, with the request's launch spec
            body = ec2_call(upstream, {**r["form"], "MinCount": "1", "MaxCount": "1",
                                       "ClientToken": f"relaunch-{uuid.uuid4().hex[:12]}"})
            with lock:
                for iid in _ids(body):
                    r["instance"], r["state"], r["status"] = iid, "active", "fulfilled"
                    self.by_instance[(region, iid)] = r["id"]

    def interrupt(self, region: str | None, iid: str, upstream: Upstream, lock: Any) -> str:
        """EC2 interrupts the instance: stop (persistent, behaviour stop) or terminate; returns what it did."""
        with lock:
            sir = self.by_instance.get((region, iid))
            if sir is None:
                raise ValueError(f"{iid} has no spot request")
            r = self.requests[(region, sir)]
            stop = r["type"] == "persistent" and r["behaviour"] in ("stop", "hibernate")
            self.reasons[(region, iid)] = "Server.SpotInstanceShutdown" if stop else "Server.SpotInstanceTermination"
            if stop:
                r["state"], r["status"] = "disabled", "instance-stopped-no-capacity"
            else:
                r["state"], r["status"] = "closed", "instance-terminated-no-capacity"
        ec2_call(upstream, {"Action": "StopInstances" if stop else "TerminateInstances", "InstanceId.1": iid})
        return "stopped" if stop else "terminated"

    def dies(self, region: str | None, body: bytes, code: str, upstream: Upstream, lock: Any) -> None:
        """The launch's instances go from pending to terminated at once, with the reason `code`."""
        ids = _ids(body)
        with lock:
            for iid in ids:
                self.reasons[(region, iid)] = code
                sir = self.by_instance.get((region, iid))
                if sir:
                    self.requests[(region, sir)].update(state="closed", status="instance-terminated-no-capacity")
        if ids:
            ec2_call(upstream, {"Action": "TerminateInstances", **{f"InstanceId.{i}": v for i, v in enumerate(ids, 1)}})

    # -- helpers
    def _filtered(self, r: dict[str, Any], name: str, values: list[str]) -> bool:
        import fnmatch

        if name.startswith("tag:"):
            have = r["tags"].get(name[4:])
            return have is not None and any(fnmatch.fnmatchcase(have, v) for v in values)
        if name == "state":
            return r["state"] in values
        if name in ("instance-id",):
            return r["instance"] in values
        if name == "spot-instance-request-id":
            return r["id"] in values
        return True

    def _item(self, r: dict[str, Any]) -> str:
        tags = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in r["tags"].items())
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        instance = f"<instanceId>{r['instance']}</instanceId>" if r["instance"] else ""
        return (f"<item><spotInstanceRequestId>{r['id']}</spotInstanceRequestId><spotPrice>{escape(r['price'])}"
                f"</spotPrice><type>{r['type']}</type><state>{r['state']}</state><status><code>{r['status']}</code>"
                f"<updateTime>{now}</updateTime><message>{r['status']}</message></status>{instance}"
                f"<instanceInterruptionBehavior>{r['behaviour']}</instanceInterruptionBehavior>"
                f"<launchedAvailabilityZone>{escape(r['zone'])}</launchedAvailabilityZone><tagSet>{tags}</tagSet></item>")


__all__ = ["NS", "REASONS", "SpotEc2", "ec2_call"]
