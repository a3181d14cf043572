"""What one append's SQL costs, piece by piece, and the append function against its
previous version (0008_append_one_insert of the chain before the baseline, kept in
tests/support/legacy_migrations/).

    python -m bench.statement_costs [--rounds 5] [--calls 300]

On an isolated database, one asyncpg connection runs each statement ``--calls`` times
back to back, in ``--rounds`` interleaved rounds (a fresh stream per round and
version), and prints the median microseconds per statement:

- with ``synchronous_commit`` off (every statement still commits, but does not wait for
  the WAL flush, so these are Postgres's own work plus a round trip): ``SELECT 1``, the
  stream row lock (``SELECT ... FOR UPDATE``), the row update, one record insert, an
  empty plpgsql function returning one row, and ``append_requests`` for one
  single-record request without and with its NOTIFY;
- the same connection with ``synchronous_commit`` on: ``SELECT 1`` against one record
  insert, whose difference is what waiting for the flush costs;
- 0008's ``append_requests`` (created from its migration file under another name)
  against the current one, for one request, a 16-request group and one 100-record
  request, ``synchronous_commit`` off;
- a 100-row insert into a table shaped like ``records`` with the per-row foreign key to
  ``streams`` that the schema no longer has, against the same table without it.

docs/credit.md quotes these figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import uvloop

from bench.environment import isolated_database, postgres_server
from ductor_streams.schema.migrate import migrate
from tests.support.legacy_chain import LEGACY_DIR

OLD_FUNCTION = LEGACY_DIR / "0008_append_one_insert.sql"
APPEND = (
    "SELECT count(*) FROM workflow_streams.{name}($1, $2, $3, $4, $5, $6, NULL::jsonb[], {notify})"
)
NEW_STREAM = """
INSERT INTO workflow_streams.streams (tenant, run_id, stream_id, direction, definition)
VALUES ('bench', $1, 's', 'output', '{"stream_id": "s", "direction": "output"}')
RETURNING stream_pk"""

Statement = Callable[[int], Awaitable[object]]


def old_function_sql(path: Path = OLD_FUNCTION) -> str:
    """0008's append_requests, renamed ``append_requests_0008``."""
    text = path.read_text()
    body = text[text.index("CREATE OR REPLACE FUNCTION") :]
    return body.replace(
        "workflow_streams.append_requests(", "workflow_streams.append_requests_0008(", 1
    )


async def _per_call_us(statement: Statement, calls: int) -> float:
    for i in range(20):  # warm the plan caches
        await statement(i)
    started = time.perf_counter()
    for i in range(20, 20 + calls):  # every call gets its own index
        await statement(i)
    return (time.perf_counter() - started) / calls * 1e6


async def _stream(conn: asyncpg.Connection, label: str) -> int:
    return int(await conn.fetchval(NEW_STREAM, f"{label}-{time.monotonic_ns()}"))


def _append(
    conn: asyncpg.Connection, name: str, pk: int, requests: int, records: int, notify: bool
) -> Statement:
    query = APPEND.format(name=name, notify="true" if notify else "false")
    args = (
        [records] * requests,
        [None] * requests,
        ["h"] * requests,
        ['{"n": 1}'] * (requests * records),
        [8] * (requests * records),
    )
    return lambda _i: conn.fetchval(query, pk, *args)


def _piece_statements(conn: asyncpg.Connection, pk: int) -> list[tuple[str, Statement]]:
    async def insert(i: int) -> None:
        await conn.execute(
            "INSERT INTO workflow_streams.records"
            " (stream_pk, sequence, payload, size, cumulative_bytes)"
            " VALUES ($1, $2, '{}', 2, 0)",
            pk,
            1_000_000 + i,  # far beyond what the appends below reach
        )

    return [
        ("SELECT 1 (a round trip)", lambda _i: conn.fetchval("SELECT 1")),
        (
            "the row lock",
            lambda _i: conn.fetchval(
                "SELECT stream_pk FROM workflow_streams.streams WHERE stream_pk = $1 FOR UPDATE",
                pk,
            ),
        ),
        (
            "the row update",
            lambda _i: conn.execute(
                "UPDATE workflow_streams.streams SET total_items = total_items + 1,"
                " total_bytes = total_bytes + 8 WHERE stream_pk = $1",
                pk,
            ),
        ),
        ("one record insert", insert),
        (
            "an empty plpgsql function",
            lambda _i: conn.fetchval("SELECT count(*) FROM pg_temp.one_row()"),
        ),
        ("append_requests, 1 record", _append(conn, "append_requests", pk, 1, 1, False)),
        ("  the same with its NOTIFY", _append(conn, "append_requests", pk, 1, 1, True)),
    ]


