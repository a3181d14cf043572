"""The raw-Postgres baseline: what the same shape costs with no service in between.

    python -m bench.raw_postgres --dsn DSN --connections 16 --streams 1 --batch 1 --seconds 5

Each connection runs a closed loop of the plainest durable append, over asyncpg:
BEGIN; lock the stream row and take the next sequences (UPDATE ... RETURNING);
INSERT the records; NOTIFY; COMMIT. Connection i appends to stream i mod streams.
Its own tables live in schema ``bench_raw`` of the given (bench) database.
Prints one JSON object like ``bench.loadgen``: appends/s (transactions), p50/p99 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from array import array
from typing import Any

import asyncpg
import uvloop

from bench.loadgen import percentile

SETUP = """
CREATE SCHEMA IF NOT EXISTS bench_raw;
CREATE TABLE IF NOT EXISTS bench_raw.streams (
    stream_id bigint PRIMARY KEY, latest bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS bench_raw.records (
    stream_id bigint NOT NULL, sequence bigint NOT NULL, payload text NOT NULL,
    appended_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (stream_id, sequence));
"""
LOCK = "UPDATE bench_raw.streams SET latest = latest + $2 WHERE stream_id = $1 RETURNING latest"
INSERT = (
    "INSERT INTO bench_raw.records (stream_id, sequence, payload) "
    "SELECT $1, $2 + o, p FROM unnest($3::text[]) WITH ORDINALITY AS r(p, o)"
)
NOTIFY = "SELECT pg_notify('bench_raw', $1)"


async def run(
    dsn: str, connections: int, streams: int, batch: int, seconds: float, warmup: float
) -> dict[str, Any]:
    setup = await asyncpg.connect(dsn)
    try:
        await setup.execute(SETUP)
        base = int(
            await setup.fetchval("SELECT coalesce(max(stream_id), 0) FROM bench_raw.streams")
        )
        ids = list(range(base + 1, base + streams + 1))
        await setup.executemany(
            "INSERT INTO bench_raw.streams (stream_id) VALUES ($1)", [(i,) for i in ids]
        )
    finally:
        await setup.close()
    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    payloads = ['{"n":1,"text":"hello"}'] * batch
    latencies = array("d")
    state = {"counting": False, "stop": False}

    async def loop(conn: asyncpg.Connection, stream_id: int) -> None:
        while not state["stop"]:
            started = time.perf_counter_ns()
            async with conn.transaction():
                last = await conn.fetchval(LOCK, stream_id, batch)
                await conn.execute(INSERT, stream_id, last - batch, payloads)
                await conn.execute(NOTIFY, str(stream_id))
            if state["counting"]:
                latencies.append((time.perf_counter_ns() - started) / 1e6)

    tasks = [asyncio.create_task(loop(c, ids[i % streams])) for i, c in enumerate(conns)]
    await asyncio.sleep(warmup)
    state["counting"] = True
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    state["counting"] = False
    elapsed = time.perf_counter() - started
    state["stop"] = True
    await asyncio.gather(*tasks)
    for c in conns:
        await c.close()
    values = list(latencies)
    return {
        "requests": len(values),
        "ok": len(values),
        "elapsed": elapsed,
        "per_second": len(values) / elapsed,
        "p50_ms": percentile(values, 0.50),
        "p99_ms": percentile(values, 0.99),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.raw_postgres", description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args(argv)
    result = uvloop.run(
        run(args.dsn, args.connections, args.streams, args.batch, args.seconds, args.warmup)
    )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
