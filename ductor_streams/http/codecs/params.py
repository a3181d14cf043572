"""Query and header parameters that the contract gives exact error codes."""

from __future__ import annotations

from ductor_streams.errors import InvalidCursor, InvalidLimit

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_MAX_SEQUENCE = 2**62


def parse_cursor(raw: str | None) -> int:
    if raw is None:
        return 0
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) > _MAX_SEQUENCE:
        raise InvalidCursor(f"cursor {raw[:40]!r} is not a non-negative integer")
    return int(text)


def parse_limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 4 and 1 <= int(text) <= MAX_LIMIT):
        raise InvalidLimit(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return int(text)
