"""The deletion outbox: stored bytes to remove, with retries, state in Postgres.

Rows come from pruning (``retention``), abort (``aborted``), expiry (``expired``) and the
orphan sweep (``orphan``). A claim pushes ``next_attempt_at`` ahead (a lease), so a
process that dies mid-way leaves the row due again later, never lost. Success marks it
``done``; failure keeps it ``pending`` with the error and an exponential backoff. Rows
of a stream under legal hold are not claimed until the hold is lifted.

Objects own their deletion: ``run_deletion`` (an abort deletes its bytes at once) and
``attempt_deletion`` are here; the upkeep pass that claims due rows in batches is
maintenance/deletions.py.
"""

from __future__ import annotations

import logging

import asyncpg

from ductor_streams.objects.stores import BlobStores
from ductor_streams.schema import QUERIES

log = logging.getLogger(__name__)

LEASE_SECONDS = 300.0
MAX_BACKOFF_SECONDS = 3600.0


def backoff_seconds(attempts: int) -> float:
    """2, 4, 8, ... seconds after the n-th failed attempt, at most an hour."""
    return float(min(MAX_BACKOFF_SECONDS, 2.0 ** max(1, attempts)))


async def attempt_deletion(
    pool: asyncpg.Pool, stores: BlobStores, deletion_id: int, region: str, key: str, attempts: int
) -> bool:
    """Delete one claimed row's bytes; mark the row done, or failed with a backoff."""
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


async def run_deletion(pool: asyncpg.Pool, stores: BlobStores, deletion_id: int) -> bool:
    """Carry out one queued deletion now, if it is due and not held (abort uses this so
    that aborted bytes go at once); otherwise the workers will."""
    row = await pool.fetchrow(QUERIES["deletion_claim_one"], deletion_id, LEASE_SECONDS)
    if row is None or not stores.has(row["region"]):
        return False
    return await attempt_deletion(
        pool, stores, deletion_id, row["region"], row["storage_key"], row["attempts"]
    )
