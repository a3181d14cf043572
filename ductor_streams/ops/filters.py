"""Operator filters and page tokens, checked the same way for HTTP and the CLI.

A page token is the last id of the page before it (deliveries go up by id, gaps go
down); it is opaque to callers, who only hand back what ``next_page`` said.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ductor_streams.errors import InvalidFilter, InvalidLimit, InvalidPage
from ductor_streams.foundation.definitions import RUN_ID_RE, STREAM_ID_RE
from ductor_streams.ops.models import DELIVERY_STATES

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_SUMMARY_STREAMS = 100
_MAX_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class DeliveryFilter:
    """Which deliveries to list; ``None`` means any."""

    state: str | None = None
    run_id: str | None = None
    stream_id: str | None = None
    older_than_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class GapFilter:
    run_id: str | None = None
    stream_id: str | None = None


def parse_state(raw: str | None) -> str | None:
    if raw is None:
        return None
    if raw not in DELIVERY_STATES:
        raise InvalidFilter(f"state must be one of {', '.join(DELIVERY_STATES)}")
    return raw


def parse_run(raw: str | None) -> str | None:
    if raw is not None and not RUN_ID_RE.fullmatch(raw):
        raise InvalidFilter("run is not a valid run ID")
    return raw


def parse_stream(raw: str | None) -> str | None:
    if raw is not None and not STREAM_ID_RE.fullmatch(raw):
        raise InvalidFilter("stream is not a valid stream ID")
    return raw


MAX_AGE_SECONDS = 100 * 366 * 86_400


def parse_age(raw: str | float | None) -> float | None:
    """A minimum age in seconds: a non-negative, finite number."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidFilter("older_than must be a number of seconds") from None
    # Capped at 100 years: Postgres intervals overflow (a 500) long before float does.
    if not math.isfinite(value) or value < 0 or value > MAX_AGE_SECONDS:
        raise InvalidFilter("older_than must be a number of seconds from 0 to 100 years")
    return value


def parse_limit(raw: str | int | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    text = str(raw).strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 4 and 1 <= int(text) <= MAX_LIMIT):
        raise InvalidLimit(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return int(text)


def parse_page(raw: str | None) -> int | None:
    """The id a page token stands for, or ``None`` for the first page."""
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19 and int(raw) <= _MAX_ID):
        raise InvalidPage(f"page {raw[:40]!r} is not a page token from next_page")
    return int(raw)


def page_token(last_id: int) -> str:
    return str(last_id)


def delivery_filter(params: Mapping[str, str]) -> DeliveryFilter:
    """Deliveries filter from query-like parameters (``state``, ``run``, ``stream``,
    ``older_than``)."""
    return DeliveryFilter(
        state=parse_state(params.get("state")),
        run_id=parse_run(params.get("run")),
        stream_id=parse_stream(params.get("stream")),
        older_than_seconds=parse_age(params.get("older_than")),
    )


def gap_filter(params: Mapping[str, str]) -> GapFilter:
    return GapFilter(
        run_id=parse_run(params.get("run")), stream_id=parse_stream(params.get("stream"))
    )


def reject_unknown(params: Mapping[str, str], allowed: set[str]) -> None:
    """A misspelt filter must not silently widen the answer."""
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise InvalidFilter(
            f"unknown parameter {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}"
        )
