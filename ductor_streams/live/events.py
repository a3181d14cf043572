"""What live delivery hands to its edges: batches of records and the terminal events."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from ductor_streams.errors import CursorExpired
from ductor_streams.store.models import Record


@dataclass(slots=True, eq=False)
class LiveBatch:
    """Consecutive records read in one statement, with the stream's bounds then.

    One batch object is shared by every local subscriber it is fanned out to, so an
    edge may cache its encoding of the batch in ``memo`` (keyed by whatever varies
    between subscribers, e.g. redaction) and encode it once for all of them.
    """

    records: Sequence[Record]
    latest_sequence: int
    closed: bool
    memo: dict[Hashable, bytes] = field(default_factory=dict)
    _nbytes: int = -1

    @property
    def nbytes(self) -> int:
        """The records' payload bytes (their ``size``), counted once per batch."""
        if self._nbytes < 0:
            self._nbytes = sum(r.size for r in self.records)
        return self._nbytes


@dataclass(frozen=True, slots=True)
class End:
    """The stream is closed and every record up to ``last_sequence`` was delivered."""

    last_sequence: int


@dataclass(frozen=True, slots=True)
class Expired:
    """Retention removed records this subscriber had not been sent yet (HTTP 410)."""

    error: CursorExpired


@dataclass(frozen=True, slots=True)
class Gone:
    """The stream no longer exists."""


@dataclass(frozen=True, slots=True)
class Interrupted:
    """The subscriber's own read found the database unavailable (a restart, a failover):
    the response ends without an event, and the client resumes from its Last-Event-ID,
    the last record it was sent."""


@dataclass(frozen=True, slots=True)
class Draining:
    """This server is shutting down: the response ends with a reconnect hint, and the
    client resumes elsewhere from its Last-Event-ID."""


@dataclass(frozen=True, slots=True)
class TokenExpired:
    """The subscriber's bearer token has expired: the response ends, and the client
    reconnects with a fresh token from its Last-Event-ID."""


Terminal = End | Expired | Gone | Interrupted | Draining | TokenExpired
