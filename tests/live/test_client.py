"""The Python client against a real server: idempotent appends with Retry-After, pages,
and a subscription that resumes across a server restart."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from ductor_streams.auth import issue_token
from ductor_streams.client import (
    CreditExhaustedError,
    CursorExpiredError,
    StreamsClient,
)
from tests.conftest import JWT_SECRET
from tests.support.live import eventually, stream_pk
from tests.support.server import ServerProcess

# An SSE test that hangs (a response that never ends) fails here, well before the
# suite's 300 s: the slowest of these takes a few seconds.
pytestmark = pytest.mark.timeout(60)


def token(tenant: str) -> str:
    return issue_token(
        JWT_SECRET,
        sub="client",
        tenant=tenant,
        scopes=["streams:read", "streams:write", "streams:ack", "streams:admin"],
        runs=["*"],
        ttl_seconds=600,
    )


class Recorder:
    """httpx event hook: the status of every response, in order."""

    def __init__(self) -> None:
        self.statuses: list[int] = []

    async def __call__(self, response: httpx.Response) -> None:
        if "/records" in response.request.url.path:
            self.statuses.append(response.status_code)


async def test_append_read_and_subscribe_to_the_end(server, tenant, run_id):
    async with StreamsClient(server.url, token(tenant)) as client:
        await client.create_stream(run_id, {"stream_id": "out", "direction": "output"})
        first = await client.append(run_id, "out", [{"i": 1}, {"i": 2}])
        assert (first.first_sequence, first.last_sequence, first.replayed) == (1, 2, False)
        again = await client.append(run_id, "out", ["x"], idempotency_key="k-1")
        replay = await client.append(run_id, "out", ["x"], idempotency_key="k-1")
        assert (again.first_sequence, replay.first_sequence, replay.replayed) == (3, 3, True)
        page = await client.read(run_id, "out", cursor=1, limit=10)
        assert [r.sequence for r in page.records] == [2, 3] and page.next_cursor == 3
        assert page.records[0].payload == {"i": 2} and not page.closed

        received: list[int] = []

        async def consume() -> None:
            async for record in client.subscribe(run_id, "out", cursor=1):
                received.append(record.sequence)

        task = asyncio.create_task(consume())
        await eventually(lambda: received == [2, 3], what="the backfill")
        await client.append(run_id, "out", [4, 5])
        assert await client.close_stream(run_id, "out") == 5
        await asyncio.wait_for(task, 30)  # the iterator ends after `end`
    assert received == [2, 3, 4, 5]


async def test_append_honours_retry_after_and_keeps_its_idempotency_key(server, tenant, run_id):
    recorder = Recorder()
    http = httpx.AsyncClient(base_url=server.url, event_hooks={"response": [recorder]})
    async with http, StreamsClient(server.url, token(tenant), http=http, retry_budget=20) as client:
        await client.create_stream(
            run_id,
            {
                "stream_id": "credit",
                "direction": "output",
                "consumers": ["c"],
                "credit": {"max_unread_items": 2, "on_unread_full": "reject"},
            },
        )
        await client.append(run_id, "credit", [1, 2])
        started = time.monotonic()
        appending = asyncio.create_task(client.append(run_id, "credit", [3]))
        await eventually(lambda: 429 in recorder.statuses, what="the 429")
        await client.ack(run_id, "credit", "c", 2)
        result = await asyncio.wait_for(appending, 30)
        waited = time.monotonic() - started
        assert (result.first_sequence, result.last_sequence) == (3, 3)
        assert recorder.statuses == [201, 429, 201]  # waited Retry-After, did not hammer
        assert waited >= 1.0  # Retry-After is whole seconds, >= 1

        # Budget spent: the typed error, after a bounded number of tries.
        recorder.statuses.clear()
        client.retry_budget = 2.5
        with pytest.raises(CreditExhaustedError) as caught:
            await client.append(run_id, "credit", [4, 5])
        assert caught.value.code == "credit_exhausted" and caught.value.retry_after >= 1
        assert recorder.statuses and set(recorder.statuses) == {429}
        assert len(recorder.statuses) <= 3
        page = await client.read(run_id, "credit")
        assert [r.payload for r in page.records] == [1, 2, 3]


class LoseFirstAppendAnswer(httpx.AsyncBaseTransport):
    """Delivers the first append to the server, then 'loses' its answer."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.keys: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST" and request.url.path.endswith("/records"):
            self.keys.append(request.headers["idempotency-key"])
            if len(self.keys) == 1:
                await response.aclose()
                raise httpx.ReadError("connection reset", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_lost_answer_is_retried_with_the_same_key_and_appends_once(server, tenant, run_id):
    transport = LoseFirstAppendAnswer()
    http = httpx.AsyncClient(base_url=server.url, transport=transport)
    async with http, StreamsClient(server.url, token(tenant), http=http) as client:
        await client.create_stream(run_id, {"stream_id": "once", "direction": "output"})
        result = await client.append(run_id, "once", ["only"])
        assert (result.first_sequence, result.replayed) == (1, True)
        assert len(transport.keys) == 2 and transport.keys[0] == transport.keys[1]
        page = await client.read(run_id, "once")
        assert [r.payload for r in page.records] == ["only"]


async def test_subscribe_raises_typed_410(server, tenant, run_id, pool):
    async with StreamsClient(server.url, token(tenant)) as client:
        await client.create_stream(run_id, {"stream_id": "gone", "direction": "output"})
        await client.append(run_id, "gone", list(range(6)))
        pk = await stream_pk(pool, tenant, run_id, "gone")
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "DELETE FROM workflow_streams.records WHERE stream_pk = $1 AND sequence < 4", pk
            )
            await conn.execute(
                "UPDATE workflow_streams.streams SET earliest_sequence = 4 WHERE stream_pk = $1",
                pk,
            )
        with pytest.raises(CursorExpiredError) as caught:
            async for _ in client.subscribe(run_id, "gone", cursor=1):
                pass
        error = caught.value
        assert (error.requested_sequence, error.earliest_sequence, error.latest_sequence) == (
            2,
            4,
            6,
        )
        assert error.status == 410 and error.resync_reason == "retention"


async def test_subscribe_resumes_across_a_server_restart(settings, tenant, run_id):
    first = ServerProcess(settings).start()
    port = first.port
    received: list[int] = []
    try:
        async with StreamsClient(first.url, token(tenant)) as client:
            await client.create_stream(run_id, {"stream_id": "r", "direction": "output"})
            await client.append(run_id, "r", list(range(1, 21)))

            async def consume() -> None:
                async for record in client.subscribe(run_id, "r", reconnect_budget=60):
                    received.append(record.sequence)

            task = asyncio.create_task(consume())
            await eventually(lambda: len(received) == 20, what="the first 20")
            first.kill()
            second = ServerProcess(settings, port=port).start()
            try:
                await client.append(run_id, "r", list(range(21, 41)))
                await client.close_stream(run_id, "r")
                await asyncio.wait_for(task, 60)
            finally:
                second.stop()
    finally:
        first.kill()
    assert received == list(range(1, 41))
