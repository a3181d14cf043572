"""A Python client for external apps (httpx, asyncio).

``StreamsClient`` appends with idempotency keys by default and honours ``Retry-After``
within a bounded budget, reads pages, and ``subscribe()`` follows a stream live,
reconnecting with ``Last-Event-ID`` after any disconnect. See docs/client.md.

Everything an app uses is here (``__all__``); the modules behind it (``api``, ``models``,
``retry``, ``subscribe``, ``errors``) are the client's own. The client imports nothing
of the server (``make lint`` checks it).
"""

from ductor_streams.client.api import StreamsClient
from ductor_streams.client.errors import (
    ApiError,
    ConnectionLostError,
    CreditExhaustedError,
    CursorExpiredError,
    HistoryDivergedError,
)
from ductor_streams.client.models import AppendResult, Page, Record

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
