"""What the client's calls return: records, pages and append results, as plain values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Record:
    """A record as the API returns it (``appended_at`` is ISO 8601 text).

    ``fingerprint`` is opaque: keep it beside the sequence and send it back when resuming
    after this record (``read(..., fingerprint=)``, ``subscribe(..., fingerprint=)``), and
    the server says ``HistoryDivergedError`` if the stream no longer has this record (a
    database failover lost commits). None from a server that does not send one."""

    sequence: int
    payload: Any
    size: int
    appended_at: str
    object: dict[str, Any] | None
    fingerprint: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        fingerprint = data.get("fingerprint")
        return cls(
            sequence=int(data["sequence"]),
            payload=data["payload"],
            size=int(data["size"]),
            appended_at=str(data["appended_at"]),
            object=data.get("object"),
            fingerprint=str(fingerprint) if fingerprint is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Page:
    """A page of records. ``next_cursor`` and ``next_fingerprint`` are where to resume:
    the last record's sequence and fingerprint, or the cursor and fingerprint read after
    when the page is empty."""

    records: list[Record]
    next_cursor: int
    earliest_sequence: int
    latest_sequence: int
    closed: bool
    next_fingerprint: str | None = None


@dataclass(frozen=True, slots=True)
class AppendResult:
    first_sequence: int
    last_sequence: int
    replayed: bool
