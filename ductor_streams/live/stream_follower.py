"""The per-process follower of one stream: one read per wake, fanned out in memory.

However many subscribers this process has on a stream, each wake of the stream costs
one read of ``sequence > last_read`` (more only when a read fills a whole page). The
batch is handed to every registered subscriber without awaiting any of them, so a slow
subscriber never delays the others.

Correctness rests on two rules. A follower watches the hub, then registers the watch
that makes appends notify and reads ``latest_sequence`` in one statement
(``Followers.subscribe``), and starts after that: everything committed later is
announced to it; and
``last_read`` only moves through reads whose batch is fanned out to every subscriber
registered at that moment. A record committed after a subscriber registered is then
either fanned out to it, or was read by a read that began after it registered, which
also fanned out to it. Records committed before it registered are in its own backfill.

Appends of this process are also ``feed``-ed to the follower right after their commit
returned (store/append.py): a fed batch that follows on from ``last_read`` is fanned
out like a read's, without the read. It obeys the same rule (committed before it is
fanned out to everyone registered then), so it moves ``last_read`` just as a read
does. Anything else fed (another process appended in between) is dropped: the wake
every commit still sends brings a read, which delivers it. While a statement of this
process appends to the stream, a wake's read waits for it to end (its wake often
arrives before its own answer, and the read would then deliver its records a round trip
later than the feed): the read still happens, right after, and the safety poll reads
regardless. Once a fed batch did not follow on because records committed elsewhere
come first, the wake's read goes at once instead: with this process's statements
following each other back to back, "after it ends" might otherwise not come until the
process stops appending.

A fed batch that follows on from ``last_read`` while the follower's task waits with
nothing to do is fanned out within the ``feed`` call itself (the hub's NOTIFY callback,
or the appender's turn after its commit returned) instead of a turn of the event loop
later, when the task would have run with exactly that state. Fed batches that arrive
while the task has work pending queue up and go out together as before.

A record wake says up to which sequence the stream has committed (``r<pk>:<seq>``).
When ``last_read`` has reached it (the feed delivered this process's
own commit), the wake's read is skipped: everything it announces was fanned out already.
A wake that carries no sequence (close, acks, a reconnect, older senders) always reads.
Wakes of one stream may arrive out of order (one queued in ``store/wakes.py`` after a
commit can be overtaken by the NOTIFY of the stream's next statement), so the largest
announced since the last read counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

from ductor_streams.errors import CursorExpired, NotFound
from ductor_streams.foundation.metrics import FOLLOWER_LAG, LIVE_FED
from ductor_streams.live.events import LiveBatch
from ductor_streams.live.hub import NotificationHub
from ductor_streams.live.subscription import Subscription
from ductor_streams.store.db import database_unavailable
from ductor_streams.store.models import Page, Record
from ductor_streams.store.outage import report_unavailable

log = logging.getLogger(__name__)

# Failed reads are retried after retry_delay, doubling up to this many seconds while they
# keep failing (the database is restarting); the hub's reconnect wakes the follower too.
MAX_RETRY_DELAY = 1.0

# A wake that does not say up to where to read: read everything.
READ_ALL = 1 << 62

# Subscribers served per turn of the event loop. A fan-out to a thousand subscribers
# writes a thousand sockets (milliseconds of CPU); in slices, the appends and reads of
# the same process are not held up behind all of it.
FAN_OUT_SLICE = 128

Reader = Callable[[int, int, int], Awaitable[Page]]
"""``read(stream_pk, after, limit)``, e.g. ``store.read.read_page`` over the pool."""


class StreamFollower:
    """Follows one stream for the subscribers of this process."""

    def __init__(
        self,
        stream_pk: int,
        *,
        hub: NotificationHub,
        read: Reader,
        page_records: int,
        poll_seconds: float | None = None,
        retry_delay: float = 0.2,
    ) -> None:
        self.stream_pk = stream_pk
        self.last_read = 0  # set by start()
        self._hub = hub
        self._read = read
        self._page = page_records
        self._poll_seconds = poll_seconds
        self._retry_delay = retry_delay
        self._subscribers: dict[Subscription, None] = {}
        self._wake = asyncio.Event()
        self._polled = False  # the poll timer ran out (see _run)
        # The highest sequence a wake since the last read announced (READ_ALL: unknown, or
        # the poll ran out); a read is due while it is above last_read.
        self._read_to = 0
        # A fed batch showed records committed elsewhere that were never read: their
        # wake's read goes at once, even beside a statement of ours (see _deliver_fed).
        self._read_now = False
        self._fed: deque[list[Record]] = deque()
        self._own_appends = 0  # statements of this process appending to the stream now
        self._stopped = False
        self._unwatch: Callable[[], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed_announced = False
        self._parked = False  # the task waits for a wake (see _run)
        self.reads = 0
        self.fed_batches = 0  # fed batches fanned out without a read

    def watch(self) -> None:
        """Take the stream's wakes from now on (before the start point is read, so that
        none between that read and ``start`` is lost)."""
        if self._unwatch is None:
            unwatch = self._hub.subscribe(self.stream_pk, self._on_wake)
            # Records a wake carries (another process's commit) are fed as our own are.
            unfeed = self._hub.subscribe_records(self.stream_pk, self.feed)

            def undo() -> None:
                unwatch()
                unfeed()

            self._unwatch = undo

    def start(self, after: int) -> None:
        """Follow from ``after``: a latest sequence read after ``watch``."""
        self.watch()
        self.last_read = after
        self._task = asyncio.get_running_loop().create_task(self._run())

    def add(self, subscription: Subscription) -> None:
        self._subscribers[subscription] = None

    def drain(self) -> None:
        """End every subscription of this stream for a shutdown (``Subscription.drain``)."""
        for subscription in list(self._subscribers):
            subscription.drain()

    def remove(self, subscription: Subscription) -> bool:
        """Unregister; returns True when no subscriber is left."""
        self._subscribers.pop(subscription, None)
        return not self._subscribers

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def stop(self) -> None:
        """Stop following; a read in flight finishes (its batch goes nowhere)."""
        self._stopped = True
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        self._wake.set()

    async def wait_stopped(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def feed(self, records: list[Record]) -> None:
        """Take consecutive records whose commit has ALREADY happened: returned in this
        process, or announced by a wake that carries them (store/wake_format.py)."""
        if self._stopped:
            return
        # The task waits for a wake with nothing pending: deliver now, as it would.
        idle = self._parked and not self._wake.is_set() and not self._fed
        if idle and self._deliver_now(records):
            return
        self._fed.append(records)
        self._wake.set()

    def _deliver_now(self, records: list[Record]) -> bool:
        """Fan ``records`` out within this call when they follow on from ``last_read``
        (what ``_deliver_fed`` would do one turn later); False leaves them to the task:
        they do not follow on (the task drops them, and the wake's read goes at once),
        or there are more subscribers than one slice of a fan-out serves."""
        if len(self._subscribers) > FAN_OUT_SLICE:
            return False
        expected = self.last_read + 1
        fed = [r for r in records if r.sequence >= expected]
        if not fed:
            return True  # read or fed already
        if fed[0].sequence != expected:
            return False
        try:
            self._offer(LiveBatch(fed, fed[-1].sequence, False), list(self._subscribers))
        except Exception:
            # Never into the caller (the appender's answer, the hub's callback): the task
            # reads them instead; a subscriber that got them drops the repeat.
            log.exception("live fan-out failed", extra={"stream_pk": self.stream_pk})
            self._read_to = READ_ALL
            self._wake.set()
            return True
        self.last_read = fed[-1].sequence
        self.fed_batches += 1
        LIVE_FED.n += 1
        return True

    def own_append(self, underway: bool) -> None:
        """A statement of this process appending to the stream starts or has ended."""
        if underway:
            self._own_appends += 1
        else:
            # A follower started while the statement was in flight never saw it start.
            self._own_appends = max(0, self._own_appends - 1)
            if self._read_due and not self._own_appends:
                self._wake.set()

    @property
    def _read_due(self) -> bool:
        return self._read_to > self.last_read

    def _on_wake(self, _stream_pk: int, latest: int | None) -> None:
        self._read_to = max(self._read_to, READ_ALL if latest is None else latest)
        self._wake.set()

    def _on_poll(self) -> None:
        # A safety net: a wake lost between commit and LISTEN costs a delay only.
        self._polled = True
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        retry_delay = self._retry_delay
        while True:
            # A timer rather than asyncio.wait_for, which wraps the wait in a task of its
            # own: a wake would then reach this loop three turns of the event loop after
            # it was set, behind the answers of the appends that fed it, instead of one.
            poll = (
                loop.call_later(self._poll_seconds, self._on_poll)
                if self._poll_seconds is not None
                else None
            )
            try:
                self._parked = True  # feed() may deliver meanwhile (see _deliver_now)
                await self._wake.wait()
            finally:
                self._parked = False
                if poll is not None:
                    poll.cancel()
            polled, self._polled = self._polled, False
            if polled:
                self._read_to = READ_ALL
            self._wake.clear()
            if self._stopped:
                return
            try:
                await self._deliver_fed()
                if self._read_due and (polled or self._read_now or not self._own_appends):
                    self._read_to = 0
                    self._read_now = False
                    await self._read_new()
            except Exception as exc:
                # The pool or the database hiccuped: try again soon, backing off while
                # the database stays away (a restart). Subscribers keep what they have;
                # nothing is skipped because last_read did not move.
                if database_unavailable(exc):
                    report_unavailable("live", exc)
                else:
                    log.exception("live follower read failed", extra={"stream_pk": self.stream_pk})
                await asyncio.sleep(retry_delay)
                retry_delay = min(retry_delay * 2, MAX_RETRY_DELAY)
                self._read_to = READ_ALL
                self._wake.set()
            else:
                retry_delay = self._retry_delay

    async def _deliver_fed(self) -> None:
        while self._fed and not self._stopped:
            # Everything fed meanwhile goes out as one batch: under load (a fan-out to
            # many subscribers takes a while) one write per subscriber carries several
            # appends, as one read after several wakes would.
            records: list[Record] = []
            expected = self.last_read + 1
            while self._fed:
                fed = [r for r in self._fed.popleft() if r.sequence >= expected]
                if fed and fed[0].sequence == expected:
                    records.extend(fed)
                    expected = fed[-1].sequence + 1
                elif fed:
                    # Records before these were committed by another writer (or carry
                    # an object, which is never fed) and not read yet. Their wake's read
                    # must not wait for our statements to end: with statements following
                    # each other back to back, that would be when this process stops
                    # appending. Holding it back only served to let the feed go first.
                    self._read_now = True
                # else: read already
            if not records:
                return
            await self._fan_out(LiveBatch(records, records[-1].sequence, False))
            self.last_read = records[-1].sequence
            self.fed_batches += 1
            LIVE_FED.n += 1

    async def _read_new(self) -> None:
        while not self._stopped:
            try:
                page = await self._read(self.stream_pk, self.last_read, self._page)
            except CursorExpired as exc:
                # Retention passed us: go on from the first retained record. Subscribers
                # see the hole, try to repair it and get the 410 as an error event.
                self.last_read = int(exc.extra["earliest_sequence"]) - 1
                continue
            except NotFound:
                for subscription in list(self._subscribers):
                    subscription.stream_gone()
                return
            finally:
                self.reads += 1
            if page.records or (page.closed and not self._closed_announced):
                self._closed_announced = page.closed
                batch = LiveBatch(page.records, page.latest_sequence, page.closed)
                await self._fan_out(batch)
                if page.records:
                    self.last_read = page.records[-1].sequence
            if not page.records or page.records[-1].sequence >= page.latest_sequence:
                return  # read up to the stream's latest (a page may be cut by bytes)

    async def _fan_out(self, batch: LiveBatch) -> None:
        # The snapshot is taken after the read: whoever registers later (even between
        # slices) began its own backfill after this read, so it has these records.
        subscribers = list(self._subscribers)
        for start in range(0, len(subscribers), FAN_OUT_SLICE):
            if start:
                await asyncio.sleep(0)
            self._offer(batch, subscribers[start : start + FAN_OUT_SLICE], lag=not start)

    def _offer(self, batch: LiveBatch, subscribers: list[Subscription], lag: bool = True) -> None:
        """Hand ``batch`` to ``subscribers`` (one slice of a fan-out; ``lag``: the first,
        which observes the follower's lag)."""
        if lag and batch.records:
            FOLLOWER_LAG.observe(max(0.0, time.time() - batch.records[-1].appended_at.timestamp()))
        for subscription in subscribers:
            subscription.offer(batch)
