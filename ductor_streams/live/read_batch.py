"""Follower reads of one turn of the event loop, sent to Postgres as one statement.

A commit of another process that touches many streams wakes each of their followers
here in the same turn (its NOTIFY carries one wake per stream), and each would read its
stream alone: 100 streams at 50 appends/s each from a worker were ~5,000 one-record
reads a second, queued on the pool. ``ReadBatcher.read`` queues a read and, at the end
of the turn, sends every queued one in one ``records_read_bytes_many`` statement (one
snapshot: each page is exactly what a read of its own would have returned then). A read
queued alone goes as the plain ``records_read_bytes``. Both go on a connection kept
while reads follow each other (store/held.py), so an answer does not wait for the
pool's reset. A read sent a turn later than asked is still a read begun after whatever
the follower waited for, so the followers' continuity argument (live/stream_follower.py) is
unchanged.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import asyncpg

from ductor_streams.schema import QUERIES
from ductor_streams.store.held import HeldConnection
from ductor_streams.store.models import Page
from ductor_streams.store.read import page_of_rows

Queued = tuple[int, int, int, "asyncio.Future[Page]"]

# A statement reads at most this many streams (each page is up to its byte budget).
MAX_READS_PER_STATEMENT = 64


class ReadBatcher:
    """Reads of several streams' pages after their cursors, batched per turn."""

    def __init__(self, pool: asyncpg.Pool, page_bytes: int) -> None:
        self._pool = pool
        # Kept while reads follow each other: through the pool, each read's answer would
        # wait for the release's reset, a second round trip (store/held.py).
        self._connection = HeldConnection(pool)
        self._page_bytes = page_bytes
        self._queued: list[Queued] = []
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps weak references
        self.statements = 0  # read statements sent (tests read it)

    async def read(self, stream_pk: int, after: int, limit: int) -> Page:
        """What ``read_page(pool, stream_pk, after, limit, max_bytes=page_bytes)`` returns
        (or raises), read together with the other reads of this turn."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Page] = loop.create_future()
        self._queued.append((stream_pk, after, limit, future))
        if len(self._queued) == 1:
            loop.call_soon(self._send)
        elif len(self._queued) >= MAX_READS_PER_STATEMENT:
            self._send()  # the turn's later reads start another statement
        return await future

    def release(self) -> None:
        """Give the held connection back to the pool now (the process is stopping)."""
        self._connection.release()

    def _send(self) -> None:
        queued, self._queued = self._queued, []
        if not queued:
            return
        task = asyncio.get_running_loop().create_task(self._run(queued))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, queued: list[Queued]) -> None:
        try:
            self.statements += 1
            if len(queued) == 1:
                stream_pk, after, limit, future = queued[0]
                try:
                    rows = await self._connection.fetch(
                        QUERIES["records_read_bytes"], stream_pk, after, limit, self._page_bytes
                    )
                    page = page_of_rows(rows, after)
                except Exception as exc:
                    _fail(future, exc)
                else:
                    _settle(future, page)
                return
            rows = await self._connection.fetch(
                QUERIES["records_read_bytes_many"],
                [q[0] for q in queued],
                [q[1] for q in queued],
                [q[2] for q in queued],
                self._page_bytes,
            )
            by_index: dict[int, list[asyncpg.Record]] = defaultdict(list)
            for row in rows:
                by_index[row["i"]].append(row)
            for index, (_, after, _, future) in enumerate(queued, start=1):
                try:
                    page = page_of_rows(by_index.get(index, []), after)
                except Exception as exc:  # NotFound, CursorInFuture, CursorExpired
                    _fail(future, exc)
                else:
                    _settle(future, page)
        except BaseException as exc:
            # The statement failed (the database went away) or was cancelled: each
            # waiting read gets what its own read would have met.
            for *_, future in queued:
                _fail(future, exc)
            if not isinstance(exc, Exception):
                raise


def _settle(future: asyncio.Future[Page], page: Page) -> None:
    if not future.done():
        future.set_result(page)


def _fail(future: asyncio.Future[Page], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)
