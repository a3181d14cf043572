"""Retention pruning: ``max_records`` keeps the newest N records, ``max_age_seconds``
removes records older than S seconds. Pruning moves ``earliest_sequence`` (reads below it
answer 410) and ``pruned_bytes``, and queues the bytes of pruned objects for deletion.

Append receipts (what an ``Idempotency-Key`` replays) go once retention has removed
every record they answered for and they are older than the idempotency window
(``DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS``), whichever comes later: a stream keeps
the receipts of its retained records and of the window's appends, no more.

Each step is one statement under the stream's row lock that re-checks legal hold there,
so a stream under hold loses nothing, however the hold and a pass race. A stream that
fails to prune is logged, counted and stepped over (maintenance/isolation.py): the pass
goes on with the next one.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from ductor_streams.config import DEFAULT_IDEMPOTENCY_WINDOW_SECONDS
from ductor_streams.maintenance.isolation import isolated
from ductor_streams.schema import QUERIES

# Records removed per statement: keeps each hold of the stream's row lock short.
STEP_RECORDS = 10_000
# Receipts removed per statement (no lock is held; this bounds one statement's work).
STEP_RECEIPTS = 10_000
# How long a receipt outlives its records unless configured (24 hours).


@dataclass
class RetentionReport:
    streams: int = 0
    records: int = 0
    objects: int = 0
    receipts: int = 0


async def prune_stream(
    pool: asyncpg.Pool, stream_pk: int, *, step: int = STEP_RECORDS
) -> tuple[int, int]:
    """Prune one stream as far as its retention says; returns (records, objects queued)."""
    records = objects = 0
    while True:
        row = await pool.fetchrow(QUERIES["stream_prune"], stream_pk, step)
        if row is None or row["new_earliest"] <= row["old_earliest"]:
            return records, objects
        records += row["records_pruned"]
        objects += row["objects_queued"]


async def prune_receipts(
    pool: asyncpg.Pool,
    stream_pk: int,
    *,
    window_seconds: float = DEFAULT_IDEMPOTENCY_WINDOW_SECONDS,
    step: int = STEP_RECEIPTS,
) -> int:
    """Remove the stream's due append receipts (see the module docstring); how many."""
    removed = 0
    while True:
        count = int(
            await pool.fetchval(QUERIES["append_receipts_prune"], stream_pk, window_seconds, step)
        )
        removed += count
        if count < step:
            return removed


async def prune_all(
    pool: asyncpg.Pool,
    *,
    page: int = 500,
    idempotency_window_seconds: float = DEFAULT_IDEMPOTENCY_WINDOW_SECONDS,
) -> RetentionReport:
    """One retention pass over every stream that has a retention limit."""
    report = RetentionReport()
    after = 0
    while True:
        rows = await pool.fetch(QUERIES["streams_with_retention"], after, page)
        for row in rows:
            records = objects = receipts = 0
            with isolated("retention", stream_pk=row["stream_pk"]):
                records, objects = await prune_stream(pool, row["stream_pk"])
                if records or row["pruned_before"]:
                    receipts = await prune_receipts(
                        pool, row["stream_pk"], window_seconds=idempotency_window_seconds
                    )
            report.receipts += receipts
            if records:
                report.streams += 1
                report.records += records
                report.objects += objects
        if len(rows) < page:
            return report
        after = rows[-1]["stream_pk"]
