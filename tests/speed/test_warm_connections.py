"""New connections of the store's pool are warmed for the append path (store/warm.py):
the append statements are prepared and the backend has run them, and warming changes
nothing in the database."""

from __future__ import annotations

import asyncpg

from ductor_streams.live.hub import parse_wake
from ductor_streams.schema import QUERIES
from ductor_streams.store import Store, encode_batch
from ductor_streams.store.db import create_pool
from ductor_streams.store.warm import NO_STREAM, WARM_STATEMENTS, warm_connection
from tests.support.credit import make_stream

APPEND_STATEMENTS = {QUERIES[name] for name, _ in WARM_STATEMENTS}


async def prepared_statements(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch("SELECT statement FROM pg_prepared_statements")
    return {row["statement"] for row in rows}


async def rows_of_no_stream(conn: asyncpg.Connection) -> dict[str, int]:
    """The rows of ``stream_pk`` -1 in every table an append writes (or that holds it)."""
    counts = {}
    for table in ("streams", "records", "append_receipts", "input_deliveries"):
        counts[table] = await conn.fetchval(
            f"SELECT count(*) FROM workflow_streams.{table} WHERE stream_pk = $1", NO_STREAM
        )
    return counts


async def test_each_new_connection_of_a_warm_pool_has_the_append_statements_prepared(
    database_url: str,
) -> None:
    pool = await create_pool(database_url, min_size=2, max_size=3, warm=True)
    try:
        async with pool.acquire() as a, pool.acquire() as b, pool.acquire() as c:
            # Two opened with the pool, the third on demand: all three were warmed.
            for conn in (a, b, c):
                assert APPEND_STATEMENTS <= await prepared_statements(conn)
    finally:
        await pool.close()


async def test_a_cold_pool_prepares_nothing_in_advance(database_url: str) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            assert not APPEND_STATEMENTS & await prepared_statements(conn)
    finally:
        await pool.close()


async def test_warming_writes_nothing_and_announces_nothing(database_url: str) -> None:
    watcher = await asyncpg.connect(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        heard: list[str] = []
        await watcher.add_listener("workflow_streams", lambda *args: heard.append(args[-1]))
        await warm_connection(conn)
        # A wake would have been sent at the commit, before warm_connection returned;
        # this round trip on the listening connection delivers anything already queued.
        await watcher.fetchval("SELECT 1")
        # Other processes of the test session may write and announce meanwhile: only
        # what names the stream the warming used is looked for (that nothing at all is
        # written: test_the_warming_statements_take_no_transaction_id).
        assert await rows_of_no_stream(watcher) == dict.fromkeys(
            ("streams", "records", "append_receipts", "input_deliveries"), 0
        )
        assert [w for w in map(parse_wake, heard) if w is not None and w[0] == NO_STREAM] == []
        assert not conn.is_in_transaction()
    finally:
        await conn.close()
        await watcher.close()


async def test_a_connection_that_cannot_warm_is_used_as_it_is(database_url: str) -> None:
    # A read-only session (as on a standby after failover) refuses the append functions'
    # UPDATE even for no row: warming gives up quietly and the connection still serves.
    conn = await asyncpg.connect(
        database_url, server_settings={"default_transaction_read_only": "on"}
    )
    try:
        await warm_connection(conn)
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


async def test_appends_through_a_warmed_pool_answer_as_before(database_url: str) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=4, warm=True)
    try:
        store = Store(pool)
        ref = await make_stream(store)
        results = [await store.append(ref, encode_batch([f"r{i}"])) for i in range(3)]
        assert [(r.first_sequence, r.last_sequence) for r in results] == [(1, 1), (2, 2), (3, 3)]
    finally:
        await pool.close()


async def test_the_warming_statements_take_no_transaction_id(database_url: str) -> None:
    # Nothing written: Postgres gives a transaction an id only at its first write, so
    # the warming commits no WAL record and waits for no flush.
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            for name, args in WARM_STATEMENTS:
                rows = await conn.fetch(QUERIES[name], *args)
                assert [row["outcome"] for row in rows] == ["not_found"], name
            assert await conn.fetchval("SELECT txid_current_if_assigned()") is None
    finally:
        await conn.close()
