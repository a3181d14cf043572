"""``ductor-streams prune``: one upkeep pass now, then exit, printing what it did."""

from __future__ import annotations

import asyncio

from ductor_streams.config import Settings, UpkeepConfig
from ductor_streams.foundation.logs import configure_logging
from ductor_streams.foundation.tracing import configure_tracing
from ductor_streams.maintenance.upkeep import PassReport, run_pass
from ductor_streams.objects.stores import BlobStores
from ductor_streams.store.db import create_pool


async def _prune(settings: Settings, config: UpkeepConfig) -> PassReport:
    pool = await create_pool(
        settings.require_database(), min_size=1, max_size=2, pooler=settings.database_pooler
    )
    try:
        return await run_pass(
            pool,
            BlobStores(
                settings.object_stores,
                credentials_file=settings.google_application_credentials,
            ),
            sweep_orphans_now=True,
            orphan_grace_seconds=config.orphan_grace_seconds,
            idempotency_window_seconds=config.idempotency_window_seconds,
        )
    finally:
        await pool.close()


def prune_once(settings: Settings) -> int:
    """Run retention, expiry, the orphan sweep and due deletions once; print a summary
    (stdout). Warnings, e.g. a stream that could not be pruned, are JSON lines on stderr,
    as in ``serve`` and ``workers``."""
    settings.require_database()
    configure_logging(settings.log_level_number)
    configure_tracing(settings, service="ductor-streams-prune")
    config = settings.upkeep
    report = asyncio.run(_prune(settings, config))
    for line in report.lines():
        print(line)
    return 0
