"""Capacity Reservations and Capacity Blocks for ML, which moto lacks, kept by the fault proxy as EC2 documents them.

moto 5.x implements none of DescribeCapacityReservations, DescribeCapacityBlockOfferings, PurchaseCapacityBlock
(each "has not been implemented"), ignores RunInstances' CapacityReservationSpecification, and calls an instance
launched with MarketType capacity-block a spot one (/tmp/research/ec2-contracts.md §13, probed). So the proxy keeps:

* reservations (a test adds them: POST /__faults__/capacity {"reservations": [...]}) and Capacity Block offerings
  ({"offerings": [...]}), answered in EC2's XML with the shapes of botocore's EC2 model (2016-11-15):
  capacityReservationSet items (capacityReservationId, instanceType, availabilityZone, totalInstanceCount,
  availableInstanceCount, state, startDate, endDate, instanceMatchCriteria, reservationType, capacityBlockId) and
  capacityBlockOfferingSet items (capacityBlockOfferingId, instanceType, availabilityZone, instanceCount, startDate,
  endDate, capacityBlockDurationHours, upfrontFee, currencyCode);
* DescribeCapacityBlockOfferings: CapacityDurationHours is required (botocore marks it so; "1-day increments up 14
  days, and in 7-day increments up to 182 days" — InvalidParameterValue otherwise), the offerings whose type, count,
  duration and window (StartDateRange <= start, end <= EndDateRange) match;
* PurchaseCapacityBlock (CapacityBlockOfferingId and InstancePlatform required; no ClientToken): the offering becomes
  a capacity-block reservation, targeted (`payment-pending` for its first `payment_looks` listings, 0 unless a test
  asks: "payment-pending" is one of botocore's CapacityReservationState values), `scheduled` before its start (the EC2
  guide's state for a future-dated one), `active` from its start, `expired` at its end ("When a Capacity Block
  expires, all instances in the Capacity Block are terminated"; "Thirty minutes before the reservation expires, we
  begin to terminate any instances that are still running in the Capacity Block", EC2 guide, capacity-blocks-using: a
  launch in those last 30 minutes is refused here; the termination itself is not imitated). The proxy's clock moves
  with POST {"advance": seconds}. An unknown offering is InvalidParameterValue (unverified: EC2's exact code for it is
  not published);
* RunInstances targeting (CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId, or
  CapacityReservationPreference open): an unknown id is InvalidCapacityReservationId.NotFound (the code
  terraform-provider-aws and steampipe handle for it), another type or zone than the reservation's is
  InvalidParameterCombination (unverified wording), a Capacity Block without MarketType capacity-block likewise
  (the EC2 guide: "you must specify the Capacity Block reservation ID" with that market type), a block not yet
  started or already ended is InsufficientInstanceCapacity (500; the EC2 Fleet walkthrough: "you will receive an
  Insufficient Capacity Error"), a reservation with fewer instances available than MinCount is
  ReservationCapacityExceeded (400, "The requested reservation does not have sufficient compatible and available
  capacity for this request.", observed in terraform-provider-aws#35745). What passes goes to moto without the two
  fields (so moto does not make it spot), and the reservation's available count drops; TerminateInstances gives
  it back, for a Capacity Block only once its clean-up is over (CLEANUP_SECONDS of the proxy's clock; until then a
  launch into it is ReservationCapacityExceeded). StartInstances of a stopped instance of a block no longer
  active is refused. `open` takes an active open reservation of the type and zone with
  room, when there is one.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import re
import time
from typing import Any
from xml.sax.saxutils import escape

NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
TARGET = "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"
PREFERENCE = "CapacityReservationSpecification.CapacityReservationPreference"
MARKET = "InstanceMarketOptions.MarketType"
END_TERMINATES = 30 * 60  # EC2 begins terminating a block's instances this long before its end
# "it takes several minutes to clean up your instance before you can launch another instance to replace it" (EC2
# user guide, "Launch instances using Capacity Blocks"): the minutes are not given; five here (POST {"cleanup": s})
CLEANUP_SECONDS = 300.0
_ids = itertools.count(1)

Answer = tuple[int, bytes] | tuple[int, str, str]


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _epoch(text: str) -> float:
    return _dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _body(action: str, inner: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{NS}"><requestId>fault-proxy-capacity'
            f"</requestId>{inner}</{action}Response>").encode()


class CapacityEc2:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.reservations: dict[str, dict[str, Any]] = {}
        self.offerings: dict[str, dict[str, Any]] = {}
        self.instances: dict[str, str] = {}  # instance id -> the reservation it runs in
        self.cleaning: list[tuple[float, str]] = []  # (when it is free again, reservation): a block's ended instance
        self.cleanup = CLEANUP_SECONDS
        self.payment_looks = 0  # listings a bought block answers payment-pending (POST {"payment_looks": n})
        self.offset = 0.0  # the proxy's clock: time.time() + offset (POST {"advance": s})

    def now(self) -> float:
        return time.time() + self.offset

    # -- control
    def configure(self, ask: dict[str, Any]) -> dict[str, Any]:
        for r in ask.get("reservations", []):
            rid = r.get("id") or f"cr-{next(_ids):017x}"
            self.reservations[rid] = {
                "id": rid, "region": r.get("region", "us-east-1"), "type": r["instance_type"], "zone": r["zone"],
                "total": int(r.get("count", 1)), "used": 0, "start": float(r.get("start", self.now() - 3600)),
                "end": r.get("end"), "match": r.get("match", "open"), "kind": r.get("kind", "default"),
                "block_id": r.get("block_id"), "state": r.get("state"), "tags": r.get("tags", []),
                "placement_group": r.get("placement_group")}
        for o in ask.get("offerings", []):
            oid = o.get("id") or f"cb-offering-{next(_ids):08x}"
            self.offerings[oid] = {"id": oid, "region": o.get("region", "us-east-1"), "type": o["instance_type"],
                                   "zone": o["zone"], "count": int(o.get("count", 1)), "start": float(o["start"]),
                                   "hours": int(o["hours"]), "fee": str(o["fee"])}
        if "payment_looks" in ask:
            self.payment_looks = int(ask["payment_looks"])
        if "cleanup" in ask:
            self.cleanup = float(ask["cleanup"])
        if "advance" in ask:
            self.offset += float(ask["advance"])
        return self.state()

    def state(self) -> dict[str, Any]:
        return {"now": self.now(), "offerings": list(self.offerings.values()),
                "reservations": [dict(r, state_now=self._state(r)) for r in self.reservations.values()],
                "instances": dict(self.instances)}

    # -- the reservation's life
    def _state(self, r: dict[str, Any]) -> str:
        if r.get("state"):  # a test's fixed state (cancelled, payment-pending …)
            return str(r["state"])
        if r.get("pending"):  # bought moments ago: EC2 has not taken the payment yet
            return "payment-pending"
        now = self.now()
        if now < r["start"]:
            return "scheduled"
        if r["end"] is not None and now >= float(r["end"]):
            return "expired"
        return "active"

    def _item(self, r: dict[str, Any]) -> str:
        end = f"<endDate>{_iso(float(r['end']))}</endDate><endDateType>limited</endDateType>" if r["end"] else \
            "<endDateType>unlimited</endDateType>"
        block = f"<capacityBlockId>{r['block_id']}</capacityBlockId>" if r["block_id"] else ""
        if r.get("placement_group"):  # a reservation made in a cluster placement group (botocore: PlacementGroupArn)
            block += (f"<placementGroupArn>arn:aws:ec2:{r['region']}:123456789012:placement-group/"
                      f"{r['placement_group']}</placementGroupArn>")
        tags = "".join(f"<item><key>{escape(t['Key'])}</key><value>{escape(t['Value'])}</value></item>"
                       for t in r["tags"])
        return (f"<item><capacityReservationId>{r['id']}</capacityReservationId><ownerId>123456789012</ownerId>"
                f"<instanceType>{r['type']}</instanceType><instancePlatform>Linux/UNIX</instancePlatform>"
                f"<availabilityZone>{r['zone']}</availabilityZone><tenancy>default</tenancy>"
                f"<totalInstanceCount>{r['total']}</totalInstanceCount>"
                f"<availableInstanceCount>{max(0, r['total'] - r['used'])}</availableInstanceCount>"
                f"<state>{self._state(r)}</state><startDate>{_iso(r['start'])}</startDate>{end}"
                f"<instanceMatchCriteria>{r['match']}</instanceMatchCriteria>"
                f"<reservationType>{r['kind']}</reservationType>{block}<tagSet>{tags}</tagSet></item>")

    # -- EC2 calls the proxy answers itself (None: not ours)
    def answer(self, req: dict[str, Any]) -> Answer | None:
        action, form, region = req["action"], req["form"], req["region"] or "us-east-1"
        self._cleaned()
        if action == "DescribeCapacityReservations":
            ids = [v for k, v in sorted(form.items()) if k.startswith("CapacityReservationId.")]
            unknown = [i for i in ids if i not in self.reservations]
            if unknown:
                return 400, "InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{unknown[0]}' " \
                                                                     "does not exist"
            mine = [r for r in self.reservations.values() if r["region"] == region and (not ids or r["id"] in ids)]
            answer = _body(action, "<capacityReservationSet>" + "".join(self._item(r) for r in mine)
                           + "</capacityReservationSet>")
            for r in mine:  # payment-pending for its first `payment_looks` listings
                r["pending"] = max(0, r.get("pending", 0) - 1)
            return 200, answer
        if action == "DescribeCapacityBlockOfferings":
            return self._offerings(form, region)
        if action == "PurchaseCapacityBlock":
            return self._purchase(form, region)
        if action == "StartInstances":
            return self._start(form)
        return None

    def _start(self, form: dict[str, str]) -> Answer | None:
        """A stopped instance of a Capacity Block that is no longer active cannot start ("you can't restart them
        until you target another Capacity Block in the active state", EC2 user guide; the code is unverified: the
        one this imitation gives a launch into an ended block)."""
        for k, iid in form.items():
            rid = self.instances.get(iid) if k.startswith("InstanceId.") else None
            r = self.reservations.get(rid) if rid else None
            if r is not None and r["kind"] == "capacity-block" and self._state(r) != "active":
                return 500, "InsufficientInstanceCapacity", f"Insufficient capacity: {rid} is {self._state(r)}"
        return None

    def _offerings(self, form: dict[str, str], region: str) -> Answer:
        if not form.get("CapacityDurationHours"):
            return 400, "MissingParameter", "The request must contain the parameter CapacityDurationHours"
        hours = int(form["CapacityDurationHours"])
        if hours <= 0 or (hours > 14 * 24 and hours % (7 * 24)) or (hours <= 14 * 24 and hours % 24) or hours > 182 * 24:
            return 400, "InvalidParameterValue", f"CapacityDurationHours {hours}: 1-day increments up to 14 days, " \
                                                 "7-day increments up to 182 days"
        after = _epoch(form["StartDateRange"]) if form.get("StartDateRange") else None
        before = _epoch(form["EndDateRange"]) if form.get("EndDateRange") else None
        found = [o for o in self.offerings.values() if o["region"] == region and o["hours"] == hours
                 and (not form.get("InstanceType") or o["type"] == form["InstanceType"])
                 and (not form.get("InstanceCount") or o["count"] == int(form["InstanceCount"]))
                 and (after is None or o["start"] >= after)
                 and (before is None or o["start"] + o["hours"] * 3600 <= before)]
        items = "".join(
            f"<item><capacityBlockOfferingId>{o['id']}</capacityBlockOfferingId><instanceType>{o['type']}</instanceType>"
            f"<availabilityZone>{o['zone']}</availabilityZone><instanceCount>{o['count']}</instanceCount>"
            f"<startDate>{_iso(o['start'])}</startDate><endDate>{_iso(o['start'] + o['hours'] * 3600)}</endDate>"
            f"<capacityBlockDurationHours>{o['hours']}</capacityBlockDurationHours><upfrontFee>{o['fee']}</upfrontFee>"
            f"<currencyCode>USD</currencyCode><tenancy>default</tenancy></item>" for o in found)
        return 200, _body("DescribeCapacityBlockOfferings", f"<capacityBlockOfferingSet>{items}</capacityBlockOfferingSet>")

    def _purchase(self, form: dict[str, str], region: str) -> Answer:
        oid, platform = form.get("CapacityBlockOfferingId"), form.get("InstancePlatform")
        if not oid or not platform:
            return 400, "MissingParameter", "CapacityBlockOfferingId and InstancePlatform are required"
        offer = self.offerings.get(oid)
        if offer is None or offer["region"] != region:
            return 400, "InvalidParameterValue", f"The Capacity Block offering {oid} is not available"
        del self.offerings[oid]  # bought: no one else gets it
        tags = []
        for n in itertools.count(1):
            if f"TagSpecification.1.Tag.{n}.Key" not in form:
                break
            tags.append({"Key": form[f"TagSpecification.1.Tag.{n}.Key"], "Value": form[f"TagSpecification.1.Tag.{n}.Value"]})
        rid = f"cr-{next(_ids):017x}"
        self.reservations[rid] = {"id": rid, "region": region, "type": offer["type"], "zone": offer["zone"],
                                  "total": offer["count"], "used": 0, "start": offer["start"],
                                  "end": offer["start"] + offer["hours"] * 3600, "match": "targeted",
                                  "kind": "capacity-block", "block_id": f"cb-{next(_ids):017x}", "state": None,
                                  "tags": tags, "pending": self.payment_looks}
        return 200, _body("PurchaseCapacityBlock", f"<capacityReservation>{self._item(self.reservations[rid])[6:-7]}"
                          "</capacityReservation>")

    # -- RunInstances into a reservation
    def run_instances(self, req: dict[str, Any]) -> Answer | dict[str, str] | None:
        """A refusal, the form to forward (the two fields moto misreads taken out), or None (not ours)."""
        form = req["form"]
        target, preference, market = form.get(TARGET), form.get(PREFERENCE), form.get(MARKET)
        if target is None and preference != "open" and market != "capacity-block":
            return None
        want = int(form.get("MinCount") or 1)
        zone, itype = form.get("Placement.AvailabilityZone"), form.get("InstanceType")
        self._cleaned()
        if target is not None:
            r = self.reservations.get(target)
            if r is None:
                return 400, "InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{target}' does not exist"
            if r["type"] != itype or (zone and r["zone"] != zone):
                return 400, "InvalidParameterCombination", f"The instance type and Availability Zone must match " \
                                                           f"{target}'s ({r['type']}, {r['zone']})"
            if r["kind"] == "capacity-block" and market != "capacity-block":
                return 400, "InvalidParameterCombination", "A Capacity Block is launched into with MarketType capacity-block"
            state = self._state(r)
            if state != "active" or (r["kind"] == "capacity-block" and r["end"] is not None
                                     and self.now() >= float(r["end"]) - END_TERMINATES):
                return 500, "InsufficientInstanceCapacity", f"Insufficient capacity: {target} is {state}" + \
                    (f" (it starts at {_iso(r['start'])})" if state == "scheduled" else "")
            if r["total"] - r["used"] < want:
                return 400, "ReservationCapacityExceeded", "The requested reservation does not have sufficient " \
                                                           "compatible and available capacity for this request."
            req["reservation"] = target
        elif market == "capacity-block":
            return 400, "MissingParameter", "MarketType capacity-block needs a CapacityReservationTarget"
        else:  # open: an active open reservation of the type and zone with room, if any; else plain on-demand
            room = [r for r in self.reservations.values() if r["match"] == "open" and r["type"] == itype
                    and (not zone or r["zone"] == zone) and self._state(r) == "active" and r["total"] - r["used"] >= want]
            if room:
                req["reservation"] = room[0]["id"]
        return {k: v for k, v in form.items() if not k.startswith(("CapacityReservationSpecification.",
                                                                    "InstanceMarketOptions."))
                or (k.startswith("InstanceMarketOptions.") and market not in (None, "capacity-block"))}

    def launched(self, req: dict[str, Any], body: bytes) -> None:
        rid = req.get("reservation")
        if rid is None:
            return
        ids = re.findall(rb"<instanceId>(i-[0-9a-f]+)</instanceId>", body)
        for iid in ids:
            self.instances[iid.decode()] = rid
        self.reservations[rid]["used"] += len(ids)

    def terminated(self, form: dict[str, str]) -> None:
        for k, v in form.items():
            if k.startswith("InstanceId.") and v in self.instances:
                rid = self.instances.pop(v)
                if self.reservations[rid]["kind"] == "capacity-block":  # free once EC2 has cleaned the instance up
                    self.cleaning.append((self.now() + self.cleanup, rid))
                else:
                    self.reservations[rid]["used"] -= 1

    def _cleaned(self) -> None:
        """A block's ended instances whose clean-up is over give their capacity back."""
        now = self.now()
        for at, rid in [c for c in self.cleaning if c[0] <= now]:
            self.cleaning.remove((at, rid))
            self.reservations[rid]["used"] -= 1
