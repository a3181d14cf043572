"""The deletion outbox: stored bytes to remove, with retries, state in Postgres.

Rows come from pruning (``retention``), abort (``aborted``), expiry (``expired``) and the
orphan sweep (``orphan``). A worker claims due rows with ``FOR UPDATE SKIP LOCKED``; the
claim pushes ``next_attempt_at`` ahead (a lease), so a worker that dies mid-way leaves
the row due again later, never lost. Success marks it ``done``; failure keeps it
``pending`` with the error and an exponential backoff. Rows of a stream under legal
hold are not claimed until the hold is lifted. A deletion whose bookkeeping fails is
logged, counted and stepped over (maintenance/isolation.py): its lease expires and a
later pass claims it again, and this pass goes on with the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from ductor_streams.maintenance.isolation import isolated
from ductor_streams.objects.stores import BlobStores
from ductor_streams.schema import QUERIES

log = logging.getLogger(__name__)

LEASE_SECONDS = 300.0
MAX_BACKOFF_SECONDS = 3600.0


def backoff_seconds(attempts: int) -> float:
    """2, 4, 8, ... seconds after the n-th failed attempt, at most an hour."""
    return float(min(MAX_BACKOFF_SECONDS, 2.0 ** max(1, attempts)))


@dataclass
class DeletionReport:
    deleted: int = 0
    failed: int = 0


async def _attempt(
    pool: asyncpg.Pool, stores: BlobStores, deletion_id: int, region: str, key: str, attempts: int
) -> bool:
    try:
        await stores.for_region(region).delete(key)
    except Exception as exc:
        # The key and the error type only: never bytes.
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
        await pool.execute(
            QUERIES["deletion_failed"], deletion_id, error, backoff_seconds(attempts)
        )
        log.warning(
            "object deletion failed",
            extra={"deletion_id": deletion_id, "error_type": type(exc).__name__},
        )
        return False
    await pool.execute(QUERIES["deletion_done"], deletion_id)
    return True


async def run_deletions(
    pool: asyncpg.Pool, stores: BlobStores, *, batch: int = 100, max_batches: int = 100
) -> DeletionReport:
    """Claim and carry out due deletions of the regions this process has stores for."""
    report = DeletionReport()
    regions = stores.regions
    if not regions:
        return report
    for _ in range(max_batches):
        rows = await pool.fetch(QUERIES["deletions_claim"], batch, regions, LEASE_SECONDS)
        for row in rows:
            ok = False
            with isolated("deletion", deletion_id=row["deletion_id"]):
                ok = await _attempt(
                    pool,
                    stores,
                    row["deletion_id"],
                    row["region"],
                    row["storage_key"],
                    row["attempts"],
                )
            if ok:
                report.deleted += 1
            else:
                report.failed += 1
        if len(rows) < batch:
            break
    return report


async def run_deletion(pool: asyncpg.Pool, stores: BlobStores, deletion_id: int) -> bool:
    """Carry out one queued deletion now, if it is due and not held (abort uses this so
    that aborted bytes go at once); otherwise the workers will."""
    row = await pool.fetchrow(QUERIES["deletion_claim_one"], deletion_id, LEASE_SECONDS)
    if row is None or not stores.has(row["region"]):
        return False
    return await _attempt(
        pool, stores, deletion_id, row["region"], row["storage_key"], row["attempts"]
    )
