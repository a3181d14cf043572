"""Plain data carried between the store and its edges."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from ductor_streams.foundation.definitions import StreamDefinition


@dataclass(frozen=True, slots=True)
class StreamKey:
    """The public identity of a stream: (tenant, run ID, stream ID)."""

    tenant: str
    run_id: str
    stream_id: str


@dataclass(frozen=True, slots=True)
class StreamRef:
    """A stream that exists: its key, primary key and immutable definition."""

    key: StreamKey
    stream_pk: int
    definition: StreamDefinition

    @property
    def is_input(self) -> bool:
        return self.definition.direction == "input"


@dataclass(frozen=True, slots=True)
class ConsumerState:
    consumer_id: str
    acked_sequence: int


@dataclass(frozen=True, slots=True)
class StreamState:
    latest_sequence: int
    earliest_sequence: int
    closed: bool
    legal_hold: bool
    legal_hold_reason: str | None
    total_items: int
    total_bytes: int
    unread_items: int
    unread_bytes: int
    consumers: list[ConsumerState]

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "latest_sequence": self.latest_sequence,
            "earliest_sequence": self.earliest_sequence,
            "closed": self.closed,
            "legal_hold": self.legal_hold,
            "legal_hold_reason": self.legal_hold_reason,
            "total_items": self.total_items,
            "total_bytes": self.total_bytes,
            "unread_items": self.unread_items,
            "unread_bytes": self.unread_bytes,
            "consumers": [
                {"consumer_id": c.consumer_id, "acked_sequence": c.acked_sequence}
                for c in self.consumers
            ],
        }


class Record(msgspec.Struct, frozen=True):
    """A stored record. ``payload`` is its compact JSON text, exactly as stored.

    A frozen msgspec Struct rather than a frozen dataclass: every record a read returns
    is made one by one, and a frozen dataclass's ``__init__`` (``object.__setattr__`` per
    field) cost several times as much (the SSE backfill's profile, docs/speed.md)."""

    sequence: int
    payload: str
    size: int
    appended_at: datetime
    object: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Page:
    """The answer to a read: records after the cursor and the stream's bounds."""

    records: list[Record]
    next_cursor: int
    earliest_sequence: int
    latest_sequence: int
    closed: bool


@dataclass(frozen=True, slots=True)
class AppendResult:
    first_sequence: int
    last_sequence: int
    replayed: bool = False
