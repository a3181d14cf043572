"""A Python client for external apps (httpx, asyncio).

``StreamsClient`` appends with idempotency keys by default and honours ``Retry-After``
within a bounded budget, reads pages, and ``subscribe()`` follows a stream live,
reconnecting with ``Last-Event-ID`` after any disconnect. See docs/client.md.
"""

from ductor_streams.client.api import AppendResult, Page, Record, StreamsClient
from ductor_streams.client.errors import (
    ApiError,
    ConnectionLostError,
    CreditExhaustedError,
    CursorExpiredError,
    HistoryDivergedError,
)

__all__ = [
    "ApiError",
    "AppendResult",
    "ConnectionLostError",
    "CreditExhaustedError",
    "CursorExpiredError",
    "HistoryDivergedError",
    "Page",
    "Record",
    "StreamsClient",
]
