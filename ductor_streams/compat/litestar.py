"""Litestar's non-public parts this package leans on, each behind one name here.

- ``BodyHookedStreamingResponse``: ``ASGIStreamingResponse._stream`` sends a streaming
  body once the head is out; the SSE response (http/codecs/sse_response.py) needs to
  know when that starts and ends, to let the fan-out write in between.
- ``is_schema_not_found_handler``: the handler Litestar registers on the schema router
  for unknown schema paths, known only by its function's name (http/routes/openapi.py
  replaces it).
- ``allowed_methods``: the methods a 405 allows, which Litestar's router puts in the
  exception's ``allow`` header (http/codecs/problems.py answers them as ``Allow``).

pyproject.toml bounds Litestar from above; tests/foundation/test_private_apis.py says
which part moved in a new release.
"""

from __future__ import annotations

from typing import Any

from litestar.exceptions import HTTPException
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Send

SCHEMA_NOT_FOUND_HANDLER = "handle_schema_path_not_found"


class BodyHookedStreamingResponse(ASGIStreamingResponse):
    """``ASGIStreamingResponse`` that calls ``body_starting(send)`` after the head has
    been sent and before the body, and ``body_ended()`` however the body ends."""

    __slots__ = ()

    def body_starting(self, send: Send) -> None:
        """The head is out; the body is about to be streamed through ``send``."""

    def body_ended(self) -> None:
        """The body has ended (completed, failed or cancelled)."""

    async def _stream(self, send: Send) -> None:
        # The head has been sent (Litestar's ASGIResponse sends it before the body).
        self.body_starting(send)
        try:
            await super()._stream(send)
        finally:
            self.body_ended()


def is_schema_not_found_handler(value: Any) -> bool:
    """Whether ``value`` is the handler Litestar registers for unknown schema paths."""
    return getattr(value, "handler_name", None) == SCHEMA_NOT_FOUND_HANDLER


def allowed_methods(exc: HTTPException) -> str:
    """The ``Allow`` value of a 405 raised by Litestar's router ("" when it gave none)."""
    headers = exc.headers or {}
    return headers.get("allow") or headers.get("Allow") or ""
