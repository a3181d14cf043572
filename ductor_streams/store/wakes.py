"""Wakes off the commit path: announce appends after their commit, coalesced.

A NOTIFY inside the append transaction makes Postgres hold its database-wide notify
lock through that commit's WAL flush, which serialises commits across ALL streams
(what this buys: docs/speed.md, "Wakes after commit").
So the append transaction carries no NOTIFY; once it has committed, the appender calls
``announce``. While one announcing statement is in flight, further wakes (any stream)
gather and go together in the next one, on the same connection (store/held.py).

Guarantees: a wake is sent only after the commit it announces returned (never before);
a failed send is retried, and a wake lost anyway (the process dies between commit and
send) only delays a follower that re-reads Postgres, it never loses a record.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from ductor_streams.schema import QUERIES
from ductor_streams.store.db import DRIVER_ERRORS
from ductor_streams.store.held import HeldConnection
from ductor_streams.store.wake_format import KIND as RECORDS_KIND

log = logging.getLogger(__name__)
# A wake waits at most this long for others to share its statement (only when the
# previous statement started less than this long ago).
MIN_INTERVAL_SECONDS = 0.002


class WakeSender:
    """Coalesces wake payloads into one NOTIFY statement at a time.

    A payload is ``<kind><stream_pk>``, optionally followed by ``:<detail>``
    (``r<stream_pk>:<latest sequence>``); of several queued for the same kind and stream,
    only the last is sent (announced in commit order, it says the most). Wakes that
    carry records (``R<stream_pk>:<last sequence>:...``, store/wake_format.py) are each
    sent, in the order announced: each carries records the others do not.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        retry_delay: float = 0.05,
        min_interval: float = MIN_INTERVAL_SECONDS,
    ) -> None:
        self._pool = pool
        # Kept across back-to-back wake statements: through the pool, each would also
        # cost the release's reset, a second round trip before the next could start.
        self._connection = HeldConnection(pool)
        self._pending: dict[str, str] = {}  # kind and stream -> payload, insertion-ordered
        self._task: asyncio.Task[None] | None = None
        self._retry_delay = retry_delay
        self._min_interval = min_interval
        self._last_sent_at = -1e9  # loop time at which the last statement started
        self._urgent = False  # a queued wake has no later commit to share a statement with
        self.statements = 0  # NOTIFY statements sent (tests and benchmarks read it)

    def announce(self, payload: str, *, more_coming: bool = False) -> None:
        """Queue a wake for a commit that has ALREADY returned; sends soon, in order.

        ``more_coming``: other commits of this process are in flight, so this wake may
        wait (at most ``min_interval`` after the previous statement) to share theirs.
        """
        self._pending[_coalesced_by(payload)] = payload
        if not more_coming:
            self._urgent = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush())

    async def drain(self) -> None:
        """Wait until every queued wake was sent (or given up on)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _flush(self) -> None:
        delay = self._retry_delay
        loop = asyncio.get_running_loop()
        while self._pending:
            # Under load (more commits in flight), at most one statement per
            # ``min_interval``: the wakes of many commits go together. A wake with no
            # commit in flight behind it goes at once.
            if not self._urgent:
                wait = self._last_sent_at + self._min_interval - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
            self._last_sent_at = loop.time()
            self._urgent = False
            payloads = list(self._pending.values())
            self._pending.clear()
            try:
                await self._connection.fetch(QUERIES["wake_send"], payloads)
                self.statements += 1
                delay = self._retry_delay
            except DRIVER_ERRORS as exc:
                if self._pool.is_closing():
                    return  # shutting down: followers elsewhere re-read on their own
                log.warning("wake send failed, retrying: %s", type(exc).__name__)
                for payload in payloads:  # unless a newer one was queued meanwhile
                    self._pending.setdefault(_coalesced_by(payload), payload)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)


def _coalesced_by(payload: str) -> str:
    """The key under which a queued wake replaces an earlier one: its kind and stream;
    for a wake carrying records, also its last sequence (it replaces none)."""
    head, _, rest = payload.partition(":")
    if head.startswith(RECORDS_KIND):
        return f"{head}:{rest.partition(':')[0]}"
    return head
