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
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from ductor_streams.auth import Principal
from ductor_streams.compat.uvicorn_protocol import note_tenant
from ductor_streams.errors import (
    ClientGone,
    Forbidden,
    InvalidInput,
    MethodNotAllowed,
    NotFound,
    StreamsError,
)
from ductor_streams.http.access import authenticate
from ductor_streams.http.codecs.headers import NOSNIFF, SANDBOX
from ductor_streams.http.codecs.problems import PROBLEM_JSON, error_for, problem_parts
from ductor_streams.http.middleware.live_reads import LiveRead, LiveReads
from ductor_streams.http.middleware.write_budget import BudgetedBody, send_pieces
from ductor_streams.names import API_MOUNT
from ductor_streams.runtime import Runtime

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

DS_PATH = re.compile(re.escape(API_MOUNT) + r"/runs/([^/]+)/ds/v1/stream/([^/]+)")
# The route DS requests are observed as (metrics, spans: http/middleware/observe.py).
DS_TEMPLATE = API_MOUNT + "/runs/{run_id}/ds/v1/stream/{stream_id}"
ALLOW = "GET, HEAD, POST, PUT, OPTIONS"
NO_STORE = "no-store"
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    NOSNIFF,
    SANDBOX,
    (b"cross-origin-resource-policy", b"cross-origin"),
)


@dataclass
class Reply:
    """A DS answer: status, headers (names as the protocol spells them) and body; or, for
    a catch-up page larger than a piece, its ``pieces`` (``body`` is then empty), sent
    under the write budget (http/middleware/write_budget.py) with ``release`` run when done."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    pieces: AsyncIterator[bytes] | None = None
    release: Callable[[], None] | None = None


class Refusal(Exception):
    """A domain error with the DS headers its answer carries (e.g. ``Stream-Closed``)."""

    def __init__(self, error: StreamsError, headers: dict[str, str]) -> None:
        super().__init__(error.detail)
        self.error = error
        self.headers = headers


@dataclass(frozen=True)
class Request:
    """What the DS handlers need of one request."""

    runtime: Runtime
    scope: Scope
    receive: Receive
    run_id: str
    stream_id: str
    headers: dict[str, str]
    query: list[tuple[str, str]]
    # The process's count of live reads per tenant; None: live reads are not capped.
    live_reads: LiveReads | None = None

    @property
    def path(self) -> str:
        return str(self.scope["path"])

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def param(self, name: str) -> str | None:
        """The query parameter's value; InvalidInput when it is given twice."""
        values = [v for k, v in self.query if k == name]
        if len(values) > 1:
            raise InvalidInput(f"the query parameter {name!r} is given more than once")
        return values[0] if values else None

    def authenticate(self, scope: str) -> Principal:
        principal = authenticate(
            self.scope["headers"],
            self.run_id,
            scope,
            self.runtime.settings.require_jwt_secret(),
        )
        note_tenant(self.scope, principal.tenant)
        return principal

    def live_read(self, principal: Principal) -> LiveRead | None:
        """A place for one live read of the principal's tenant (None when uncapped);
        TooManyLiveReads past the tenant's limit (http/middleware/live_reads.py)."""
        return None if self.live_reads is None else self.live_reads.enter(principal.tenant)


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
    # Imported here: the handler modules import this one.
    from ductor_streams.http.fronts.ds import reads, sse, writes

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


def problem_reply(exc: Exception, path: str) -> Reply:
    extra: dict[str, str] = {}
    if isinstance(exc, Refusal):
        extra = exc.headers
        exc = exc.error
    status, body, headers = problem_parts(error_for(exc, path), path)
    return Reply(
        status,
        {"Content-Type": PROBLEM_JSON, "Cache-Control": NO_STORE, **headers, **extra},
        body,
    )


def require_admin(principal: Principal) -> None:
    if not principal.has("streams:admin"):
        raise Forbidden("closing a stream needs the scope 'streams:admin'")


def not_found(stream_id: str) -> NotFound:
    return NotFound(f"stream {stream_id!r} does not exist")


def response_start(status: int, headers: dict[str, str], length: int | None) -> dict[str, Any]:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    if length is not None:
        raw.append((b"content-length", str(length).encode()))
    raw.extend(SECURITY_HEADERS)
    return {"type": "http.response.start", "status": status, "headers": raw}


async def respond(send: Send, reply: Reply, *, head: bool = False) -> None:
    body = reply.body
    no_body = reply.status in (204, 304)
    await send(response_start(reply.status, reply.headers, None if no_body else len(body)))
    await send({"type": "http.response.body", "body": b"" if head or no_body else body})
