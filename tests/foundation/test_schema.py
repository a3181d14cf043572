"""Migrations: a migrated empty database holds what the code expects; the runner is safe
to run twice and from two processes at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import asyncpg

from ductor_streams.schema import QUERIES
from ductor_streams.schema.migrate import applied_versions, available_migrations, migrate
from tests.support.schema_dump import REGENERATE, SCHEMA_FILE, dump_database, server_major
from tests.support.server import settings_env

SPEC_TABLES = {
    "streams",
    "records",
    "append_receipts",
    "consumers",
    "object_intents",
    "input_deliveries",
    "deletion_outbox",
    "gap_evidence",
    "schema_migrations",
}


async def test_every_named_query_prepares_against_a_fresh_migrated_database(test_database):
    dsn, drop = await asyncio.to_thread(test_database.fresh)
    try:
        applied = await migrate(dsn)
        assert [m.version for m in applied] == [m.version for m in available_migrations()]
        conn = await asyncpg.connect(dsn)
        try:
            tables = {
                r["table_name"]
                for r in await conn.fetch(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = 'workflow_streams'"
                )
            }
            assert SPEC_TABLES <= tables
            # Preparing a statement makes Postgres resolve every table, column, function
            # and type it names: the schema the code expects is the schema we have. The
            # staged append statements read a temporary table that exists only inside
            # their transaction, so they are prepared where it does.
            async with conn.transaction():
                await conn.execute(QUERIES["append_stage_payloads"])
                for name, sql in QUERIES.items():
                    try:
                        await conn.prepare(sql)
                    except asyncpg.PostgresError as exc:
                        raise AssertionError(
                            f"query {name} does not fit the schema: {exc}"
                        ) from exc
        finally:
            await conn.close()
    finally:
        await asyncio.to_thread(drop)


async def test_migrate_twice_and_concurrently(test_database, settings):
    dsn, drop = await asyncio.to_thread(test_database.fresh)
    try:
        env = {**settings_env(settings), "DUCTOR_STREAMS_DATABASE_URL": dsn}
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "ductor_streams.process.cli",
                "migrate",
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(3)
        ]
        outputs = [await p.communicate() for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outputs
        applied_by = [out.decode() for out, _ in outputs]
        # Exactly one process applied each migration; the others found them current.
        for migration in available_migrations():
            line = f"applied {migration.version:04d}_{migration.name}"
            assert sum(line in text for text in applied_by) == 1
        assert await migrate(dsn) == []
        conn = await asyncpg.connect(dsn)
        try:
            assert await applied_versions(conn) == [m.version for m in available_migrations()]
        finally:
            await conn.close()
    finally:
        await asyncio.to_thread(drop)


async def _apply(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def test_schema_sql_is_what_the_migrations_make(test_database):
    """schema/schema.sql is the migrations' result, the way procrastinate checks its own
    schema file: a fresh database migrated step by step and a fresh database given the
    file in one go must end up with the same catalog, and on the Postgres major version
    that wrote the file the dump must equal the file word for word."""
    stale = (
        f"ductor_streams/schema/schema.sql does not match the migrations; "
        f"regenerate it with `{REGENERATE}` and commit it"
    )
    on_file = await asyncio.to_thread(SCHEMA_FILE.read_text, encoding="utf-8")
    migrated_dsn, drop_migrated = await asyncio.to_thread(test_database.fresh)
    loaded_dsn, drop_loaded = await asyncio.to_thread(test_database.fresh)
    try:
        await migrate(migrated_dsn)
        migrated = await dump_database(migrated_dsn)
        try:
            await _apply(loaded_dsn, on_file)
        except asyncpg.PostgresError as exc:
            raise AssertionError(f"{stale} (it does not apply: {exc})") from exc
        loaded = await dump_database(loaded_dsn)
    finally:
        await asyncio.to_thread(drop_migrated)
        await asyncio.to_thread(drop_loaded)
    assert loaded == migrated, stale
    if server_major(on_file) == server_major(migrated):
        assert on_file == migrated, stale


async def test_schema_dump_is_deterministic(database_url):
    """Two dumps of one database are the same text: the file has no volatile lines."""
    first = await dump_database(database_url)
    assert first == await dump_database(database_url)
    assert "CREATE OR REPLACE FUNCTION workflow_streams.append_requests(" in first
