"""The append statement's own floor: what Postgres costs per append with no HTTP at all.

    python -m bench.append_floor [--seconds 3]

On an isolated database (as the other parts), one asyncpg connection loops the append
path's own statements (store/append.py builds the arguments) back to back, commit
included, one record per request:

- ``1 request``: a group of one, notifying at commit (what one client costs at best);
- ``16 requests, 1 stream``: one group of 16 (16 clients on one stream, per statement);
- ``100 records, 1 request``: one 100-record request;
- ``4 streams``: ``append_stream_groups`` with one request on each of 4 streams, the
  first several-stream statements of the connection (before ``append_stream_groups``
  forced generic plans, small ones first used to leave the connection planning them
  again on every call);
- ``16 streams``: ``append_stream_groups`` with one request on each of 16 streams;
- ``16 streams, watched``: the same on 16 streams with a watch (an SSE follower
  somewhere), whose commit sends each stream's wake.

Prints statements/s, records/s, ms per statement and this process's CPU per statement
(building the arguments and asyncpg's encoding: the client side of the append path).
With one client the service cannot beat the first line; the others show what Postgres
needs per group and per stream.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import uvloop

from bench.environment import isolated_database, postgres_server
from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.schema import QUERIES
from ductor_streams.schema.migrate import migrate
from ductor_streams.store import Store, StreamKey, encode_batch
from ductor_streams.store.append import statement_arguments

NO_CEILINGS = {
    "max_unread_items": None,
    "max_unread_bytes": None,
    "max_total_items": None,
    "max_total_bytes": None,
}


async def _rate(
    seconds: float, statement: Callable[[], Awaitable[object]]
) -> tuple[float, float, float]:
    """Statements/s, wall ms and this process's CPU us per statement (argument building
    and asyncpg's encoding: the client side of the append path)."""
    count = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        await statement()
        count += 1
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    return count / elapsed, elapsed / count * 1000, cpu / count * 1e6


async def run(dsn: str, seconds: float) -> None:
    await migrate(dsn)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        store = Store(pool)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        pks = []
        for i in range(32):
            body = {"stream_id": f"s{i}", "direction": "output", "credit": NO_CEILINGS}
            definition = parse_definition(body, region="local", object_store_regions=frozenset())
            ref, _ = await store.create_stream(StreamKey("bench", run_id, f"s{i}"), definition)
            pks.append(ref.stream_pk)
        # The last 16 are watched (an SSE follower somewhere): their commits NOTIFY.
        pks, watched = pks[:16], pks[16:]
        await pool.execute(
            "UPDATE workflow_streams.streams SET watched_until = now() + interval '1 day'"
            " WHERE stream_pk = ANY ($1)",
            watched,
        )
        one = encode_batch([{"n": 1, "text": "hello"}])
        hundred = encode_batch([{"n": 1, "text": "hello"}] * 100)
        group = QUERIES["records_append_group"]
        streams = QUERIES["records_append_stream_groups"]

        async with pool.acquire() as conn:

            def one_each(stream_pks: list[int]) -> Awaitable[object]:
                """One one-record request on each of ``stream_pks``, in one statement."""
                n = len(stream_pks)
                arguments = statement_arguments([one] * n)
                return conn.fetch(streams, stream_pks, [1] * n, [1] * n, *arguments, True, None)

            # The arguments are built per statement, as the appender does; the last one
            # is each request's traceparent, None (no array) while tracing is off.
            shapes: list[tuple[str, int, Callable[[], Awaitable[object]]]] = [
                (
                    "1 request",
                    1,
                    lambda: conn.fetch(group, pks[0], *statement_arguments([one]), True, None),
                ),
                (
                    "16 requests, 1 stream",
                    16,
                    lambda: conn.fetch(
                        group, pks[0], *statement_arguments([one] * 16), False, None
                    ),
                ),
                (
                    "100 records, 1 request",
                    100,
                    lambda: conn.fetch(group, pks[0], *statement_arguments([hundred]), True, None),
                ),
                ("4 streams", 4, lambda: one_each(pks[:4])),
                ("16 streams", 16, lambda: one_each(pks)),
                ("16 streams, watched", 16, lambda: one_each(watched)),
            ]
            print(
                f"{'statement':<24} {'statements/s':>13} {'records/s':>10} "
                f"{'ms/statement':>13} {'client CPU us':>14}"
            )
            for title, records, statement in shapes:
                per_second, ms, cpu_us = await _rate(seconds, statement)
                print(
                    f"{title:<24} {per_second:>13,.0f} {per_second * records:>10,.0f} "
                    f"{ms:>13.3f} {cpu_us:>14.0f}"
                )
    finally:
        await pool.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.append_floor", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="per statement shape")
    args = parser.parse_args(argv)
    with postgres_server() as server, isolated_database(server) as dsn:
        uvloop.run(run(dsn, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
