"""Reads with the exact cursor rule: records with ``sequence > cursor``, ascending."""

from __future__ import annotations

import json
from dataclasses import dataclass

import asyncpg

from ductor_streams.errors import CursorExpired, CursorInFuture, NotFound
from ductor_streams.schema import QUERIES
from ductor_streams.store.models import Page, Record


async def read_page(
    pool: asyncpg.Pool | asyncpg.Connection,
    stream_pk: int,
    cursor: int,
    limit: int,
    max_bytes: int | None = None,
) -> Page:
    """Return up to ``limit`` records after ``cursor`` (and, given ``max_bytes``, no more
    records than fit that many payload bytes, but at least one).

    A cursor beyond the latest sequence is CursorInFuture (never an implicit reset);
    a cursor whose next record retention removed is CursorExpired (HTTP 410). Bounds
    and records come from one statement, so they are one consistent snapshot.
    """
    if max_bytes is None:
        rows = await pool.fetch(QUERIES["records_read"], stream_pk, cursor, limit)
    else:
        rows = await pool.fetch(QUERIES["records_read_bytes"], stream_pk, cursor, limit, max_bytes)
    return page_of_rows(rows, cursor)


def page_of_rows(rows: list[asyncpg.Record], cursor: int) -> Page:
    """The page the rows of a read after ``cursor`` stand for (``read_page``'s rules)."""
    if not rows:
        raise NotFound("stream does not exist")
    head = rows[0]
    latest, earliest = head["latest_sequence"], head["earliest_sequence"]
    check_cursor(cursor, earliest, latest)
    records = [
        Record(
            sequence=r["sequence"],
            payload=r["payload"],
            size=r["size"],
            appended_at=r["appended_at"],
            object=json.loads(r["object"]) if r["object"] is not None else None,
        )
        for r in rows
        if r["sequence"] is not None
    ]
    return Page(
        records=records,
        next_cursor=records[-1].sequence if records else cursor,
        earliest_sequence=earliest,
        latest_sequence=latest,
        closed=head["closed"],
    )


def check_cursor(cursor: int, earliest: int, latest: int) -> None:
    """The cursor rules of every read: CursorInFuture past the latest sequence,
    CursorExpired when retention removed the record after the cursor."""
    if cursor > latest:
        raise CursorInFuture(f"cursor {cursor} is beyond the latest sequence {latest}")
    if cursor + 1 < earliest:
        raise CursorExpired(requested=cursor + 1, earliest=earliest, latest=latest)


@dataclass(frozen=True, slots=True)
class PageText:
    """A page whose records Postgres wrote as the API's JSON (``records_read_page_json``).

    ``records_json`` is the records' JSON objects joined with commas (empty for none), as
    ``http.codec.record_json`` encodes them without redaction."""

    records_json: str
    count: int
    next_cursor: int
    earliest_sequence: int
    latest_sequence: int
    closed: bool


async def read_page_text(
    pool: asyncpg.Pool | asyncpg.Connection, stream_pk: int, cursor: int, limit: int
) -> PageText | None:
    """``read_page`` with the records as JSON text, for a reader without redaction; None
    when a record of the page refers to an object (then ``read_page`` reads it)."""
    row = await pool.fetchrow(QUERIES["records_read_page_json"], stream_pk, cursor, limit)
    if row is None:
        raise NotFound("stream does not exist")
    earliest, latest = row["earliest_sequence"], row["latest_sequence"]
    check_cursor(cursor, earliest, latest)
    if row["has_objects"]:
        return None
    count = row["records"]
    return PageText(
        records_json=row["body"] or "",
        count=count,
        next_cursor=row["last_sequence"] if count else cursor,
        earliest_sequence=earliest,
        latest_sequence=latest,
        closed=row["closed"],
    )
