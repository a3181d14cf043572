"""The floor under token -> SSE: one durable commit and its NOTIFY reaching a LISTEN
connection, with no service in between.

    python -m bench.notify_floor [--dsn DSN] [--streams 1] [--rate 50] [--seconds 5]

``--streams`` producers each make ``--rate`` records a second; one connection commits
whatever is queued, back to back (a group commit, as the service's appender does),
each record inserted and notified in that one statement's transaction (so the
notifications leave at its commit); a LISTEN connection in a process of its own notes
when each arrives. Prints, in ms: made -> the statement's answer (``commit``) and made
-> LISTEN (``notify``), p50/p99. Postgres: ``--dsn``, else a fresh database on
$DUCTOR_STREAMS_BENCH_DATABASE_URL / $DUCTOR_STREAMS_TEST_DATABASE_URL, else an embedded
one (bench/environment.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import asyncpg

from bench.environment import isolated_database, postgres_server

SETUP = """
CREATE SCHEMA IF NOT EXISTS bench_floor;
CREATE TABLE IF NOT EXISTS bench_floor.records (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, stream_id bigint NOT NULL,
    payload text NOT NULL);
"""
APPEND = """
WITH r AS (INSERT INTO bench_floor.records (stream_id, payload)
           SELECT * FROM unnest($1::bigint[], $2::text[]) RETURNING payload)
SELECT count(pg_notify('bench_floor', payload)) FROM r
"""


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"n": len(ordered), "p50_ms": pick(0.5), "p99_ms": pick(0.99)}


async def listen(dsn: str) -> None:
    """The listener process: prints ``ready``, then on stdin's line one JSON list of
    [payload's made time, receive time]."""
    conn = await asyncpg.connect(dsn)
    got: list[tuple[float, float]] = []

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        got.append((float(payload), time.time()))

    await conn.add_listener("bench_floor", on_notify)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print(json.dumps(got), flush=True)
    await conn.close()


async def run(dsn: str, streams: int, rate: float, seconds: float) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    await conn.execute(SETUP)
    listener = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.notify_floor",
        "--listen",
        "--dsn",
        dsn,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        limit=64 * 1024 * 1024,
    )
    assert listener.stdin is not None and listener.stdout is not None
    assert (await listener.stdout.readline()).strip() == b"ready"
    commits: list[float] = []
    queued: list[tuple[int, float]] = []
    arrived = asyncio.Event()
    count = int(rate * seconds)
    started = time.monotonic() + 0.2

    async def producer(stream_id: int) -> None:
        offset = stream_id / streams / rate
        for i in range(count):
            wait = started + offset + i / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            queued.append((stream_id, time.time()))
            arrived.set()

    async def committer() -> None:
        done = 0
        while done < count * streams:
            await arrived.wait()
            arrived.clear()
            batch = queued[:]
            del queued[:]
            await conn.fetchval(APPEND, [s for s, _ in batch], [repr(m) for _, m in batch])
            now = time.time()
            commits.extend((now - made) * 1000 for _, made in batch)
            done += len(batch)

    await asyncio.gather(committer(), *(producer(i + 1) for i in range(streams)))
    await asyncio.sleep(0.5)
    listener.stdin.write(b"stop\n")
    got = json.loads(await listener.stdout.readline())
    await listener.wait()
    await conn.close()
    return {
        "streams": streams,
        "rate_per_stream": rate,
        "commit": percentiles(commits),
        "notify": percentiles([(at - made) * 1000 for made, at in got]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.notify_floor", description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--listen", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.listen:
        asyncio.run(listen(args.dsn))
        return 0
    if args.dsn:
        result = asyncio.run(run(args.dsn, args.streams, args.rate, args.seconds))
    else:
        with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
            result = asyncio.run(run(dsn, args.streams, args.rate, args.seconds))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
