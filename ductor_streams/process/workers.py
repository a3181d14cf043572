"""``ductor-streams workers``: the worker services without HTTP, until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import uvloop

from ductor_streams.config import Settings
from ductor_streams.foundation.logs import configure_logging
from ductor_streams.foundation.tracing import configure_tracing
from ductor_streams.process.services import worker_services
from ductor_streams.runtime import open_runtime
from ductor_streams.runtime.gc_tuning import tuned_after_start


async def run_worker_services(settings: Settings, stop: asyncio.Event) -> None:
    """Open the runtime, run every worker service until ``stop`` is set, then close."""
    # The garbage collector is tuned once everything has started (runtime/gc_tuning.py).
    services = [*worker_services(settings), tuned_after_start]
    pool_min_size = min(1, settings.pool_min_size)
    async with (
        open_runtime(settings, name="workers", pool_min_size=pool_min_size) as runtime,
        contextlib.AsyncExitStack() as stack,
    ):
        for service in services:
            await stack.enter_async_context(service(runtime))
        await stop.wait()


def run_workers(settings: Settings) -> int:
    settings.require_database()
    settings.require_session_database()
    configure_logging(settings.log_level_number)
    configure_tracing(settings, service="ductor-streams-workers")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_worker_services(settings, stop)

    # uvloop, as `serve` runs under uvicorn: its callbacks and sockets cost less CPU
    # than asyncio's own loop, and a worker's event loop is its whole latency budget
    # (docs/temporal.md, "Run the worker on uvloop").
    uvloop.run(main())
    return 0
