"""A fingerprint of the data of some tenants, to prove that a refused request changed
nothing. Only those tenants' rows are compared (every data table has a ``stream_pk``,
or, for a tenant's own counts, a ``tenant``): other tests' background workers may be at
work on their own tenants meanwhile.

One column is left out: ``streams.watched_until``, the lease by which a live follower
asks appends to notify. Any subscribe that starts following sets it,
successful or not; it is no stream data and no answer depends on it."""

from __future__ import annotations

import asyncpg

_TABLES = """
SELECT c.relname,
       EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = c.oid AND a.attname = 'stream_pk' AND NOT a.attisdropped)
         AS has_stream,
       EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = c.oid AND a.attname = 'tenant' AND NOT a.attisdropped)
         AS has_tenant
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'workflow_streams' AND c.relkind = 'r' ORDER BY c.relname
"""
_HASH = "SELECT count(*) AS n, coalesce(md5(string_agg({row}, '|' ORDER BY {row})), '') AS h"
_ROW = "t::text"
_STREAM_ROW = "(to_jsonb(t) - 'watched_until')::text"


async def fingerprint(pool: asyncpg.Pool, *tenants: str) -> dict[str, tuple[int, str]]:
    """(row count, md5 of every row's text) per table, for ``tenants``' streams (all
    rows of tables that belong to no stream, such as schema_migrations)."""
    assert tenants, "name the tenants whose data must not change"
    async with pool.acquire() as conn:
        result: dict[str, tuple[int, str]] = {}
        for table in await conn.fetch(_TABLES):
            name = table["relname"]
            if name == "streams" or table["has_tenant"]:
                where, args = " WHERE t.tenant = ANY($1::text[])", [list(tenants)]
            elif table["has_stream"]:
                where = (
                    " WHERE t.stream_pk IN (SELECT stream_pk FROM workflow_streams.streams"
                    " WHERE tenant = ANY($1::text[]))"
                )
                args = [list(tenants)]
            else:
                where, args = "", []
            text = _STREAM_ROW if name == "streams" else _ROW
            row = await conn.fetchrow(
                f"{_HASH.format(row=text)} FROM workflow_streams.{name} t{where}", *args
            )
            result[name] = (row["n"], row["h"])
        return result
