"""Tunables of live delivery, from the environment (defaults suit production)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ductor_streams.config import ConfigError


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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LiveSettings:
        env = os.environ if env is None else env
        defaults = cls()
        return cls(
            keepalive_seconds=_number(
                env, "DUCTOR_STREAMS_SSE_KEEPALIVE_SECONDS", defaults.keepalive_seconds, 0.05, 15
            ),
            buffer_records=int(
                _number(env, "DUCTOR_STREAMS_SSE_BUFFER_RECORDS", defaults.buffer_records, 1, 1e7)
            ),
            page_records=int(
                _number(env, "DUCTOR_STREAMS_SSE_PAGE_RECORDS", defaults.page_records, 1, 1000)
            ),
            poll_seconds=_number(
                env, "DUCTOR_STREAMS_LIVE_POLL_SECONDS", defaults.poll_seconds, 0.05, 3600
            ),
        )


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low:g} and {high:g}")
    return value
