"""What every HTTP request leaves behind: a request ID, its metrics and (when tracing is
on) its server span. ``StreamsApp`` (http/app.py) runs each request through ``Request``.

- Request ID: the client's ``X-Request-ID`` when it is 1 to 128 printable ASCII
  characters, else 16 random hex digits. Set in ``logs.REQUEST_ID`` for the request's
  task (every log line of the request carries it, uvicorn's access line included),
  echoed as the response's ``X-Request-ID`` and in every problem body (``request_id``).
- Metrics: ``ductor_streams_http_request_duration_seconds`` by method, route template
  (never the raw path: ``unmatched`` when no route matched) and status.
- Span (foundation/tracing.py): ``<METHOD> <route template>``, a server span that continues the
  request's ``traceparent``, with the route and the status.

The records front (appends and reads, the hot path) passes the route it matched and
its status straight in; Litestar's answers are seen through the ``send`` wrapper
(``observed_send``), whose route comes from Litestar's routing (``path_template``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ductor_streams.foundation import metrics, tracing
from ductor_streams.foundation.logs import REQUEST_ID
from ductor_streams.http.codecs.headers import secured

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

REQUEST_ID_HEADER = b"x-request-id"
_MAX_ID = 128
UNMATCHED = "unmatched"
# Litestar's templates carry parameter types (``{run_id:str}``); metrics and spans
# show the plain OpenAPI form (``{run_id}``).
_TYPED = re.compile(r"\{(\w+):[^}]*\}")
_templates: dict[str, str] = {}


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's ``X-Request-ID`` when it is usable, else a new one."""
    for key, value in headers:
        if key == REQUEST_ID_HEADER or key.lower() == REQUEST_ID_HEADER:
            if 0 < len(value) <= _MAX_ID and value.isascii():
                text = value.decode("ascii")
                if text.isprintable():
                    return text
            break
    return _new_request_id()


class _RequestIds:
    """Random 16-hex-digit IDs, drawn from the OS 512 at a time: one ``getrandom``
    call per request showed in the append path's profile."""

    __slots__ = ("_hex", "_next")

    def __init__(self) -> None:
        self._hex = ""
        self._next = 0

    def __call__(self) -> str:
        start = self._next
        if start >= len(self._hex):
            self._hex, start = os.urandom(8 * 512).hex(), 0
        self._next = start + 16
        return self._hex[start : start + 16]


_new_request_id = _RequestIds()


def route_template(scope: MutableMapping[str, Any]) -> str:
    """The route Litestar matched for ``scope``, in OpenAPI form; ``unmatched`` else."""
    raw = scope.get("path_template")
    if not raw:
        return UNMATCHED
    template = _templates.get(raw)
    if template is None:
        template = _templates[raw] = _TYPED.sub(r"{\1}", raw)
    return template


class Request:
    """One HTTP request's observation: ``begin`` at arrival, ``end`` once answered."""

    __slots__ = ("method", "request_id", "span", "started", "status")

    def __init__(self, scope: MutableMapping[str, Any]) -> None:
        self.started = time.perf_counter()
        self.method: str = scope["method"]
        self.request_id = request_id_of(scope["headers"])
        self.status = 0
        REQUEST_ID.set(self.request_id)
        self.span: Any = None
        if tracing.ENABLED:
            parent = tracing.request_context(scope["headers"])
            attributes = tracing.sample_request(parent)
            if attributes is not None:
                self.span = _start_span(parent, self.method, attributes)

    def end(self, route: str, status: int | None = None) -> None:
        """The request is answered (``status``, or what ``observed_send`` saw)."""
        if status is not None:
            self.status = status
        if self.status:
            metrics.observe_request(
                self.method, route, self.status, time.perf_counter() - self.started
            )
        span = self.span
        if span is not None:
            self.span = None
            _end_span(span, self.method, route, self.status)

    def observed_send(self, send: Send, *, api: bool) -> Send:
        """``send`` with the response headers every answer carries (http/codecs/headers.py)
        and ``X-Request-ID``, noting the status. A plain function returning ``send``'s
        own awaitable (the SSE writer drives a body write's awaitable itself)."""
        request_id = (REQUEST_ID_HEADER, self.request_id.encode("ascii"))

        def send_observed(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                headers = secured(message.get("headers", ()), api=api)
                headers.append(request_id)
                message = {**message, "headers": headers}
            return send(message)

        return send_observed

    def tagged_send(self, send: Send) -> Send:
        """``send`` with ``X-Request-ID`` added and the status noted, nothing else (the
        Durable Streams endpoint sets its own headers)."""
        request_id = (REQUEST_ID_HEADER, self.request_id.encode("ascii"))

        def send_tagged(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), request_id]}
            return send(message)

        return send_tagged


def _start_span(parent: Any, method: str, attributes: dict[str, Any]) -> Any:
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    attributes["http.request.method"] = method
    span = tracing.tracer().start_span(
        method, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes
    )
    # Current for the rest of the request's task (appends store it with their input
    # deliveries; log lines carry its IDs). The task ends with the request, and its
    # context with it: nothing to detach.
    otel_context.attach(trace.set_span_in_context(span))
    return span


def _end_span(span: Any, method: str, route: str, status: int) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.update_name(f"{method} {route}")
    span.set_attribute("http.route", route)
    if status:
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
    span.end()
