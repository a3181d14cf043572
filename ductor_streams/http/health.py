"""Liveness and readiness, at the server root (not under the API mount)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from ductor_streams.errors import StreamsError
from ductor_streams.http.codec import json_response
from ductor_streams.schema.migrate import is_current


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
    """The database answers and every migration is applied."""
    try:
        async with request.app.state.store.pool.acquire() as conn:
            current = await is_current(conn)
    except (OSError, TimeoutError) as exc:
        raise NotReady("the database is unreachable") from exc
    if not current:
        raise NotReady("migrations are pending: run `ductor-streams migrate`")
    return json_response({"status": "ready"})


ROUTES = [healthz, readyz]
