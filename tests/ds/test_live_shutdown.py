"""DS live reads against their own real server: with a pool of 2 connections, 20
long-polls and 10 SSE readers waiting at the tail hold none of them (an append answers,
and every reader gets its record), and SIGTERM ends the waiting ones at once (long-polls
answer 204, SSE responses end) and the server exits within its budget; and a DS SSE
response ends when its token expires, however long the setting lets it last."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest

from ductor_streams.config import Settings
from tests.conftest import API, TokenFactory
from tests.support.server import ServerProcess

LONG_POLL_SECONDS = 30  # far longer than anything the test waits for


async def _sse_until_up_to_date(
    http: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    ready: asyncio.Event,
    counter: list[int],
    want: int,
) -> bytes:
    """Read an SSE response to its end; set ``ready`` once ``want`` readers are at the tail."""
    seen = b""
    async with http.stream("GET", url, headers=headers) as r:
        assert r.status_code == 200
        async for chunk in r.aiter_raw():
            if not seen and b"upToDate" in chunk:
                counter[0] += 1
                if counter[0] == want:
                    ready.set()
            seen += chunk
    return seen


@pytest.mark.timeout(120)
async def test_waiting_live_reads_hold_no_connection_and_end_at_sigterm(
    settings: Settings, run_id: str, auth: TokenFactory, tmp_path: Path
) -> None:
    env = {
        "DUCTOR_STREAMS_POOL_MIN_SIZE": "1",
        "DUCTOR_STREAMS_POOL_MAX_SIZE": "2",
        "DUCTOR_STREAMS_DS_LONG_POLL_SECONDS": str(LONG_POLL_SECONDS),
        "DUCTOR_STREAMS_DS_SSE_SECONDS": "600",
    }
    server = ServerProcess(settings, extra_env=env, log_path=tmp_path / "server.log").start()
    headers = auth()
    url = f"{API}/runs/{run_id}/ds/v1/stream/live"
    json_headers = {**headers, "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=100)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as http:
            r = await http.put(url, headers=json_headers, content=b"[1]")
            assert r.status_code == 201, r.text
            tail = r.headers["stream-next-offset"]

            # 1. Readers at the tail, then an append: it is answered, and each reader gets it.
            polls = [
                asyncio.create_task(
                    http.get(url + f"?offset={tail}&live=long-poll", headers=headers)
                )
                for _ in range(20)
            ]
            ready, counter = asyncio.Event(), [0]
            sses = [
                asyncio.create_task(
                    _sse_until_up_to_date(
                        http, url + f"?offset={tail}&live=sse", headers, ready, counter, 10
                    )
                )
                for _ in range(10)
            ]
            await asyncio.wait_for(ready.wait(), 30)
            r = await asyncio.wait_for(http.post(url, headers=json_headers, content=b"[2]"), 10)
            assert r.status_code == 204, r.text
            answers = await asyncio.wait_for(asyncio.gather(*polls), 10)
            assert [(a.status_code, a.json()) for a in answers] == [(200, [2])] * 20

            # 2. Readers waiting again, then SIGTERM: all end promptly, the server exits.
            tail = r.headers["stream-next-offset"]
            polls = [
                asyncio.create_task(
                    http.get(url + f"?offset={tail}&live=long-poll", headers=headers)
                )
                for _ in range(20)
            ]
            ready2, counter2 = asyncio.Event(), [0]
            sses2 = [
                asyncio.create_task(
                    _sse_until_up_to_date(
                        http, url + f"?offset={tail}&live=sse", headers, ready2, counter2, 10
                    )
                )
                for _ in range(10)
            ]
            await asyncio.wait_for(ready2.wait(), 30)
            assert server.process is not None
            server.process.send_signal(signal.SIGTERM)
            # In order: the long-polls answered, the SSE responses ended, then the process
            # exited by itself (a drain that hung would meet the deadlines, or be killed).
            answers = await asyncio.wait_for(asyncio.gather(*polls), 30)
            assert {a.status_code for a in answers} == {204}
            ended = await asyncio.wait_for(asyncio.gather(*sses, *sses2), 30)
            assert all(b"[2]" in frames for frames in ended[:10])
            # uvicorn re-raises the SIGTERM once it has shut down: ended by it, not killed.
            assert await asyncio.to_thread(server.process.wait, 30) in (0, -signal.SIGTERM)
    finally:
        server.stop()


@pytest.mark.timeout(120)
async def test_a_ds_sse_response_ends_when_its_token_expires(
    settings: Settings, run_id: str, auth: TokenFactory, tmp_path: Path
) -> None:
    env = {"DUCTOR_STREAMS_DS_SSE_SECONDS": "600", "DUCTOR_STREAMS_SSE_KEEPALIVE_SECONDS": "0.2"}
    url = f"{API}/runs/{run_id}/ds/v1/stream/expiring"
    with ServerProcess(settings, extra_env=env, log_path=tmp_path / "server.log") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            admin = {**auth(), "Content-Type": "application/json"}
            assert (await http.put(url, headers=admin, content=b"[1]")).status_code == 201
            short = auth(ttl=3)

            async def follow() -> bytes:
                async with http.stream("GET", url + "?offset=-1&live=sse", headers=short) as r:
                    assert r.status_code == 200
                    return b"".join([chunk async for chunk in r.aiter_raw()])

            # It ends with the token (3 s), long before the 600 s the setting allows.
            frames = await asyncio.wait_for(follow(), 60)
    assert b"event: data\ndata:[1]" in frames
