"""Backfill pages whose SSE record events Postgres writes (``records_read_sse_frames``).

The native SSE backfill (http/routes/subscribe.py) sends each record as ``event:
record``, ``id`` and ``data`` lines. Read as ``Record``s and framed in Python, that cost
the server about five times what a paged read of the same records costs, whose JSON
Postgres writes (store/read.py ``read_page_text``); here Postgres writes the frames too,
and a page is one string (docs/speed.md, "SSE backfill written by Postgres").
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from ductor_streams.errors import NotFound
from ductor_streams.schema import QUERIES
from ductor_streams.store.read import check_cursor


@dataclass(frozen=True, slots=True)
class FramedPage:
    """Records after a cursor as the native SSE response's record events, joined.

    ``frames`` holds ``count`` records' events, the last one ``last_sequence`` (the
    cursor when ``count`` is 0), byte for byte what the record-by-record path writes for
    a reader without redaction; the bounds are the stream's at the read."""

    frames: bytes
    count: int
    last_sequence: int
    earliest_sequence: int
    latest_sequence: int
    closed: bool


async def read_sse_frames(
    pool: asyncpg.Pool | asyncpg.Connection,
    stream_pk: int,
    cursor: int,
    limit: int,
    max_bytes: int,
) -> FramedPage | None:
    """The records of ``read_page(pool, stream_pk, cursor, limit, max_bytes)`` as SSE
    record events, up to the first that refers to an object; None when the page's first
    record does (then ``read_page`` reads it). The cursor rules and errors are
    ``read_page``'s."""
    row = await pool.fetchrow(
        QUERIES["records_read_sse_frames"], stream_pk, cursor, limit, max_bytes
    )
    if row is None:
        raise NotFound("stream does not exist")
    earliest, latest = row["earliest_sequence"], row["latest_sequence"]
    check_cursor(cursor, earliest, latest)
    count = row["records"]
    if not count and row["object_next"]:
        return None
    frames = row["frames"]
    return FramedPage(
        frames=frames.encode() if frames is not None else b"",
        count=count,
        last_sequence=row["last_sequence"] if count else cursor,
        earliest_sequence=earliest,
        latest_sequence=latest,
        closed=row["closed"],
    )
