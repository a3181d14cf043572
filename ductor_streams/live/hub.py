"""The per-process notification hub: ONE dedicated LISTEN connection for all streams.

Notifications are wake signals (``r<pk>:<seq>`` records, ``a<pk>`` acks,
``c<pk>`` close); Postgres delivers them at commit, never before. Whoever is woken
re-reads durable state, unless it already has what the wake announces: a record wake
carries the stream's latest sequence at that commit (``r<pk>:<seq>``), which a live
follower that was fed its own process's appends has often delivered already. A plain
``r<pk>`` (older processes, an operator's retry) announces nothing more than "read".
A wake of kind ``R`` also carries the records it announces (store/wake_format.py):
they are handed to the stream's record watchers (its follower) before its wake.
When the LISTEN connection drops, the hub reconnects and wakes every watcher, because
notifications sent while it was away are lost.

A hub made with ``listen_on_demand`` (a Temporal worker's, whose activities rarely wait
for a wake) keeps its connection but LISTENs only while someone watches, and for
``LISTEN_LINGER_SECONDS`` after the last watcher left. Otherwise such a worker would
take every wake of the whole deployment, one per append statement and stream, each
decoded by the worker and sent to it by a Postgres backend of its own
(docs/decisions.md, "Wakes and live delivery"). A
watcher that arrives while nobody listens is woken, as after a reconnect, once the
LISTEN is in place: what committed before that was not announced to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator

import asyncpg

from ductor_streams.store.db import CONNECT_TIMEOUT_SECONDS, database_unavailable
from ductor_streams.store.models import Record
from ductor_streams.store.wake_format import KIND as RECORDS_KIND
from ductor_streams.store.wake_format import parse_record_wake

CHANNEL = "workflow_streams"
log = logging.getLogger(__name__)

# Reconnect attempts back off up to this many seconds apart: after a Postgres restart
# the hub is back (and its followers re-read) at most about this long after Postgres.
MAX_RECONNECT_DELAY = 1.0
# A hub that listens on demand UNLISTENs once nobody has watched for this long (watches
# that come and go, one per append of a writer that credit may refuse, keep it on).
LISTEN_LINGER_SECONDS = 30.0

StreamWakeCallback = Callable[[int, int | None], None]
"""``callback(stream_pk, latest)``: ``latest`` is the sequence a record wake says is
committed, or None when the wake says only that something changed."""
RecordsCallback = Callable[[list[Record]], None]
"""``callback(records)``: consecutive records of the stream, committed."""


class NotificationHub:
    """Fans Postgres notifications out to in-process watchers, per stream."""

    def __init__(
        self,
        dsn: str,
        *,
        reconnect_delay: float = 0.2,
        max_reconnect_delay: float = MAX_RECONNECT_DELAY,
        listen_on_demand: bool = False,
        listen_linger: float = LISTEN_LINGER_SECONDS,
    ) -> None:
        self._dsn = dsn
        self._on_demand = listen_on_demand
        self._linger = listen_linger
        # Whether the connection LISTENs now (always, unless on demand), and the task
        # that brings that in line with the watchers (one at a time on the connection).
        self._listening = False
        self._settle_task: asyncio.Task[None] | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self.listens = 0  # LISTENs taken up on demand (tests read it)
        self._reconnect_delay = reconnect_delay
        self._max_reconnect_delay = max_reconnect_delay
        self._conn: asyncpg.Connection | None = None
        self._watchers: dict[int, set[StreamWakeCallback]] = {}
        # callback -> the wake kinds it is called for (None: every kind).
        self._any_watchers: dict[StreamWakeCallback, frozenset[str] | None] = {}
        self._record_watchers: dict[int, set[RecordsCallback]] = {}
        self._reconnect_task: asyncio.Task[None] | None = None
        self._closed = False
        self.reconnects = 0

    async def start(self) -> None:
        """Open the LISTEN connection; when the database cannot be reached now, keep
        trying in the background (followers poll meanwhile) instead of failing."""
        try:
            await self._connect()
        except Exception as exc:
            if not database_unavailable(exc):
                raise
            log.warning("LISTEN connection unavailable at start; retrying in the background")
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def close(self) -> None:
        self._closed = True
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        if self._settle_task is not None:
            self._settle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._settle_task
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reconnect_task
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=2)
            self._conn = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    @property
    def on_demand(self) -> bool:
        """Whether the hub LISTENs only while watched (``listen_on_demand``)."""
        return self._on_demand

    @property
    def listening(self) -> bool:
        """Whether the connection LISTENs now (always so unless ``listen_on_demand``)."""
        return self.connected and self._listening

    @property
    def backend_pid(self) -> int | None:
        """The server process of the LISTEN connection (tests terminate it)."""
        return self._conn.get_server_pid() if self._conn is not None else None

    def subscribe(self, stream_pk: int, callback: StreamWakeCallback) -> Callable[[], None]:
        """Call ``callback(stream_pk, latest)`` on every wake of the stream; returns the
        undo."""
        self._watchers.setdefault(stream_pk, set()).add(callback)
        self._watched()

        def unsubscribe() -> None:
            callbacks = self._watchers.get(stream_pk)
            if callbacks is not None:
                callbacks.discard(callback)
                if not callbacks:
                    del self._watchers[stream_pk]
            self._unwatched()

        return unsubscribe

    def subscribe_records(self, stream_pk: int, callback: RecordsCallback) -> Callable[[], None]:
        """Call ``callback(records)`` with the records a wake of the stream carries,
        before the wake's own callbacks; returns the undo."""
        self._record_watchers.setdefault(stream_pk, set()).add(callback)
        self._watched()

        def unsubscribe() -> None:
            callbacks = self._record_watchers.get(stream_pk)
            if callbacks is not None:
                callbacks.discard(callback)
                if not callbacks:
                    del self._record_watchers[stream_pk]
            self._unwatched()

        return unsubscribe

    def subscribe_any(
        self, callback: StreamWakeCallback, *, kinds: str | None = None
    ) -> Callable[[], None]:
        """Call ``callback(stream_pk, latest)`` on every wake of every stream (only on
        wakes of the ``kinds`` given, e.g. ``"rRd"``, when given), and
        ``callback(0, None)`` after a reconnect (anything may have happened); returns the
        undo."""
        self._any_watchers[callback] = frozenset(kinds) if kinds is not None else None
        self._watched()

        def unsubscribe() -> None:
            self._any_watchers.pop(callback, None)
            self._unwatched()

        return unsubscribe

    @contextlib.contextmanager
    def watch(self, stream_pk: int) -> Iterator[asyncio.Event]:
        """An event set on every wake of the stream while the block runs.

        Enter it BEFORE reading durable state, so that no wake between the read and
        the wait is lost; clear it before each re-read.
        """
        event = asyncio.Event()
        undo = self.subscribe(stream_pk, lambda _pk, _latest: event.set())
        try:
            yield event
        finally:
            undo()

    # -- LISTEN on demand (the module docstring) --------------------------------------------

    def _has_watchers(self) -> bool:
        return bool(self._watchers or self._any_watchers or self._record_watchers)

    def _watched(self) -> None:
        if not self._on_demand:
            return
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if not self._listening:
            self._settle()

    def _unwatched(self) -> None:
        if not self._on_demand or self._has_watchers() or self._closed:
            return
        if self._linger_timer is None:
            # Listening (or about to) goes on for a while: the next watcher may be near.
            self._linger_timer = asyncio.get_running_loop().call_later(
                self._linger, self._linger_over
            )

    def _linger_over(self) -> None:
        self._linger_timer = None
        if not self._has_watchers():
            self._settle()

    def _settle(self) -> None:
        """Start bringing LISTEN in line with the watchers, unless that is under way."""
        if self._closed or (self._settle_task is not None and not self._settle_task.done()):
            return
        self._settle_task = asyncio.get_running_loop().create_task(self._settle_listen())

    async def _settle_listen(self) -> None:
        # One statement at a time on the connection: loop until the state holds still.
        while not self._closed:
            conn = self._conn
            if conn is None or conn.is_closed():
                return  # the reconnect LISTENs as the watchers then want
            want = self._has_watchers() or self._linger_timer is not None
            if want == self._listening:
                return
            try:
                if want:
                    await conn.add_listener(CHANNEL, self._on_notify)
                    self._listening = True
                    self.listens += 1
                    # What committed before the LISTEN was announced to nobody here.
                    self._wake_all()
                else:
                    await conn.remove_listener(CHANNEL, self._on_notify)
                    self._listening = False
            except Exception as exc:
                # The connection is going: its termination listener reconnects.
                log.warning("LISTEN change failed: %s", type(exc).__name__)
                return

    def _wake(self, stream_pk: int, latest: int | None = None, kind: str = "") -> None:
        # A broken watcher must not starve the others.
        for callback in list(self._watchers.get(stream_pk, ())):
            try:
                callback(stream_pk, latest)
            except Exception:
                log.exception("wake callback failed", extra={"stream_pk": stream_pk})
        for any_callback, kinds in list(self._any_watchers.items()):
            if kinds is not None and kind not in kinds:
                continue
            try:
                any_callback(stream_pk, latest)
            except Exception:
                log.exception("wake callback failed", extra={"stream_pk": stream_pk})

    def _wake_all(self) -> None:
        for stream_pk in list(self._watchers):
            self._wake(stream_pk)
        for callback in list(self._any_watchers):
            callback(0, None)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        wake = parse_wake(payload)
        if wake is None:
            return
        if payload.startswith(RECORDS_KIND) and wake[0] in self._record_watchers:
            parsed = parse_record_wake(payload)
            if parsed is not None:
                for callback in list(self._record_watchers.get(wake[0], ())):
                    try:
                        callback(parsed[2])
                    except Exception:
                        log.exception("records callback failed", extra={"stream_pk": wake[0]})
        self._wake(*wake, payload[:1])

    def _on_terminated(self, conn: object) -> None:
        if conn is not self._conn:
            return  # a connection that never finished starting (see _connect)
        self._conn = None
        self._listening = False
        if not self._closed and (self._reconnect_task is None or self._reconnect_task.done()):
            log.warning("LISTEN connection lost; reconnecting")
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _connect(self) -> None:
        conn = await asyncpg.connect(self._dsn, timeout=CONNECT_TIMEOUT_SECONDS)
        listen = not self._on_demand or self._has_watchers()
        try:
            if listen:
                await conn.add_listener(CHANNEL, self._on_notify)
        except BaseException:
            conn.terminate()  # e.g. Postgres went away again between the two
            raise
        self._listening = listen
        conn.add_termination_listener(self._on_terminated)
        if conn.is_closed():  # lost before the termination listener was there to notice
            raise asyncpg.exceptions.ConnectionDoesNotExistError("lost while it started")
        self._conn = conn
        if self._on_demand and self._has_watchers() != listen:
            self._settle()  # watchers came or went while it connected

    async def _reconnect(self) -> None:
        delay = self._reconnect_delay
        while not self._closed:
            try:
                await self._connect()
            except Exception as exc:
                # Postgres is restarting, failing over or unreachable: keep trying, with
                # backoff, for as long as it takes.
                log.warning("LISTEN reconnect failed: %s", type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_reconnect_delay)
                continue
            log.info("LISTEN connection back; every follower re-reads")
            self.reconnects += 1
            # Anything committed while we were away was not announced: everyone re-reads.
            self._wake_all()
            return


def parse_wake(payload: str) -> tuple[int, int | None] | None:
    """``(stream_pk, latest)`` of a wake payload, or None for one that is no wake.

    ``latest`` only for a record wake that carries it (``r<pk>:<seq>``, and
    ``R<pk>:<seq>:...`` with its records); ``a<pk>``, ``c<pk>`` and a plain ``r<pk>``
    give None.
    """
    kind = payload[:1]
    pk_text, _, latest_text = payload[1:].partition(":")
    if kind == RECORDS_KIND:
        latest_text = latest_text.partition(":")[0]
    try:
        stream_pk = int(pk_text)
        latest = int(latest_text) if kind in ("r", RECORDS_KIND) and latest_text else None
    except ValueError:
        return None
    return stream_pk, latest
