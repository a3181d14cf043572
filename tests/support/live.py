"""Helpers for live-delivery tests: streams over real HTTP, SSE collectors, SQL pokes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
from httpx_sse import aconnect_sse

API = "/api/workflow-streams"


def stream_url(run_id: str, stream_id: str) -> str:
    return f"{API}/runs/{run_id}/streams/{stream_id}"


async def create_stream(
    c: httpx.AsyncClient, run_id: str, stream_id: str, headers: dict[str, str], **extra: Any
) -> None:
    body = {"stream_id": stream_id, "direction": "output", **extra}
    r = await c.post(f"{API}/runs/{run_id}/streams", json=body, headers=headers)
    assert r.status_code == 201, r.text


async def append(
    c: httpx.AsyncClient, run_id: str, stream_id: str, payloads: list[Any], headers: dict[str, str]
) -> tuple[int, int]:
    r = await c.post(
        stream_url(run_id, stream_id) + "/records",
        json={"records": [{"payload": p} for p in payloads]},
        headers=headers,
    )
    assert r.status_code == 201, r.text
    body = r.json()
    return body["first_sequence"], body["last_sequence"]


async def close(c: httpx.AsyncClient, run_id: str, stream_id: str, headers: dict[str, str]) -> int:
    r = await c.post(stream_url(run_id, stream_id) + "/close", headers=headers)
    assert r.status_code == 200, r.text
    return int(r.json()["last_sequence"])


@dataclass
class Collected:
    """What one SSE connection received, in order."""

    sequences: list[int] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    end: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    other: list[str] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


async def collect_sse(
    base_url: str,
    path: str,
    headers: dict[str, str],
    *,
    params: dict[str, Any] | None = None,
    until: int | None = None,
    into: Collected | None = None,
    timeout: float = 60.0,  # noqa: ASYNC109 (the HTTP timeout, not a deadline)
) -> Collected:
    """Follow an SSE response until it ends (or ``until`` was received), recording all."""
    got = into or Collected()
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout)) as c,
        aconnect_sse(c, "GET", path, headers=headers, params=params) as source,
    ):
        assert source.response.status_code == 200, (await source.response.aread()).decode()
        got.connected.set()
        async for event in source.aiter_sse():
            if event.event == "record":
                record = json.loads(event.data)
                got.records.append(record)
                got.sequences.append(record["sequence"])
                got.ids.append(event.id)
            elif event.event == "end":
                got.end = json.loads(event.data)
            elif event.event == "error":
                got.error = json.loads(event.data)
            elif event.data:
                got.other.append(event.event)
            got.changed.set()
            if until is not None and got.sequences and got.sequences[-1] >= until:
                break
    return got


async def eventually(
    check: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 30.0,  # noqa: ASYNC109 (a polling deadline)
    what: str = "",
) -> None:
    """Poll ``check`` until it holds, failing after ``timeout`` seconds (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.01)


async def stream_pk(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, run_id: str, sid: str
) -> int:
    pk = await conn.fetchval(
        "SELECT stream_pk FROM workflow_streams.streams"
        " WHERE tenant = $1 AND run_id = $2 AND stream_id = $3",
        tenant,
        run_id,
        sid,
    )
    assert pk is not None
    return int(pk)


async def listen_backends(conn: asyncpg.Connection | asyncpg.Pool) -> list[int]:
    """Server pids of every LISTEN connection on this database (the hubs)."""
    rows = await conn.fetch(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND query ILIKE 'LISTEN %'"
    )
    return [r["pid"] for r in rows]
