"""Waiting on a caller's behalf only while the caller is there.

A wait that serves a caller (an append blocked on credit, an object commit blocked on
credit, a long-poll) takes ``caller_gone``: a function whose awaitable returns once
the caller has gone (for HTTP, ``http/middleware/disconnect.py``: the connection closed). The
store knows nothing of HTTP; it only races its work against that awaitable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ductor_streams.errors import ClientGone

# Returns an awaitable that completes once the caller has gone (never, while it stays).
CallerGone = Callable[[], Awaitable[object]]

T = TypeVar("T")


async def unless_gone(work: Awaitable[T], gone: Awaitable[object]) -> T:
    """``work``'s result; or, if ``gone`` completes first, ClientGone with ``work``
    cancelled. Only ``work``'s own awaits are cancelled: an append statement that is
    already in flight runs in the appender's task and finishes (store/append.py)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(gone)
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise ClientGone()
    return task.result()
