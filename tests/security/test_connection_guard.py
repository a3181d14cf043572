"""Connection hygiene of a real ``serve``: a head deadline closes slowloris connections,
an oversized head is answered 431 at once on every route, and at a file limit of 1,024
with 1,000 stalled connections ``/healthz`` still answers (a new connection evicts the
one waiting longest for its head)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ductor_streams.config import Settings
from tests.support.healthz import healthz_probe
from tests.support.server import ServerProcess

STALLED = 1000


@pytest.fixture
def guarded_server(settings: Settings, tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(
        settings,
        log_path=tmp_path / "serve.log",
        nofile=1024,
        extra_env={"DUCTOR_STREAMS_HEAD_TIMEOUT_SECONDS": "3"},
    ) as server:
        yield server


async def _healthz_ms(url: str) -> float:
    """One /healthz on a new connection: its time in ms (inf when it failed)."""
    started = time.monotonic()
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            answer = await client.get(url + "/healthz")
    except httpx.HTTPError:
        return float("inf")
    return (time.monotonic() - started) * 1000 if answer.status_code == 200 else float("inf")


SLOW_HEAD = b"GET /api/workflow-streams/runs/r/streams/s/records HTTP/1.1\r\nHost: x\r\n"
SLOW_HEAD += b"X-Slow: " + b"z" * 1000  # more than eight minutes of trickle: never completes


async def _slowloris(port: int, started: asyncio.Event, sent: list[int]) -> None:
    """Send a request head one byte every half second until the server closes; append
    how many bytes went before it did (all of them: it never closed)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        sent.append(0)
        return
    started.set()
    count = 0
    try:
        for byte in SLOW_HEAD:
            writer.write(bytes([byte]))
            await writer.drain()
            count += 1
            try:
                data = await asyncio.wait_for(reader.read(4096), 0.5)
            except TimeoutError:
                continue
            if data == b"" or data.startswith(b"HTTP/1.1 408"):
                break
    except OSError:
        pass
    finally:
        sent.append(count)
        writer.close()


@pytest.mark.timeout(120)
async def test_slowloris_is_closed_by_the_head_deadline_and_healthz_stays_reachable(
    guarded_server: ServerProcess,
) -> None:
    started = asyncio.Event()
    sent: list[int] = []
    attack = [
        asyncio.create_task(_slowloris(guarded_server.port, started, sent)) for _ in range(STALLED)
    ]
    await started.wait()
    # /healthz is probed from a process of its own (tests/support/healthz.py), each probe
    # on a new connection: the test's own loop runs the 1,000 trickling connections.
    with healthz_probe(guarded_server.url, new_connections=True) as probes:
        await asyncio.gather(*attack)
    print(f"bytes sent before the close: {sorted(set(sent))}; healthz ms: {sorted(probes)}")
    # Every stalled connection was closed by the server (the head deadline is 3 s), each
    # before a fraction of its head went: trickling one byte a half second, the whole
    # head takes more than eight minutes. (How fast /healthz answers is bench's.)
    assert len(sent) == STALLED
    assert max(sent) < len(SLOW_HEAD) // 4, max(sent)
    # /healthz answered on every probe while 1,000 connections stalled at 1,024 files.
    assert len(probes) >= 10
    assert float("inf") not in probes, probes


@pytest.mark.parametrize(
    "path", ["/healthz", "/api/workflow-streams/runs/r/streams/s/records", "/schema/openapi.json"]
)
async def test_an_oversized_head_is_answered_431_at_once_on_every_route(
    server: ServerProcess, path: str
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Big: ".encode())
    chunk = b"a" * 65536
    answer = b""
    chunks = 0
    try:
        for _ in range(2048):  # up to 128 MiB, as long as the server reads
            writer.write(chunk)
            await writer.drain()
            chunks += 1
            try:
                answer = await asyncio.wait_for(reader.read(65536), 0.001)
            except TimeoutError:
                continue
            break
    except OSError:
        pass
    if not answer:
        answer = await asyncio.wait_for(reader.read(65536), 30)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"application/problem+json" in answer and b'"request_header_too_large"' in answer
    # At once: answered while a small part of the 128 MiB had gone, not after reading it.
    assert chunks < 2048 // 8, chunks
    # The server is not held up meanwhile.
    assert await _healthz_ms(server.url) != float("inf")
