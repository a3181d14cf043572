"""Listing streams for people (the console): a tenant's streams or one run's, newest
activity first, in keyset pages.

A page token is the last stream's activity time (microseconds since the epoch) and
stream key, ``<micros>-<stream_pk>``: the next page starts strictly after it. Activity
moves as streams are written, so a stream written while someone pages can show up again
on a later page or not at all; each page on its own is exact.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from ductor_streams.errors import InvalidPage
from ductor_streams.schema import QUERIES

PAGE_PATTERN = r"^[0-9]{1,17}-[0-9]{1,18}$"
_PAGE_RE = re.compile(PAGE_PATTERN)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class StreamFilter:
    """Which streams to list; ``None`` means any."""

    run_id: str | None = None
    run_prefix: str | None = None
    direction: str | None = None
    closed: bool | None = None


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who lists: the tenant, the runs the token covers (``None``: all), the principal."""

    tenant: str
    runs: tuple[str, ...] | None
    sub: str


@dataclass(frozen=True, slots=True)
class PageAfter:
    """Where a page starts: after this (activity, stream_pk)."""

    activity_at: datetime
    stream_pk: int


@dataclass(frozen=True, slots=True)
class StreamListing:
    """One stream as the list shows it: identity, state and its credit ceilings."""

    stream_pk: int
    run_id: str
    stream_id: str
    direction: str
    content_class: str
    latest_sequence: int
    earliest_sequence: int
    total_items: int
    total_bytes: int
    unread_items: int
    unread_bytes: int
    credit: dict[str, Any]
    closed_at: datetime | None
    legal_hold: bool
    created_at: datetime
    last_append_at: datetime | None
    activity_at: datetime

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "stream_id": self.stream_id,
            "direction": self.direction,
            "content_class": self.content_class,
            "latest_sequence": self.latest_sequence,
            "earliest_sequence": self.earliest_sequence,
            "total_items": self.total_items,
            "total_bytes": self.total_bytes,
            "unread_items": self.unread_items,
            "unread_bytes": self.unread_bytes,
            "credit": self.credit,
            "closed": self.closed_at is not None,
            "closed_at": _iso(self.closed_at),
            "legal_hold": self.legal_hold,
            "created_at": self.created_at.isoformat(),
            "last_append_at": _iso(self.last_append_at),
            "activity_at": self.activity_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class StreamPage:
    streams: list[StreamListing]
    next_page: str | None

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "streams": [s.to_json_dict() for s in self.streams],
            "next_page": self.next_page,
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def page_token(listing: StreamListing) -> str:
    delta = listing.activity_at - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return f"{micros}-{listing.stream_pk}"


def parse_page(raw: str | None) -> PageAfter | None:
    """The position a ``next_page`` token stands for, or ``None`` for the first page."""
    if raw is None:
        return None
    if not _PAGE_RE.fullmatch(raw):
        raise InvalidPage(f"page {raw[:40]!r} is not a page token from next_page")
    micros, _, pk = raw.partition("-")
    try:
        moment = _EPOCH + timedelta(microseconds=int(micros))
    except OverflowError:
        raise InvalidPage(f"page {raw[:40]!r} is not a page token from next_page") from None
    if moment.year > 9999 or int(pk) > 2**63 - 1:
        raise InvalidPage(f"page {raw[:40]!r} is not a page token from next_page")
    return PageAfter(moment, int(pk))


def _listing(row: Any) -> StreamListing:
    definition = json.loads(row["definition"])
    credit = definition.get("credit") or {}
    return StreamListing(
        stream_pk=row["stream_pk"],
        run_id=row["run_id"],
        stream_id=row["stream_id"],
        direction=row["direction"],
        content_class=definition.get("content_class", "json"),
        latest_sequence=row["latest_sequence"],
        earliest_sequence=row["earliest_sequence"],
        total_items=row["total_items"],
        total_bytes=row["total_bytes"],
        unread_items=row["unread_items"],
        unread_bytes=row["unread_bytes"],
        credit={
            name: credit.get(name)
            for name in (
                "max_unread_items",
                "max_unread_bytes",
                "max_total_items",
                "max_total_bytes",
            )
        },
        closed_at=row["closed_at"],
        legal_hold=row["legal_hold"],
        created_at=row["created_at"],
        last_append_at=row["last_append_at"],
        activity_at=row["activity_at"],
    )


async def list_streams(
    pool: asyncpg.Pool,
    viewer: Viewer,
    where: StreamFilter,
    *,
    limit: int,
    after: PageAfter | None = None,
) -> StreamPage:
    """One page of the streams ``viewer`` may read, newest activity first."""
    rows = await pool.fetch(
        QUERIES["streams_browse"],
        viewer.tenant,
        list(viewer.runs) if viewer.runs is not None else None,
        viewer.sub,
        where.run_id,
        where.run_prefix,
        where.direction,
        where.closed,
        after.activity_at if after else None,
        after.stream_pk if after else None,
        limit + 1,
    )
    listings = [_listing(r) for r in rows[:limit]]
    more = len(rows) > limit
    return StreamPage(listings, page_token(listings[-1]) if more else None)
