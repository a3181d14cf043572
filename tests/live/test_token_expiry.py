"""An SSE subscription never outlives its token: the response ends at ``exp`` with
``event: reconnect`` (``token_expired``), and the Python client, given a token provider,
reconnects with a fresh token and loses nothing."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import jwt
import pytest

from ductor_streams.auth import issue_token
from ductor_streams.client import StreamsClient
from tests.conftest import JWT_SECRET
from tests.support.live import eventually

# An SSE test that hangs (a response that never ends) fails here, well before the
# suite's 300 s: the slowest of these takes a few seconds.
pytestmark = pytest.mark.timeout(60)

SCOPES = ["streams:read", "streams:write", "streams:admin"]


def _token(tenant: str, ttl: int) -> str:
    return issue_token(
        JWT_SECRET, sub="t", tenant=tenant, scopes=SCOPES, runs=["*"], ttl_seconds=ttl
    )


async def test_a_5_second_token_ends_its_stream_at_exp_with_a_final_event(server, tenant, run_id):
    token = _token(tenant, 5)
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    headers = {"Authorization": f"Bearer {token}"}
    base = f"{server.url}/api/workflow-streams/runs/{run_id}/streams"
    async with httpx.AsyncClient(timeout=30) as client:
        created = await client.post(
            base, json={"stream_id": "s", "direction": "output"}, headers=headers
        )
        assert created.status_code == 201
        events: list[tuple[str, str]] = []
        ended_at = 0.0
        async with client.stream("GET", f"{base}/s/subscribe", headers=headers) as response:
            assert response.status_code == 200
            appended = await client.post(
                f"{base}/s/records", json={"records": [{"payload": 1}]}, headers=headers
            )
            assert appended.status_code == 201
            event = ""
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    events.append((event, line[6:]))
            ended_at = time.time()
        # The stream ended by itself, within about a second of exp, saying why.
        assert exp - 0.1 <= ended_at < exp + 1.0, (ended_at, exp)
        assert [e for e, _ in events] == ["record", "reconnect"]
        assert json.loads(events[-1][1]) == {"reason": "token_expired"}
        # And a plain read with the same token is refused now, as the stream was.
        read = await client.get(f"{base}/s/records", headers=headers)
        assert read.status_code == 401


async def test_the_client_asks_its_provider_again_and_loses_nothing(server, tenant, run_id):
    issued: list[float] = []

    async def provider() -> str:
        issued.append(time.time())
        return _token(tenant, 2)

    async with StreamsClient(server.url, provider) as client:
        await client.create_stream(run_id, {"stream_id": "s", "direction": "output"})
        received: list[int] = []

        async def consume() -> None:
            async for record in client.subscribe(run_id, "s"):
                received.append(record.sequence)

        task = asyncio.create_task(consume())
        deadline = time.monotonic() + 7
        n = 0
        while time.monotonic() < deadline:  # appends across at least two token lifetimes
            n = (await client.append(run_id, "s", [n])).last_sequence
            await asyncio.sleep(0.1)
        await eventually(lambda: len(received) >= n, what="every record", timeout=15)
        await client.close_stream(run_id, "s")
        await asyncio.wait_for(task, 15)
    assert received == list(range(1, n + 1))
    assert len(issued) >= 3  # the first token, then fresh ones as each expired