async def _pieces(conn: asyncpg.Connection, rounds: int, calls: int) -> dict[str, list[float]]:
    await conn.execute(
        "CREATE FUNCTION pg_temp.one_row() RETURNS TABLE (a int, b text) LANGUAGE plpgsql"
        " AS $$ BEGIN a := 1; b := 'x'; RETURN NEXT; END $$"
    )
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        pk = await _stream(conn, "pieces")  # a fresh stream per round
        for title, statement in _piece_statements(conn, pk):
            results.setdefault(title, []).append(await _per_call_us(statement, calls))
    return results


async def _flush(conn: asyncpg.Connection, rounds: int, calls: int) -> dict[str, list[float]]:
    # A temporary table writes no WAL: the probe table is a real one (in this database only).
    await conn.execute("CREATE TABLE bench_flush_probe (x int)")
    await conn.execute("SET synchronous_commit = on")
    pieces: list[tuple[str, Statement]] = [
        ("SELECT 1", lambda _i: conn.fetchval("SELECT 1")),
        (
            "one-row insert, its commit waits for the flush",
            lambda _i: conn.execute("INSERT INTO bench_flush_probe VALUES (1)"),
        ),
    ]
    results: dict[str, list[float]] = {}
    try:
        for _ in range(rounds):
            for title, statement in pieces:
                results.setdefault(title, []).append(await _per_call_us(statement, calls))
    finally:
        await conn.execute("SET synchronous_commit = off")
    return results


async def _versions(conn: asyncpg.Connection, rounds: int, calls: int) -> dict[str, list[float]]:
    await conn.execute(old_function_sql())
    results: dict[str, list[float]] = {}
    for requests, records, title in (
        (1, 1, "1 request"),
        (16, 1, "16 requests"),
        (1, 100, "100 records"),
    ):
        for _ in range(rounds):
            for name, label in (("append_requests_0008", "0008"), ("append_requests", "now")):
                pk = await _stream(conn, label)
                statement = _append(conn, name, pk, requests, records, False)
                n = calls if requests * records < 50 else max(20, calls // 4)
                results.setdefault(f"{title}: {label}", []).append(await _per_call_us(statement, n))
    return results


ROW_CHECK_TABLES = """
CREATE SCHEMA bench_row_checks;
CREATE TABLE bench_row_checks.records_checked (
    stream_pk bigint NOT NULL REFERENCES workflow_streams.streams,
    sequence bigint NOT NULL, payload text NOT NULL, size integer NOT NULL,
    cumulative_bytes bigint NOT NULL, PRIMARY KEY (stream_pk, sequence));
CREATE TABLE bench_row_checks.records_unchecked
    (LIKE bench_row_checks.records_checked INCLUDING ALL);
"""
ROW_CHECK_INSERT = (
    "INSERT INTO bench_row_checks.{table} (stream_pk, sequence, payload, size, cumulative_bytes)"
    " SELECT $1, $2 + o, p, 8, 0 FROM unnest($3::text[]) WITH ORDINALITY AS r(p, o)"
)


async def _row_checks(conn: asyncpg.Connection, rounds: int, calls: int) -> dict[str, list[float]]:
    # Two tables alike but for the key, in this benchmark's own database.
    await conn.execute(ROW_CHECK_TABLES)
    payloads = ['{"n": 1}'] * 100
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        pk = await _stream(conn, "row-checks")  # a fresh stream per round
        for table, title in (
            ("records_checked", "100-row insert, foreign key checked per row"),
            ("records_unchecked", "100-row insert, no foreign key (0013)"),
        ):
            query = ROW_CHECK_INSERT.format(table=table)

            def statement(i: int, query: str = query, pk: int = pk) -> Awaitable[object]:
                return conn.execute(query, pk, i * 100, payloads)

            n = max(20, calls // 4)
            results.setdefault(title, []).append(await _per_call_us(statement, n))
    return results


def _print(title: str, results: dict[str, list[float]]) -> None:
    print(title)
    for name, values in results.items():
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {name:<44} median {statistics.median(values):>7.0f} us   ({runs})")


async def run(dsn: str, rounds: int, calls: int) -> None:
    await migrate(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET synchronous_commit = off")
        _print("synchronous_commit off:", await _pieces(conn, rounds, calls))
        _print("synchronous_commit on:", await _flush(conn, rounds, calls))
        _print(
            "append_requests, 0008 against now (synchronous_commit off):",
            await _versions(conn, rounds, calls),
        )
        _print(
            "records' foreign key (synchronous_commit off):", await _row_checks(conn, rounds, calls)
        )
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.statement_costs", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300, help="statements per measurement")
    args = parser.parse_args(argv)
    with postgres_server() as server, isolated_database(server) as dsn:
        uvloop.run(run(dsn, args.rounds, args.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
