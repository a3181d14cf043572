"""SIGTERM to one of two ``serve`` replicas under load: how long it takes to exit, and
whether anything was lost or stored twice.

Writers append with an Idempotency-Key to replica A and move to B (same key) when A
stops answering; SSE subscribers follow on A and resume on B from their Last-Event-ID
once A ends their response. After the writers stop, the stream is closed and every
subscriber must have seen 1..latest exactly once, and the stream must hold every
acknowledged record exactly once.

tests/production/test_serve_shutdown.py runs the scenario and asserts its bounds.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ductor_streams.config import Settings
from tests.support.server import ServerProcess

API = "/api/workflow-streams"
STREAM = "out"


@dataclass
class ShutdownResult:
    """What one run saw."""

    exit_seconds: float
    exit_code: int | None
    acked: int
    stored: int
    duplicates_stored: int
    acked_missing: int
    stored_unacked: int
    subscribers_complete: int
    subscriber_faults: list[str] = field(default_factory=list)
    reconnect_events: int = 0
    writer_statuses: Counter[int] = field(default_factory=Counter)


class _Subscriber:
    """Follows on A, resumes on B from the last id it saw; stops at ``end``."""

    def __init__(self, a: str, b: str, path: str, headers: dict[str, str]) -> None:
        self.urls = [a + path, b + path]
        self.headers = headers
        self.seen: list[int] = []
        self.reconnects = 0
        self.ended = False
        self.started = asyncio.Event()

    async def run(self, client: httpx.AsyncClient) -> None:
        for url in self.urls:
            headers = {**self.headers, "Last-Event-ID": str(self.seen[-1] if self.seen else 0)}
            async with client.stream("GET", url, headers=headers, timeout=60) as response:
                if response.status_code != 200:
                    raise AssertionError(f"subscribe answered {response.status_code}")
                self.started.set()
                event = ""
                async for line in response.aiter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("id: ") and event == "record":
                        self.seen.append(int(line[4:]))
                    elif line.startswith("retry: ") and event == "reconnect":
                        self.reconnects += 1
                    elif line == "":
                        if event == "end":
                            self.ended = True
                            return
                        event = ""


async def _writer(
    index: int,
    clients: list[httpx.AsyncClient],
    path: str,
    headers: dict[str, str],
    stop: asyncio.Event,
    acked: list[tuple[int, int]],
    statuses: Counter[int],
) -> None:
    target = 0
    n = 0
    while not stop.is_set():
        body = {"records": [{"payload": {"w": index, "n": n}}]}
        key = {"Idempotency-Key": f"w{index}-{n}"}
        while True:  # the same request, with its key, until one replica answers it
            try:
                answer = await clients[target].post(
                    path, json=body, headers={**headers, **key}, timeout=30
                )
            except httpx.TransportError:
                target = 1  # A is going away (or gone): B has the same store
                continue
            statuses[answer.status_code] += 1
            if answer.status_code in (200, 201):
                break
            if answer.status_code in (502, 503, 504):
                target = 1
                continue
            raise AssertionError(f"append answered {answer.status_code}: {answer.text}")
        acked.append((index, n))
        n += 1


async def run_scenario(
    settings: Settings,
    token: str,
    *,
    writers: int = 16,
    subscribers: int = 100,
    log_dir: Path,
) -> ShutdownResult:
    """One run: two replicas, load, SIGTERM to A, then check everything on B."""
    a = ServerProcess(settings, log_path=log_dir / "a.log")
    b = ServerProcess(settings, log_path=log_dir / "b.log")
    await asyncio.gather(asyncio.to_thread(a.start), asyncio.to_thread(b.start))
    headers = {"Authorization": f"Bearer {token}"}
    run = f"shutdown-{uuid.uuid4().hex[:8]}"
    base = f"{API}/runs/{run}/streams"
    limits = httpx.Limits(max_connections=writers + subscribers + 8, keepalive_expiry=1.0)
    try:
        async with (
            httpx.AsyncClient(base_url=a.url, limits=limits) as on_a,
            httpx.AsyncClient(base_url=b.url, limits=limits) as on_b,
            httpx.AsyncClient(limits=limits) as sse,
        ):
            created = await on_a.post(
                base, json={"stream_id": STREAM, "direction": "output"}, headers=headers
            )
            assert created.status_code == 201, created.text
            subs = [
                _Subscriber(a.url, b.url, f"{base}/{STREAM}/subscribe", headers)
                for _ in range(subscribers)
            ]
            sub_tasks = [asyncio.create_task(s.run(sse)) for s in subs]
            await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in subs)), 60)
            stop = asyncio.Event()
            acked: list[tuple[int, int]] = []
            statuses: Counter[int] = Counter()
            records = f"{base}/{STREAM}/records"
            writer_tasks = [
                asyncio.create_task(
                    _writer(i, [on_a, on_b], records, headers, stop, acked, statuses)
                )
                for i in range(writers)
            ]
            await _until(lambda: len(acked) >= 20 * writers, 60, "appends before the SIGTERM")
            assert a.process is not None
            signalled = time.monotonic()
            a.process.send_signal(signal.SIGTERM)
            exit_code = await asyncio.to_thread(_wait_exit, a, 30.0)
            exit_seconds = time.monotonic() - signalled
            moved = len(acked)
            await _until(lambda: len(acked) >= moved + 10 * writers, 60, "appends on B")
            stop.set()
            await asyncio.gather(*writer_tasks)
            closed = await on_b.post(f"{base}/{STREAM}/close", headers=headers)
            assert closed.status_code == 200, closed.text
            await asyncio.wait_for(asyncio.gather(*sub_tasks, return_exceptions=True), 60)
            stored = await _stored(on_b, records, headers)
    finally:
        a.stop()
        b.stop()
    latest = len(stored)
    stored_set = Counter(stored)
    acked_set = set(acked)
    faults: list[str] = []
    complete = 0
    for i, s in enumerate(subs):
        if s.seen == list(range(1, latest + 1)) and s.ended:
            complete += 1
        elif len(faults) < 5:
            faults.append(f"subscriber {i}: {len(s.seen)} ids, ended={s.ended}")
    return ShutdownResult(
        exit_seconds=exit_seconds,
        exit_code=exit_code,
        acked=len(acked),
        stored=latest,
        duplicates_stored=sum(c - 1 for c in stored_set.values()),
        acked_missing=len(acked_set - set(stored_set)),
        stored_unacked=len(set(stored_set) - acked_set),
        subscribers_complete=complete,
        subscriber_faults=faults,
        reconnect_events=sum(s.reconnects for s in subs),
        writer_statuses=statuses,
    )


def _wait_exit(server: ServerProcess, timeout: float) -> int | None:
    assert server.process is not None
    try:
        return server.process.wait(timeout)
    except Exception:
        return None


async def _until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {seconds} s")
        await asyncio.sleep(0.02)


async def _stored(
    client: httpx.AsyncClient, path: str, headers: dict[str, str]
) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    cursor = 0
    while True:
        page = await client.get(path, params={"cursor": cursor, "limit": 1000}, headers=headers)
        body = page.json()
        for record in body["records"]:
            out.append((record["payload"]["w"], record["payload"]["n"]))
        if body["next_cursor"] == cursor:
            return out
        cursor = body["next_cursor"]
