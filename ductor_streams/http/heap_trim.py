"""Give the C heap's free pages back to the system after a burst of cut readers.

The pieces of a hundred stalled catch-up readers (http/write_budget.py) are freed when
their connections are cut, but glibc keeps freed heap memory for reuse: the server's RSS
stayed ~30 MB above where it was before them, although none of it was in use. glibc's
``malloc_trim`` returns those pages (it took the RSS back to within 1 MB). It runs in a
thread (it locks each arena in turn, never the event loop for long), a second after the
first cut of a burst, once per burst. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

# Cuts come in bursts (readers that stalled together reach their budgets together): one
# trim this long after the first cut of a burst covers all of it.
TRIM_DELAY_SECONDS = 1.0

_scheduled = False
_tasks: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak refs)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


def trim_soon() -> None:
    """Trim the heap ``TRIM_DELAY_SECONDS`` from now, unless a trim is already due."""
    global _scheduled
    if _scheduled or _malloc_trim() is None:
        return
    _scheduled = True
    loop = asyncio.get_running_loop()
    loop.call_later(TRIM_DELAY_SECONDS, _start, loop)


def _start(loop: asyncio.AbstractEventLoop) -> None:
    task = loop.create_task(_trim(loop))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def _trim(loop: asyncio.AbstractEventLoop) -> None:
    global _scheduled
    trim = _malloc_trim()
    try:
        if trim is not None:
            await loop.run_in_executor(None, trim, 0)
    except Exception:  # never worth more than a log line
        log.warning("malloc_trim failed", exc_info=True)
    finally:
        _scheduled = False
