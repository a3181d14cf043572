"""The current schema as one SQL file, read back from a migrated database's catalog.

A development tool (``make schema`` and the schema test use it), kept out of the
``ductor_streams`` package: it writes DDL text from catalog names, which the runtime
never does (tests/security/test_sql_injection.py holds the package to constant SQL).

``schema/schema.sql`` is this module's output for a database that has run every
migration: each table, constraint, index, view, trigger and function of the
``workflow_streams`` schema, functions with their current bodies. It is generated, never
edited by hand: ``make schema`` writes it, and ``tests/foundation/test_schema.py`` fails
when the migrations and the file disagree. Reading it is the way to learn what the
database does today (for example what ``append_requests`` decides) without replaying
the baseline and every migration after it in one's head.

The catalog is read with ``pg_get_*def`` functions rather than ``pg_dump`` so that the
output does not depend on a ``pg_dump`` binary matching the server's major version, and
so that it holds no volatile lines (no dump timestamps, no ``SET`` preamble, no owners).
Objects are written in a fixed order (tables by name, foreign keys, indexes, views,
functions, triggers), so that the file also applies as is to an empty database.
"""

from __future__ import annotations

from pathlib import Path

import asyncpg

SCHEMA = "workflow_streams"
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "ductor_streams" / "schema" / "schema.sql"
REGENERATE = "make schema"

HEADER = f"""\
-- The current {SCHEMA} schema: what every migration in schema/migrations/ adds up to.
-- Generated from a freshly migrated database by `{REGENERATE}`; do not edit by hand.
-- A migration changes the schema; this file only shows the result in one place."""

# Postgres words a view's query a little differently from one major version to the next
# (16 stopped qualifying columns of a single-table query), so the file says which one
# wrote it; tests/foundation/test_schema.py compares it word for word only on that one.
SERVER_LINE = "-- Read from Postgres {major}."

_TABLES = """
SELECT c.oid, c.relname, c.relpersistence, c.reloptions
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
 ORDER BY c.relname
"""

_COLUMNS = """
SELECT a.attname,
       format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull,
       a.attidentity::text AS attidentity,
       a.attgenerated::text AS attgenerated,
       pg_get_expr(d.adbin, d.adrelid) AS default_expr,
       CASE WHEN a.attcollation <> t.typcollation
            THEN (SELECT quote_ident(collname) FROM pg_collation WHERE oid = a.attcollation)
       END AS collation
  FROM pg_attribute a
  JOIN pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
"""

# NOT NULL constraints are written on their columns (Postgres 18 also catalogs them as
# constraints of type 'n'; older servers do not), so both give the same file.
_CONSTRAINTS = """
SELECT conname, contype::text AS contype, pg_get_constraintdef(oid, true) AS definition
  FROM pg_constraint
 WHERE conrelid = $1 AND contype <> 'n'
 ORDER BY CASE contype WHEN 'p' THEN 0 WHEN 'u' THEN 1 WHEN 'c' THEN 2 ELSE 3 END, conname
"""

_INDEXES = """
SELECT ic.relname, pg_get_indexdef(i.indexrelid) AS definition
  FROM pg_index i
  JOIN pg_class ic ON ic.oid = i.indexrelid
  JOIN pg_class tc ON tc.oid = i.indrelid
  JOIN pg_namespace n ON n.oid = tc.relnamespace
 WHERE n.nspname = $1
   AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
 ORDER BY ic.relname
"""

_VIEWS = """
SELECT c.relname, pg_get_viewdef(c.oid, true) AS definition
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relkind = 'v'
 ORDER BY c.relname
"""

_FUNCTIONS = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args,
       pg_get_functiondef(p.oid) AS definition
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = $1
 ORDER BY p.proname, args
"""

_TRIGGERS = """
SELECT t.tgname, c.relname, pg_get_triggerdef(t.oid, true) AS definition
  FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND NOT t.tgisinternal
 ORDER BY c.relname, t.tgname
"""

# Every object in the schema must be one of the kinds above; anything else (a type, a
# free-standing sequence, a materialized view) would be left out of the file silently.
_UNCOVERED = """
SELECT 'relation ' || c.relname::text || ' (relkind ' || c.relkind::text || ')'
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1
   AND c.relkind NOT IN ('r', 'p', 'v', 'i', 't')
   AND NOT (c.relkind = 'S' AND EXISTS (
         SELECT 1 FROM pg_depend d
          WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'i'))
UNION ALL
SELECT 'type ' || t.typname::text
  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE n.nspname = $1 AND t.typtype IN ('e', 'd', 'r', 'm')
UNION ALL
SELECT 'composite type ' || t.typname::text
  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
  JOIN pg_class c ON c.oid = t.typrelid
 WHERE n.nspname = $1 AND t.typtype = 'c' AND c.relkind = 'c'
