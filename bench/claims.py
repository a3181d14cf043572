"""Benchmark: the dispatcher's claim statement against streams with open deliveries.

    python -m bench.claims [--open 0,100,1000,10000] [--repeat 30]

One stream of tenant ``hot`` has a due delivery; ``--open`` other streams (another
tenant) each have a delivery backing off for an hour, as streams of runs that are slow
to take their input do. For each count it times, as the median of ``--repeat`` runs
(each in a transaction rolled back, so every run claims the same row):

- the claim of every stream of the tenant (``delivery_claim``: a dispatcher's idle poll,
  due time or reconnect);
- the claim of the stream a wake named (``delivery_claim_stream``: a dispatcher woken
  by an append);
- ``delivery_next_due`` (what a dispatcher runs after a claim of every stream);

and each as a ratio to the same statement with no other open stream, measured first in
the same run. The database is a fresh one on $DUCTOR_STREAMS_BENCH_DATABASE_URL (else
the tests' server, else an embedded Postgres), dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg

from bench.environment import isolated_database, postgres_server
from ductor_streams.schema import QUERIES
from ductor_streams.schema.migrate import migrate

_STREAMS = """
WITH made AS (
    INSERT INTO workflow_streams.streams (tenant, run_id, stream_id, direction, definition)
    SELECT $3, 'run-' || g, 'input', 'input', '{}'::jsonb
      FROM generate_series($1::int, $2::int) g
    RETURNING stream_pk)
INSERT INTO workflow_streams.input_deliveries (stream_pk, sequence, state, next_attempt_at)
SELECT stream_pk, 1, $4, now() + make_interval(secs => $5) FROM made
RETURNING stream_pk
"""


class _Rollback(Exception):
    """Leaves a transaction block rolled back."""


async def _timed(conn: asyncpg.Connection, repeat: int, query: str, *args: object) -> float:
    times = []
    for _ in range(repeat):
        try:
            async with conn.transaction():
                started = time.perf_counter()
                await conn.fetch(query, *args)
                times.append((time.perf_counter() - started) * 1000)
                raise _Rollback  # every run claims the same row
        except _Rollback:
            pass
    return statistics.median(times)


async def add_streams(
    conn: asyncpg.Connection | asyncpg.Pool,
    tenant: str,
    count: int,
    *,
    first: int = 1,
    state: str = "retrying",
    due_in: float = 3600.0,
) -> list[int]:
    """``count`` input streams of ``tenant`` with one delivery each (by default backing
    off for an hour); their stream_pks."""
    rows = await conn.fetch(_STREAMS, first, first + count - 1, tenant, state, due_in)
    return [row["stream_pk"] for row in rows]


async def run(dsn: str, counts: list[int], repeat: int) -> list[dict[str, float]]:
    await migrate(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        [hot] = await add_streams(conn, "hot", 1, state="pending", due_in=0.0)
        made = 0
        rows: list[dict[str, float]] = []
        for count in counts:
            if count > made:
                await add_streams(conn, "other", count - made, first=made + 1)
                made = count
            await conn.execute("ANALYZE workflow_streams.input_deliveries")
            args = ("bench", 30.0, 16, 100, "hot")
            named = QUERIES["delivery_claim_stream"]
            rows.append(
                {
                    "open": count,
                    "everywhere": await _timed(conn, repeat, QUERIES["delivery_claim"], *args),
                    "named": await _timed(conn, repeat, named, *args, hot),
                    "next_due": await _timed(conn, repeat, QUERIES["delivery_next_due"], "hot"),
                }
            )
        return rows
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.claims", description=__doc__)
    parser.add_argument("--open", default="0,100,1000,10000")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    counts = sorted({0, *(int(n) for n in args.open.split(","))})
    with postgres_server() as server, isolated_database(server) as dsn:
        rows = asyncio.run(run(dsn, counts, args.repeat))
    base = rows[0]
    print(f"{'open streams':>12}  {'claim everywhere':>20}  {'claim named':>18}  {'next due':>18}")
    for row in rows:
        kinds = ("everywhere", "named", "next_due")
        cells = [f"{row[k]:8.3f} ms {row[k] / base[k]:6.1f}x" for k in kinds]
        print(f"{int(row['open']):>12}  {cells[0]:>20}  {cells[1]:>18}  {cells[2]:>18}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
