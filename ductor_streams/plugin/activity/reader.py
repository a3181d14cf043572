"""``StreamReader``: the records of a stream after a cursor, live, inside an activity.

It subscribes through the worker's ``live.Followers``, the machinery behind SSE: one
follower per stream and worker, woken by the LISTEN hub and fed the worker's own
appends, so a record appended over HTTP reaches the activity a few milliseconds after
its commit. The reader heartbeats its cursor: a record counts as consumed once the
activity asks for the next one, and a retried attempt (same activity, any worker)
starts after the last record the previous attempt consumed. The record being handled
when an attempt died is therefore handed out again: at least once per record, in order.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from types import TracebackType

from ductor_streams.activities.errors import to_application_error
from ductor_streams.activities.models import StreamRecord
from ductor_streams.activities.streams import StreamsActivities
from ductor_streams.errors import NotFound, StreamsError
from ductor_streams.live.events import End, Expired, Gone, LiveBatch
from ductor_streams.live.followers import Followers
from ductor_streams.live.subscription import Subscription
from ductor_streams.plugin.activity.attempt import AttemptState
from ductor_streams.store import StreamKey, StreamRef
from ductor_streams.store.db import database_unavailable

# Resubscribing after the database went away waits this long, doubling up to 1 s.
RESUBSCRIBE_DELAY_SECONDS = 0.1


class StreamReader:
    """Reads one stream from inside an activity; use ``stream_reader(...)``."""

    def __init__(
        self,
        current: StreamsActivities,
        state: AttemptState,
        run_id: str,
        stream_id: str,
        *,
        cursor: int | None,
        idle_heartbeat: float,
    ) -> None:
        self._current = current
        self._state = state
        self.run_id = run_id
        self.stream_id = stream_id
        self._key = f"{run_id}/{stream_id}"
        resumed = state.readers.get(self._key, 0)
        self.cursor = max(cursor or 0, resumed)
        """The last consumed sequence: the next record handed out comes after it."""
        self._idle = idle_heartbeat
        self._ref: StreamRef | None = None
        self._followers: Followers | None = None
        self._subscription: Subscription | None = None
        self._ready: deque[StreamRecord] = deque()
        self._handed: StreamRecord | None = None
        self._received = self.cursor  # the last sequence taken from the subscription
        self._ended = False
        self._opened = False

    async def __aenter__(self) -> StreamReader:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> StreamReader:
        return self

    async def __anext__(self) -> StreamRecord:
        if not self._opened:
            await self._open()
        if self._handed is not None:  # asked for the next one: the last is consumed
            self._consumed(self._handed.sequence)
            self._handed = None
        while not self._ready:
            if self._ended:
                await self.aclose()
                raise StopAsyncIteration
            await self._receive()
        record = self._ready.popleft()
        self._handed = record
        return record

    async def aclose(self) -> None:
        """Stop reading: release the subscription (what was handed out counts as
        consumed only once the next record was asked for)."""
        self._release()
        if self._opened:
            self._opened = False
            self._state.closed()

    # ---------------------------------------------------------------------------------------

    async def _open(self) -> None:
        current = self._current
        key = StreamKey(current.settings.tenant, self.run_id, self.stream_id)
        try:
            self._ref = await current.store.get_stream(key)
            current.check_egress(self._ref)
        except StreamsError as exc:
            raise to_application_error(exc) from exc
        self._followers = current.runtime.followers
        self._opened = True
        self._state.opened()
        self._state.readers[self._key] = self.cursor
        await self._subscribe()

    async def _subscribe(self) -> None:
        assert self._followers is not None and self._ref is not None
        delay = RESUBSCRIBE_DELAY_SECONDS
        while True:
            try:
                self._subscription = await self._followers.subscribe(
                    self._ref.stream_pk, self._received
                )
                return
            except StreamsError as exc:
                if not database_unavailable(exc):
                    raise to_application_error(exc) from exc
            except Exception as exc:
                if not database_unavailable(exc):
                    raise
            self._state.heartbeat()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _release(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None and self._followers is not None and self._ref is not None:
            self._followers.release(self._ref.stream_pk, subscription)

    async def _receive(self) -> None:
        if self._subscription is None:
            await self._subscribe()
        assert self._subscription is not None
        item = await self._subscription.next(idle_timeout=self._idle)
        if item is None:  # idle: still alive
            self._state.heartbeat()
            return
        if isinstance(item, list):
            self._take(item)
            return
        self._release()  # a terminal: the subscription has ended
        if isinstance(item, End):
            self._ended = True
        elif isinstance(item, Expired):
            raise to_application_error(item.error) from item.error
        elif isinstance(item, Gone):
            error = NotFound(f"stream {self.stream_id!r} of run {self.run_id!r} is gone")
            raise to_application_error(error)
        else:
            # Interrupted (the database went away) or Draining: subscribe again from
            # the last record received, after a pause.
            self._state.heartbeat()
            await asyncio.sleep(RESUBSCRIBE_DELAY_SECONDS)

    def _take(self, batches: list[LiveBatch]) -> None:
        for batch in batches:
            for r in batch.records:
                if r.sequence <= self._received:
                    continue
                self._received = r.sequence
                self._ready.append(
                    StreamRecord(
                        stream_id=self.stream_id,
                        sequence=r.sequence,
                        payload=json.loads(r.payload),
                        object=r.object,
                        appended_at=r.appended_at.isoformat(),
                    )
                )

    def _consumed(self, sequence: int) -> None:
        self.cursor = sequence
        self._state.readers[self._key] = sequence
        self._state.heartbeat()
