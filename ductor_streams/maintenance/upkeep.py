"""One upkeep pass (retention, expiry, orphans, deletions), and the periodic worker that
runs it inside ``serve`` and ``workers``.

Every step is safe with several replicas at once: pruning is one statement under the
stream's row lock, expiry a guarded update with SKIP LOCKED, deletions leased claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from ductor_streams.config import (
    DEFAULT_IDEMPOTENCY_WINDOW_SECONDS,
    DEFAULT_ORPHAN_GRACE_SECONDS,
    UpkeepConfig,
)
from ductor_streams.foundation import metrics, tracing
from ductor_streams.maintenance.deletions import DeletionReport, run_deletions
from ductor_streams.maintenance.retention import RetentionReport, prune_all
from ductor_streams.maintenance.sweep import expire_intents, sweep_orphans
from ductor_streams.objects.stores import BlobStores
from ductor_streams.store.db import database_unavailable
from ductor_streams.store.outage import report_unavailable

log = logging.getLogger(__name__)

# A pass that found the database unavailable is retried after this many seconds, then
# twice as long each time it fails again, up to the interval.
UNAVAILABLE_FIRST_RETRY_SECONDS = 1.0


@dataclass
class PassReport:
    """What one pass did."""

    retention: RetentionReport = field(default_factory=RetentionReport)
    expired_intents: int = 0
    orphans_queued: int = 0
    deletions: DeletionReport = field(default_factory=DeletionReport)
    swept_orphans: bool = False

    def lines(self) -> list[str]:
        return [
            f"pruned {self.retention.records} records from {self.retention.streams} streams "
            f"({self.retention.objects} objects queued for deletion)",
            f"expired {self.expired_intents} object intents",
            (
                f"queued {self.orphans_queued} orphaned objects for deletion"
                if self.swept_orphans
                else "orphan sweep not due"
            ),
            f"deleted {self.deletions.deleted} stored objects "
            f"({self.deletions.failed} failed, will retry)",
            f"pruned {self.retention.receipts} append receipts",
        ]

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "records_pruned": self.retention.records,
            "streams_pruned": self.retention.streams,
            "objects_queued_by_retention": self.retention.objects,
            "receipts_pruned": self.retention.receipts,
            "intents_expired": self.expired_intents,
            "orphans_queued": self.orphans_queued,
            "deleted": self.deletions.deleted,
            "deletions_failed": self.deletions.failed,
        }


async def run_pass(
    pool: asyncpg.Pool,
    stores: BlobStores,
    *,
    sweep_orphans_now: bool = True,
    orphan_grace_seconds: float = DEFAULT_ORPHAN_GRACE_SECONDS,
    idempotency_window_seconds: float = DEFAULT_IDEMPOTENCY_WINDOW_SECONDS,
) -> PassReport:
    """Prune (records, then the append receipts due), expire, sweep orphans (when
    asked), then carry out due deletions."""
    with tracing.span("maintenance pass", {"ductor_streams.sweep_orphans": sweep_orphans_now}):
        return await _run_pass(
            pool, stores, sweep_orphans_now, orphan_grace_seconds, idempotency_window_seconds
        )


async def _run_pass(
    pool: asyncpg.Pool,
    stores: BlobStores,
    sweep_orphans_now: bool,
    orphan_grace_seconds: float,
    idempotency_window_seconds: float,
) -> PassReport:
    report = PassReport()
    report.retention = await prune_all(pool, idempotency_window_seconds=idempotency_window_seconds)
    report.expired_intents = await expire_intents(pool)
    if sweep_orphans_now:
        report.orphans_queued = await sweep_orphans(
            pool, stores, grace_seconds=orphan_grace_seconds
        )
        report.swept_orphans = True
    report.deletions = await run_deletions(pool, stores)
    metrics.PRUNED_RECORDS.inc(report.retention.records)
    metrics.EXPIRED_INTENTS.inc(report.expired_intents)
    metrics.OBJECT_DELETIONS.labels("done").inc(report.deletions.deleted)
    metrics.OBJECT_DELETIONS.labels("failed").inc(report.deletions.failed)
    return report


@contextlib.asynccontextmanager
async def running_upkeep(
    pool: asyncpg.Pool, stores: BlobStores, config: UpkeepConfig
) -> AsyncIterator[None]:
    """Run a pass every ``config.interval_seconds`` while the block runs (``serve`` and
    ``workers`` run it as a service: process/services.py)."""
    task = asyncio.get_running_loop().create_task(_loop(pool, stores, config))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _loop(pool: asyncpg.Pool, stores: BlobStores, config: UpkeepConfig) -> None:
    last_orphan_sweep = float("-inf")
    retry = UNAVAILABLE_FIRST_RETRY_SECONDS
    while True:
        started = time.monotonic()
        sweep = started - last_orphan_sweep >= config.orphan_interval_seconds
        try:
            report = await run_pass(
                pool,
                stores,
                sweep_orphans_now=sweep,
                orphan_grace_seconds=config.orphan_grace_seconds,
                idempotency_window_seconds=config.idempotency_window_seconds,
            )
            if sweep:
                last_orphan_sweep = started
            if any(report.to_json_dict().values()):
                log.info("upkeep pass", extra=report.to_json_dict())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if database_unavailable(exc):
                # Postgres is restarting or failing over: wait and try again, backing
                # off up to the interval, so upkeep resumes soon after it is back.
                report_unavailable("upkeep", exc)
                await asyncio.sleep(min(retry, config.interval_seconds))
                retry = min(retry * 2, config.interval_seconds)
                continue
            # Keep running: the next pass retries whatever this one could not do.
            log.warning("upkeep pass failed", extra={"error_type": type(exc).__name__})
        retry = UNAVAILABLE_FIRST_RETRY_SECONDS
        await asyncio.sleep(config.interval_seconds)
