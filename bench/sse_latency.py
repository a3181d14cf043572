"""Benchmark: live delivery latency over SSE, and what subscribers cost Postgres.

    python -m bench.sse_latency [--subscribers 0,1,100,1000,2000] [--rate 200] [--seconds 10]
                                [--runs 1] [--baseline REV] [--no-floor] [--profile PREFIX]
                                [--database-url postgresql://...] [--json out.json]

For each subscriber count, on a fresh stream of a real ``serve --no-workers`` process:
the subscribers connect (in a separate process, raw asyncio protocols, so that parsing
does not disturb the producer), then this process appends one record per request at
``--rate`` per second for ``--seconds`` and closes the stream. Latency is from the moment
the append request was written to its socket (a pre-built request on a keep-alive raw
connection: no HTTP client library's own CPU in the figure) to the moment a subscriber's
socket delivered the record, over every (subscriber, record) pair; both processes read
the same monotonic clock. ``ans p50`` is the append's own round trip, for comparison:
live delivery of the server's own appends does not wait for it.

Postgres cost, over the producing window: the server's live-delivery reads per append
(``ductor_streams_live_reads_total`` from its /metrics: ``follower`` reads are one per
wake per stream, ``subscriber`` reads are backfills, overflow catch-ups and gap repairs)
and the largest number of connections to the database seen (pool + the one LISTEN
connection). Neither may grow with the number of subscribers. ``fed/app``: batches of the
server's own appends fanned out without a read, per append (docs/live.md).

``chunks/app``: batches the fan-out wrote to a subscriber's connection itself, per append
(``ductor_streams_sse_chunk_writes_total``); ``srv us/write``: the server's CPU over the
writes its fan-outs owed (batches fanned out, ``ductor_streams_follower_lag_seconds``'s
count, times subscribers), an upper bound of one write's cost (the appends are in it
too) that other revisions report alike.

Baselines in the same run: raw ``pg_notify`` commit -> asyncpg listener callback; and,
unless ``--no-floor``, the fan-out floor (bench/fanout_floor.py: a process with no
database and no framework that only writes each turn's appends to every subscriber's
socket), run beside this checkout's server in every run as the side ``floor``, with
the medians of the paired ratios (checkout / floor) printed after the runs.
``--baseline REV`` also starts a server on git revision REV's ``ductor_streams/``
(``git archive``, as bench/compare_revisions.py) over the same database: each of the
``--runs`` is then a pair, the two servers back to back in alternating order, and the
medians and the paired ratios (this checkout / REV) are printed after the runs.
``--profile PREFIX`` records py-spy's raw stacks of this checkout's server during each
producing window to ``PREFIX-<subscribers>.txt`` (``bench.profile.summarise`` reads
them).
The database is a fresh one created on the given server (default
$DUCTOR_STREAMS_DATABASE_URL, else $DUCTOR_STREAMS_TEST_DATABASE_URL) and dropped after.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import functools
import json
import multiprocessing as mp
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import uvloop

from bench.compare_revisions import exported
from bench.environment import HTTP_LIMITS, bench_token
from bench.loadgen import first_response
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support.postgres import create_database, drop_database
from tests.support.server import ServerProcess

API = "/api/workflow-streams"
_ID = re.compile(rb"^id: (\d+)\r?$", re.MULTILINE)
_END = b"event: end"
# The side of bench/fanout_floor.py: the same load against a process that only writes.
FLOOR = "floor"
# Appends in flight at once at most (each on its own keep-alive connection).
PRODUCER_CONNECTIONS = 8


# -- subscribers (child process) ------------------------------------------------------------


class _PollClock:
    """When the event loop found the current batch of readable sockets: the first
    callback of a batch takes the time, and it is cleared once the batch has been
    handled (a ``call_soon`` callback runs after the loop's I/O callbacks). Every socket
    of the batch already held its data then, so this is its arrival time without the
    time this process spent on the sockets before it in the batch."""

    def __init__(self) -> None:
        self._now: float | None = None

    def now(self) -> float:
        if self._now is None:
            self._now = time.monotonic()
            asyncio.get_running_loop().call_soon(self._clear)
        return self._now

    def _clear(self) -> None:
        self._now = None


class _SseClient(asyncio.Protocol):
    """A minimal SSE reader: the receive time of every ``id:`` line, by sequence, both
    when its callback ran (``times``) and when the loop found its socket readable
    (``poll_times``, see ``_PollClock``)."""

    def __init__(
        self,
        request: bytes,
        times: array.array[float],
        poll_times: array.array[float],
        clock: _PollClock,
        done: asyncio.Future[None],
    ):
        self.request = request
        self.times = times
        self.poll_times = poll_times
        self.clock = clock
        self.done = done
        self.headers_seen = asyncio.get_running_loop().create_future()
        self._head = b""
        self._tail = b""
        self._in_body = False
        # Ids that came again, after a higher one, or were never appended (must stay 0).
        self.disorder = 0
        self._last = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        polled = self.clock.now()
        now = time.monotonic()
        if not self._in_body:
            self._head += data
            head, sep, rest = self._head.partition(b"\r\n\r\n")
            if not sep:
                return
            if not head.startswith(b"HTTP/1.1 200"):
                self.headers_seen.set_exception(RuntimeError(head.split(b"\r\n")[0].decode()))
                return
            self._in_body = True
            self.headers_seen.set_result(None)
            data = rest
        buffer = self._tail + data
        cut = buffer.rfind(b"\n\n")
        if cut < 0:
            self._tail = buffer
            return
        complete, self._tail = buffer[: cut + 2], buffer[cut + 2 :]
        times = self.times
        for match in _ID.finditer(complete):
            sequence = int(match.group(1))
            if sequence <= self._last or sequence >= len(times):
                self.disorder += 1
                continue
            self._last = sequence
            times[sequence] = now
            self.poll_times[sequence] = polled
        if _END in complete and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)
        if not self.headers_seen.done():
            self.headers_seen.set_exception(ConnectionError("closed before the headers"))


async def _subscribers(
    host: str, port: int, path: str, token: str, count: int, capacity: int, pipe: Connection
) -> list[array.array[float]]:
    loop = asyncio.get_running_loop()
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Accept: text/event-stream\r\n\r\n"
    ).encode()
    all_times = [array.array("d", bytes(8 * capacity)) for _ in range(count)]
    all_poll_times = [array.array("d", bytes(8 * capacity)) for _ in range(count)]
    clock = _PollClock()
    clients: list[tuple[asyncio.Transport, _SseClient]] = []
    for i in range(count):
        done: asyncio.Future[None] = loop.create_future()
        transport, protocol = await loop.create_connection(
            functools.partial(_SseClient, request, all_times[i], all_poll_times[i], clock, done),
            host,
            port,
        )
        clients.append((transport, protocol))  # type: ignore[arg-type]
        if i % 100 == 99:
            await asyncio.gather(*(p.headers_seen for _, p in clients))
    await asyncio.gather(*(p.headers_seen for _, p in clients))
    pipe.send("ready")  # every subscriber is registered (headers come after registration)
    await asyncio.wait_for(asyncio.gather(*(p.done for _, p in clients)), timeout=600)
    for transport, _ in clients:
        transport.close()
    disorder = array.array("d", (float(p.disorder) for _, p in clients))
    return [*all_times, *all_poll_times, disorder]


def _subscriber_process(
    host: str, port: int, path: str, token: str, count: int, capacity: int, pipe: Connection
) -> None:
    try:
        times = uvloop.run(_subscribers(host, port, path, token, count, capacity, pipe))
    except BaseException as exc:
        pipe.send(f"failed: {type(exc).__name__}: {exc}")
        raise
    pipe.send([t.tobytes() for t in times])


# -- producer (this process) -------------------------------------------------------------------


class RawConnection(asyncio.Protocol):
    """One keep-alive connection for the producer: one request at a time, raw bytes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.answer: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None and self.answer is None
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.answer

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        response = first_response(self.buffer)
        if response is None:
            return
        status, start, end = response
        body = bytes(self.buffer[start:end])
        del self.buffer[:end]
        answer, self.answer = self.answer, None
        if answer is not None:
            answer.set_result((status, body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(exc or ConnectionError("closed"))


class Producer:
    """Appends over a few keep-alive raw connections (requests built from bytes: the
    producer must not add its own milliseconds to the latency it measures)."""

    def __init__(self, host: str, port: int, path: str, token: str) -> None:
        self._host, self._port = host, port
        self._head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()
        self._free: asyncio.Queue[RawConnection] = asyncio.Queue()

    async def connect(self, connections: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(connections):
            _, protocol = await loop.create_connection(RawConnection, self._host, self._port)
            self._free.put_nowait(protocol)

    async def append(self, i: int) -> tuple[float, float, int]:
        """Append ``{"i": i}``: (write time, answer time, first sequence)."""
        body = b'{"records":[{"payload":{"i":%d}}]}' % i
        request = self._head + b"%d\r\n\r\n" % len(body) + body
        conn = await self._free.get()
        try:
            started = time.monotonic()
            status, answer = await conn.send(request)
            finished = time.monotonic()
        finally:
            self._free.put_nowait(conn)
        if status != 201:
            raise RuntimeError(f"append answered {status}: {answer[:200]!r}")
        return started, finished, int(json.loads(answer)["first_sequence"])

    def close(self) -> None:
        while not self._free.empty():
            conn = self._free.get_nowait()
            if conn.transport is not None:
                conn.transport.close()


def _start_profile(
    server: ServerProcess, profile: Path | None, subscribers: int, seconds: float
) -> subprocess.Popen[bytes] | None:
    """py-spy on the server for the producing window, raw stacks to
    ``<profile>-<subscribers>.txt`` (``bench.profile.summarise`` prints them)."""
    if profile is None or server.process is None:
        return None
    beside = Path(sys.executable).with_name("py-spy")  # the virtualenv's, when there
    return subprocess.Popen(
        [
            str(beside) if beside.exists() else "py-spy",
            "record",
            "-p",
            str(server.process.pid),
            "-d",
            str(max(1, int(seconds) - 1)),
            "-r",
            "250",
            "-f",
            "raw",
            "-o",
            f"{profile}-{subscribers}.txt",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# -- measurements ------------------------------------------------------------------------------


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000

    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": ordered[-1] * 1000}


async def notify_baseline(dsn: str, samples: int = 400, rate: float = 200.0) -> dict[str, float]:
    """Raw commit -> NOTIFY -> asyncpg listener callback, one notification at a time."""
    listener = await asyncpg.connect(dsn)
    sender = await asyncpg.connect(dsn)
    got: asyncio.Queue[float] = asyncio.Queue()
    await listener.add_listener("bench_baseline", lambda *_: got.put_nowait(time.monotonic()))
    latencies = []
    try:
        for i in range(samples):
            started = time.monotonic()
            await sender.execute(f"SELECT pg_notify('bench_baseline', '{i}')")
            latencies.append(await asyncio.wait_for(got.get(), 10) - started)
            await asyncio.sleep(max(0.0, started + 1 / rate - time.monotonic()))
    finally:
        await listener.close()
        await sender.close()
    return _percentiles(latencies)


class _Connections:
    """The largest number of client connections to the database seen while sampling."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.peak = 0

    async def sample(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            count = await self.conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
            self.peak = max(self.peak, int(count))
            try:
                await asyncio.wait_for(stop.wait(), 0.25)
            except TimeoutError:
                pass


_READS = re.compile(r'^ductor_streams_live_reads_total\{kind="(\w+)"\} (\S+)$', re.MULTILINE)


_FED = re.compile(r"^ductor_streams_live_fed_batches_total (\S+)$", re.MULTILINE)
_CHUNKS = re.compile(r"^ductor_streams_sse_chunk_writes_total (\S+)$", re.MULTILINE)
_FAN_OUTS = re.compile(r"^ductor_streams_follower_lag_seconds_count (\S+)$", re.MULTILINE)


async def live_reads(client: httpx.AsyncClient) -> dict[str, float]:
    """The server's Postgres reads for live delivery so far, by kind, and (as ``fed``)
    the batches of its own appends it fanned out without a read, and (as ``chunks``) the
    batches the fan-out wrote to a subscriber's connection itself, and (as ``fan_outs``)
    the batches fanned out (from /metrics)."""
    text = (await client.get("/metrics")).text
    counts = {kind: float(value) for kind, value in _READS.findall(text)}
    fed = _FED.search(text)
    counts["fed"] = float(fed[1]) if fed else 0.0
    chunks = _CHUNKS.search(text)
    counts["chunks"] = float(chunks[1]) if chunks else 0.0
    fan_outs = _FAN_OUTS.search(text)  # one observation per batch fanned out
    counts["fan_outs"] = float(fan_outs[1]) if fan_outs else 0.0
    return counts


async def one_run(
    server: ServerProcess,
    token: str,
    connections: _Connections,
    *,
    subscribers: int,
    rate: float,
    seconds: float,
    client_processes: int = 1,
    profile: Path | None = None,
) -> dict[str, Any]:
    run_id = f"bench-{secrets.token_hex(4)}"
    stream = f"{API}/runs/{run_id}/streams/s"
    headers = {"Authorization": f"Bearer {token}"}
    total = int(rate * seconds)
    starts = [0.0] * (total + 1)
    answered: list[float] = []  # each append's own round trip, as the producer saw it
    async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=HTTP_LIMITS) as client:
        r = await client.post(
            f"{API}/runs/{run_id}/streams",
            json={"stream_id": "s", "direction": "output"},
            headers=headers,
        )
        r.raise_for_status()
        children: list[tuple[Any, Connection]] = []
        shares = [subscribers // client_processes] * client_processes
        for k in range(subscribers % client_processes):
            shares[k] += 1
        for share in (n for n in shares if n):
            parent_end, child_end = mp.Pipe()
            child = mp.get_context("spawn").Process(
                target=_subscriber_process,
                args=(
                    "127.0.0.1",
                    server.port,
                    stream + "/subscribe",
                    token,
                    share,
                    total + 1,
                    child_end,
                ),
            )
            child.start()
            children.append((child, parent_end))
        for _, parent_end in children:
            ready = await asyncio.to_thread(parent_end.poll, 300)
            answer = parent_end.recv() if ready else "no answer in 300 s"
            if answer != "ready":
                raise RuntimeError(f"subscribers did not connect: {answer}")

        reads_before = await live_reads(client)
        server_process = psutil.Process(server.process.pid if server.process else 0)
        cpu_before = sum(server_process.cpu_times()[:2])
        client_processes_ = [psutil.Process(child.pid) for child, _ in children]
        clients_before = sum(sum(c.cpu_times()[:2]) for c in client_processes_)
        connections.peak = 0
        stop = asyncio.Event()
        sampler = asyncio.create_task(connections.sample(stop))

        producer = Producer("127.0.0.1", server.port, stream + "/records", token)
        await producer.connect(PRODUCER_CONNECTIONS)
        spy = _start_profile(server, profile, subscribers, seconds)

        async def one_append(i: int) -> None:
            started, finished, sequence = await producer.append(i)
            starts[sequence] = started
            answered.append(finished - started)

        began = time.monotonic()
        tasks = []
        for i in range(total):
            await asyncio.sleep(max(0.0, began + i / rate - time.monotonic()))
            tasks.append(asyncio.create_task(one_append(i)))
        await asyncio.gather(*tasks)
        produced_in = time.monotonic() - began
        producer.close()
        if spy is not None:
            await asyncio.to_thread(spy.wait)
        stop.set()
        await sampler
        reads_after = await live_reads(client)
        server_cpu = sum(server_process.cpu_times()[:2]) - cpu_before
        clients_cpu = sum(sum(c.cpu_times()[:2]) for c in client_processes_) - clients_before
        r = await client.post(stream + "/close", headers=headers)
        r.raise_for_status()

        latencies: list[float] = []
        poll_latencies: list[float] = []
        missing = disorder = 0
        for child, parent_end in children:
            ready = await asyncio.to_thread(parent_end.poll, 600)
            if not ready:
                raise RuntimeError("subscribers did not finish")
            answer = parent_end.recv()
            if isinstance(answer, str):
                raise RuntimeError(f"subscribers failed: {answer}")
            # The callback times of each subscriber, then the poll times of each, then
            # each subscriber's ids out of order (bench/floors.py checks them).
            disorder_counts = array.array("d")
            disorder_counts.frombytes(answer.pop())
            disorder += int(sum(disorder_counts))
            half = len(answer) // 2
            for k, raw in enumerate(answer):
                times = array.array("d")
                times.frombytes(raw)
                for sequence in range(1, total + 1):
                    if times[sequence] == 0.0:
                        missing += k < half  # the same record is missing from both
                    elif k < half:
                        latencies.append(times[sequence] - starts[sequence])
                    else:
                        poll_latencies.append(times[sequence] - starts[sequence])
            child.join(30)
    return {
        "subscribers": subscribers,
        "appends": total,
        "achieved_rate": round(total / produced_in, 1),
        "deliveries": len(latencies),
        "missing": missing,
        "disorder": disorder,
        **{k: round(v, 2) for k, v in _percentiles(latencies).items()},
        "append_p50_ms": round(_percentiles(answered)["p50_ms"], 2),
        **{
            f"poll_{k}": round(v, 2)
            for k, v in _percentiles(poll_latencies).items()
            if k != "max_ms"
        },
        **{
            f"{kind}_reads_per_append": round(
                (reads_after.get(kind, 0) - reads_before.get(kind, 0)) / total, 3
            )
            for kind in ("follower", "subscriber")
        },
        "fed_batches_per_append": round(
            (reads_after.get("fed", 0) - reads_before.get("fed", 0)) / total, 3
        ),
        "chunk_writes_per_append": round(
            (reads_after.get("chunks", 0) - reads_before.get("chunks", 0)) / total, 3
        ),
        # All of the server's CPU over the writes its fan-outs owed (every batch to every
        # subscriber): an upper bound of one write's cost (the appends' own work is in
        # it), which the fan-out dominates from 1,000 subscribers. The same count on
        # revisions without the chunk counter.
        "server_us_per_write": round(
            1e6
            * server_cpu
            / max(
                1.0,
                (reads_after.get("fan_outs", 0) - reads_before.get("fan_outs", 0)) * subscribers,
            ),
            1,
        ),
        "max_server_connections": connections.peak,
        "server_cpu_share": round(server_cpu / produced_in, 3),
        "client_cpu_share": round(clients_cpu / produced_in, 3),
    }


async def run(
    *,
    subscribers: tuple[int, ...] = (0, 1, 100, 1000, 2000),
    rate: float = 200.0,
    seconds: float = 10.0,
    database_url: str | None = None,
    client_processes: int = 1,
    profile: Path | None = None,
    runs: int = 1,
    baseline_code: tuple[str, Path] | None = None,
    floor: bool = True,
) -> dict[str, Any]:
    """Run the benchmark; returns the baseline and one row per subscriber count, side
    (``checkout``, the revision of ``baseline_code``: its name and a folder holding
    its ``ductor_streams/``, or ``floor``: bench/fanout_floor.py) and run. Each run
    takes the sides back to back, in alternating order."""
    server_dsn = (
        database_url
        or os.environ.get("DUCTOR_STREAMS_DATABASE_URL")
        or os.environ.get("DUCTOR_STREAMS_TEST_DATABASE_URL")
    )
    if not server_dsn:
        raise SystemExit("give --database-url or set DUCTOR_STREAMS_DATABASE_URL")
    name = f"ds_bench_{secrets.token_hex(5)}"
    dsn = await asyncio.to_thread(create_database, server_dsn, name)
    try:
        await migrate(dsn)
        secret = secrets.token_urlsafe(32)
        settings = Settings(
            database_url=dsn,
            jwt_secret=secret,
            object_stores={"local": Path(tempfile.mkdtemp(prefix="ds-bench-")).as_uri()},
        )
        token = bench_token(secret)
        baseline = await notify_baseline(dsn)
        rows = []
        monitor = await asyncpg.connect(dsn)
        try:
            with contextlib.ExitStack() as stack:
                # The child of a baseline runs ``python -m`` from its folder: its cwd comes
                # first on sys.path, ahead of the editable install.
                sides = [("checkout", stack.enter_context(ServerProcess(settings)))]
                if baseline_code is not None:
                    revision, code = baseline_code
                    sides.append((revision, stack.enter_context(ServerProcess(settings, cwd=code))))
                if floor:
                    floor_server = ServerProcess(settings, module="bench.fanout_floor")
                    sides.append((FLOOR, stack.enter_context(floor_server)))
                connections = _Connections(monitor)
                for count in subscribers:
                    for k in range(runs):
                        for side, server in sides if k % 2 == 0 else sides[::-1]:
                            row = await one_run(
                                server,
                                token,
                                connections,
                                subscribers=count,
                                rate=rate,
                                seconds=seconds,
                                client_processes=client_processes,
                                profile=profile if side == "checkout" else None,
                            )
                            rows.append({"side": side, "run": k, **row})
        finally:
            await monitor.close()
        return {"baseline_notify": {k: round(v, 3) for k, v in baseline.items()}, "runs": rows}
    finally:
        await asyncio.to_thread(drop_database, server_dsn, name)


_COLUMNS = (
    ("subs", "subscribers", 5),
    ("side", "side", 8),
    ("rate/s", "achieved_rate", 7),
    ("deliveries", "deliveries", 10),
    ("missing", "missing", 7),
    ("disorder", "disorder", 8),
    ("p50 ms", "p50_ms", 7),
    ("p99 ms", "p99_ms", 7),
    ("max ms", "max_ms", 7),
    ("sock p50", "poll_p50_ms", 8),
    ("sock p99", "poll_p99_ms", 8),
    ("ans p50", "append_p50_ms", 7),
    ("fed/app", "fed_batches_per_append", 7),
    ("follower/app", "follower_reads_per_append", 12),
    ("subscriber/app", "subscriber_reads_per_append", 14),
    ("chunks/app", "chunk_writes_per_append", 10),
    ("srv us/write", "server_us_per_write", 12),
    ("pg conns", "max_server_connections", 8),
    ("srv cpu", "server_cpu_share", 7),
    ("cli cpu", "client_cpu_share", 7),
)


def _print_rows(rows: list[dict[str, Any]]) -> None:
    print(" ".join(f"{title:>{width}}" for title, _, width in _COLUMNS))
    for row in rows:
        print(" ".join(f"{str(row[key])[:width]:>{width}}" for _, key, width in _COLUMNS))


def _print_medians(rows: list[dict[str, Any]], baselines: list[str]) -> None:
    """Per subscriber count and side, the medians over runs; for each of ``baselines``
    (a revision, the floor), the medians of the paired ratios (checkout / it) of p50,
    p99 and the CPU per write, with their spread."""
    print("medians of the runs:")
    medians = []
    for count in dict.fromkeys(r["subscribers"] for r in rows):
        for side in dict.fromkeys(r["side"] for r in rows):
            mine = [r for r in rows if r["subscribers"] == count and r["side"] == side]
            medians.append(
                {
                    key: (
                        round(statistics.median(float(r[key]) for r in mine), 3)
                        if isinstance(mine[0][key], int | float)
                        else mine[0][key]
                    )
                    for _, key, _ in _COLUMNS
                }
            )
    _print_rows(medians)
    for baseline, count in (
        (b, c) for b in baselines for c in dict.fromkeys(r["subscribers"] for r in rows)
    ):
        pairs = [
            (a, b)
            for a in rows
            for b in rows
            if a["subscribers"] == b["subscribers"] == count
            and a["run"] == b["run"]
            and a["side"] == "checkout"
            and b["side"] == baseline
        ]
        for key in ("p50_ms", "p99_ms", "server_us_per_write"):
            ratios = [a[key] / b[key] for a, b in pairs if b[key] and b[key] == b[key]]
            if ratios:
                print(
                    f"{count:>5} subscribers, {key}: checkout / {baseline} "
                    f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}, "
                    f"{len(ratios)} pairs)"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sse_latency", description=__doc__)
    parser.add_argument("--subscribers", default="0,1,100,1000,2000")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--database-url")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="processes the subscribers are spread over (check client cpu in the output)",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per subscriber count")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also run a server on git revision REV's code, each run a pair with this one",
    )
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the fan-out floor (bench/fanout_floor.py) beside each run",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy the server while it is loaded: raw stacks to PROFILE-<subscribers>.txt",
    )
    args = parser.parse_args(argv)
    counts = tuple(int(x) for x in args.subscribers.split(",") if x.strip())
    with contextlib.ExitStack() as stack:
        code = stack.enter_context(exported(args.baseline)) if args.baseline else None
        result = uvloop.run(
            run(
                subscribers=counts,
                rate=args.rate,
                seconds=args.seconds,
                database_url=args.database_url,
                client_processes=max(1, args.client_processes),
                profile=args.profile,
                runs=max(1, args.runs),
                baseline_code=(args.baseline, code) if code is not None else None,
                floor=not args.no_floor,
            )
        )
    base = result["baseline_notify"]
    print(
        f"baseline commit->NOTIFY->listener: p50 {base['p50_ms']:.3f} ms, "
        f"p99 {base['p99_ms']:.3f} ms"
    )
    _print_rows(result["runs"])
    baselines = [b for b in (args.baseline, None if args.no_floor else FLOOR) if b]
    if args.runs > 1 or baselines:
        _print_medians(result["runs"], baselines)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
