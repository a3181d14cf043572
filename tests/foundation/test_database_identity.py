"""The database identity watch (store/identity.py): read from real Postgres, compared on
every new connection of the store's pool, a change logged with both values and counted
in ``ductor_streams_database_identity_changes_total``. Another cluster cannot be brought
up here: a change is an identity the watch saw before that differs from the real one
(or a stubbed identity query on a real connection)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from ductor_streams.foundation import metrics
from ductor_streams.store import identity
from ductor_streams.store.db import create_pool
from ductor_streams.store.identity import DatabaseIdentity, IdentityWatch


def changes_total() -> float:
    value = metrics.REGISTRY.get_sample_value("ductor_streams_database_identity_changes_total")
    assert value is not None
    return value


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()


async def real_identity(conn: asyncpg.Connection) -> DatabaseIdentity:
    system = await conn.fetchval("SELECT system_identifier FROM pg_control_system()")
    # The test server is a primary: the timeline of the WAL it writes.
    wal = await conn.fetchval("SELECT pg_walfile_name(pg_current_wal_lsn())")
    return DatabaseIdentity(int(system), int(wal[:8], 16))


async def test_the_watch_reads_the_clusters_identity_and_remembers_it(conn, caplog):
    watch = IdentityWatch()
    before = changes_total()
    with caplog.at_level(logging.INFO, logger="ductor_streams.store.identity"):
        seen = await watch.check(conn)
        again = await watch.check(conn)
    expected = await real_identity(conn)
    assert seen == again == watch.known == expected
    assert expected.timeline >= 1
    assert watch.changes == 0 and changes_total() == before
    [line] = [r for r in caplog.records if r.name == "ductor_streams.store.identity"]
    assert line.levelno == logging.INFO and line.system_identifier == str(
        expected.system_identifier
    )


async def test_a_new_timeline_is_a_warning_with_both_values_and_counted(conn, caplog):
    real = await real_identity(conn)
    watch = IdentityWatch()
    watch.known = DatabaseIdentity(real.system_identifier, real.timeline + 4)  # before it
    before = changes_total()
    with caplog.at_level(logging.INFO, logger="ductor_streams.store.identity"):
        assert await watch.check(conn) == real
        await watch.check(conn)  # the same again: nothing new
    assert watch.changes == 1 and changes_total() == before + 1
    assert watch.known == real
    [line] = [r for r in caplog.records if r.name == "ductor_streams.store.identity"]
    assert line.levelno == logging.WARNING
    assert (line.old_timeline, line.new_timeline) == (real.timeline + 4, real.timeline)
    assert line.old_system_identifier == line.new_system_identifier == str(real.system_identifier)
    message = line.getMessage()
    assert f"timeline {real.timeline + 4} -> {real.timeline}" in message
    assert "failover" in message


async def test_another_cluster_is_an_error_with_both_values_and_counted(conn, caplog):
    real = await real_identity(conn)
    # A stubbed identity query on a real connection: the cluster the DSN reaches now.
    other = IdentityWatch(query="SELECT 42::bigint AS system_identifier, 1::bigint AS timeline")
    other.known = real
    before = changes_total()
    with caplog.at_level(logging.INFO, logger="ductor_streams.store.identity"):
        assert await other.check(conn) == DatabaseIdentity(42, 1)
    assert changes_total() == before + 1
    [line] = [r for r in caplog.records if r.name == "ductor_streams.store.identity"]
    assert line.levelno == logging.ERROR
    assert (line.old_system_identifier, line.new_system_identifier) == (
        str(real.system_identifier),
        "42",
    )
    assert f"system identifier {real.system_identifier} -> 42" in line.getMessage()


async def test_a_database_that_refuses_the_identity_is_said_once_and_left_alone(conn, caplog):
    # A role that may not call what the statement calls, as a managed Postgres that
    # revokes the control functions: the real 42501, on a real connection.
    await conn.execute("SET ROLE pg_monitor")
    watch = IdentityWatch(
        query="SELECT pg_read_file('postgresql.conf')::text::bigint AS system_identifier,"
        " 1::bigint AS timeline"
    )
    before = changes_total()
    with caplog.at_level(logging.INFO, logger="ductor_streams.store.identity"):
        assert await watch.check(conn) is None
        assert await watch.check(conn) is None  # not asked again
    assert not watch.readable and watch.known is None and changes_total() == before
    [line] = [r for r in caplog.records if r.name == "ductor_streams.store.identity"]
    assert line.levelno == logging.WARNING and line.sqlstate == "42501"
    # The connection is still usable: nothing was left open.
    assert await conn.fetchval("SELECT 1") == 1


async def test_each_new_store_pool_connection_is_compared(database_url: str, conn):
    real = await real_identity(conn)
    watch = identity.WATCH
    remembered = watch.known
    watch.known = DatabaseIdentity(real.system_identifier, real.timeline + 1)
    before = changes_total()
    try:
        pool = await create_pool(database_url, min_size=1, max_size=1, warm=True)
        await pool.close()
        assert watch.known == real and changes_total() == before + 1
        pool = await create_pool(database_url, min_size=1, max_size=1, warm=True)
        await pool.close()
        assert changes_total() == before + 1  # the same identity: no change
    finally:
        watch.known = remembered if remembered is not None else watch.known


async def test_metrics_expose_the_counter(server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        text = (await c.get("/metrics")).text
    assert "\nductor_streams_database_identity_changes_total 0.0\n" in text
