"""The operator overview: delivery counts by state, oldest owed delivery, per-stream lag,
and the gap evidence that live delivery recorded."""

from __future__ import annotations

import asyncpg

from ductor_streams.ops.filters import GapFilter, page_token
from ductor_streams.ops.models import (
    DELIVERY_STATES,
    DeliverySummary,
    Gap,
    GapPage,
    StreamLag,
    Visibility,
)
from ductor_streams.schema import QUERIES


async def count_by_state(
    pool: asyncpg.Pool, view: Visibility
) -> tuple[dict[str, int], float | None]:
    """Deliveries per state (every state present, 0 included) and the age in seconds of
    the oldest one still to be made (pending or retrying), or ``None``."""
    if view == Visibility.everything():
        rows = await pool.fetch(QUERIES["ops_deliveries_count_all"])
    else:
        rows = await pool.fetch(QUERIES["ops_deliveries_count_by_state"], *view.args())
    counts = dict.fromkeys(DELIVERY_STATES, 0)
    for row in rows:
        counts[row["state"]] = row["deliveries"]
    oldest = await pool.fetchval(QUERIES["ops_deliveries_oldest_owed"], *view.args())
    return counts, max(0.0, oldest) if oldest is not None else None


async def summarize(pool: asyncpg.Pool, view: Visibility, *, max_streams: int) -> DeliverySummary:
    """Counts, oldest owed age, and up to ``max_streams`` lagging streams, longest first."""
    counts, oldest = await count_by_state(pool, view)
    rows = await pool.fetch(QUERIES["ops_streams_lag"], *view.args(), max_streams)
    streams = [
        StreamLag(
            run_id=r["run_id"],
            stream_id=r["stream_id"],
            latest_sequence=r["latest_sequence"],
            pending=r["pending"],
            retrying=r["retrying"],
            dead=r["dead"],
            first_undelivered_sequence=r["first_undelivered_sequence"],
            lag_seconds=max(0.0, r["lag_seconds"]),
            last_delivered_at=r["last_delivered_at"],
        )
        for r in rows
    ]
    return DeliverySummary(counts, oldest, streams)


async def list_gaps(
    pool: asyncpg.Pool,
    view: Visibility,
    where: GapFilter,
    *,
    limit: int,
    before: int | None = None,
) -> GapPage:
    """One page of gap evidence, newest first, older than the id ``before``."""
    rows = await pool.fetch(
        QUERIES["ops_gaps_list"], *view.args(), where.run_id, where.stream_id, before, limit + 1
    )
    gaps = [
        Gap(
            gap_id=r["gap_id"],
            run_id=r["run_id"],
            stream_id=r["stream_id"],
            expected_sequence=r["expected_sequence"],
            received_sequence=r["received_sequence"],
            repaired_records=r["repaired_records"],
            detected_by=r["detected_by"],
            detected_at=r["detected_at"],
        )
        for r in rows[:limit]
    ]
    return GapPage(gaps, page_token(gaps[-1].gap_id) if len(rows) > limit else None)
