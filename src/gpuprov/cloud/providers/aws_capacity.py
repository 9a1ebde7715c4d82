"""Capacity Reservations and Capacity Blocks for ML: the calls (cloud/reservations.py and cloud/capacity.py decide).

Shapes from botocore's EC2 service model (2016-11-15, the venv's botocore): DescribeCapacityReservations
(CapacityReservationId, InstanceType, AvailabilityZone, TotalInstanceCount, AvailableInstanceCount, State, StartDate,
EndDate, InstanceMatchCriteria, ReservationType, CapacityBlockId, PlacementGroupArn, Tags; its Filters, as EC2's
reference lists them, name no tag, so a purchase is found by its tags in the listing), DescribeCapacityBlockOfferings
(CapacityDurationHours the one required member; InstanceType, InstanceCount, StartDateRange, EndDateRange),
PurchaseCapacityBlock (CapacityBlockOfferingId and InstancePlatform required, TagSpecifications; no ClientToken).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gpuprov.cloud.providers.aws_base import AwsBase, AwsError, NoAnswer, tag_value
from gpuprov.cloud.providers.aws_refusals import classify
from gpuprov.cloud.providers.base import TAG_OWNER, BlockOffering, BlockUnknown, Purchase, Reservation
from gpuprov.errors import GpuprovError, UserInputError


def _reservation(raw: dict[str, Any]) -> Reservation:
    return Reservation(
        id=str(raw["CapacityReservationId"]), instance_type=str(raw.get("InstanceType") or ""),
        zone=str(raw.get("AvailabilityZone") or ""), total=int(raw.get("TotalInstanceCount") or 0),
        available=int(raw.get("AvailableInstanceCount") or 0), state=str(raw.get("State") or ""),
        start=raw.get("StartDate"), end=raw.get("EndDate"), match=str(raw.get("InstanceMatchCriteria") or "open"),
        kind=str(raw.get("ReservationType") or "default"), block_id=raw.get("CapacityBlockId"),
        placement_group=str(raw["PlacementGroupArn"]).rpartition("placement-group/")[2] if raw.get("PlacementGroupArn")
        else None)


class AwsCapacity(AwsBase):
    def reservations(self, region: str, ids: Sequence[str] = ()) -> list[Reservation]:
        ec2 = self._client("ec2", region)
        kwargs: dict[str, Any] = {"CapacityReservationIds": list(ids)} if ids else {}
        try:
            raws = self._pages(ec2, "DescribeCapacityReservations", "CapacityReservations", **kwargs)
        except AwsError as exc:
            if exc.code in ("InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed"):
                raise UserInputError("--reservation", f"{', '.join(ids)}: {exc.code}: {exc.message}",
                                     "`gpuprov gpus --live` lists the account's active reservations") from None
            raise
        return [_reservation(r) for r in raws]

    def block_offerings(self, region: str, instance_type: str, count: int, hours: int, start_after: datetime | None,
                        end_before: datetime | None) -> list[BlockOffering]:
        ec2 = self._client("ec2", region)
        kwargs: dict[str, Any] = {"InstanceType": instance_type, "InstanceCount": count, "CapacityDurationHours": hours}
        if start_after is not None:
            kwargs["StartDateRange"] = start_after
        if end_before is not None:
            kwargs["EndDateRange"] = end_before
        raws = self._pages(ec2, "DescribeCapacityBlockOfferings", "CapacityBlockOfferings", **kwargs)
        return [BlockOffering(
            id=str(r["CapacityBlockOfferingId"]), instance_type=str(r["InstanceType"]), zone=str(r["AvailabilityZone"]),
            count=int(r["InstanceCount"]), start=r["StartDate"], end=r["EndDate"],
            hours=int(r.get("CapacityBlockDurationHours") or hours), upfront_usd=float(r.get("UpfrontFee") or 0),
            currency=str(r.get("CurrencyCode") or "USD")) for r in raws]

    def purchase_block(self, region: str, offering_id: str, node: str, settle: float) -> Purchase:
        """Sent once on a client with retries off (mutations.py: ONCE): a second send could buy a second block.
        After an answer that may have been lost, the block is looked for by its tags (TagSpecifications are applied
        with the purchase) until EC2 lists it; not found, the error says so and that it may still appear."""
        ec2 = self._client("ec2", region, retries=False)
        try:
            reply = self._call("PurchaseCapacityBlock", lambda: ec2.purchase_capacity_block(
                CapacityBlockOfferingId=offering_id, InstancePlatform="Linux/UNIX",
                TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": self._tags(node)}]))
        except (NoAnswer, AwsError) as exc:
            if isinstance(exc, AwsError) and classify(exc.code, exc.message, "on-demand").then != "retry":
                raise  # refused: nothing was bought
            lost = f"{exc.code}: {exc.message}" if isinstance(exc, AwsError) else "no answer"
            try:
                found = self._look_until("PurchaseCapacityBlock", lambda: self.find_block(region, node), settle)
            except GpuprovError:
                raise BlockUnknown(offering_id, lost, settle) from None
            return Purchase(found, lost)
        return Purchase(_reservation(reply["CapacityReservation"]))

    def find_block(self, region: str, node: str) -> Reservation | None:
        ec2 = self._client("ec2", region)
        # matched by its tags here: the filters EC2's reference documents for this call name no tag
        raws = self._pages(ec2, "DescribeCapacityReservations", "CapacityReservations")
        mine = [r for r in raws if tag_value(r) == node and tag_value(r, TAG_OWNER) in self.owners]
        return _reservation(mine[0]) if mine else None

