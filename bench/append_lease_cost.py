"""Benchmark: what taking the lease in the append (``append_requests_leasing``) costs Postgres.

    python -m bench.append_lease_cost [--appends 1000] [--rounds 3]

On one isolated database, two input streams with room for every record. Each iteration
appends one record, then marks its delivery delivered (so that the next append is the
stream's head again), as one SQL procedure call that commits after each statement (no
client round trips in the figure; synchronous_commit off, so no WAL flush either). One
stream through ``append_requests``, the other through ``append_requests_leasing``, the
two alternating round by round. Printed: each round's time per iteration in ms, and the
difference: the lease's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import asyncpg

from bench.environment import isolated_database, postgres_server
from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.schema.migrate import migrate
from ductor_streams.store import Store, StreamKey
from ductor_streams.store.db import create_pool

# One record appended, then its delivery recorded, $2 times, for stream $1; $3: lease it.
PROCEDURE = """
CREATE PROCEDURE pg_temp.append_then_deliver(p_stream bigint, p_times integer,
                                             p_lease boolean)
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. p_times LOOP
        IF p_lease THEN
            PERFORM * FROM workflow_streams.append_requests_leasing(
                p_stream, '{1}', '{NULL}', '{NULL}', ARRAY['{"a":1}'], '{7}', NULL, true,
                NULL, 'bench', 30, 100);
        ELSE
            PERFORM * FROM workflow_streams.append_requests(
                p_stream, '{1}', '{NULL}', '{NULL}', ARRAY['{"a":1}'], '{7}', NULL, true,
                NULL);
        END IF;
        COMMIT;
        UPDATE workflow_streams.input_deliveries
           SET state = 'delivered', lease_owner = NULL, lease_expires_at = NULL
         WHERE stream_pk = p_stream AND state = 'pending';
        COMMIT;
    END LOOP;
END;
$$;
"""


async def _rounds(dsn: str, appends: int, rounds: int) -> dict[str, list[float]]:
    await migrate(dsn)
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        store = Store(pool)
        pks = {}
        for name in ("plain", "leasing"):
            definition = parse_definition(
                {
                    "stream_id": "s",
                    "direction": "input",
                    "credit": {"max_unread_items": 100_000_000, "max_unread_bytes": 10**12},
                },
                region="local",
                object_store_regions=frozenset(),
            )
            ref, _ = await store.create_stream(StreamKey("bench", f"run-{name}", "s"), definition)
            pks[name] = ref.stream_pk
    finally:
        await pool.close()
    conn = await asyncpg.connect(dsn)
    per: dict[str, list[float]] = {"plain": [], "leasing": []}
    try:
        await conn.execute("SET synchronous_commit = off")
        await conn.execute(PROCEDURE)
        for name in ("plain", "leasing"):  # warm: plans, caches
            await conn.execute(
                "CALL pg_temp.append_then_deliver($1, 50, $2)", pks[name], name == "leasing"
            )
        for r in range(rounds):
            order = ("plain", "leasing") if r % 2 == 0 else ("leasing", "plain")
            for name in order:
                started = time.perf_counter()
                await conn.execute(
                    "CALL pg_temp.append_then_deliver($1, $2, $3)",
                    pks[name],
                    appends,
                    name == "leasing",
                )
                per[name].append((time.perf_counter() - started) * 1000 / appends)
    finally:
        await conn.close()
    return per


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.append_lease_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--appends", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
        per = asyncio.run(_rounds(dsn, args.appends, args.rounds))
    for name, values in per.items():
        shown = ", ".join(f"{v:.3f}" for v in values)
        print(f"{name:8} append + delivered, ms per iteration by round: {shown}")
    difference = statistics.median(
        lease - plain for lease, plain in zip(per["leasing"], per["plain"], strict=True)
    )
    print(f"the lease's cost, median of the rounds' differences: {difference:.3f} ms")
    print(f"(1-minute load average at the start: {load:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
