"""The DS endpoint's way in: routing, authentication, the one error mapping, responses.

Like the records front (http/fronts/records.py), DS requests are answered before
Litestar, as plain ASGI: appends and reads are the hot path, and the protocol's exact
headers (Content-Type of the stream, caching, no ``Cache-Control: no-store`` on
catch-up reads) are ours to write. The routes are not in the OpenAPI document; the
protocol has its own specification (docs/durable-streams.md).

Access is the native API's: the bearer token, the run's visibility and the stream's
lists (401, 404, 403 problems in that order); PUT needs ``streams:admin``, POST
``streams:write`` (and ``streams:admin`` to close), GET and HEAD ``streams:read``.
Every answer, errors too, carries ``X-Content-Type-Options: nosniff``,
``Content-Security-Policy: default-src 'none'; sandbox`` (a stream's media type is
its creator's: ``text/html`` or ``image/svg+xml`` is served as such, and must run
nothing in this origin) and ``Cross-Origin-Resource-Policy: cross-origin``.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

from ductor_streams.errors import ClientGone, MethodNotAllowed
from ductor_streams.http.fronts.ds import reads, sse, writes
from ductor_streams.http.fronts.ds.protocol import (
    ALLOW,
    DS_PATH,
    DS_TEMPLATE,
    NO_STORE,
    Receive,
    Refusal,
    Reply,
    Request,
    Scope,
    Send,
    problem_reply,
    respond,
    response_start,
)
from ductor_streams.http.middleware.live_reads import LiveReads
from ductor_streams.http.middleware.write_budget import BudgetedBody, send_pieces
from ductor_streams.runtime import Runtime

__all__ = ["DS_TEMPLATE", "answer_ds", "ds_route"]


def ds_route(scope: Scope) -> re.Match[str] | None:
    """The path's match when it is a DS stream URL (groups: run and stream ids)."""
    return DS_PATH.fullmatch(scope["path"])


async def answer_ds(
    runtime: Runtime,
    scope: Scope,
    receive: Receive,
    send: Send,
    route: re.Match[str],
    *,
    live_reads: LiveReads | None = None,
) -> None:
    """Answer one DS request (``route`` is what ``ds_route`` matched); ``live_reads``
    caps each tenant's SSE and long-polls (http/middleware/live_reads.py)."""
    headers: dict[str, str] = {}
    for key, value in scope["headers"]:
        headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
    request = Request(
        runtime,
        scope,
        receive,
        route.group(1),
        route.group(2),
        headers,
        parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True),
        live_reads,
    )
    method = scope["method"]
    try:
        if method == "OPTIONS":
            # A preflight carries no credentials; whatever CORS allows is added around us.
            reply = Reply(204, {"Allow": ALLOW, "Cache-Control": NO_STORE})
        elif method == "PUT":
            reply = await writes.create(request)
        elif method == "POST":
            reply = await writes.append(request)
        elif method == "HEAD":
            reply = await reads.head(request)
        elif method == "GET":
            if request.param("live") == "sse":
                await sse.stream(request, send)
                return
            reply = await reads.read(request)
        else:
            # DELETE too: streams live as long as their run (docs/durable-streams.md).
            raise Refusal(MethodNotAllowed(f"{method} is not supported here"), {"Allow": ALLOW})
    except ClientGone:
        return
    except Exception as exc:  # the one mapping for every error of this endpoint
        reply = problem_reply(exc, request.path)
    if reply.pieces is not None:
        body = BudgetedBody(
            reply.pieces,
            scope,
            stall_seconds=runtime.settings.read_stall_seconds,
            route="ds",
            on_end=reply.release,
        )
        await send(response_start(reply.status, reply.headers, None))
        await send_pieces(send, body)
        return
    await respond(send, reply, head=method == "HEAD")
