"""What the DS endpoint's modules share: the request and reply, the refusal that carries
protocol headers, the one error mapping (``problem_reply``) and the response writers.
The way in (routing, dispatch to ``writes``, ``reads`` and ``sse``) is front.py."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ductor_streams.auth import Principal
from ductor_streams.compat.uvicorn_protocol import note_tenant
from ductor_streams.errors import (
    Forbidden,
    InvalidInput,
    NotFound,
    StreamsError,
)
from ductor_streams.http.access import authenticate
from ductor_streams.http.codecs.headers import NOSNIFF, SANDBOX
from ductor_streams.http.codecs.problems import PROBLEM_JSON, error_for, problem_parts
from ductor_streams.http.middleware.live_reads import LiveRead, LiveReads
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
