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


async def _slowloris(port: int, started: asyncio.Event, closed_at: list[float]) -> None:
    """Send a request head one byte every half second until the server closes."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        closed_at.append(time.monotonic())
        return
    head = b"GET /api/workflow-streams/runs/r/streams/s/records HTTP/1.1\r\nHost: x\r\n"
    head += b"X-Slow: " + b"z" * 1000  # more than a minute of trickle: never completes
    started.set()
    try:
        for byte in head:
            writer.write(bytes([byte]))
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(4096), 0.5)
            except TimeoutError:
                continue
            if data == b"" or data.startswith(b"HTTP/1.1 408"):
                break
    except OSError:
        pass
    finally:
        closed_at.append(time.monotonic())
        writer.close()


@pytest.mark.timeout(120)
async def test_slowloris_is_closed_by_the_head_deadline_and_healthz_stays_reachable(
    guarded_server: ServerProcess,
) -> None:
    started = asyncio.Event()
    closed_at: list[float] = []
    t0 = time.monotonic()
    attack = [
        asyncio.create_task(_slowloris(guarded_server.port, started, closed_at))
        for _ in range(STALLED)
    ]
    await started.wait()
    # /healthz is probed from a process of its own (tests/support/healthz.py), each probe
    # on a new connection: the test's own loop runs the 1,000 trickling connections.
    with healthz_probe(guarded_server.url, new_connections=True) as probes:
        await asyncio.gather(*attack)
    print(f"closed after {max(closed_at) - t0:.2f} s; healthz ms: {sorted(probes)}")
    # Every stalled connection was closed by the server: the head deadline is 3 s, and
    # trickling one byte a half second, no head completes before it.
    assert len(closed_at) == STALLED
    assert max(closed_at) - t0 < 3 + 5, max(closed_at) - t0
    # /healthz answered on every probe while 1,000 connections stalled at 1,024 files.
    assert len(probes) >= 10
    assert max(probes) < 1000, probes
    assert sorted(probes)[len(probes) // 2] < 100, probes


@pytest.mark.parametrize(
    "path", ["/healthz", "/api/workflow-streams/runs/r/streams/s/records", "/schema/openapi.json"]
)
async def test_an_oversized_head_is_answered_431_at_once_on_every_route(
    server: ServerProcess, path: str
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    started = time.monotonic()
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Big: ".encode())
    chunk = b"a" * 65536
    answer = b""
    try:
        for _ in range(2048):  # up to 128 MiB, as long as the server reads
            writer.write(chunk)
            await writer.drain()
            try:
                answer = await asyncio.wait_for(reader.read(65536), 0.001)
            except TimeoutError:
                continue
            break
    except OSError:
        pass
    if not answer:
        answer = await asyncio.wait_for(reader.read(65536), 5)
    elapsed = time.monotonic() - started
    writer.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"application/problem+json" in answer and b'"request_header_too_large"' in answer
    assert elapsed < 2.0, elapsed
    # The server is not held up meanwhile.
    assert await _healthz_ms(server.url) < 1000
