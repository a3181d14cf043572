"""Helpers of the Temporal tests: appends through the store, the delivery rows, a
dispatcher in-process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from temporalio.client import Client

from ductor_streams.delivery import Dispatcher, DispatcherConfig
from ductor_streams.delivery.temporal import TemporalWaitService
from ductor_streams.store import Store, StreamKey, StreamRef, encode_batch
from tests.temporal.polling import eventually


async def stream_ref(store: Store, tenant: str, run_id: str, stream_id: str) -> StreamRef:
    """The stream once the workflow has created it."""
    key = StreamKey(tenant, run_id, stream_id)
    ref = await eventually(
        lambda: store.directory.find(key), lambda r: r is not None, what=f"stream {stream_id}"
    )
    assert ref is not None
    return ref


async def append_inputs(store: Store, ref: StreamRef, numbers: list[int]) -> tuple[int, int]:
    result = await store.append(ref, encode_batch([{"n": n} for n in numbers]))
    return result.first_sequence, result.last_sequence


async def deliveries(pool: asyncpg.Pool, ref: StreamRef) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        "SELECT sequence, state, attempts, last_error, lease_owner, delivered_at"
        "  FROM workflow_streams.input_deliveries WHERE stream_pk = $1 ORDER BY sequence",
        ref.stream_pk,
    )
    return [dict(r) for r in rows]


async def output_payloads(store: Store, ref: StreamRef) -> list[Any]:
    import json

    page = await store.read(ref, 0, 1000)
    return [json.loads(r.payload) for r in page.records]


@contextlib.asynccontextmanager
async def running_dispatcher(
    pool: asyncpg.Pool, client: Client, tenant: str, **config: Any
) -> AsyncIterator[Dispatcher]:
    """A dispatcher delivering through Temporal while the block runs (polls: no hub)."""
    settings = {"idle_poll": 0.05, "lease_seconds": 10.0, **config}
    dispatcher = Dispatcher(
        pool, TemporalWaitService(client), tenant=tenant, config=DispatcherConfig(**settings)
    )
    task = asyncio.get_running_loop().create_task(dispatcher.run())
    try:
        yield dispatcher
    finally:
        dispatcher.stop()
        await task


class WorkersProcess:
    """A real ``ductor-streams workers`` subprocess (dispatcher + maintenance)."""

    def __init__(self, env: dict[str, str], log_path: Any) -> None:
        self._env = env
        self.log_path = log_path
        self.process: Any = None

    def start(self) -> WorkersProcess:
        import os
        import subprocess
        import sys

        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ductor_streams.process.cli", "workers"],
            env={**os.environ, **self._env},
            stdout=log,
            stderr=log,
        )
        return self

    async def started(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Wait until its dispatcher says it runs (or fail if the process died)."""

        async def probe() -> str:
            if self.process.poll() is not None:
                raise AssertionError(f"workers exited with {self.process.returncode}")
            return self.log_path.read_text(errors="replace")

        await eventually(
            probe, lambda text: "input dispatcher started" in text, timeout=timeout, what="workers"
        )

    async def returncode(self) -> int | None:
        """The exit status, or None while it runs (a probe for ``eventually``)."""
        return self.process.poll()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except Exception:
                self.process.kill()
                self.process.wait(10)


async def settled(dispatcher: Dispatcher, timeout: float = 10.0) -> None:  # noqa: ASYNC109
    """Until a wake that names a stream is claimed by name: the dispatcher's first round
    (a claim of every stream and the next-due query) is over and found nothing due, so
    what a test counts from here is its own doing. Names a stream that does not exist."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        claims, everywhere = dispatcher.claims, dispatcher.claims_everywhere
        dispatcher.notify(-1)
        await eventually(
            lambda: asyncio.sleep(0, dispatcher.claims),
            lambda n: n > claims,  # noqa: B023 (awaited here)
            what="a claim",
        )
        if dispatcher.claims_everywhere == everywhere:
            return
        assert asyncio.get_running_loop().time() < deadline, "the dispatcher never settled"
