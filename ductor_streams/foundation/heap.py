"""Giving freed memory of large requests back to the system.

Large payloads (an append's 64 KiB strings, the pieces of a catch-up body) come from
glibc's ``malloc`` heap. When the request ends they are freed, but glibc keeps the free
pages for later allocations: a few abandoned appends of tens of MB left the server at
about ten times the RSS it started with although no object survived (``malloc_trim(0)``
brought it back), and cut catch-up readers left it above its start too
(docs/decisions.md, "Failure and protection").
After such requests end without their data being used (the caller went away,
store/credit_wait.py; a stalled reader was cut, http/middleware/write_budget.py), nobody is about
to reuse that memory, so ``trim_soon`` asks glibc to return its free pages: once per
burst, ``TRIM_DELAY_SECONDS`` after its first call (the frames that held the data have
unwound by then), on a thread (a trim of ~500 MB of free pages takes ~20 ms; ctypes
releases the GIL meanwhile, and Python's small objects do not use glibc's heap).
Without glibc (no ``malloc_trim``) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

# Abandoned requests come in bursts (the clients of one outage, readers that stalled
# together): one trim this long after the first of a burst covers all of it.
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
# Per event loop: the trim that is due (scheduled or running), so a burst makes one.
_due: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle | asyncio.Future[int]] = {}


def trim_soon() -> None:
    """Return the heap's free pages to the system ``TRIM_DELAY_SECONDS`` from now,
    unless a trim is already due."""
    if _malloc_trim is None:
        return
    loop = asyncio.get_running_loop()
    if loop in _due:
        return
    _due[loop] = loop.call_later(TRIM_DELAY_SECONDS, _start_trim, loop)


def _start_trim(loop: asyncio.AbstractEventLoop) -> None:
    if _malloc_trim is None or loop.is_closed():
        _due.pop(loop, None)
        return
    future = loop.run_in_executor(None, _malloc_trim, 0)
    _due[loop] = future
    future.add_done_callback(lambda done: _report(loop, done))


def _report(loop: asyncio.AbstractEventLoop, future: asyncio.Future[int]) -> None:
    _due.pop(loop, None)
    if not future.cancelled() and future.exception() is not None:
        log.warning("malloc_trim failed", exc_info=future.exception())
