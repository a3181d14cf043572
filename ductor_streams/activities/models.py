"""What crosses the activity boundary: plain dataclasses, safe inside the workflow sandbox.

Payloads are JSON values (whatever ``json.loads`` gives); record sizes and limits are
those of the HTTP surface (the HTTP API).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Activity names, shared by the activities and the workflow helpers that call them.
CREATE_STREAM = "ductor_streams.create_stream"
APPEND = "ductor_streams.append"
CLOSE = "ductor_streams.close"
ACK = "ductor_streams.ack"
READ = "ductor_streams.read"


@dataclass
class CreateStreamInput:
    """Create (or find, when identical) a stream of run ``run_id``."""

    run_id: str
    definition: dict[str, Any]


@dataclass
class CreateStreamResult:
    stream_id: str
    created: bool
    definition: dict[str, Any]
    latest_sequence: int


@dataclass
class AppendInput:
    """Append ``payloads`` (1 to 1,000) as one atomic batch."""

    run_id: str
    stream_id: str
    payloads: list[Any]
    idempotency_key: str | None = None


@dataclass
class AppendResult:
    first_sequence: int
    last_sequence: int
    replayed: bool = False


@dataclass
class CloseInput:
    run_id: str
    stream_id: str


@dataclass
class CloseResult:
    last_sequence: int


@dataclass
class AckInput:
    run_id: str
    stream_id: str
    consumer_id: str
    sequence: int


@dataclass
class AckResult:
    acked_sequence: int


@dataclass
class ReadInput:
    """Records with ``sequence > cursor``, ascending, at most ``limit`` (1 to 1,000) and
    at most ``max_bytes`` of payload (at least one record): Temporal refuses results
    over 2 MB."""

    run_id: str
    stream_id: str
    cursor: int
    limit: int = 100
    max_bytes: int = 1024 * 1024


@dataclass
class StreamRecord:
    """One record as the workflow sees it (signal or read)."""

    stream_id: str
    sequence: int
    payload: Any = None
    object: dict[str, Any] | None = None
    appended_at: str | None = None
    # The record's fingerprint, as HTTP reads show it (store/fingerprint.py): a reader
    # that resumes after this record sends it to learn whether the stream still has it.
    fingerprint: str | None = None


@dataclass
class ReadResult:
    records: list[StreamRecord] = field(default_factory=list)
    next_cursor: int = 0
    earliest_sequence: int = 1
    latest_sequence: int = 0
    closed: bool = False