ORDER BY 1
"""


def server_major(schema_text: str) -> int | None:
    """The Postgres major version a schema file says it was read from."""
    for line in schema_text.splitlines()[:10]:
        prefix, _, rest = line.partition("-- Read from Postgres ")
        if not prefix and rest.rstrip(".").isdigit():
            return int(rest.rstrip("."))
    return None


def _ident(name: str) -> str:
    """A simple identifier as is, anything else double-quoted (like quote_ident)."""
    if name.isidentifier() and name == name.lower() and name.isascii():
        return name
    return '"' + name.replace('"', '""') + '"'


def _column(row: asyncpg.Record) -> str:
    parts = [_ident(row["attname"]), row["type"]]
    if row["collation"]:
        parts.append(f"COLLATE {row['collation']}")
    if row["attidentity"] == "a":
        parts.append("GENERATED ALWAYS AS IDENTITY")
    elif row["attidentity"] == "d":
        parts.append("GENERATED BY DEFAULT AS IDENTITY")
    elif row["attgenerated"] == "s":
        parts.append(f"GENERATED ALWAYS AS ({row['default_expr']}) STORED")
    elif row["default_expr"] is not None:
        parts.append(f"DEFAULT {row['default_expr']}")
    if row["attnotnull"]:
        parts.append("NOT NULL")
    return " ".join(parts)


async def _table(
    conn: asyncpg.Connection, oid: int, name: str, unlogged: bool, options: list[str] | None
) -> tuple[str, list[str]]:
    """The table's CREATE statement and its foreign keys as ALTER statements.

    Foreign keys come after every table (as in pg_dump) so that the file applies in
    order whatever the tables' names.
    """
    table = f"{SCHEMA}.{_ident(name)}"
    lines = [_column(r) for r in await conn.fetch(_COLUMNS, oid)]
    foreign: list[str] = []
    for r in await conn.fetch(_CONSTRAINTS, oid):
        constraint = f"CONSTRAINT {_ident(r['conname'])} {r['definition']}"
        if r["contype"] == "f":
            foreign.append(f"ALTER TABLE {table}\n    ADD {constraint};")
        else:
            lines.append(constraint)
    body = ",\n".join("    " + line for line in lines)
    kind = "UNLOGGED TABLE" if unlogged else "TABLE"
    # Storage parameters, e.g. the fillfactor of streams.
    storage = f" WITH ({', '.join(sorted(options))})" if options else ""
    return f"CREATE {kind} {table} (\n{body}\n){storage};", foreign


async def dump_schema(conn: asyncpg.Connection) -> str:
    """The ``workflow_streams`` schema of ``conn``'s database as deterministic SQL text."""
    uncovered = [r[0] for r in await conn.fetch(_UNCOVERED, SCHEMA)]
    if uncovered:
        unknown = ", ".join(uncovered)
        raise RuntimeError(f"tests/support/schema_dump.py does not know how to write: {unknown}")
    major = int(await conn.fetchval("SHOW server_version_num")) // 10000
    sections: list[str] = [
        HEADER + "\n" + SERVER_LINE.format(major=major),
        # Functions come in name order, and a SQL function's body is checked when it
        # is created, so one that calls a later one needs the check off (as pg_dump does).
        "SET check_function_bodies = false;",
        f"CREATE SCHEMA {SCHEMA};",
    ]

    sections.append("-- Tables")
    foreign_keys: list[str] = []
    for row in await conn.fetch(_TABLES, SCHEMA):
        create, foreign = await _table(
            conn, row["oid"], row["relname"], row["relpersistence"] == "u", row["reloptions"]
        )
        sections.append(create)
        foreign_keys += foreign
    if foreign_keys:
        sections.append("-- Foreign keys")
        sections += foreign_keys

    sections.append("-- Indexes (those behind a constraint are part of their table)")
    sections += [f"{r['definition']};" for r in await conn.fetch(_INDEXES, SCHEMA)]

    views = await conn.fetch(_VIEWS, SCHEMA)
    if views:
        sections.append("-- Views")
        for row in views:
            definition = row["definition"].rstrip().rstrip(";")
            sections.append(f"CREATE VIEW {SCHEMA}.{_ident(row['relname'])} AS\n{definition};")

    sections.append("-- Functions")
    for row in await conn.fetch(_FUNCTIONS, SCHEMA):
        sections.append(row["definition"].rstrip() + ";")

    triggers = await conn.fetch(_TRIGGERS, SCHEMA)
    if triggers:
        sections.append("-- Triggers")
        sections += [f"{r['definition']};" for r in triggers]

    text = "\n\n".join(sections) + "\n"
    # Trailing blanks inside function bodies are kept by Postgres as written; strip them
    # so that an editor's whitespace setting never shows up as a schema difference.
    return "\n".join(line.rstrip() for line in text.split("\n"))


async def dump_database(dsn: str) -> str:
    """The schema of the (already migrated) database at ``dsn``; see :func:`dump_schema`."""
    conn = await asyncpg.connect(dsn)
    try:
        return await dump_schema(conn)
    finally:
        await conn.close()
