"""What a stream-groups append statement costs in Postgres when its requests carry
idempotency keys (as every batch of an activity's ``stream_writer`` does) against the
same statement without keys.

    python -m bench.keyed_groups [--rounds 5] [--calls 200] [--streams 32] [--records 2]

On an isolated database, one asyncpg connection sends ``records_append_stream_groups``
(the appender's statement for several streams' groups, store/append.py) ``--calls``
times back to back: ``--streams`` streams, one request of ``--records`` records each
(the shape of 100 streaming activities' batches at 50 tokens/s), with
``synchronous_commit`` off (Postgres's own work and a round trip, not the flush), in
``--rounds`` interleaved rounds. It prints the median microseconds per statement and
per request, and the backend's CPU per request (from /proc, when readable), for:

- ``no keys``: requests without idempotency keys;
- ``keys``: each request with a fresh key (``ds:act:<digest>:1:<n>``, the writer's);
- ``keys, 0020's function``: the same through ``append_stream_groups`` as migration
  0020 defined it (created from its file under another name): keyed groups go through
  ``append_requests`` one by one;
- ``+ receipt key``: with the receipts' foreign key to streams, which the schema no
  longer has, put back (``NOT VALID``: checked for new rows only) for that shape alone.

So ``keys, 0020's function + receipt key`` is the statement before 0033 and 0034, and
``keys`` the statement after both. (The numbers name files of the migration chain that
came before the baseline, kept in tests/support/legacy_migrations/.)

``--watched``: the streams have an SSE follower (``watched_until`` ahead) and the
statement sends its wakes (``p_notify``), to a LISTEN connection of the bench, as at
100 streaming activities.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import asyncpg

from bench.environment import isolated_database, postgres_server
from ductor_streams.schema import QUERIES
from ductor_streams.schema.migrate import migrate
from ductor_streams.store.append import statement_arguments
from ductor_streams.store.encoding import batch_of_encoded
from tests.support.legacy_chain import LEGACY_DIR

OLD_FUNCTION = LEGACY_DIR / "0020_delivery_trace_context.sql"
NEW_STREAM = """
INSERT INTO workflow_streams.streams (tenant, run_id, stream_id, direction, definition)
VALUES ('bench', $1, 'output', 'output', '{"stream_id": "output", "direction": "output"}')
RETURNING stream_pk"""
RECEIPT_KEY = """
ALTER TABLE workflow_streams.append_receipts ADD CONSTRAINT bench_receipt_key
    FOREIGN KEY (stream_pk) REFERENCES workflow_streams.streams ON DELETE CASCADE NOT VALID"""
NO_RECEIPT_KEY = "ALTER TABLE workflow_streams.append_receipts DROP CONSTRAINT bench_receipt_key"
WATCHED = """
UPDATE workflow_streams.streams SET watched_until = now() + interval '1 hour'
 WHERE stream_pk = ANY ($1)"""


def old_function_sql(path: Path = OLD_FUNCTION) -> str:
    """The stream-groups function of ``path`` (its 11-argument form), renamed
    ``append_stream_groups_old``."""
    text = path.read_text()
    start = text.index("CREATE FUNCTION workflow_streams.append_stream_groups(")
    end = text.index("$$;", text.index("AS $$", start) + 5) + 3
    body = text[start:end]
    return body.replace(
        "workflow_streams.append_stream_groups(", "workflow_streams.append_stream_groups_old(", 1
    )


def backend_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    conn: asyncpg.Connection,
    query: str,
    pks: list[int],
    records: int,
    keyed: bool,
    calls: int,
    notify: bool = False,
) -> tuple[float, float | None]:
    """Microseconds per statement (wall) and backend CPU per statement."""
    label = f"{time.monotonic_ns()}"

    def args(i: int) -> tuple[object, ...]:
        batches = [
            batch_of_encoded(
                [b'{"i":%d,"t":1.0}' % n for n in range(records)],
                idempotency_key=f"ds:act:{label}{pk}:1:{i}" if keyed else None,
            )
            for pk in pks
        ]
        shape = (pks, [1] * len(pks), [records] * len(pks))
        return (*shape, *statement_arguments(batches), notify, None)

    prepared = [args(i) for i in range(calls + 10)]
    for i in range(10):
        await conn.fetch(query, *prepared[i])
    pid = conn.get_server_pid()
    cpu0 = backend_cpu(pid)
    started = time.perf_counter()
    for i in range(10, calls + 10):
        await conn.fetch(query, *prepared[i])
    wall = (time.perf_counter() - started) / calls * 1e6
    cpu1 = backend_cpu(pid)
    cpu = (cpu1 - cpu0) / calls * 1e6 if cpu0 is not None and cpu1 is not None else None
    return wall, cpu


async def run(
    dsn: str, rounds: int, calls: int, streams: int, records: int, watched: bool = False
) -> None:
    await migrate(dsn)
    conn = await asyncpg.connect(dsn)
    listener = await asyncpg.connect(dsn)
    if watched:
        await listener.add_listener("workflow_streams", lambda *_: None)
    try:
        await conn.execute("SET synchronous_commit = off")
        await conn.execute(old_function_sql())
        new = QUERIES["records_append_stream_groups"]
        old = new.replace("append_stream_groups(", "append_stream_groups_old(")
        shapes = (
            ("no keys", new, False, False),
            ("keys", new, True, False),
            ("keys + receipt key", new, True, True),
            ("keys, 0020's function", old, True, False),
            ("keys, 0020's function + receipt key", old, True, True),
        )
        results: dict[str, tuple[list[float], list[float]]] = {s[0]: ([], []) for s in shapes}
        for _ in range(rounds):
            for title, query, keyed, receipt_key in shapes:
                pks = [
                    int(await conn.fetchval(NEW_STREAM, f"kg-{time.monotonic_ns()}-{n}"))
                    for n in range(streams)
                ]
                if watched:
                    await conn.execute(WATCHED, pks)
                if receipt_key:
                    await conn.execute(RECEIPT_KEY)
                try:
                    wall, cpu = await measure(conn, query, pks, records, keyed, calls, watched)
                finally:
                    if receipt_key:
                        await conn.execute(NO_RECEIPT_KEY)
                results[title][0].append(wall)
                if cpu is not None:
                    results[title][1].append(cpu)
    finally:
        await conn.close()
        await listener.close()
    print(
        f"{streams} {'watched ' if watched else ''}streams x 1 request x {records} records a"
        f" statement, {calls} statements, {rounds} rounds (medians)"
    )
    print(f"{'statement':<38}{'us/stmt':>10}{'us/request':>12}{'pg cpu us/request':>19}")
    for title, (walls, cpus) in results.items():
        wall = statistics.median(walls)
        cpu_text = f"{statistics.median(cpus) / streams:.1f}" if cpus else "-"
        print(f"{title:<38}{wall:>10.0f}{wall / streams:>12.1f}{cpu_text:>19}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.keyed_groups", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--records", type=int, default=2)
    parser.add_argument(
        "--watched", action="store_true", help="streams with a follower: the wakes go too"
    )
    args = parser.parse_args(argv)
    with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
        asyncio.run(run(dsn, args.rounds, args.calls, args.streams, args.records, args.watched))
    return 0


if __name__ == "__main__":
    sys.exit(main())
