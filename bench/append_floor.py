"""The append statement's own floor: what Postgres costs per append with no HTTP at all.

    python -m bench.append_floor [--seconds 3]

On an isolated database (as the other parts), one asyncpg connection loops the append
path's own statements (store/append.py builds the arguments) back to back, commit
included, one record per request:

- ``1 request``: a group of one, notifying at commit (what one client costs at best);
- ``16 requests, 1 stream``: one group of 16 (16 clients on one stream, per statement);
- ``16 streams``: ``append_stream_groups`` with one request on each of 16 streams.

Prints statements/s, appends/s and ms per statement. With one client the service cannot
beat the first line; the others show what Postgres needs per group and per stream.
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
from ductor_streams.definitions import parse_definition
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


async def _rate(seconds: float, statement: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    count = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        await statement()
        count += 1
    elapsed = time.perf_counter() - started
    return count / elapsed, elapsed / count * 1000


async def run(dsn: str, seconds: float) -> None:
    await migrate(dsn)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        store = Store(pool)
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        pks = []
        for i in range(16):
            body = {"stream_id": f"s{i}", "direction": "output", "credit": NO_CEILINGS}
            definition = parse_definition(body, region="local", object_store_regions=frozenset())
            ref, _ = await store.create_stream(StreamKey("bench", run_id, f"s{i}"), definition)
            pks.append(ref.stream_pk)
        one = encode_batch([{"n": 1, "text": "hello"}])
        single = statement_arguments([one])
        sixteen = statement_arguments([one] * 16)
        group = QUERIES["records_append_group"]
        streams = QUERIES["records_append_stream_groups"]

        async with pool.acquire() as conn:
            shapes: list[tuple[str, int, Callable[[], Awaitable[object]]]] = [
                ("1 request", 1, lambda: conn.fetch(group, pks[0], *single, True)),
                ("16 requests, 1 stream", 16, lambda: conn.fetch(group, pks[0], *sixteen, False)),
                (
                    "16 streams",
                    16,
                    lambda: conn.fetch(streams, pks, [1] * 16, [1] * 16, *sixteen, True),
                ),
            ]
            print(f"{'statement':<24} {'statements/s':>13} {'appends/s':>10} {'ms/statement':>13}")
            for title, appends, statement in shapes:
                per_second, ms = await _rate(seconds, statement)
                print(
                    f"{title:<24} {per_second:>13,.0f} {per_second * appends:>10,.0f} {ms:>13.3f}"
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
