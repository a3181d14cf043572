"""Giving a dropped large batch's memory back to the system.

A large append's payloads are Python strings of up to 64 KiB each, which CPython takes
from glibc's ``malloc`` heap. When the request ends, they are freed, but glibc keeps
the free pages for later allocations: 15 abandoned 60 MB appends left the server at
~600-770 MB RSS instead of the ~75 MB it started with (measured: no object survived;
``malloc_trim(0)`` brought it back to 72 MB). After a request that held a large batch
ends without it being appended (its caller went away, store/credit_wait.py), nobody
is about to reuse that memory, so ``trim_soon`` asks glibc to return its free pages:
once, shortly after the last such request of a burst, on a thread (a trim of ~500 MB of
free pages takes ~20 ms; ctypes releases the GIL meanwhile, and Python's small objects
do not use glibc's heap). Without glibc (no ``malloc_trim``) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

# A burst of abandoned requests (clients of one outage going at once) is trimmed once,
# this long after the last of them.
TRIM_DELAY_SECONDS = 0.5


def _find_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_malloc_trim = _find_trim()
_pending: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}


def trim_soon() -> None:
    """Return the heap's free pages to the system, TRIM_DELAY_SECONDS after the last
    call of a burst (the frames that held the batch have unwound by then)."""
    if _malloc_trim is None:
        return
    loop = asyncio.get_running_loop()
    timer = _pending.pop(loop, None)
    if timer is not None:
        timer.cancel()
    _pending[loop] = loop.call_later(TRIM_DELAY_SECONDS, _start_trim, loop)


def _start_trim(loop: asyncio.AbstractEventLoop) -> None:
    _pending.pop(loop, None)
    if _malloc_trim is not None and not loop.is_closed():
        future = loop.run_in_executor(None, _malloc_trim, 0)
        future.add_done_callback(_report)


def _report(future: asyncio.Future[int]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("malloc_trim failed", exc_info=future.exception())
