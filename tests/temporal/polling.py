"""Poll with a deadline: tests never sleep for a result."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    until: Callable[[T], bool],
    *,
    timeout: float = 30.0,  # noqa: ASYNC109 - a polling deadline, not an I/O timeout
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Call ``probe`` until ``until(result)`` holds; AssertionError with the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if until(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached in {timeout}s; last value: {value!r}")
        await asyncio.sleep(interval)
