"""One baseline migration, and databases migrated before it: a fresh database gets the
baseline; a database the whole old numbered chain made is recorded as at the baseline
without running anything, and is then the schema of schema/schema.sql; a database that
ran part of the old chain is refused, by the runner and by `ductor-streams migrate`."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import asyncpg
import pytest

from ductor_streams.config import Settings
from ductor_streams.process.doctor import decisions
from ductor_streams.process.doctor.checks import Context, check_migrations
from ductor_streams.schema.legacy import LEGACY_CHAIN, LegacyChainIncomplete
from ductor_streams.schema.migrate import (
    MIGRATIONS_DIR,
    applied_rows,
    applied_versions,
    available_migrations,
    migrate,
)
from tests.support.legacy_chain import build_legacy_database, legacy_files
from tests.support.schema_dump import SCHEMA_FILE, dump_database, server_major
from tests.support.server import settings_env

PARTIAL_REFUSAL = (
    "legacy-chain-incomplete: the database was migrated by the numbered chain that came "
    "before the baseline and stopped at 0024_ds_producer_cap (19 of its 28 migrations; "
    "first missing 0033_keyed_groups_in_one_pass). This release recognises only a "
    "database that ran the whole chain, through 0041_record_fingerprint. Run "
    "`ductor-streams migrate` of a build from before the baseline against it first, then "
    "this one again; or recreate the database empty (its streams are lost) and migrate it."
)
ADOPTED_LINE = (
    "recorded 0001_baseline: the database ran the whole pre-baseline chain, which made "
    "the same schema"
)


async def _rows(dsn: str) -> list[tuple[int, str]]:
    conn = await asyncpg.connect(dsn)
    try:
        return await applied_rows(conn)
    finally:
        await conn.close()


async def _versions(dsn: str) -> list[int]:
    conn = await asyncpg.connect(dsn)
    try:
        return await applied_versions(conn)
    finally:
        await conn.close()


def _current_rows() -> list[tuple[int, str]]:
    return [(m.version, m.name) for m in available_migrations()]


def test_the_schema_starts_from_one_baseline():
    """The first migration is the baseline, and it defines each function once (with
    CREATE, not CREATE OR REPLACE, so a second definition would fail to apply)."""
    first = available_migrations()[0]
    assert (first.version, first.name) == (1, "baseline")
    sql = first.sql()
    assert "CREATE OR REPLACE" not in sql
    signatures = re.findall(r"^CREATE FUNCTION (workflow_streams\.\w+\([^)]*\))", sql, re.M)
    assert len(signatures) == 15
    assert len(set(signatures)) == len(signatures)
    assert sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql"))[0] == "0001_baseline.sql"


def test_the_runner_knows_the_old_chain_the_fixture_holds():
    assert [(v, n) for v, n, _ in legacy_files()] == list(LEGACY_CHAIN)


@pytest.mark.parametrize("pooled", [False, True], ids=["session-lock", "pooled"])
async def test_a_fresh_database_gets_the_baseline(test_database, pooled):
    dsn, drop = await asyncio.to_thread(test_database.fresh)
    try:
        applied = await migrate(dsn, pooled=pooled)
        assert [(m.version, m.name, m.adopted) for m in applied] == [
            (m.version, m.name, False) for m in available_migrations()
        ]
        assert await _rows(dsn) == _current_rows()
    finally:
        await asyncio.to_thread(drop)


@pytest.mark.parametrize("pooled", [False, True], ids=["session-lock", "pooled"])
async def test_a_database_of_the_whole_old_chain_is_at_the_baseline(test_database, pooled):
    legacy_dsn, drop_legacy = await asyncio.to_thread(test_database.fresh)
    fresh_dsn, drop_fresh = await asyncio.to_thread(test_database.fresh)
    try:
        assert await build_legacy_database(legacy_dsn) == list(LEGACY_CHAIN)
        # Before it is migrated again it already reads as at the baseline (/readyz).
        assert await _versions(legacy_dsn) == [1]
        doctor = await check_migrations(Context(Settings(database_url=legacy_dsn)))
        available = available_migrations()
        assert doctor == decisions.migrations(
            [m.version for m in available], [1], {m.version: m.name for m in available}
        )
        conn = await asyncpg.connect(legacy_dsn)
        try:
            # Data that recording the baseline keeps (nothing is re-created).
            await conn.execute(
                "INSERT INTO workflow_streams.streams (tenant, run_id, stream_id, direction,"
                " definition) VALUES ('t', 'r', 's', 'output', '{}')"
            )
        finally:
            await conn.close()

        applied = await migrate(legacy_dsn, pooled=pooled)
        assert [(m.version, m.name, m.adopted) for m in applied] == [(1, "baseline", True)] + [
            (m.version, m.name, False) for m in available_migrations()[1:]
        ]
        assert await _rows(legacy_dsn) == _current_rows()
        assert await migrate(legacy_dsn, pooled=pooled) == []

        await migrate(fresh_dsn)
        adopted = await dump_database(legacy_dsn)
        assert adopted == await dump_database(fresh_dsn)
        on_file = await asyncio.to_thread(SCHEMA_FILE.read_text, encoding="utf-8")
        if server_major(on_file) == server_major(adopted):
            assert adopted == on_file
        conn = await asyncpg.connect(legacy_dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM workflow_streams.streams") == 1
            assert await conn.fetchval("SELECT streams FROM workflow_streams.tenant_streams") == 1
        finally:
            await conn.close()
    finally:
        await asyncio.to_thread(drop_legacy)
        await asyncio.to_thread(drop_fresh)


@pytest.mark.parametrize("pooled", [False, True], ids=["session-lock", "pooled"])
async def test_part_of_the_old_chain_is_refused(test_database, pooled):
    dsn, drop = await asyncio.to_thread(test_database.fresh)
    try:
        built = await build_legacy_database(dsn, through=24)
        assert built[-1] == (24, "ds_producer_cap") and len(built) == 19
        # It is at none of this code's versions: not current, so /readyz stays 503.
        assert await _versions(dsn) == []
        with pytest.raises(LegacyChainIncomplete) as refused:
            await migrate(dsn, pooled=pooled)
        assert str(refused.value) == PARTIAL_REFUSAL
        assert refused.value.code == "legacy-chain-incomplete"
        assert await _rows(dsn) == built  # nothing recorded, nothing run
        assert await _versions(dsn) == []
        # `doctor` says the same rather than "run migrate".
        doctor = await check_migrations(Context(Settings(database_url=dsn)))
        assert doctor == ("fail", PARTIAL_REFUSAL)
    finally:
        await asyncio.to_thread(drop)


async def _cli_migrate(env: dict[str, str], processes: int) -> list[tuple[int, str, str]]:
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
        for _ in range(processes)
    ]
    outputs = [await p.communicate() for p in procs]
    return [
        (p.returncode or 0, out.decode(), err.decode())
        for p, (out, err) in zip(procs, outputs, strict=True)
    ]


async def test_the_cli_records_the_baseline_once_for_the_whole_old_chain(test_database, settings):
    """Two `migrate` at once on a database of the old chain: one records the baseline,
    the other, serialised behind it, finds the migrations current."""
    dsn, drop = await asyncio.to_thread(test_database.fresh)
    try:
        await build_legacy_database(dsn)
        env = {**settings_env(settings), "DUCTOR_STREAMS_DATABASE_URL": dsn}
        results = await _cli_migrate(env, 2)
        assert [code for code, _, _ in results] == [0, 0], results
        later = "".join(f"applied {v:04d}_{n}\n" for v, n in _current_rows()[1:])
        assert sorted(out for _, out, _ in results) == sorted(
            [f"{ADOPTED_LINE}\n{later}", "migrations are current\n"]
        )
        assert await _rows(dsn) == _current_rows()
    finally:
        await asyncio.to_thread(drop)


async def test_the_cli_refuses_part_of_the_old_chain(test_database, settings):
    dsn, drop = await asyncio.to_thread(test_database.fresh)
    try:
        built = await build_legacy_database(dsn, through=24)
        env = {**settings_env(settings), "DUCTOR_STREAMS_DATABASE_URL": dsn}
        [(code, out, err)] = await _cli_migrate(env, 1)
        assert (code, out, err) == (1, "", f"ductor-streams migrate: {PARTIAL_REFUSAL}\n")
        assert await _rows(dsn) == built
    finally:
        await asyncio.to_thread(drop)
