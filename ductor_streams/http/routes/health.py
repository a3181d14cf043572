"""Liveness and readiness, at the server root (not under the API mount)."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Request, Response, get

from ductor_streams.errors import StreamsError
from ductor_streams.http.codecs.json_bodies import json_response
from ductor_streams.http.state import runtime_of
from ductor_streams.schema import QUERIES
from ductor_streams.schema.migrate import is_current
from ductor_streams.store.db import database_unavailable, replace_pooled_connections

# A readiness probe answers within this many seconds: a database that takes longer to
# hand out a connection and answer one query is not ready (a partition must not hang
# the probe until the connect timeout).
READY_TIMEOUT_SECONDS = 2.0


class NotReady(StreamsError):
    """The service is not ready."""

    code = "not_ready"
    status = 503


@get("/healthz", exclude_from_auth=True)
async def healthz() -> Response[bytes]:
    """The process is up."""
    return json_response({"status": "ok"})


@get("/readyz", exclude_from_auth=True)
async def readyz(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The database answers, takes writes, and every migration is applied.

    Not ready (503) while the database is unreachable, restarting, in recovery or
    read-only (no writable primary during a failover); ready again once the pool
    reconnects, without a restart of this process.
    """
    try:
        async with asyncio.timeout(READY_TIMEOUT_SECONDS):
            async with runtime_of(request).pool.acquire() as conn:
                writable = await conn.fetchval(QUERIES["health_takes_writes"])
                current = await is_current(conn)
    except TimeoutError as exc:
        raise NotReady("the database does not answer") from exc
    except Exception as exc:
        if not database_unavailable(exc):
            raise
        raise NotReady("the database is unreachable") from exc
    if not writable:
        # A connection to what is now a standby (an endpoint that has not moved yet, or
        # one opened before the failover): the pools replace theirs, as after a 25006.
        replace_pooled_connections()
        raise NotReady("the database takes no writes (a standby, or a failover under way)")
    if not current:
        raise NotReady("migrations are pending: run `ductor-streams migrate`")
    return json_response({"status": "ready"})


ROUTES = [healthz, readyz]
