"""Migrations: a migrated empty database holds what the code expects; the runner is safe
to run twice and from two processes at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import asyncpg

from ductor_streams.schema import QUERIES
from ductor_streams.schema.migrate import applied_versions, available_migrations, migrate
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
                "ductor_streams.cli",
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
