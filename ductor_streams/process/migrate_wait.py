"""``migrate --wait``: a migration job started together with its database (a compose
file, a Kubernetes Job beside a fresh Postgres) retries while Postgres cannot be reached
yet, instead of failing at once and relying on the engine to restart it (some engines,
podman-compose among them, start services in order but do not wait for health)."""

from __future__ import annotations

import asyncio
import sys
import time

from ductor_streams.schema.migrate import Migration, migrate
from ductor_streams.store.db import database_unavailable


async def migrate_when_reachable(
    dsn: str, wait_seconds: float, *, pooled: bool = False
) -> list[Migration]:
    """``migrate(dsn, pooled=pooled)``, retried every second while the database is
    unavailable (refused, starting up, in recovery), for at most ``wait_seconds``; any
    other error at once."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return await migrate(dsn, pooled=pooled)
        except Exception as exc:
            if not database_unavailable(exc) or time.monotonic() >= deadline:
                raise
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
            print(f"ductor-streams migrate: waiting for Postgres ({reason})", file=sys.stderr)
            await asyncio.sleep(1.0)
