"""``StreamReader``: the records of a stream after a cursor, live, inside an activity.

It subscribes through the worker's ``live.Followers``, the machinery behind SSE: one
follower per stream and worker, woken by the LISTEN hub and fed the worker's own
appends, so a record appended over HTTP reaches the activity a few milliseconds after
its commit. The reader heartbeats its cursor: a record counts as consumed once the
activity asks for the next one, and a retried attempt (same activity, any worker)
starts after the last record the previous attempt consumed. The record being handled
when an attempt died is therefore handed out again: at least once per record, in order.

Beside the cursor it keeps the fingerprint of the record there (heartbeat details too),
and resumes with it, a retried attempt as well as a resubscription after the database
went away (a failover): when the stream's record at the cursor is not that one, a
failover lost commits the reader had, and it raises ``history_diverged`` rather than go
on after records that are not the ones it consumed (store/fingerprint.py).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from types import TracebackType

from ductor_streams.activities.application_errors import to_application_error
from ductor_streams.activities.models import StreamRecord
from ductor_streams.activities.streams import StreamsActivities
from ductor_streams.errors import NotFound, StreamsError
from ductor_streams.live.events import End, Expired, Gone, LiveBatch
from ductor_streams.live.followers import Followers
from ductor_streams.live.subscription import Subscription
from ductor_streams.plugin.streaming.attempt import AttemptState
from ductor_streams.store import StreamKey, StreamRef
from ductor_streams.store.db import database_unavailable
from ductor_streams.store.fingerprint import parse_fingerprint, record_fingerprint

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
        fingerprint: str | None = None,
    ) -> None:
        self._current = current
        self._state = state
        self.run_id = run_id
        self.stream_id = stream_id
        self._key = f"{run_id}/{stream_id}"
        resumed = state.readers.get(self._key, 0)
        self.cursor = max(cursor or 0, resumed)
        """The last consumed sequence: the next record handed out comes after it."""
        if resumed > (cursor or 0):  # the previous attempt's record, and its fingerprint
            fingerprint = state.reader_fingerprints.get(self._key)
        elif resumed and resumed == cursor:
            fingerprint = state.reader_fingerprints.get(self._key, fingerprint)
        self.fingerprint: str | None = fingerprint if self.cursor else None
        """The fingerprint of the record at ``cursor`` (None: unknown, or cursor 0)."""
        self._idle = idle_heartbeat
        self._ref: StreamRef | None = None
        self._followers: Followers | None = None
        self._subscription: Subscription | None = None
        self._ready: deque[StreamRecord] = deque()
        self._handed: StreamRecord | None = None
        self._received = self.cursor  # the last sequence taken from the subscription
        self._received_fingerprint = self.fingerprint  # and its record's fingerprint
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
            self._consumed(self._handed)
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
            parse_fingerprint(self.fingerprint, self.cursor)  # a malformed one: refused
            self._ref = await current.store.get_stream(key)
            current.check_egress(self._ref)
        except StreamsError as exc:
            raise to_application_error(exc) from exc
        self._followers = current.runtime.followers
        self._opened = True
        self._state.opened()
        self._state.readers[self._key] = self.cursor
        self._remember_fingerprint(self.fingerprint)
        await self._subscribe()

    async def _subscribe(self) -> None:
        assert self._followers is not None and self._ref is not None
        delay = RESUBSCRIBE_DELAY_SECONDS
        while True:
            try:
                # Resuming after a record: the stream must still have that record.
                self._subscription = await self._followers.subscribe(
                    self._ref.stream_pk,
                    self._received,
                    fingerprint=self._received_fingerprint if self._received else None,
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
                fingerprint = record_fingerprint(r.sequence, r.appended_at, r.size)
                self._received = r.sequence
                self._received_fingerprint = fingerprint
                self._ready.append(
                    StreamRecord(
                        stream_id=self.stream_id,
                        sequence=r.sequence,
                        payload=json.loads(r.payload),
                        object=r.object,
                        appended_at=r.appended_at.isoformat(),
                        fingerprint=fingerprint,
                    )
                )

    def _consumed(self, record: StreamRecord) -> None:
        self.cursor = record.sequence
        self.fingerprint = record.fingerprint
        self._state.readers[self._key] = record.sequence
        self._remember_fingerprint(record.fingerprint)
        self._state.heartbeat()

    def _remember_fingerprint(self, fingerprint: str | None) -> None:
        if fingerprint is None:
            self._state.reader_fingerprints.pop(self._key, None)
        else:
            self._state.reader_fingerprints[self._key] = fingerprint
