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
    already in flight runs in the appender's task and finishes (store/append.py).

    ``gone`` gets one step before ``work`` starts: a caller that left already (while
    its body was decoded, or its request queued) is seen before anything is sent for
    it, since the appender sends a statement in the same step it is asked for."""
    watch = asyncio.ensure_future(gone)
    await asyncio.sleep(0)
    if watch.done():
        if asyncio.iscoroutine(work):
            work.close()  # never started
        elif isinstance(work, asyncio.Future):
            work.cancel()
        raise ClientGone()
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    try:
        if not task.done() or task.cancelled():
            raise ClientGone()
        return task.result()
    finally:
        # The task keeps its exception (a refusal), whose traceback keeps this frame
        # and so the task: a cycle that held a refused batch's memory until the
        # collector's next full pass. Dropped here, it goes with the exception.
        del task
