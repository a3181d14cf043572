"""The migration runner: applies ``migrations/NNNN_name.sql`` in order, once each.

``0001_baseline`` makes the whole schema; later changes are further numbered files on
top of it. A database migrated by the numbered chain that came before the baseline is
recognised under the lock before anything runs (``legacy.py``): the whole chain counts
as the baseline, part of it is refused.

Safe to run from several processes at once: a session advisory lock serialises
runners, and each migration commits together with its ``schema_migrations`` row.

Through a transaction pooler (``pooled``) a session lock would be taken and released on
whichever server sessions the pooler picks, so it would serialise nothing: each
migration's transaction takes a transaction-level advisory lock instead and checks
again, under it, whether another runner applied the migration meanwhile. The CLI uses
that only when no direct connection is configured (``DUCTOR_STREAMS_DIRECT_DATABASE_URL``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import asyncpg

from ductor_streams.schema.legacy import (
    BASELINE,
    LegacyChainIncomplete,
    LegacyState,
    is_legacy_row,
    legacy_state,
)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Any fixed 64-bit number; it only has to be the same in every runner.
_LOCK_KEY = 0x64756374_6D696772  # "duct" "migr"

_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS workflow_streams;
CREATE TABLE IF NOT EXISTS workflow_streams.schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True)
class Migration:
    """One numbered SQL file. ``adopted``: in what ``migrate`` returns, the baseline
    recorded for a database the pre-baseline chain had already brought to it (its SQL
    did not run)."""

    version: int
    name: str
    path: Path
    adopted: bool = False

    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")


def available_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Every migration file, in version order."""
    found = []
    for path in directory.iterdir():
        match = _FILE.match(path.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), path))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version in {directory}")
    return found


async def applied_rows(conn: asyncpg.Connection) -> list[tuple[int, str]]:
    """``(version, name)`` of every row of ``schema_migrations``, as stored (empty when
    the schema does not exist yet)."""
    exists = await conn.fetchval("SELECT to_regclass('workflow_streams.schema_migrations')")
    if exists is None:
        return []
    rows = await conn.fetch(
        "SELECT version, name FROM workflow_streams.schema_migrations ORDER BY version"
    )
    return [(r["version"], r["name"]) for r in rows]


async def applied_versions(conn: asyncpg.Connection) -> list[int]:
    """Versions of this code's numbering already applied (empty when the schema does
    not exist yet). A database that ran the whole pre-baseline chain and has not been
    migrated since reads as at the baseline, which it is; part of that chain counts for
    nothing (``migrate`` refuses such a database)."""
    rows = await applied_rows(conn)
    state = legacy_state(rows)
    versions = {version for version, name in rows if not is_legacy_row((version, name))}
    if state is LegacyState.COMPLETE:
        versions.add(BASELINE[0])
    return sorted(versions)


async def migrate(dsn: str, *, pooled: bool = False) -> list[Migration]:
    """Apply every pending migration; return the ones this call applied.

    ``pooled``: ``dsn`` goes through a transaction pooler (the module docstring): no
    named prepared statements, and a lock per migration's transaction.
    """
    if pooled:
        # Named statements would land on other server sessions (store/db.py).
        conn = await asyncpg.connect(dsn, statement_cache_size=0)
    else:
        conn = await asyncpg.connect(dsn)
    try:
        if pooled:
            return await _migrate_locking_each(conn)
        return await _migrate_locked(conn)
    finally:
        await conn.close()


async def _migrate_locked(conn: asyncpg.Connection) -> list[Migration]:
    """Every pending migration under one session lock (a direct or session connection)."""
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        async with conn.transaction():
            await conn.execute(_BOOTSTRAP)
            adopted = await _adopt_legacy_chain(conn)
        done = set(await applied_versions(conn))
        applied = adopted
        for migration in available_migrations():
            if migration.version in done:
                continue
            async with conn.transaction():
                await _apply(conn, migration)
            applied.append(migration)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)


async def _migrate_locking_each(conn: asyncpg.Connection) -> list[Migration]:
    """Every pending migration, each in a transaction that holds the lock until it
    commits (a transaction pooler keeps a transaction on one server session)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        await conn.execute(_BOOTSTRAP)
        adopted = await _adopt_legacy_chain(conn)
    done = set(await applied_versions(conn))
    applied = adopted
    for migration in available_migrations():
        if migration.version in done:
            continue
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            if migration.version in set(await applied_versions(conn)):
                continue  # another runner applied it while this one waited
            await _apply(conn, migration)
        applied.append(migration)
    return applied


async def _adopt_legacy_chain(conn: asyncpg.Connection) -> list[Migration]:
    """Under the lock, in the caller's transaction: a database the whole pre-baseline
    chain made gets the baseline's row in place of the chain's (the schema is already
    the baseline's, so nothing runs); one made by part of the chain is refused. Returns
    the baseline, marked adopted, when this call recorded it."""
    rows = await applied_rows(conn)
    state = legacy_state(rows)
    if state is LegacyState.NONE:
        return []
    if state is LegacyState.PARTIAL:
        raise LegacyChainIncomplete(rows)
    legacy = [row for row in rows if is_legacy_row(row)]
    await conn.execute(
        "DELETE FROM workflow_streams.schema_migrations WHERE version = ANY($1::integer[])",
        [version for version, _ in legacy],
    )
    baseline = next(m for m in available_migrations() if (m.version, m.name) == BASELINE)
    await conn.execute(
        "INSERT INTO workflow_streams.schema_migrations (version, name) VALUES ($1, $2)",
        baseline.version,
        baseline.name,
    )
    return [replace(baseline, adopted=True)]


async def _apply(conn: asyncpg.Connection, migration: Migration) -> None:
    """One migration and its ``schema_migrations`` row (inside the caller's transaction)."""
    await conn.execute(migration.sql())
    await conn.execute(
        "INSERT INTO workflow_streams.schema_migrations (version, name) VALUES ($1, $2)",
        migration.version,
        migration.name,
    )


async def is_current(conn: asyncpg.Connection) -> bool:
    """True when every available migration has been applied."""
    wanted = {m.version for m in available_migrations()}
    return wanted <= set(await applied_versions(conn))
