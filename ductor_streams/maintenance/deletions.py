"""Upkeep's pass over the deletion outbox (objects/deletions.py): due rows claimed in batches.

A worker claims due rows with ``FOR UPDATE SKIP LOCKED`` (a lease: one that dies mid-way
leaves the row due again later). A deletion whose bookkeeping fails is
logged, counted and stepped over (maintenance/isolation.py): its lease expires and a
later pass claims it again, and this pass goes on with the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from ductor_streams.maintenance.isolation import isolated
from ductor_streams.objects.deletions import LEASE_SECONDS
from ductor_streams.objects.deletions import attempt_deletion as _attempt
from ductor_streams.objects.stores import BlobStores
from ductor_streams.schema import QUERIES


@dataclass
class DeletionReport:
    deleted: int = 0
    failed: int = 0


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
