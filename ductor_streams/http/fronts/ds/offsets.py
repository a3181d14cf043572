"""DS offsets and cursors.

A DS offset is our exclusive cursor (the last sequence before the position) written as
20 zero-padded digits, so offsets sort lexicographically and never collide with the
sentinels ``-1`` (the first retained record) and ``now`` (the tail).
"""

from __future__ import annotations

import random
import re
import time

from ductor_streams.errors import InvalidOffset

OFFSET_DIGITS = 20
_OFFSET = re.compile(r"[0-9]{20}")
# Sequences are Postgres bigints: a 20-digit offset past this was never returned.
MAX_SEQUENCE = 2**63 - 1
# An echoed Stream-Cursor: ASCII digits only (str.isdigit() also takes "²", which int()
# refuses), short enough to be an interval count.
_CURSOR = re.compile(r"[0-9]{1,18}")
START = "-1"
NOW = "now"

# Stream-Cursor: 20-second intervals since 2024-10-09T00:00:00Z (the protocol's default).
CURSOR_EPOCH = 1_728_432_000
CURSOR_INTERVAL = 20
_MAX_JITTER_SECONDS = 3600


def format_offset(sequence: int) -> str:
    """The DS offset after ``sequence``."""
    return f"{sequence:020d}"


def parse_offset(value: str | None) -> int | str | None:
    """A request's ``offset``: a cursor, None for the start (absent or ``-1``) or
    ``NOW``; InvalidOffset for anything else."""
    if value is None or value == START:
        return None
    if value == NOW:
        return NOW
    if not _OFFSET.fullmatch(value) or int(value) > MAX_SEQUENCE:
        raise InvalidOffset(
            f"offset {value[:64]!r} is not -1, now or an offset this server returned"
        )
    return int(value)


def response_cursor(client_cursor: str | None, now: float | None = None) -> str:
    """The ``Stream-Cursor`` of a live answer: the current interval, or past the client's
    echo when that is current already (so that caches never loop on one answer)."""
    current = int(((time.time() if now is None else now) - CURSOR_EPOCH) // CURSOR_INTERVAL)
    if client_cursor is None or not _CURSOR.fullmatch(client_cursor):
        return str(current)
    echoed = int(client_cursor)
    if echoed < current:
        return str(current)
    jitter = random.randint(1, _MAX_JITTER_SECONDS)
    return str(echoed + max(1, -(-jitter // CURSOR_INTERVAL)))
