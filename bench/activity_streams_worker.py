"""The worker process of ``bench.activity_streams``: ``BenchTokensWorkflow`` and its
activities with the ``StreamsPlugin`` (settings from the environment), until killed.

    python -m bench.activity_streams_worker
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import uvloop
from temporalio import activity
from temporalio.worker import Worker

from bench import hops
from bench.activity_streams_workflows import (
    MAKE_TOKENS,
    TASK_QUEUE,
    WRITE_TOKENS,
    BenchTokensWorkflow,
    TokensReport,
    TokensRequest,
)
from ductor_streams import temporal_connection
from ductor_streams.config import Settings
from ductor_streams.plugin import StreamsPlugin
from ductor_streams.plugin.streaming import stream_writer


async def _paced(request: TokensRequest) -> Any:
    """Yields token numbers at ``request.rate`` from ``request.start_at`` (0: at once)."""
    delay = request.start_at - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    started = time.monotonic()
    for i in range(request.tokens):
        if request.rate:
            wait = started + i / request.rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        yield i


@activity.defn(name=WRITE_TOKENS)
async def write_tokens(request: TokensRequest) -> TokensReport:
    async with stream_writer("output") as out:
        first = None
        async for i in _paced(request):
            if first is None:
                first = time.monotonic()
            await out.write({"i": i, "t": time.time()})
        await out.flush()
    assert first is not None
    return TokensReport(request.tokens, time.monotonic() - first)


@activity.defn(name=MAKE_TOKENS)
async def make_tokens(request: TokensRequest) -> list[Any]:
    return [{"i": i, "t": time.time()} async for i in _paced(request)]


async def main() -> None:
    settings = Settings.from_env()
    client = await temporal_connection.connect(settings, plugins=[StreamsPlugin(settings)])
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[BenchTokensWorkflow],
        activities=[write_tokens, make_tokens],
        max_concurrent_activities=1000,
    )
    print("bench worker polling", flush=True)
    await worker.run()


# The worker's event loop (bench.activity_streams --worker-loop): uvloop, as
# docs/temporal.md advises and `ductor-streams workers` runs, or asyncio's own.
LOOP_ENV = "BENCH_WORKER_LOOP"

if __name__ == "__main__":
    if hops.enabled():
        hops.install_worker()
    if os.environ.get(LOOP_ENV, "uvloop") == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())
