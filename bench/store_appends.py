"""Single-record appends through the store alone: an input stream beside an output one.

    python -m bench.store_appends [--appends 300] [--rounds 2] [--pause-ms 2]

No HTTP, no dispatcher, no Temporal: ``Store.append`` of one record at a time, with a
short pause between appends, on one isolated database, alternating an output and an
input stream each round. Printed: the median latency of each round in ms. It is the
floor of the append hop that ``bench.temporal_delivery``'s latency run measures with
everything else running (``server_hops_mean_ms.append_statement``); the difference is
what the rest of the input path costs the next append.

Beside them, paced the same and in the same rounds, what lies under ``Store.append``:
the input stream's append statement alone on a connection of its own (no appender, no
pool), and a one-row ``INSERT`` into a table of one integer column with its commit (the
least a durable write costs here; ``--pause-ms 10`` is what the latency run's pacing
charges every process and the WAL flush after idle).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench.environment import isolated_database, postgres_server
from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.schema.migrate import migrate
from ductor_streams.schema.queries import QUERIES
from ductor_streams.store import Store, StreamKey, StreamRef, encode_batch
from ductor_streams.store.append import statement_arguments
from ductor_streams.store.db import create_pool


async def paced_appends(store: Store, ref: StreamRef, appends: int, pause: float) -> list[float]:
    """``appends`` one-record appends to ``ref`` through ``store``, each ``pause`` seconds
    after the last answer: each one's latency in ms, in order (batches encoded before)."""
    batches = [encode_batch([{"i": i}]) for i in range(appends)]
    return await _paced_calls(lambda i: store.append(ref, batches[i]), appends, pause)


async def _paced_calls(
    call: Callable[[int], Awaitable[object]], count: int, pause: float
) -> list[float]:
    """``call(i)`` awaited for i in 0 .. count - 1, each ``pause`` seconds after the last
    answer: each one's latency in ms, in order."""
    times = []
    for i in range(count):
        started = time.perf_counter()
        await call(i)
        times.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(pause)
    return times


async def _fetch(
    statement: asyncpg.prepared_stmt.PreparedStatement, args: tuple[Any, ...], _: int
) -> object:
    """One run of a prepared ``statement`` (``_paced_calls``' call, the index unused)."""
    return await statement.fetch(*args)


async def _stream(store: Store, direction: str) -> StreamRef:
    definition = parse_definition(
        {"stream_id": "s", "direction": direction},
        region="local",
        object_store_regions=frozenset(),
    )
    key = StreamKey("bench", f"run-{uuid.uuid4().hex[:8]}", "s")
    ref, _ = await store.create_stream(key, definition)
    return ref


SIDES = ("output", "input", "input statement", "one-row insert")


async def _rounds(dsn: str, appends: int, rounds: int, pause: float) -> dict[str, list[float]]:
    await migrate(dsn)
    pool = await create_pool(dsn, min_size=2, max_size=4)
    conn = await asyncpg.connect(dsn)
    medians: dict[str, list[float]] = {side: [] for side in SIDES}
    try:
        store = Store(pool)
        await conn.execute("CREATE TABLE bench_one_row (n integer)")
        insert = await conn.prepare("INSERT INTO bench_one_row VALUES (1)")
        statement = await conn.prepare(QUERIES["records_append_group"])
        arguments = statement_arguments([encode_batch([{"i": 0}])])
        for _ in range(rounds):
            for side in SIDES:
                if side in ("output", "input"):
                    ref = await _stream(store, side)
                    times = await paced_appends(store, ref, appends, pause)
                elif side == "input statement":
                    pk = (await _stream(store, "input")).stream_pk
                    call = functools.partial(_fetch, statement, (pk, *arguments, True, None))
                    times = await _paced_calls(call, appends, pause)
                else:
                    times = await _paced_calls(
                        functools.partial(_fetch, insert, ()), appends, pause
                    )
                medians[side].append(statistics.median(times))
    finally:
        await conn.close()
        await pool.close()
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.store_appends",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pause-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
        medians = asyncio.run(_rounds(dsn, args.appends, args.rounds, args.pause_ms / 1000))
    for side, values in medians.items():
        shown = ", ".join(f"{v:.3f}" for v in values)
        print(f"{side:15} median of {args.appends} per round: {shown} ms")
    print(f"(1-minute load average at the start: {load:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
