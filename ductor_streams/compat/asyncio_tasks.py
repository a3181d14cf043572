"""Start a coroutine in the caller's turn of the event loop, and finish it as a task.

asyncio has no public way to take over a coroutine that was stepped by hand: a task
clears the ``_asyncio_future_blocking`` mark of the future the coroutine yielded, and
``finish_started`` does the same (tests/foundation/test_private_apis.py guards it).

``loop.create_task`` runs nothing until the loop reaches the new task, behind every
callback and task already queued. When one turn of the loop has parsed 16 requests,
uvicorn has queued 16 request tasks; the appender's statement task, created by the
first of them, then waits for the other 15 to be authenticated and queued before its
statement is sent, while Postgres idles (docs/speed.md). ``start_now`` runs the
coroutine at once up to its first wait (the statement is on the wire by then) and lets
a task drive the rest, as Python 3.12's eager tasks do (``eager_start``, which this
project cannot rely on: it supports 3.11).

The rest runs as a task would run it: a future the coroutine waits for hands it its
result or error, and cancelling the returned task raises ``CancelledError`` inside the
coroutine at the await it is suspended in (cancelling what it waits for, if pending).
Like a task, the coroutine runs in a copy of the caller's context, the same copy from
its first step to its last: a context variable it sets is not seen by the caller, and
one it sets in its first step and resets later (a tracing span made current, say) is
reset in the context it was set in.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any


def start_now(coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
    """Run ``coro`` until it first waits, then in a task; the future ends with it."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    try:
        awaited = context.run(coro.send, None)
    except StopIteration:
        done: asyncio.Future[None] = loop.create_future()
        done.set_result(None)
        return done
    except Exception as exc:  # as a task would: the error is the future's
        failed: asyncio.Future[None] = loop.create_future()
        failed.set_exception(exc)
        return failed
    return loop.create_task(finish_started(coro, awaited), context=context)


async def finish_started(coro: Coroutine[Any, Any, Any], awaited: Any) -> None:
    """Drive ``coro``, already run by hand up to the point where it yielded ``awaited``,
    to its end, as the task that runs this does: ``start_now``'s rest, and an SSE
    write that the fan-out started synchronously (http/codecs/sse_response.py). The one
    place that uses asyncio's private future protocol (``_asyncio_future_blocking``)."""
    while True:
        cancelled: asyncio.CancelledError | None = None
        try:
            if awaited is None:  # a bare yield: give the loop one turn
                await asyncio.sleep(0)
            else:
                # The coroutine's yield marked it as awaited; a task clears the mark
                # when it takes the future over, and so must this one.
                awaited._asyncio_future_blocking = False
                await awaited
        except asyncio.CancelledError as exc:
            # This task was cancelled, or the awaited future was: either way the
            # coroutine meets the cancellation at its own await, as under a task.
            cancelled = exc
        except BaseException:
            pass  # the awaited future's own error: the coroutine reads it from result()
        try:
            awaited = coro.throw(cancelled) if cancelled is not None else coro.send(None)
        except StopIteration:
            return
