"""Reporting a database outage: a warning line now and then, not one per failure.

While Postgres restarts, every request that touches it fails the same way; a traceback
(or even a line) for each would bury everything else in the log. Each place that meets
the outage (``http`` answers, ``live`` followers, ``upkeep``) logs one warning the first
time and then at most one per ``LOG_INTERVAL_SECONDS`` while it lasts, each carrying how
many failures it stands for (``held_back``: those since the line before).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ductor_streams.errors import StreamsError

log = logging.getLogger(__name__)

# At most one warning per source per this many seconds while the database is away.
LOG_INTERVAL_SECONDS = 5.0


class Throttle:
    """Lets a line that repeats through at most once per ``interval`` seconds, counting
    the ones it held back."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next = float("-inf")
        self._held_back = 0

    def take(self) -> int | None:
        """None while the line is held back; else how many were held back before it."""
        now = time.monotonic()
        if now < self._next:
            self._held_back += 1
            return None
        held_back, self._held_back = self._held_back, 0
        self._next = now + self.interval
        return held_back


_throttles: dict[str, Throttle] = {}


def report_unavailable(source: str, exc: BaseException, **extra: Any) -> None:
    """Note that ``source`` found the database unavailable (``exc``, which
    ``store.db.database_unavailable`` classified); logs a warning unless one for the same
    source went out less than ``LOG_INTERVAL_SECONDS`` ago. ``extra`` must hold no
    payload or token."""
    throttle = _throttles.get(source)
    if throttle is None:
        throttle = _throttles[source] = Throttle(LOG_INTERVAL_SECONDS)
    held_back = throttle.take()
    if held_back is None:
        return
    # The driver's error says more than the domain error made of it.
    cause = exc.__cause__ if isinstance(exc, StreamsError) and exc.__cause__ else exc
    log.warning(
        "database unavailable",
        extra={
            "source": source,
            "error_type": type(cause).__name__,
            "held_back": held_back,
            **extra,
        },
    )
