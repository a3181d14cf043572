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
    """

    keepalive_seconds: float = 10.0
    buffer_records: int = 4096
    page_records: int = 500
    poll_seconds: float = 5.0
    watch_seconds: float = 60.0
