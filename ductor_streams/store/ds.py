"""The store's side of the Durable Streams endpoint: writes with writer checks, reads
from a DS offset, the stream's tail, and create-with-body in one transaction.

Plain appends (no ``Stream-Seq``, producer or close) are not here: they take the
group-commit path of every native append (``Store.append``). A write with writer state
runs ``workflow_streams.ds_append``, which decides the checks under the
stream's row lock and appends through ``append_requests`` in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from ductor_streams.errors import NotFound
from ductor_streams.foundation import tracing
from ductor_streams.foundation.definitions import StreamDefinition
from ductor_streams.schema import QUERIES
from ductor_streams.store.append import outcome_to_result
from ductor_streams.store.db import translate_db_errors
from ductor_streams.store.encoding import EncodedBatch
from ductor_streams.store.models import Page, StreamKey, StreamRef
from ductor_streams.store.outcomes import DsWriteOutcome
from ductor_streams.store.read import page_of_rows
from ductor_streams.store.streams import StreamDirectory


@dataclass(frozen=True, slots=True)
class WriterHeaders:
    """A DS write's coordination: close after it, its ``Stream-Seq``, its producer."""

    close: bool = False
    stream_seq: str | None = None
    producer_id: str | None = None
    producer_epoch: int | None = None
    producer_seq: int | None = None

    @property
    def plain(self) -> bool:
        """Whether the write needs none of ``ds_append``'s checks (group commit serves it)."""
        return not self.close and self.stream_seq is None and self.producer_id is None


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What ``ds_append`` decided (its outcomes are listed above it in
    schema/migrations/0001_baseline.sql)."""

    outcome: DsWriteOutcome
    first_sequence: int | None
    last_sequence: int | None
    latest_sequence: int
    closed: bool
    producer_epoch: int | None
    producer_seq: int | None


@dataclass(frozen=True, slots=True)
class StreamHead:
    latest_sequence: int
    earliest_sequence: int
    closed: bool


async def write(
    conn: asyncpg.Pool | asyncpg.Connection,
    stream_pk: int,
    batch: EncodedBatch | None,
    headers: WriterHeaders,
) -> WriteOutcome:
    """Run one DS write (``batch`` None: close only) in one transaction."""
    with translate_db_errors():
        row = await conn.fetchrow(
            QUERIES["ds_append"],
            stream_pk,
            batch.payloads if batch is not None else [],
            batch.sizes if batch is not None else [],
            batch.request_hash if batch is not None else None,
            headers.close,
            headers.stream_seq,
            headers.producer_id,
            headers.producer_epoch,
            headers.producer_seq,
            # Kept with an input stream's delivery rows (foundation/tracing.py); None while off.
            tracing.current_traceparent(),
        )
    assert row is not None
    return WriteOutcome(
        outcome=DsWriteOutcome.parse(row["outcome"]),
        first_sequence=row["first_sequence"],
        last_sequence=row["last_sequence"],
        latest_sequence=row["latest_sequence"] or 0,
        closed=bool(row["closed"]),
        producer_epoch=row["producer_epoch"],
        producer_seq=row["producer_seq"],
    )


async def head(pool: asyncpg.Pool, stream_pk: int) -> StreamHead:
    row = await pool.fetchrow(QUERIES["ds_stream_head"], stream_pk)
    if row is None:
        raise NotFound("stream does not exist")
    return StreamHead(row["latest_sequence"], row["earliest_sequence"], row["closed"])


@dataclass(frozen=True, slots=True)
class CatchUpPage:
    """A DS catch-up page: its first piece (``first``: its records and the stream's
    bounds) and its last sequence (``page_last``, None when it is empty). The records
    after the piece, up to ``page_last``, are read with ``read.read_range``."""

    first: Page
    page_last: int | None


async def read(
    pool: asyncpg.Pool,
    stream_pk: int,
    after: int | None,
    limit: int,
    max_bytes: int,
    piece_bytes: int,
) -> CatchUpPage:
    """The page after ``after`` (None: from the first retained record), at most ``limit``
    records and about ``max_bytes`` (at least one record), of which only the records
    within ``piece_bytes`` of the first are read (``ds_records_read``); ``read_page``'s
    cursor rules."""
    rows = await pool.fetch(
        QUERIES["ds_records_read"], stream_pk, after, limit, max_bytes, piece_bytes
    )
    if not rows:
        raise NotFound("stream does not exist")
    first = page_of_rows(rows, int(rows[0]["after"]))
    return CatchUpPage(first, rows[0]["page_last"])


async def create(
    pool: asyncpg.Pool,
    directory: StreamDirectory,
    key: StreamKey,
    definition: StreamDefinition,
    batch: EncodedBatch | None,
    close: bool,
) -> tuple[StreamRef, bool, WriteOutcome | None]:
    """Create the stream with its initial records and closed state in ONE transaction.

    Returns ``(ref, created, outcome)``; for an existing stream nothing is written
    (``created`` False, ``outcome`` None) and the caller compares what DS can see."""
    outcome = None
    async with pool.acquire() as conn, conn.transaction():
        ref, created = await directory.create(key, definition, connection=conn, exact=False)
        if not created:
            return ref, False, None
        if batch is not None or close:
            outcome = await write(conn, ref.stream_pk, batch, WriterHeaders(close=close))
            if outcome.outcome != DsWriteOutcome.APPENDED:
                # Only a ceiling could refuse the first records of a new stream; the
                # transaction rolls back and nothing of the stream is kept.
                raise _refusal(outcome.outcome)
    return directory.remember(ref), True, outcome


def _refusal(outcome: DsWriteOutcome) -> Exception:
    same = outcome.as_append
    if same is not None:
        try:
            outcome_to_result((same, None, None))
        except Exception as exc:
            return exc
    return RuntimeError(f"unexpected DS create outcome {outcome!r}")
