"""Cross-origin access (CORS) for browser pages on other origins, for every route.

One layer, applied by ``StreamsApp`` (http/app.py) before anything else answers: the
records front, Litestar's routes, SSE and the Durable Streams routes all pass through it,
so no route has CORS code of its own and none can forget it.

- ``DUCTOR_STREAMS_CORS_ORIGINS`` unset: this layer is not installed; no response
  carries a CORS header and a preflight is answered like any other request.
- A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) from an
  allowed origin is answered here, 204, without a token: a browser never sends
  credentials with a preflight, so requiring one would make every cross-origin call
  with a bearer token impossible. It allows ``ALLOWED_METHODS`` and
  ``ALLOWED_REQUEST_HEADERS``.
- Every other response to an allowed origin carries ``Access-Control-Allow-Origin`` and
  ``Access-Control-Expose-Headers`` (``EXPOSED_RESPONSE_HEADERS``), errors included.
- A request from an origin that is not allowed gets no CORS header at all (so the browser
  hides the answer from the page); its preflight goes on to the routes like any request.

With a list of origins every response carries ``Vary: Origin``, even one to a request
without ``Origin``: a browser cache may otherwise hand a page the copy made for another
origin (or for none). With ``*`` the answer is the same for every origin, so every
response carries the allow header and none needs ``Vary``.

``Access-Control-Allow-Credentials`` is never sent: the API authenticates with a bearer
token in ``Authorization``, never a cookie, and a page sends that header itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]
Scope = MutableMapping[str, Any]

ANY_ORIGIN = "*"

# Every method a route answers (DELETE too: the Durable Streams routes answer it with
# an honest 405, which a page can only read if the preflight lets the request through).
ALLOWED_METHODS: tuple[str, ...] = ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS")

# Request headers a page may send beyond the CORS-safelisted ones. Content-Type is
# listed because application/json is not a "simple" type.
NATIVE_REQUEST_HEADERS: tuple[str, ...] = (
    "Authorization",
    "Content-Type",
    "Idempotency-Key",
    "Last-Event-ID",
    "If-None-Match",
    # A page's own request ID and its trace context (http/middleware/observe.py,
    # foundation/tracing.py).
    "X-Request-ID",
    "traceparent",
    "tracestate",
)
# The Durable Streams protocol's request headers (PROTOCOL.md of durable-streams), the
# ones the server refuses (TTL, expiry, forks) included: a client must be able to send
# them to read the refusal.
DS_REQUEST_HEADERS: tuple[str, ...] = (
    "Stream-Seq",
    "Stream-Closed",
    "Stream-TTL",
    "Stream-Expires-At",
    "Stream-Forked-From",
    "Stream-Fork-Offset",
    "Stream-Fork-Sub-Offset",
    "Producer-Id",
    "Producer-Epoch",
    "Producer-Seq",
)
ALLOWED_REQUEST_HEADERS: tuple[str, ...] = NATIVE_REQUEST_HEADERS + DS_REQUEST_HEADERS

# Response headers a page may read beyond the CORS-safelisted ones (Content-Type,
# Content-Length, Cache-Control, ... need no listing).
NATIVE_RESPONSE_HEADERS: tuple[str, ...] = (
    "Retry-After",
    "Location",
    "ETag",
    "Idempotent-Replayed",
    "Content-Disposition",
    "Allow",
    "X-Request-ID",
)
DS_RESPONSE_HEADERS: tuple[str, ...] = (
    "Stream-Next-Offset",
    "Stream-Up-To-Date",
    "Stream-Closed",
    "Stream-Cursor",
    "Stream-TTL",
    "Stream-Expires-At",
    "Producer-Epoch",
    "Producer-Seq",
    "Producer-Expected-Seq",
    "Producer-Received-Seq",
    "Stream-SSE-Data-Encoding",
)
EXPOSED_RESPONSE_HEADERS: tuple[str, ...] = NATIVE_RESPONSE_HEADERS + DS_RESPONSE_HEADERS

# How long a browser may reuse a preflight's answer (Chromium caps it at 2 hours).
PREFLIGHT_MAX_AGE_SECONDS = 3600

_ORIGIN = b"origin"
_REQUEST_METHOD = b"access-control-request-method"
_VARY = b"vary"
_VARY_ORIGIN = (_VARY, b"Origin")
_ALLOW_ORIGIN = b"access-control-allow-origin"
_EXPOSE = (b"access-control-expose-headers", ", ".join(EXPOSED_RESPONSE_HEADERS).encode())
_PREFLIGHT_HEADERS = (
    (b"access-control-allow-methods", ", ".join(ALLOWED_METHODS).encode()),
    (b"access-control-allow-headers", ", ".join(ALLOWED_REQUEST_HEADERS).encode()),
    (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_SECONDS).encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
)


class CorsPolicy:
    """Which origins may read the API's answers from a browser: ``origins`` as the
    settings give them (``("*",)`` for any origin; each other entry an origin like
    ``https://app.example.com``, lower-case, without a path)."""

    def __init__(self, origins: Iterable[str]) -> None:
        listed = tuple(origins)
        self.any_origin = ANY_ORIGIN in listed
        self.origins = frozenset(listed) - {ANY_ORIGIN}

    def allowed_origin(self, scope: Scope) -> bytes | None:
        """The request's ``Origin`` value when that origin is allowed, else None."""
        for name, value in scope["headers"]:
            if name == _ORIGIN:
                # Scheme and host are case-insensitive; the allow header echoes the
                # value as sent, which is what the browser compares it with.
                if self.any_origin or value.decode("latin-1").lower() in self.origins:
                    return value
                return None
        return None

    async def screen(self, scope: Scope, send: Send) -> Send | None:
        """Apply the policy to one HTTP request: None when this layer answered it (an
        allowed preflight), else the ``send`` the app must answer through."""
        origin = self.allowed_origin(scope)
        if origin is None:
            if self.any_origin:
                return _adding(send, ((_ALLOW_ORIGIN, b"*"), _EXPOSE))
            return _adding(send, (_VARY_ORIGIN,))
        if scope["method"] == "OPTIONS" and _has(scope, _REQUEST_METHOD):
            await _answer_preflight(send, self._allow_headers(origin))
            return None
        return _adding(send, (*self._allow_headers(origin), _EXPOSE))

    def _allow_headers(self, origin: bytes) -> tuple[tuple[bytes, bytes], ...]:
        if self.any_origin:
            return ((_ALLOW_ORIGIN, b"*"),)
        return ((_ALLOW_ORIGIN, origin), _VARY_ORIGIN)


def _has(scope: Scope, name: bytes) -> bool:
    return any(key == name for key, _ in scope["headers"])


async def _answer_preflight(send: Send, allow: tuple[tuple[bytes, bytes], ...]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 204,
            "headers": [*allow, *_PREFLIGHT_HEADERS],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def _adding(send: Send, extra: tuple[tuple[bytes, bytes], ...]) -> Send:
    """An ASGI ``send`` that adds ``extra`` to the response start; a ``Vary`` the app
    set is kept, with ``Origin`` added to it.

    A plain function returning ``send``'s own awaitable (as http/codecs/headers.py's
    ``secure_send``): the SSE writer drives the awaitable of each body write itself."""

    def send_with_cors(message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            message = {**message, "headers": _merged(message.get("headers", ()), extra)}
        return send(message)

    return send_with_cors


def _merged(
    headers: Iterable[tuple[bytes, bytes]], extra: tuple[tuple[bytes, bytes], ...]
) -> list[tuple[bytes, bytes]]:
    merged = list(headers)
    for name, value in extra:
        if name == _VARY:
            for i, (key, existing) in enumerate(merged):
                if key.lower() == _VARY:
                    merged[i] = (key, existing + b", " + value)
                    break
            else:
                merged.append((name, value))
        else:
            merged.append((name, value))
    return merged
