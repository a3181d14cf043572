"""Reads with the exact cursor rule: records with ``sequence > cursor``, ascending."""

from __future__ import annotations

import json
from dataclasses import dataclass

import asyncpg

from ductor_streams.errors import CursorExpired, CursorInFuture, NotFound
from ductor_streams.schema import QUERIES
from ductor_streams.store.fingerprint import check_fingerprint
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
    """A page whose records Postgres wrote as the API's JSON (``records_read_page_json``),
    or its first piece.

    ``records_json`` is the records' JSON objects joined with commas (empty for none), as
    ``http.codecs.json_bodies.record_json`` encodes them without redaction. ``count`` and
    ``last_sequence`` are those of the records here; ``next_cursor`` is the whole page's
    (its last sequence), past ``last_sequence`` when the rest of the page is still to be
    read (``read_range_text``)."""

    records_json: str
    count: int
    next_cursor: int
    earliest_sequence: int
    latest_sequence: int
    closed: bool
    last_sequence: int

    @property
    def complete(self) -> bool:
        """Whether the whole page is here."""
        return self.last_sequence >= self.next_cursor


# Payload bytes per piece when the caller gives no bound: the whole page in one piece.
WHOLE_PAGE = 2**62


async def read_page_text(
    pool: asyncpg.Pool | asyncpg.Connection,
    stream_pk: int,
    cursor: int,
    limit: int,
    max_bytes: int = WHOLE_PAGE,
    fingerprint: str | None = None,
) -> PageText | None:
    """``read_page`` with the records as JSON text, for a reader without redaction; None
    when a record of the page (of its first piece) refers to an object (then
    ``read_page`` reads it). Only the records that start within ``max_bytes`` payload
    bytes of the first (at least one) are read: the rest of the page, up to its
    ``next_cursor``, is read a piece at a time with ``read_range_text``.

    With ``fingerprint`` (of the record the reader saw at ``cursor``) the same statement
    looks that record up: HistoryDiverged when it is not the stream's
    (``store.fingerprint.check_fingerprint``), before any page is returned."""
    row = await pool.fetchrow(
        QUERIES["records_read_page_json"],
        stream_pk,
        cursor,
        limit,
        max_bytes,
        fingerprint is not None,
    )
    if row is None:
        raise NotFound("stream does not exist")
    earliest, latest = row["earliest_sequence"], row["latest_sequence"]
    if fingerprint is not None:
        check_fingerprint(cursor, fingerprint, row["cursor_fingerprint"], earliest, latest)
    check_cursor(cursor, earliest, latest)
    if row["has_objects"]:
        return None
    count = row["records"]
    return PageText(
        records_json=row["body"] or "",
        count=count,
        # Sequences are dense: the page is cursor+1 .. cursor+limit, up to the latest.
        next_cursor=min(cursor + limit, latest) if count else cursor,
        earliest_sequence=earliest,
        latest_sequence=latest,
        closed=row["closed"],
        last_sequence=row["last_sequence"] if count else cursor,
    )


@dataclass(frozen=True, slots=True)
class RangeText:
    """Records of ``read_range_text`` as JSON text (``PageText.records_json``'s form)."""

    records_json: str
    count: int
    last_sequence: int


async def read_range_text(
    pool: asyncpg.Pool | asyncpg.Connection, stream_pk: int, after: int, last: int, max_bytes: int
) -> RangeText | None:
    """The records after ``after`` up to ``last`` that start within ``max_bytes`` payload
    bytes of the first (at least one, if any is left), as JSON text; None when one
    refers to an object (then ``read_range`` reads them)."""
    row = await pool.fetchrow(QUERIES["records_range_json"], stream_pk, after, last, max_bytes)
    assert row is not None  # an aggregate: always one row
    if row["has_objects"]:
        return None
    count = row["records"]
    return RangeText(row["body"] or "", count, row["last_sequence"] if count else after)


async def read_range(
    pool: asyncpg.Pool | asyncpg.Connection, stream_pk: int, after: int, last: int, max_bytes: int
) -> list[Record]:
    """``read_range_text``'s records as ``Record`` values."""
    rows = await pool.fetch(QUERIES["records_range"], stream_pk, after, last, max_bytes)
    return [
        Record(
            sequence=r["sequence"],
            payload=r["payload"],
            size=r["size"],
            appended_at=r["appended_at"],
            object=json.loads(r["object"]) if r["object"] is not None else None,
        )
        for r in rows
    ]


async def verify_fingerprint(
    pool: asyncpg.Pool | asyncpg.Connection, stream_pk: int, cursor: int, fingerprint: str
) -> None:
    """Whether the record the reader saw at ``cursor`` (its ``fingerprint``) is still
    the stream's: returns when it is (or retention removed it), raises HistoryDiverged
    when not, and what a read after ``cursor`` raises first (NotFound, CursorExpired).
    One primary-key lookup, for the paths whose own read cannot carry it (a subscribe's
    start, a read with redaction)."""
    row = await pool.fetchrow(QUERIES["record_fingerprint_at"], stream_pk, cursor)
    if row is None:
        raise NotFound("stream does not exist")
    earliest, latest = row["earliest_sequence"], row["latest_sequence"]
    check_fingerprint(cursor, fingerprint, row["fingerprint"], earliest, latest)
    check_cursor(cursor, earliest, latest)
