"""The headers every response carries, whoever answers it.

- ``X-Content-Type-Options: nosniff`` on every response: a browser takes the content
  type as given and never sniffs a payload (or an uploaded object) into HTML or script.
- ``Cache-Control: no-store`` on every response under the API mount: records, SSE
  events, object bytes, operator views and even problems carry tenant data or say
  something about it, and no browser or shared cache may keep a copy. This replaces
  whatever ``Cache-Control`` a handler set (SSE's ``no-cache`` included).
- ``Content-Security-Policy: default-src 'none'; sandbox`` on every response under the
  API mount that sets no policy of its own (the operator page does): a payload a
  browser is led to render anyway (a record that is HTML, an SVG) runs no script and
  loads nothing, in an opaque origin.

``StreamsApp`` (http/app.py) applies them to every response Litestar sends, through
``secure_send``; the records front (http/fronts/records.py) adds ``API_HEADERS`` to its
own answers directly, which costs nothing per request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from ductor_streams.names import API_MOUNT

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

NOSNIFF = (b"x-content-type-options", b"nosniff")
NO_STORE = (b"cache-control", b"no-store")
SANDBOX_VALUE = "default-src 'none'; sandbox"
SANDBOX = (b"content-security-policy", SANDBOX_VALUE.encode("ascii"))
# What an answer under the API mount carries (the records front adds these itself).
API_HEADERS = (NOSNIFF, NO_STORE, SANDBOX)

_API_REPLACED = frozenset({NOSNIFF[0], NO_STORE[0]})
_OTHER_REPLACED = frozenset({NOSNIFF[0]})


def is_api_path(path: str) -> bool:
    """Whether ``path`` is under the API mount (the operator page included)."""
    return path == API_MOUNT or path.startswith(API_MOUNT + "/")


def secured(headers: Iterable[tuple[bytes, bytes]], *, api: bool) -> list[tuple[bytes, bytes]]:
    """``headers`` with the headers above, each once (a handler's own value replaced,
    but for its own Content-Security-Policy, which is kept)."""
    if not api:
        kept = [(name, value) for name, value in headers if name.lower() not in _OTHER_REPLACED]
        kept.append(NOSNIFF)
        return kept
    kept = []
    policy = False
    for name, value in headers:
        lower = name.lower()
        if lower in _API_REPLACED:
            continue
        policy = policy or lower == SANDBOX[0]
        kept.append((name, value))
    kept.append(NOSNIFF)
    kept.append(NO_STORE)
    if not policy:
        kept.append(SANDBOX)
    return kept


def secure_send(send: Send, *, api: bool) -> Send:
    """An ASGI ``send`` that adds the headers to the response start.

    A plain function returning ``send``'s own awaitable, not a coroutine of its own: the
    SSE writer (http/codecs/sse_response.py) drives the awaitable of a body write itself, and
    each SSE event costs no extra coroutine."""

    def send_secured(message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            message = {**message, "headers": secured(message.get("headers", ()), api=api)}
        return send(message)

    return send_secured
