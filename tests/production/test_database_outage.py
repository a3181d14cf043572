"""A Postgres outage under load, against real servers and a real (private) Postgres.

A private cluster (tests/support/cluster.py, never the machine's server) is crashed with
``pg_ctl stop -m immediate``, kept down for ``OUTAGE_SECONDS`` and started again, while
two ``ductor-streams serve`` processes on it take concurrent appends, reads, acks,
creates, object prepares, ops calls, subscribe starts and an SSE subscriber. Required:

- no 500 at all; every 5xx is 503 ``database_unavailable`` with ``Retry-After`` >= 1;
- ``/readyz`` answers 503 while Postgres is down and 200 a few seconds after it is
  back; ``/healthz`` answers 200 throughout; the servers never restart;
- every acknowledged (2xx) append is stored exactly once, at the sequences it was
  given; an append answered 503 is stored at most once;
- the Python client's appends through the outage all succeed, each stored once;
- the SSE subscriber (the Python client's resumable ``subscribe``) gets every record
  once, in order, including records another server appended after the outage (which
  reach it only through its hub's reconnected LISTEN connection: its poll is off);
- the server logs warnings, no traceback and nothing at ERROR; the upkeep worker
  lives through it.

It prints the 5xx answers by status: ``pytest -s tests/production -k outage``.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.client import StreamsClient
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.conftest import JWT_SECRET
from tests.support.cluster import PrivateCluster
from tests.support.live import eventually
from tests.support.server import ServerProcess

API = "/api/workflow-streams"
RUN = "outage-run"
OUTAGE_SECONDS = 3.0
LOAD_STREAMS = 4
RAW_APPENDERS = 6
CLIENT_APPENDERS = 2
# Each load worker pauses this long between its requests (a steady load, not a spin).
PACE_SECONDS = 0.005


@dataclass
class Tally:
    """Every answer of the load, by kind of request; the 5xx that break the contract."""

    by_kind: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    broken: list[str] = field(default_factory=list)
    transport_errors: Counter[str] = field(default_factory=Counter)
    ok_after: dict[str, float] = field(default_factory=dict)  # last 2xx time per kind

    def note(self, kind: str, response: httpx.Response) -> None:
        status = response.status_code
        self.by_kind[kind][status] += 1
        if status < 300:
            self.ok_after[kind] = time.monotonic()
        if status >= 500:
            problem: Any = None
            try:
                problem = response.json()
            except ValueError:
                pass
            retry_after = response.headers.get("retry-after", "")
            if not (
                status == 503
                and response.headers.get("content-type", "").startswith("application/problem+json")
                and isinstance(problem, dict)
                and problem.get("code") == "database_unavailable"
                and retry_after.isdigit()
                and int(retry_after) >= 1
            ):
                self.broken.append(f"{kind}: {status} {response.text[:300]!r} {retry_after!r}")

    def statuses(self) -> Counter[int]:
        total: Counter[int] = Counter()
        for counts in self.by_kind.values():
            total.update(counts)
        return total


@dataclass
class World:
    cluster: PrivateCluster
    dsn: str
    a: ServerProcess
    b: ServerProcess
    headers: dict[str, str]
    token: str


@pytest.fixture(scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    cluster = PrivateCluster().init()
    cluster.start()
    servers: list[ServerProcess] = []
    try:
        conn = await asyncpg.connect(cluster.dsn())
        try:
            await conn.execute("CREATE DATABASE outage")
        finally:
            await conn.close()
        dsn = cluster.dsn("outage")
        await migrate(dsn)
        folder = tmp_path_factory.mktemp("outage")
        settings = Settings(
            database_url=dsn,
            jwt_secret=JWT_SECRET,
            region="local",
            object_stores={"local": (folder / "objects").as_uri()},
        )
        # Server A serves the load and the subscriber, with its upkeep worker running
        # often; its followers' safety poll is off (an hour), so records appended
        # elsewhere reach its subscriber only through its LISTEN connection.
        a = ServerProcess(
            settings,
            workers=True,
            log_path=folder / "a.log",
            extra_env={
                "DUCTOR_STREAMS_LIVE_POLL_SECONDS": "3600",
                "DUCTOR_STREAMS_MAINTENANCE_INTERVAL": "0.5",
            },
        )
        servers.append(a.start())
        b = ServerProcess(settings, log_path=folder / "b.log")  # another replica
        servers.append(b.start())
        token = issue_token(
            JWT_SECRET,
            sub="outage",
            tenant="t-outage",
            scopes=list(SCOPES),
            runs=["*"],
            ttl_seconds=3600,
        )
        yield World(cluster, dsn, a, b, {"Authorization": f"Bearer {token}"}, token)
    finally:
        for server in servers:
            server.stop()
        cluster.destroy()


def _stream(stream_id: str) -> str:
    return f"{API}/runs/{RUN}/streams/{stream_id}"


async def _all_records(client: StreamsClient, stream_id: str) -> list[Any]:
    """Every record of a stream, read in pages (after the outage)."""
    records: list[Any] = []
    cursor = 0
    while True:
        page = await client.read(RUN, stream_id, cursor=cursor, limit=1000)
        records.extend(page.records)
        if page.next_cursor >= page.latest_sequence:
            return records
        cursor = page.next_cursor


async def test_an_outage_answers_503_and_loses_nothing(world: World) -> None:
    tally = Tally()
    stop = asyncio.Event()
    acked: dict[tuple[int, int], tuple[int, int]] = {}  # (worker, n) -> (stream, sequence)
    refused: set[tuple[int, int]] = set()  # answered 503: stored at most once
    client_appends: list[tuple[int, int, int]] = []  # (worker, n, sequence)
    client_spans: list[tuple[float, float]] = []  # when each client append began, ended
    received: list[int] = []
    readyz: list[tuple[float, int]] = []
    healthz: Counter[int] = Counter()

    http = httpx.AsyncClient(
        base_url=world.a.url,
        headers=world.headers,
        timeout=30,
        limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
    )
    client = StreamsClient(world.a.url, world.token, retry_budget=90)
    replica = StreamsClient(world.b.url, world.token, retry_budget=90)

    for i in range(LOAD_STREAMS):
        await client.create_stream(
            RUN, {"stream_id": f"load{i}", "direction": "output", "consumers": ["c"]}
        )
    for j in range(CLIENT_APPENDERS):
        await client.create_stream(RUN, {"stream_id": f"client{j}", "direction": "output"})
    await client.create_stream(RUN, {"stream_id": "live", "direction": "output"})
    await client.create_stream(RUN, {"stream_id": "objs", "direction": "output"})

    async def request(kind: str, method: str, url: str, **kwargs: Any) -> httpx.Response | None:
        try:
            response = await http.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            tally.transport_errors[f"{kind}:{type(exc).__name__}"] += 1
            return None
        tally.note(kind, response)
        return response

    async def each(body: Callable[[int], Awaitable[None]]) -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            await body(n)
            await asyncio.sleep(PACE_SECONDS)

    def raw_appender(worker: int) -> Callable[[int], Awaitable[None]]:
        stream = worker % LOAD_STREAMS

        async def body(n: int) -> None:
            r = await request(
                "append",
                "POST",
                _stream(f"load{stream}") + "/records",
                json={"records": [{"payload": {"w": worker, "n": n}}]},
                headers={"Idempotency-Key": f"w{worker}-{n}"},
            )
            if r is not None and r.status_code < 300:
                acked[(worker, n)] = (stream, r.json()["first_sequence"])
            else:
                refused.add((worker, n))

        return body

    def client_appender(worker: int) -> Callable[[int], Awaitable[None]]:
        async def body(n: int) -> None:
            began = time.monotonic()
            result = await client.append(RUN, f"client{worker}", [{"c": worker, "n": n}])
            client_appends.append((worker, n, result.first_sequence))
            client_spans.append((began, time.monotonic()))
            tally.ok_after["client-append"] = time.monotonic()

        return body

    async def live_appender(n: int) -> None:
        await client.append(RUN, "live", [{"live": n}])
        tally.ok_after["live-append"] = time.monotonic()

    async def reader(n: int) -> None:
        await request("read", "GET", _stream(f"load{n % LOAD_STREAMS}") + "/records?cursor=0")
        await request("state", "GET", _stream(f"load{n % LOAD_STREAMS}"))

    async def acker(n: int) -> None:
        done = [seq for (w, _), (s, seq) in list(acked.items()) if s == 0]
        if done:
            await request(
                "ack", "POST", _stream("load0") + "/consumers/c/ack", json={"sequence": max(done)}
            )

    async def creator(n: int) -> None:
        await request(
            "create",
            "POST",
            f"{API}/runs/{RUN}/streams",
            json={"stream_id": f"new-{n}", "direction": "output"},
        )

    async def objects(n: int) -> None:
        content = f"object {n}".encode()
        await request(
            "object",
            "POST",
            _stream("objs") + "/objects",
            json={
                "idempotency_key": f"o-{n}",
                "sha256": hashlib.sha256(content).hexdigest(),
                "size": len(content),
            },
        )

    async def ops(n: int) -> None:
        await request("ops", "GET", f"{API}/ops/summary")
        await request("ops", "GET", f"{API}/ops/gaps")

    async def subscribe_start(n: int) -> None:
        try:
            async with http.stream("GET", _stream("load1") + "/subscribe?cursor=0") as r:
                if r.status_code >= 300:
                    await r.aread()
                tally.note("subscribe", r)
        except httpx.TransportError as exc:
            tally.transport_errors[f"subscribe:{type(exc).__name__}"] += 1

    async def probes(n: int) -> None:
        r = await http.get("/readyz")
        readyz.append((time.monotonic(), r.status_code))
        healthz[(await http.get("/healthz")).status_code] += 1

    async def subscriber() -> None:
        async for record in client.subscribe(RUN, "live", reconnect_budget=90):
            received.append(record.sequence)

    bodies: list[Callable[[int], Awaitable[None]]] = [
        *(raw_appender(w) for w in range(RAW_APPENDERS)),
        *(client_appender(w) for w in range(CLIENT_APPENDERS)),
        live_appender,
        reader,
        acker,
        creator,
        objects,
        ops,
        subscribe_start,
        probes,
    ]
    kinds = ["append", "read", "state", "ack", "create", "object", "ops", "subscribe"]
    kinds += ["client-append", "live-append"]
    subscribing = asyncio.create_task(subscriber())
    load = [asyncio.create_task(each(body)) for body in bodies]

    def all_ok_since(moment: float) -> bool:
        for task in [*load, subscribing]:
            if task.done() and task.exception() is not None:
                raise AssertionError("a load task failed") from task.exception()
        return all(tally.ok_after.get(kind, 0.0) > moment for kind in kinds)

    try:
        await eventually(lambda: all_ok_since(0.0), timeout=60, what="load before the outage")
        await eventually(lambda: len(received) > 0, timeout=30, what="the subscriber")
        await eventually(lambda: len(acked) >= 50, timeout=60, what="50 appends before")

        # The outage: a crash of Postgres, down for OUTAGE_SECONDS (the scenario's
        # length, not a wait for a result), then a start with crash recovery.
        down_at = time.monotonic()
        await asyncio.to_thread(world.cluster.stop, "immediate")
        await eventually(
            lambda: any(t > down_at and s == 503 for t, s in readyz),
            timeout=15,
            what="/readyz to say 503",
        )
        await asyncio.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))
        await asyncio.to_thread(world.cluster.start)
        up_at = time.monotonic()
        await eventually(
            lambda: any(t > up_at and s == 200 for t, s in readyz),
            timeout=15,
            what="/readyz to say 200 again",
        )
        ready_after = min(t for t, s in readyz if t > up_at and s == 200) - up_at
        await eventually(lambda: all_ok_since(up_at), timeout=30, what="every route again")
        after = len(acked) + 50
        await eventually(lambda: len(acked) >= after, timeout=60, what="50 appends after")

        # Records another server appends now reach A's subscriber only through A's
        # LISTEN connection, which must have reconnected (A's followers do not poll).
        before = len(received)
        latest = await replica.append(RUN, "live", [{"replica": k} for k in range(5)])
        await eventually(
            lambda: bool(received) and received[-1] >= latest.last_sequence,
            timeout=15,
            what="the replica's records at the subscriber",
        )
        assert len(received) > before
    finally:
        stop.set()
        await asyncio.gather(*load, return_exceptions=True)

    try:
        last = await client.close_stream(RUN, "live")
        await asyncio.wait_for(subscribing, 30)  # ends after `end`
        assert received == list(range(1, last + 1))  # every record once, in order

        # Every acknowledged append is stored exactly once, where it was told; an append
        # answered 503 (it may have committed before the crash) at most once.
        stored: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        for i in range(LOAD_STREAMS):
            for record in await _all_records(client, f"load{i}"):
                marker = (record.payload["w"], record.payload["n"])
                stored[marker].append((i, record.sequence))
        for marker, where in acked.items():
            assert stored[marker] == [where], marker
        assert all(len(places) == 1 for places in stored.values())
        assert set(stored) <= set(acked) | refused

        # The client's appends all succeeded, each stored once.
        for j in range(CLIENT_APPENDERS):
            records = await _all_records(client, f"client{j}")
            markers = [(r.payload["c"], r.payload["n"]) for r in records]
            assert len(markers) == len(set(markers))
            mine = {(w, n): seq for w, n, seq in client_appends if w == j}
            assert {(r.payload["c"], r.payload["n"]): r.sequence for r in records} == mine
    finally:
        await client.aclose()
        await replica.aclose()
        await http.aclose()
        if not subscribing.done():
            subscribing.cancel()

    statuses = tally.statuses()
    five = {status: count for status, count in sorted(statuses.items()) if status >= 500}
    summary = {
        "outage_seconds": OUTAGE_SECONDS,
        "requests": sum(statuses.values()),
        "5xx_by_status": five,
        "by_kind": {kind: dict(sorted(c.items())) for kind, c in sorted(tally.by_kind.items())},
        "transport_errors": dict(tally.transport_errors),
        "readyz_200_after_start_s": round(ready_after, 2),
        "client_appends": len(client_appends),
        "raw_appends_acknowledged": len(acked),
        "subscriber_records": len(received),
    }
    print("\nOUTAGE " + json.dumps(summary))

    assert not tally.broken, tally.broken[:10]
    assert 500 not in statuses and set(five) <= {503}
    assert five.get(503, 0) > 0  # the outage was met, not missed
    assert not tally.transport_errors  # the servers stayed up and answered everything
    # Once /readyz said 200 again it stayed 200: readiness came back once, for good
    # (how soon it came back is printed above; timing belongs to the benches).
    recovered = min(t for t, s in readyz if t > up_at and s == 200)
    assert {s for t, s in readyz if t >= recovered} == {200}
    # The client's appends made while Postgres was down succeeded once it was back.
    assert any(down_at < began < up_at < ended for began, ended in client_spans)
    assert set(healthz) == {200}
    assert world.a.process is not None and world.a.process.poll() is None
    assert world.b.process is not None and world.b.process.poll() is None
    _check_log(world.a.log_path, expect_sources={"http", "upkeep"})
    _check_log(world.b.log_path, expect_sources=set())


def _check_log(path: Path | None, *, expect_sources: set[str]) -> None:
    """Warnings, a few of them: no traceback, nothing at ERROR or above."""
    assert path is not None
    text = path.read_text()
    assert "Traceback" not in text, text[-3000:]
    entries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert not [e for e in entries if e["level"] in ("ERROR", "CRITICAL")], text[-3000:]
    outage = [e for e in entries if e["message"] == "database unavailable"]
    assert expect_sources <= {e["source"] for e in outage}
    # One line per source per 5 s at most (store/outage.py), not one per request.
    per_source = Counter(e["source"] for e in outage)
    assert all(count <= 10 for count in per_source.values()), per_source
