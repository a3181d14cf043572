"""What operators see: deliveries, gap evidence and the delivery summary, as plain data.

``to_json_dict`` gives the one JSON shape shared by HTTP and ``outbox --json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

DELIVERY_STATES = ("pending", "retrying", "delivered", "dead")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True, slots=True)
class Visibility:
    """What the caller may see: one tenant (``None``: all, the CLI on the database host)
    and some of its runs (``None``: all of them)."""

    tenant: str | None
    runs: tuple[str, ...] | None

    @classmethod
    def everything(cls) -> Visibility:
        return cls(None, None)

    @classmethod
    def of(cls, tenant: str, runs: frozenset[str]) -> Visibility:
        return cls(tenant, None if "*" in runs else tuple(sorted(runs)))

    def args(self) -> tuple[str | None, list[str] | None]:
        return self.tenant, list(self.runs) if self.runs is not None else None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One input record's way to its workflow (a row of ``input_deliveries``)."""

    delivery_id: int
    tenant: str
    run_id: str
    stream_id: str
    sequence: int
    state: str
    attempts: int
    last_error: str | None
    next_attempt_at: datetime
    delivered_at: datetime | None
    created_at: datetime
    retried_by: str | None
    retried_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "delivery_id": self.delivery_id,
            "run_id": self.run_id,
            "stream_id": self.stream_id,
            "sequence": self.sequence,
            "state": self.state,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "next_attempt_at": _iso(self.next_attempt_at),
            "delivered_at": _iso(self.delivered_at),
            "created_at": _iso(self.created_at),
            "retried_by": self.retried_by,
            "retried_at": _iso(self.retried_at),
            "lease_owner": self.lease_owner,
            "lease_expires_at": _iso(self.lease_expires_at),
        }


@dataclass(frozen=True, slots=True)
class DeliveryDetail:
    """A delivery with its record. ``payload`` is the stored JSON text, or ``None`` once
    retention removed the record; edges decide whether the caller may see it."""

    delivery: Delivery
    record_size: int | None
    record_appended_at: datetime | None
    payload: str | None


@dataclass(frozen=True, slots=True)
class DeliveryPage:
    """One page of deliveries; ``next_page`` is the token for the next one, or ``None``."""

    deliveries: list[Delivery]
    next_page: str | None

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "deliveries": [d.to_json_dict() for d in self.deliveries],
            "next_page": self.next_page,
        }


@dataclass(frozen=True, slots=True)
class Gap:
    """Evidence that live delivery saw a gap and repaired it from Postgres."""

    gap_id: int
    run_id: str
    stream_id: str
    expected_sequence: int
    received_sequence: int
    repaired_records: int
    detected_by: str
    detected_at: datetime

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "gap_id": self.gap_id,
            "run_id": self.run_id,
            "stream_id": self.stream_id,
            "expected_sequence": self.expected_sequence,
            "received_sequence": self.received_sequence,
            "repaired_records": self.repaired_records,
            "detected_by": self.detected_by,
            "detected_at": _iso(self.detected_at),
        }


@dataclass(frozen=True, slots=True)
class GapPage:
    gaps: list[Gap]
    next_page: str | None

    def to_json_dict(self) -> dict[str, Any]:
        return {"gaps": [g.to_json_dict() for g in self.gaps], "next_page": self.next_page}


@dataclass(frozen=True, slots=True)
class StreamLag:
    """An input stream that still owes deliveries to its workflow."""

    run_id: str
    stream_id: str
    latest_sequence: int
    pending: int
    retrying: int
    dead: int
    first_undelivered_sequence: int
    lag_seconds: float
    last_delivered_at: datetime | None

    @property
    def owed(self) -> int:
        return self.pending + self.retrying + self.dead

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "stream_id": self.stream_id,
            "latest_sequence": self.latest_sequence,
            "owed": self.owed,
            "pending": self.pending,
            "retrying": self.retrying,
            "dead": self.dead,
            "first_undelivered_sequence": self.first_undelivered_sequence,
            "lag_seconds": round(self.lag_seconds, 3),
            "last_delivered_at": _iso(self.last_delivered_at),
        }


@dataclass(frozen=True, slots=True)
class DeliverySummary:
    """Counts by state, the age of the oldest delivery still to be made (pending or
    retrying; ``None`` when there is none) and the streams that lag the most."""

    counts: dict[str, int]
    oldest_pending_age_seconds: float | None
    streams: list[StreamLag]

    def to_json_dict(self) -> dict[str, Any]:
        age = self.oldest_pending_age_seconds
        return {
            "counts": dict(self.counts),
            "oldest_pending_age_seconds": round(age, 3) if age is not None else None,
            "streams": [s.to_json_dict() for s in self.streams],
        }
