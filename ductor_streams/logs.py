"""Structured JSON logs. Records carry stream metadata, never payloads or tokens."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info and record.exc_info[0] is not None:
            entry["error_type"] = record.exc_info[0].__name__
        return json.dumps(entry, separators=(",", ":"))


def configure_logging(level: int = logging.INFO) -> None:
    """JSON lines on stderr at ``level`` (commands pass the settings'
    ``DUCTOR_STREAMS_LOG_LEVEL``). No level ever logs payloads or tokens."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


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
