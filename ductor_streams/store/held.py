"""One pool connection kept across back-to-back append statements.

Every ``pool.fetch`` acquires a connection and releases it, and asyncpg's release runs
in a task of its own (``asyncio.shield``) with a reset and a re-armed idle timer: about
a tenth of the server's CPU per append with one client (docs/speed.md). While append
statements follow each other, ``HeldConnection`` keeps the last one's connection and
hands it to the next; once none has come for ``idle_seconds`` it goes back to the pool.
So nothing is held for long: a pool being closed waits at most that long for it.

Only one statement uses the held connection at a time; statements running beside it
(large batches in parallel) use the pool as before. A connection whose statement
failed or was cancelled goes back to the pool at once, which resets or replaces it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

IDLE_SECONDS = 0.05


class HeldConnection:
    """``fetch`` like ``pool.fetch``, reusing one connection while calls keep coming."""

    def __init__(self, pool: asyncpg.Pool, *, idle_seconds: float = IDLE_SECONDS) -> None:
        self._pool = pool
        self._idle_seconds = idle_seconds
        self._idle: Any = None  # the held connection (a pool proxy), when not in use
        self._last_kept = 0.0  # loop time at which it was last kept
        self._timer: asyncio.TimerHandle | None = None
        self._releases: set[asyncio.Task[None]] = set()  # the loop keeps weak references

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        conn = self._take()
        if conn is None:
            conn = await self._pool.acquire()
        try:
            rows: list[asyncpg.Record] = await conn.fetch(query, *args)
        except BaseException:
            await self._pool.release(conn)
            raise
        self._keep(conn)
        return rows

    def release(self) -> None:
        """Give the idle connection back to the pool now (if one is held)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn, self._idle = self._idle, None
        if conn is not None:
            self._give_back(conn)

    def _give_back(self, conn: Any) -> None:
        task = asyncio.ensure_future(self._pool.release(conn))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    def _take(self) -> Any:
        conn, self._idle = self._idle, None
        if conn is None:
            return None
        try:
            closed = conn.is_closed()
        except asyncpg.InterfaceError:
            return None  # its server went away and the pool has taken it back already
        if closed:
            self._give_back(conn)  # the pool replaces it
            return None
        return conn

    def _keep(self, conn: Any) -> None:
        if self._idle is not None:  # another statement's connection is held already
            self._give_back(conn)
            return
        self._idle = conn
        loop = asyncio.get_running_loop()
        if self._timer is None:
            self._timer = loop.call_at(loop.time() + self._idle_seconds, self._on_timer)
        self._last_kept = loop.time()

    def _on_timer(self) -> None:
        # Re-armed lazily: while statements keep coming it only moves its deadline.
        self._timer = None
        if self._idle is None:
            return
        loop = asyncio.get_running_loop()
        deadline = self._last_kept + self._idle_seconds
        if loop.time() < deadline:
            self._timer = loop.call_at(deadline, self._on_timer)
        else:
            self.release()
