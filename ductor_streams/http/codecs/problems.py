"""The one mapping from errors to RFC 9457 problem responses (application/problem+json)."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, NotFoundException

from ductor_streams.compat.litestar import allowed_methods
from ductor_streams.errors import (
    ClientGone,
    CreditExhausted,
    DatabaseUnavailable,
    InvalidBody,
    MethodNotAllowed,
    NotFound,
    RequestTooLarge,
    StreamsError,
    TooManyLiveReads,
    TooManyReads,
)
from ductor_streams.foundation.logs import REQUEST_ID
from ductor_streams.http.codecs.headers import Send, is_api_path
from ductor_streams.http.middleware.observe import UNMATCHED
from ductor_streams.http.middleware.observe import Request as ObservedRequest
from ductor_streams.store.db import translate_db_error
from ductor_streams.store.outage import report_unavailable

log = logging.getLogger(__name__)
PROBLEM_JSON = "application/problem+json"


def problem_parts(
    error: StreamsError, instance: str | None = None
) -> tuple[int, bytes, dict[str, str]]:
    """Status, ``application/problem+json`` body and extra headers for ``error``."""
    body: dict[str, Any] = {
        "type": f"https://ductor.dev/problems/{error.code}",
        "title": error.title(),
        "status": error.status,
        "detail": error.detail,
        "code": error.code,
    }
    if instance:
        body["instance"] = instance
    body.update(error.extra)
    request_id = REQUEST_ID.get()
    if request_id is not None:
        # The same ID as the response's X-Request-ID header and the request's log lines.
        body["request_id"] = request_id
    headers = {}
    if isinstance(error, CreditExhausted | DatabaseUnavailable | TooManyLiveReads | TooManyReads):
        headers["Retry-After"] = str(error.retry_after)
    elif isinstance(error, MethodNotAllowed) and error.allow:
        headers["Allow"] = error.allow
    return error.status, msgspec.json.encode(body), headers


def problem_response(error: StreamsError, instance: str | None = None) -> Response[bytes]:
    status, content, headers = problem_parts(error, instance)
    return Response(content=content, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _from_http_exception(exc: HTTPException) -> StreamsError:
    if isinstance(exc, NotFoundException) or exc.status_code == 404:
        return NotFound("no such resource")
    if exc.status_code == 405:
        return MethodNotAllowed(allow=allowed_methods(exc))
    if exc.status_code == 413:
        return RequestTooLarge()
    if exc.status_code in (400, 422):
        return InvalidBody(str(exc.detail) if exc.detail else None)
    generic = StreamsError(str(exc.detail) if exc.detail else None)
    generic.code = "http_error"  # type: ignore[misc]
    generic.status = exc.status_code  # type: ignore[misc]
    return generic


def error_for(exc: Exception, route: str | None) -> StreamsError:
    """The problem an exception is answered with; an unexpected one is logged (its type
    and the route only, never the payload or the token) and becomes a 500. An
    unavailable database (restarting, failing over, unreachable) is a 503
    ``database_unavailable`` with ``Retry-After``, logged as a warning now and then
    (store/outage.py), not a traceback per request."""
    if isinstance(exc, StreamsError):
        error = exc
    elif isinstance(exc, HTTPException):
        error = _from_http_exception(exc)
    elif isinstance(translated := translate_db_error(exc), StreamsError):
        # A driver error that stands for bad input (e.g. NUL in text) or for an
        # unavailable database, on a path that did not translate it itself: a 4xx or a
        # 503, never a 500.
        error = translated
    else:
        log.error(
            "unhandled error",
            exc_info=exc,
            extra={"route": route, "error_type": type(exc).__name__},
        )
        error = StreamsError("internal error")
    if isinstance(error, DatabaseUnavailable):
        report_unavailable("http", error, route=route)
    return error


# The status a Litestar route's request is recorded with (metrics, spans) when its
# client went away before the answer (ClientGone): nginx's "client closed request". It
# is never read by anyone: the connection is closed, and the server drops the write.
CLIENT_CLOSED_REQUEST = 499


async def refuse(scope: MutableMapping[str, Any], send: Send, error: StreamsError) -> None:
    """Answer an HTTP request with ``error``'s problem before any route sees it (the
    ``Host`` check, http/middleware/host.py), with the headers every answer carries, observed as
    an unmatched request."""
    path = scope.get("path")
    request = ObservedRequest(scope)
    status, body, extra = problem_parts(error, path)
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode("latin-1")) for k, v in extra.items()),
    ]
    observed = request.observed_send(send, api=is_api_path(str(path)))
    try:
        await observed({"type": "http.response.start", "status": status, "headers": headers})
        await observed({"type": "http.response.body", "body": body})
    finally:
        request.end(UNMATCHED, status)


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """Litestar exception handler for every exception type."""
    if isinstance(exc, ClientGone):
        return Response(content=b"", status_code=CLIENT_CLOSED_REQUEST)
    path = request.scope.get("path")
    return problem_response(error_for(exc, path), path)
