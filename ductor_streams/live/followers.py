"""The entry point of live delivery: subscribe to a stream in this process.

Keeps at most one ``StreamFollower`` per stream, created with the first subscriber and
stopped with the last, all woken by the process's one ``NotificationHub``. Appends
notify only for watched (or input) streams (``streams.watched_until``), so each follower's stream
is watched from before its start point is read, and renewed here while followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from functools import partial

import asyncpg

from ductor_streams.config import LiveSettings
from ductor_streams.errors import NotFound
from ductor_streams.live.hub import NotificationHub
from ductor_streams.live.read_batch import ReadBatcher
from ductor_streams.live.stats import LIVE_READS
from ductor_streams.live.stream_follower import StreamFollower
from ductor_streams.live.subscription import Subscription
from ductor_streams.schema import QUERIES
from ductor_streams.store.db import database_unavailable
from ductor_streams.store.models import Page, Record
from ductor_streams.store.outage import report_unavailable
from ductor_streams.store.read import read_page, verify_fingerprint
from ductor_streams.store.read_frames import FramedPage, read_sse_frames

log = logging.getLogger(__name__)

# See ``Followers.follows``.
FEED_MAX_SUBSCRIBERS = 128


class Followers:
    """Subscriptions of this process, one follower per followed stream."""

    def __init__(
        self, pool: asyncpg.Pool, hub: NotificationHub, settings: LiveSettings | None = None
    ) -> None:
        self._pool = pool
        self._hub = hub
        self.settings = settings or LiveSettings()
        self._followers: dict[int, StreamFollower] = {}
        # Followers woken in the same turn read in one statement (live/read_batch.py).
        self._reads = ReadBatcher(pool, self.settings.page_bytes)
        self._rewatch_task: asyncio.Task[None] | None = None
        self.draining = False
        self.detected_by = f"live@{socket.gethostname()}:{os.getpid()}"

    async def subscribe(
        self,
        stream_pk: int,
        cursor: int,
        *,
        sse_frames: bool = False,
        fingerprint: str | None = None,
    ) -> Subscription:
        """Register a subscriber after ``cursor``, then read its first page.

        Raises what a read with that cursor raises (CursorInFuture, CursorExpired,
        NotFound), before anything is sent; the caller must ``release`` the returned
        subscription when done with it. With ``sse_frames`` (the native SSE response of
        a reader without redaction) the subscription's own pages come as ``FramedPage``s
        of SSE record events that Postgres wrote (store/read_frames.py). With
        ``fingerprint`` (of the record the subscriber saw at ``cursor``), first
        HistoryDiverged when the stream's record there differs (store/fingerprint.py).
        """
        if fingerprint is not None:
            await verify_fingerprint(self._pool, stream_pk, cursor, fingerprint)
        follower = self._followers.get(stream_pk)
        if follower is None:
            follower = await self._start_follower(stream_pk)
        subscription = Subscription(
            cursor,
            read=partial(self._subscriber_read, stream_pk),
            record_gap=partial(self._record_gap, stream_pk),
            buffer_records=self.settings.buffer_records,
            page_records=self.settings.page_records,
            buffer_bytes=self.settings.buffer_bytes,
            read_framed=partial(self._framed_read, stream_pk) if sse_frames else None,
        )
        follower.add(subscription)  # registered BEFORE the first read: nothing slips by
        if self.draining:
            subscription.drain()
        try:
            await subscription.prime()
        except BaseException:
            self.release(stream_pk, subscription)
            raise
        return subscription

    async def _start_follower(self, stream_pk: int) -> StreamFollower:
        candidate = StreamFollower(
            stream_pk,
            hub=self._hub,
            read=self._follower_read,
            page_records=self.settings.page_records,
            poll_seconds=self.settings.poll_seconds,
        )
        candidate.watch()  # a wake arriving while the start point is read is kept
        LIVE_READS.labels("start").inc()
        try:
            # Appends that lock the stream after this notify (``watched_until``).
            latest = await self._pool.fetchval(
                QUERIES["live_stream_watch"], stream_pk, self.settings.watch_seconds
            )
        except BaseException:
            candidate.stop()
            raise
        follower = self._followers.get(stream_pk)  # another subscriber may have won
        if latest is None or follower is not None:
            candidate.stop()
            if follower is None:
                raise NotFound("stream does not exist")
            return follower
        candidate.start(after=int(latest))
        self._followers[stream_pk] = candidate
        if self._rewatch_task is None:
            self._rewatch_task = asyncio.get_running_loop().create_task(self._rewatch())
        return candidate

    async def _rewatch(self) -> None:
        """Renew the watch of every followed stream well before it lapses."""
        while True:
            await asyncio.sleep(self.settings.watch_seconds / 3)
            if not self._followers:
                continue
            try:
                await self._pool.execute(
                    QUERIES["live_streams_rewatch"],
                    list(self._followers),
                    self.settings.watch_seconds,
                )
            except Exception as exc:
                # A lapsed watch only delays other processes' wakes: followers also poll.
                if database_unavailable(exc):
                    report_unavailable("live", exc)
                else:
                    log.exception("could not renew the watch of followed streams")

    def drain(self) -> None:
        """The server is shutting down: end every subscription (and any that starts
        from now on) with ``Draining``, so each client resumes on another server."""
        self.draining = True
        for follower in list(self._followers.values()):
            follower.drain()

    def release(self, stream_pk: int, subscription: Subscription) -> None:
        """Unregister a subscription; the last one out stops the stream's follower."""
        subscription.close()
        follower = self._followers.get(stream_pk)
        if follower is not None and follower.remove(subscription):
            follower.stop()
            del self._followers[stream_pk]

    def follows(self, stream_pk: int) -> bool:
        """Whether this process follows the stream with few enough subscribers to take
        its own appends fed (``store.append.CommitFeed``).

        With more than ``FEED_MAX_SUBSCRIBERS`` the follower reads instead: a fan-out
        that long is CPU-bound, and the records committed during a read go out together
        (docs/decisions.md, "Wakes and live delivery").
        """
        follower = self._followers.get(stream_pk)
        return follower is not None and follower.subscriber_count <= FEED_MAX_SUBSCRIBERS

    def committed(self, stream_pk: int, records: list[Record]) -> None:
        """Records this process has just committed: its follower fans them out without
        a read when they follow on from what it delivered (``store.append.CommitFeed``)."""
        follower = self._followers.get(stream_pk)
        if follower is not None:
            follower.feed(records)

    def appending(self, stream_pk: int, underway: bool) -> None:
        """A statement of this process appending to the stream starts or has ended
        (``store.append.CommitFeed``): its follower holds a wake's read back meanwhile."""
        follower = self._followers.get(stream_pk)
        if follower is not None:
            follower.own_append(underway)

    def follower(self, stream_pk: int) -> StreamFollower | None:
        return self._followers.get(stream_pk)

    async def close(self) -> None:
        if self._rewatch_task is not None:
            self._rewatch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rewatch_task
            self._rewatch_task = None
        followers, self._followers = list(self._followers.values()), {}
        for follower in followers:
            follower.stop()
        for follower in followers:
            await follower.wait_stopped()
        self._reads.release()

    async def _follower_read(self, stream_pk: int, after: int, limit: int) -> Page:
        LIVE_READS.labels("follower").inc()
        return await self._reads.read(stream_pk, after, limit)

    async def _subscriber_read(self, stream_pk: int, after: int, limit: int) -> Page:
        LIVE_READS.labels("subscriber").inc()
        return await self._read(stream_pk, after, limit)

    async def _framed_read(self, stream_pk: int, after: int, limit: int) -> FramedPage | None:
        LIVE_READS.labels("subscriber").inc()
        return await read_sse_frames(
            self._pool, stream_pk, after, limit, max_bytes=self.settings.page_bytes
        )

    async def _read(self, stream_pk: int, after: int, limit: int) -> Page:
        return await read_page(
            self._pool, stream_pk, after, limit, max_bytes=self.settings.page_bytes
        )

    async def _record_gap(
        self, stream_pk: int, expected: int, received: int, repaired: int
    ) -> None:
        await self._pool.execute(
            QUERIES["gap_evidence_insert"],
            stream_pk,
            expected,
            received,
            repaired,
            self.detected_by,
        )
