"""asyncpg's pool queue: how many acquires are waiting for a connection."""

from __future__ import annotations

from typing import Any


def waiting_acquires(pool: Any) -> int:
    """The tasks waiting in ``pool.acquire()`` for a free connection, read at scrape time.

    asyncpg has no public count of waiting acquires: its free connections are an
    asyncio.Queue (``pool._queue``), whose getters (``_getters``) are the waiting
    acquires. Read only; 0 when a release of asyncpg no longer has them
    (tests/foundation/test_private_apis.py notices first)."""
    queue = getattr(pool, "_queue", None)
    getters = getattr(queue, "_getters", ())
    return sum(1 for getter in getters if not getter.done())
