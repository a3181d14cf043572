"""Tunables of live delivery (defaults suit production; ``Settings.live`` builds them
from the environment)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LiveSettings:
    """How live delivery behaves in this process.

    ``keepalive_seconds``: idle time after which an SSE comment is sent (the contract
    asks for one at least every 15 s). ``buffer_records``: records a subscriber may
    hold in memory before it falls back to reading from Postgres. ``page_records``:
    records per backfill / repair / follower read. ``poll_seconds``: a follower also
    reads when no wake came for this long, so a lost notification (e.g. a writer that
    died between its commit and its NOTIFY) delays delivery but never stalls it.
    ``watch_seconds``: how long a follower's watch of its stream lasts (appends notify
    while it does); renewed every third of it while followed. Not from the environment.

    A subscriber's memory is bounded in bytes too: ``buffer_bytes`` of buffered records
    (past it, as past ``buffer_records``, it reads Postgres instead), ``page_bytes`` per
    read (not from the environment), and ``write_chunk`` bytes per write to its socket, so
    a slow reader holds at most about one chunk in the server's send buffer.
    ``stall_seconds``: a write that the client has not accepted for this long ends the
    connection (the client resumes with Last-Event-ID).
    """

    keepalive_seconds: float = 10.0
    buffer_records: int = 4096
    page_records: int = 500
    poll_seconds: float = 5.0
    watch_seconds: float = 60.0
    buffer_bytes: int = 4 * 1024 * 1024
    page_bytes: int = 256 * 1024
    write_chunk: int = 64 * 1024
    stall_seconds: float = 30.0
