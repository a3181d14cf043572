"""Databases as the numbered migration chain before the baseline left them.

``legacy_migrations/`` holds that chain's files as they were, for tests only: the
runner of those days applied each in its own transaction together with its
``schema_migrations`` row, and ``build_legacy_database`` does the same, so a test can
start from a database migrated by the old chain (all of it, or the first few files).
"""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg

LEGACY_DIR = Path(__file__).with_name("legacy_migrations")
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

# The old runner's bootstrap, word for word.
_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS workflow_streams;
CREATE TABLE IF NOT EXISTS workflow_streams.schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


def legacy_files() -> list[tuple[int, str, Path]]:
    """``(version, name, path)`` of every file of the old chain, in version order."""
    found = []
    for path in LEGACY_DIR.iterdir():
        match = _FILE.match(path.name)
        if match:
            found.append((int(match.group(1)), match.group(2), path))
    return sorted(found)


async def build_legacy_database(dsn: str, *, through: int | None = None) -> list[tuple[int, str]]:
    """Migrate the empty database ``dsn`` with the old chain, up to and including
    version ``through`` (all of it when None); return the ``(version, name)`` rows."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(_BOOTSTRAP)
        rows = []
        for version, name, path in legacy_files():
            if through is not None and version > through:
                break
            async with conn.transaction():
                await conn.execute(path.read_text(encoding="utf-8"))
                await conn.execute(
                    "INSERT INTO workflow_streams.schema_migrations (version, name) "
                    "VALUES ($1, $2)",
                    version,
                    name,
                )
            rows.append((version, name))
        return rows
    finally:
        await conn.close()
