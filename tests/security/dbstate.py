"""A fingerprint of everything in the ``workflow_streams`` schema, to prove that a
refused request changed nothing."""

from __future__ import annotations

import asyncpg

_TABLES = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'workflow_streams' AND c.relkind = 'r' ORDER BY c.relname
"""


async def fingerprint(pool: asyncpg.Pool) -> dict[str, tuple[int, str]]:
    """(row count, md5 of every row's text) per table of the schema."""
    async with pool.acquire() as conn:
        tables = [r["relname"] for r in await conn.fetch(_TABLES)]
        result: dict[str, tuple[int, str]] = {}
        for table in tables:
            row = await conn.fetchrow(
                "SELECT count(*) AS n,"
                " coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') AS h"
                f" FROM workflow_streams.{table} t"
            )
            result[table] = (row["n"], row["h"])
        return result
