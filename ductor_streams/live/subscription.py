"""One subscriber's continuity loop: backfill, follow, drop duplicates, repair gaps.

A ``Subscription`` is registered with its stream's follower BEFORE its first read, so
every record committed after registration reaches its buffer (the follower reads after
each wake and fans out to everyone registered). What it sends is therefore the union
of its own Postgres reads and the fanned-out batches, filtered to ``sequence >
last_sent`` and checked for contiguity:

- a record at or below ``last_sent`` is a duplicate and is dropped;
- a batch that starts above ``last_sent + 1`` reveals a gap: the missing range is read
  from Postgres (and recorded as gap evidence) before anything after it is sent;
- when the buffer would pass its bound, it is emptied and the subscriber reads from
  Postgres until it has caught up; the follower is never slowed down by it.

An edge that writes the records as Postgres can frame them gives a ``FramedReader``:
then its backfill and catch-up pages come as ``FramedPage``s (the records' bytes as the
edge sends them, with their bounds) instead of ``LiveBatch``es, and everything else,
including the rules above, is the same: the subscription needs a page's last sequence
and bounds, not its records.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from ductor_streams.errors import CursorExpired, NotFound
from ductor_streams.foundation import metrics, tracing
from ductor_streams.live.events import (
    Draining,
    End,
    Expired,
    Gone,
    Interrupted,
    LiveBatch,
    Terminal,
    TokenExpired,
)
from ductor_streams.live.stats import LIVE_OVERFLOWS
from ductor_streams.store.db import database_unavailable
from ductor_streams.store.models import Page
from ductor_streams.store.outage import report_unavailable
from ductor_streams.store.read_frames import FramedPage

log = logging.getLogger(__name__)

PageReader = Callable[[int, int], Awaitable[Page]]
"""``read(after, limit)``: records with ``sequence > after`` (store.read.read_page)."""

FramedReader = Callable[[int, int], Awaitable[FramedPage | None]]
"""``read(after, limit)``: ``PageReader``'s page as the edge's frames, up to its first
record that must be read as a ``Record`` (store.read_frames.read_sse_frames); None when
that is the page's first record (then ``PageReader`` reads the page)."""

Delivery = list[LiveBatch] | FramedPage
"""What ``Subscription.next`` hands the edge to send: fanned-out or read batches, or a
page its ``FramedReader`` read."""

GapRecorder = Callable[[int, int, int], Awaitable[None]]
"""``record(expected, received, repaired_records)``: keeps gap evidence."""

Sink = Callable[[LiveBatch], bool]
"""``sink(batch)``: the edge takes a batch synchronously, returning False when it cannot
(then the batch goes through the buffer). Once it returns True the edge owns the
batch: it must send it before anything it sends later."""

# How many records one call of ``next`` may hand out from the buffer at once.
MAX_DELIVERY_RECORDS = 2000


