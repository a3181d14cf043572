"""Structured JSON logs. Records carry stream metadata, never payloads or tokens.

Every process (``serve``, ``workers``, ``prune``, ``dev``) logs through the one
formatter here, uvicorn's own loggers included (``serve`` gives uvicorn no logging
config of its own, so its records reach the root handler). Each line is one JSON
object: ``time`` (UTC, milliseconds, ``Z``), ``level``, ``logger``, ``message``, the
record's ``extra`` fields, ``request_id`` while an HTTP request is being answered
(http/middleware/observe.py), and ``trace_id``/``span_id`` while a span is current and tracing is
on (foundation/tracing.py).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    # uvicorn's formatters would read these; they are not ours to print.
    "color_message",
}

# The request being answered in this task (set by http/middleware/observe.py per request; HTTP
# requests each run in a task of their own, so the value never leaks between them).
REQUEST_ID: ContextVar[str | None] = ContextVar("ductor_streams_request_id", default=None)


def utc_timestamp(created: float) -> str:
    """``created`` (seconds since the epoch) as ``2026-01-31T12:00:00.123Z``."""
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _no_trace() -> tuple[str, str] | None:
    return None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request and trace IDs,
    and the ``extra`` fields."""

    # tracing.configure_tracing replaces this with a reader of the current span.
    current_trace = staticmethod(_no_trace)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": utc_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = REQUEST_ID.get()
        if request_id is not None:
            entry["request_id"] = request_id
        ids = JsonFormatter.current_trace()
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info and record.exc_info[0] is not None:
            entry["error_type"] = record.exc_info[0].__name__
        return json.dumps(entry, separators=(",", ":"))


# uvicorn's loggers: with no config of uvicorn's own they propagate to the root handler.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


def configure_logging(level: int = logging.INFO) -> None:
    """JSON lines on stderr at ``level`` (commands pass the settings'
    ``DUCTOR_STREAMS_LOG_LEVEL``). No level ever logs payloads or tokens."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Whatever configured them before (uvicorn's default config, in an embedding
    # process) wrote plain text beside these lines.
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True


def stream_fields(
    tenant: str, run_id: str, stream_id: str, log_region: str | None
) -> dict[str, Any]:
    """The ``extra`` of a log line about one stream: its key and its pinned
    ``log_region`` (where its logs belong), never anything of its payloads."""
    return {
        "tenant": tenant,
        "run_id": run_id,
        "stream_id": stream_id,
        "log_region": log_region,
    }
