"""Capacity Reservations and Capacity Blocks for ML: the calls (cloud/reservations.py and cloud/capacity.py decide).

Shapes from botocore's EC2 service model (2016-11-15, the venv's botocore): DescribeCapacityReservations
(CapacityReservationId, InstanceType, AvailabilityZone, TotalInstanceCount, AvailableInstanceCount, State, StartDate,
EndDate, InstanceMatchCriteria, ReservationType, CapacityBlockId), DescribeCapacityBlockOfferings (CapacityDurationHours
the one required member; InstanceType, InstanceCount, StartDateRange, EndDateRange), PurchaseCapacityBlock
(CapacityBlockOfferingId and InstancePlatform required, TagSpecifications; no ClientToken).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gpuprov.cloud.providers.aws_base import AwsBase, AwsError
from gpuprov.cloud.providers.base import BlockOffering, Reservation
from gpuprov.errors import UserInputError


def _reservation(raw: dict[str, Any]) -> Reservation:
    return Reservation(
        id=str(raw["CapacityReservationId"]), instance_type=str(raw.get("InstanceType") or ""),
        zone=str(raw.get("AvailabilityZone") or ""), total=int(raw.get("TotalInstanceCount") or 0),
        available=int(raw.get("AvailableInstanceCount") or 0), state=str(raw.get("State") or ""),
        start=raw.get("StartDate"), end=raw.get("EndDate"), match=str(raw.get("InstanceMatchCriteria") or "open"),
        kind=str(raw.get("ReservationType") or "default"), block_id=raw.get("CapacityBlockId"))


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

    def purchase_block(self, region: str, offering_id: str, node: str) -> Reservation:
        ec2 = self._client("ec2", region)
        reply = self._call("PurchaseCapacityBlock", lambda: ec2.purchase_capacity_block(
            CapacityBlockOfferingId=offering_id, InstancePlatform="Linux/UNIX",
            TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": self._tags(node)}]))
        return _reservation(reply["CapacityReservation"])