class Subscription:
    """Everything after ``cursor``, once each, ascending; see the module docstring."""

    def __init__(
        self,
        cursor: int,
        *,
        read: PageReader,
        record_gap: GapRecorder,
        buffer_records: int,
        page_records: int,
        buffer_bytes: int = 4 * 1024 * 1024,
        read_framed: FramedReader | None = None,
    ) -> None:
        self.last_sent = cursor
        self._read = read
        self._read_framed = read_framed
        self._record_gap = record_gap
        self._limit = buffer_records
        self._limit_bytes = buffer_bytes
        self._buffered_bytes = 0
        self._page = page_records
        self._buffer: deque[LiveBatch] = deque()
        self._buffered = 0
        # Waiting without asyncio.wait_for: a bare future and one lazily re-armed timer
        # per subscription, because wait_for (a task and a timer per wait) cost more
        # than everything else on the fan-out path.
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._idle_timeout: float | None = None
        self._last_activity = 0.0
        self._overflowed = False
        self._catching_up = True
        self._closed_at: int | None = None
        self._terminal: Terminal | None = None
        self._finished = False
        self._pending: Delivery | None = None
        self._sink: Sink | None = None
        self.direct_deliveries = 0
        # Records read before the subscription first went live (its backfill), and the
        # backfill's span while it runs (tracing on).
        self.backfilled = 0
        self._backfill_done = False
        self._backfill_span: Any = None
        self.overflows = 0
        self.gaps = 0
        self.postgres_reads = 0

    # -- the follower's side: never blocks, never awaits ---------------------------------

    def offer(self, batch: LiveBatch) -> None:
        """Take a fanned-out batch; on overflow drop the buffer and read Postgres later."""
        if self._finished or self._overflowed:
            return
        if self._sink is not None and self._deliver_direct(batch):
            return
        size = max(1, len(batch.records))
        nbytes = batch.nbytes
        if self._buffered + size > self._limit or self._buffered_bytes + nbytes > self._limit_bytes:
            # Over either budget: keep nothing for this subscriber (its memory stays
            # bounded however slowly it reads); it reads Postgres when it gets there.
            self._buffer.clear()
            self._buffered = 0
            self._buffered_bytes = 0
            self._overflowed = True
            self.overflows += 1
            LIVE_OVERFLOWS.inc()
            log.info("live subscriber buffer overflowed; it falls back to Postgres reads")
        else:
            self._buffer.append(batch)
            self._buffered += size
            self._buffered_bytes += nbytes
        self._wake()

    def attach_sink(self, sink: Sink | None) -> None:
        """Let ``offer`` hand contiguous batches straight to the edge while it is idle.

        This saves a task switch per subscriber per wake on the fan-out path. Only the
        plain case takes this path: the edge waits in ``next`` with nothing buffered or
        pending, and the batch continues ``last_sent`` exactly and does not close the
        stream. Everything else (duplicates, gaps, close, catch-up) goes through the
        buffer and ``next`` as before.
        """
        self._sink = sink

    def _deliver_direct(self, batch: LiveBatch) -> bool:
        waiter = self._waiter
        if waiter is None or waiter.done() or self._buffer or self._pending is not None:
            return False
        if self._catching_up or self._terminal is not None or self._closed_at is not None:
            return False
        records = batch.records
        if batch.closed or not records or records[0].sequence != self.last_sent + 1:
            return False
        if not self._sink or not self._sink(batch):
            return False
        self.last_sent = records[-1].sequence
        self._last_activity = waiter.get_loop().time()
        self.direct_deliveries += 1
        metrics.SSE_EVENTS.n += len(records)
        return True

    def stream_gone(self) -> None:
        """The follower found the stream deleted."""
        if self._terminal is None:
            self._terminal = Gone()
        self._wake()

    def drain(self) -> None:
        """The server is shutting down: end with ``Draining`` at the next turn, before
        anything still buffered (the client reads it again after it resumes)."""
        if self._terminal is None:
            self._terminal = Draining()
        self._wake()

    def token_expired(self) -> None:
        """The subscriber's token has expired: end with ``TokenExpired`` at once."""
        if self._terminal is None:
            self._terminal = TokenExpired()
        self._wake()

    def close(self) -> None:
        """Release the timer; the subscription delivers nothing more."""
        self._end_backfill()
        self._finished = True
        self._sink = None
        self._buffer.clear()
        self._buffered = 0
        self._buffered_bytes = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- the edge's side ------------------------------------------------------------------

    async def prime(self) -> None:
        """The first read (the backfill's first page), done before the edge starts its
        response: raises CursorInFuture / CursorExpired / NotFound for a bad cursor."""
        if tracing.ENABLED:
            self._backfill_span = tracing.tracer().start_span(
                "sse.backfill", attributes={"ductor_streams.cursor": self.last_sent}
            )
        try:
            page = await self._read_catch_up()
        except BaseException:
            self._end_backfill()
            raise
        self._catching_up = _more_after(page)
        self._pending = self._take(page)
        self._backfill_page(_count(page))
        self._last_activity = asyncio.get_running_loop().time()

    async def next(self, idle_timeout: float | None = None) -> Delivery | Terminal | None:
        """The next batches (or framed page) to send, a terminal event (after which there
        is nothing more), or ``None`` when nothing arrived within ``idle_timeout``
        seconds."""
        loop = asyncio.get_running_loop()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._last_activity = loop.time()
            return pending
        item = await self._next(loop, idle_timeout)
        self._last_activity = loop.time()
        return item

    async def _next(
        self, loop: asyncio.AbstractEventLoop, idle_timeout: float | None
    ) -> Delivery | Terminal | None:
        while True:
            if self._finished:
                raise RuntimeError("the subscription has ended")
            if self._terminal is not None:
                return self._finish(self._terminal)
            if self._overflowed:
                self._overflowed = False
                self._catching_up = True
            if self._catching_up:
                try:
                    page = await self._read_catch_up()
                except CursorExpired as exc:
                    return self._finish(Expired(exc))
                except NotFound:
                    return self._finish(Gone())
                except Exception as exc:
                    if not database_unavailable(exc):
                        raise
                    return self._finish(_interrupted(exc))
                self._catching_up = _more_after(page)
                taken = self._take(page)
                if not self._backfill_done:
                    self._backfill_page(_count(page))
                if taken is not None:
                    return taken
                continue
            if self._closed_at is not None and self.last_sent >= self._closed_at:
                return self._finish(End(self._closed_at))
            if not self._buffer:
                if idle_timeout is not None and (loop.time() - self._last_activity >= idle_timeout):
                    return None
                self._idle_timeout = idle_timeout
                self._waiter = loop.create_future()
                self._arm_timer(loop)
                try:
                    await self._waiter
                finally:
                    self._waiter = None
                continue
            delivery = await self._from_buffer()
            if isinstance(delivery, Expired | Gone | Interrupted):
                return self._finish(delivery)
            if delivery:
                return delivery

    def _backfill_page(self, records: int) -> None:
        self.backfilled += records
        if not self._catching_up:
            self._end_backfill()

    def _end_backfill(self) -> None:
        """The backfill is over (caught up, or the subscription ended first)."""
        if self._backfill_done:
            return
        self._backfill_done = True
        metrics.SSE_BACKFILL_RECORDS.observe(self.backfilled)
        span, self._backfill_span = self._backfill_span, None
        if span is not None:
            span.set_attribute("ductor_streams.records", self.backfilled)
            span.end()

    @property
    def finished(self) -> bool:
        return self._finished

    def _finish(self, terminal: Terminal) -> Terminal:
        self.close()
        return terminal

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _arm_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._idle_timeout is None:
            return
        deadline = self._last_activity + self._idle_timeout
        if self._timer is not None:
            if self._timer.when() <= deadline:
                return  # it fires first and re-arms itself for the rest
            # A shorter wait than the one the timer was set for.
            self._timer.cancel()
        self._timer = loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        # Fires at most once per idle interval; while deliveries keep coming, it only
        # re-arms itself for the new deadline.
        self._timer = None
        if self._waiter is None or self._waiter.done() or self._idle_timeout is None:
            return
        loop = self._waiter.get_loop()
        if loop.time() - self._last_activity >= self._idle_timeout:
            self._waiter.set_result(None)
        else:
            self._arm_timer(loop)

    def _note_bounds(self, closed: bool, latest: int) -> None:
        if closed:
            self._closed_at = latest

    def _take(self, page: Page | FramedPage) -> Delivery | None:
        """A read page as what ``next`` hands out (None: it holds no records)."""
        if isinstance(page, FramedPage):
            self._note_bounds(page.closed, page.latest_sequence)
            if not page.count:
                return None
            self.last_sent = page.last_sequence
            return page
        return self._take_page(page) or None

    def _take_page(self, page: Page) -> list[LiveBatch]:
        self._note_bounds(page.closed, page.latest_sequence)
        if not page.records:
            return []
        self.last_sent = page.records[-1].sequence
        return [LiveBatch(page.records, page.latest_sequence, page.closed)]

    async def _read_page(self, after: int, limit: int) -> Page:
        self.postgres_reads += 1
        return await self._read(after, limit)

    async def _read_catch_up(self) -> Page | FramedPage:
        """The backfill's or a catch-up's next page: framed when the edge frames them
        and the page does not start with a record that needs a ``Record``."""
        if self._read_framed is not None:
            self.postgres_reads += 1
            framed = await self._read_framed(self.last_sent, self._page)
            if framed is not None:
                return framed
        return await self._read_page(self.last_sent, self._page)

    async def _from_buffer(self) -> list[LiveBatch] | Expired | Gone | Interrupted:
        out: list[LiveBatch] = []
        count = 0
        while self._buffer and not self._overflowed and count < MAX_DELIVERY_RECORDS:
            batch = self._buffer.popleft()
            self._buffered -= max(1, len(batch.records))
            self._buffered_bytes -= batch.nbytes
            self._note_bounds(batch.closed, batch.latest_sequence)
            records = batch.records
            if not records or records[-1].sequence <= self.last_sent:
                continue  # nothing new: a duplicate of what was already sent
            if records[0].sequence <= self.last_sent:
                skip = self.last_sent - records[0].sequence + 1
                batch = LiveBatch(records[skip:], batch.latest_sequence, batch.closed)
                records = batch.records
            if records[0].sequence != self.last_sent + 1:
                # A gap: put the batch back and fill the hole from Postgres first.
                self._buffer.appendleft(batch)
                self._buffered += len(records)
                self._buffered_bytes += batch.nbytes
                if out:
                    return out
                return await self._repair(records[0].sequence)
            out.append(batch)
            count += len(records)
            self.last_sent = records[-1].sequence
        return out

    async def _repair(self, received: int) -> list[LiveBatch] | Expired | Gone | Interrupted:
        expected = self.last_sent + 1
        batches: list[LiveBatch] = []
        try:
            while self.last_sent + 1 < received:
                page = await self._read_page(
                    self.last_sent, min(received - 1 - self.last_sent, self._page)
                )
                if not page.records:
                    break  # cannot happen while sequences have no holes; never spin
                batches.extend(self._take_page(page))
        except CursorExpired as exc:
            return Expired(exc)
        except NotFound:
            return Gone()
        except Exception as exc:
            if not database_unavailable(exc):
                raise
            return _interrupted(exc)
        self.gaps += 1
        repaired = self.last_sent + 1 - expected
        metrics.GAP_REPAIRS.inc()
        metrics.GAP_REPAIRED_RECORDS.inc(repaired)
        log.warning(
            "live delivery gap repaired from Postgres",
            extra={"expected_sequence": expected, "received_sequence": received},
        )
        try:
            await self._record_gap(expected, received, repaired)
        except Exception:  # evidence is best effort; delivery goes on
            log.exception("could not record gap evidence")
        return batches


def _interrupted(exc: BaseException) -> Interrupted:
    # Ending the response loses nothing: last_sent is what the client saw last, and its
    # resume (Last-Event-ID) reads on from there once the database is back.
    report_unavailable("live", exc)
    return Interrupted()


def _more_after(page: Page | FramedPage) -> bool:
    """Whether records after the page existed when it was read: it was cut by its
    record limit or its byte limit (store.read.read_page), or a framed page by a record
    that refers to an object, not by the stream's end."""
    if isinstance(page, FramedPage):
        return page.count > 0 and page.last_sequence < page.latest_sequence
    return bool(page.records) and page.records[-1].sequence < page.latest_sequence


def _count(page: Page | FramedPage) -> int:
    return page.count if isinstance(page, FramedPage) else len(page.records)
