"""``ductor-streams workers``: the worker services without HTTP, until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from types import SimpleNamespace

from ductor_streams import metrics
from ductor_streams.config import Settings
from ductor_streams.live.hub import NotificationHub
from ductor_streams.logs import configure_logging
from ductor_streams.store import Store
from ductor_streams.store.db import create_pool
from ductor_streams.tracing import configure_tracing
from ductor_streams.workers import worker_services


async def run_worker_services(settings: Settings, stop: asyncio.Event) -> None:
    """Open the store, run every worker service until ``stop`` is set, then close."""
    dsn = settings.require_database()
    services = worker_services(settings)
    pool = await create_pool(
        dsn, min_size=min(1, settings.pool_min_size), max_size=settings.pool_max_size
    )
    metrics.track_pool("workers", pool)
    hub = NotificationHub(dsn)
    try:
        await hub.start()
        # The same shape the services get inside `serve`: `.state.store`, `.state.settings`.
        holder = SimpleNamespace(
            state=SimpleNamespace(store=Store(pool, hub=hub), settings=settings, hub=hub)
        )
        async with contextlib.AsyncExitStack() as stack:
            for service in services:
                await stack.enter_async_context(service(holder))
            await stop.wait()
    finally:
        metrics.untrack_pool("workers", pool)
        await hub.close()
        await pool.close()


def run_workers(settings: Settings) -> int:
    settings.require_database()
    configure_logging(settings.log_level_number)
    configure_tracing(settings, service="ductor-streams-workers")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_worker_services(settings, stop)

    asyncio.run(main())
    return 0
