"""The dispatcher as a worker service of ``serve`` and ``workers`` (see ``process/services.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from ductor_streams import temporal_connection
from ductor_streams.config import Settings
from ductor_streams.delivery.dispatcher import Dispatcher, DispatcherConfig
from ductor_streams.delivery.outbox import ClaimedDelivery
from ductor_streams.delivery.temporal import TemporalWaitService
from ductor_streams.delivery.wait_service import InputEvent
from ductor_streams.foundation import tracing
from ductor_streams.runtime import Runtime
from ductor_streams.schema import QUERIES
from ductor_streams.store.append import LeasedDeliveries, LeaseTerms
from ductor_streams.store.db import DRIVER_ERRORS
from ductor_streams.store.models import StreamRef

log = logging.getLogger(__name__)

# The wakes that may make a delivery due: a record wake (``r``, ``R``: an append, an
# operator's retry) and a dispatcher giving leases back (``d0``). An ack (``a``) or a
# close (``c``) makes nothing due: with the workflow helper acking as it goes idle, a
# claim on those would be one empty claim per input record.
DUE_WAKES = "rRd"


class _InputWakes:
    """Turns the hub's wakes into dispatcher wakes, for input streams only (an output
    stream's appends create no deliveries). A stream's direction never changes.

    A wake through LISTEN that announces nothing past what this process's own append
    announced directly (``local``) wakes nobody: the claim that ``local`` set off came
    after that commit and saw its deliveries (and those of every earlier commit; a later
    commit of another process announces a later sequence). The same holds the other way
    round: the LISTEN wake of a local append can be read before the append's own answer,
    and then ``local`` has nothing left to announce."""

    def __init__(self, pool: asyncpg.Pool, dispatcher: Dispatcher, tenant: str) -> None:
        self._pool = pool
        self._dispatcher = dispatcher
        self._tenant = tenant
        self._is_input: dict[int, bool] = {}
        # stream_pk -> the last sequence a local append of it committed (and announced).
        self._announced: dict[int, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def local(self, ref: StreamRef, last_sequence: int) -> None:
        """An append of this process to an input stream committed (``Store.input_appended``)
        up to ``last_sequence``: the dispatcher claims at once, without the LISTEN round
        trip or a lookup."""
        if ref.key.tenant != self._tenant:
            return
        self._is_input[ref.stream_pk] = True
        if last_sequence <= self._announced.get(ref.stream_pk, 0):
            return  # announced already (its LISTEN wake was read first): its claim ran
        self._announce(ref.stream_pk, last_sequence)
        self._dispatcher.notify(ref.stream_pk, last_sequence)

    def _announce(self, stream_pk: int, last_sequence: int) -> None:
        if len(self._announced) > 100_000:
            self._announced.clear()  # forgetting only costs a claim that finds nothing
        self._announced[stream_pk] = last_sequence

    def __call__(self, stream_pk: int, latest: int | None = None) -> None:
        if latest is not None and latest <= self._announced.get(stream_pk, 0):
            return  # the echo of a local append (or older): its claim has run
        known = self._is_input.get(stream_pk)
        if stream_pk == 0:
            self._dispatcher.notify()
        elif known:
            if latest is not None:
                self._announce(stream_pk, latest)
            self._dispatcher.notify(stream_pk, latest)
        elif known is None:
            task = asyncio.get_running_loop().create_task(self._learn(stream_pk))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _learn(self, stream_pk: int) -> None:
        try:
            is_input = await self._pool.fetchval(QUERIES["delivery_stream_is_input"], stream_pk)
        except DRIVER_ERRORS:
            self._dispatcher.notify()
            return
        if is_input is None:
            return
        if len(self._is_input) > 100_000:
            self._is_input.clear()
        self._is_input[stream_pk] = bool(is_input)
        if is_input:
            self._dispatcher.notify(stream_pk)


class AppendLeases:
    """Leases taken by the append (``append_requests_leasing``): an append of this
    process to an input stream of the dispatcher's tenant, alone in its statement,
    leases its deliveries to the dispatcher when they are the stream's head, and the
    dispatcher signals them once the append's answer is back, with no claim in between.
    A stream the dispatcher holds already, or with no slot free, is appended as before
    and claimed on its wake."""

    def __init__(self, dispatcher: Dispatcher, tenant: str) -> None:
        self._dispatcher = dispatcher
        self._tenant = tenant

    def reserve(self, ref: StreamRef) -> LeaseTerms | None:
        dispatcher = self._dispatcher
        if ref.key.tenant != self._tenant or not dispatcher.reserve(ref.stream_pk):
            return None
        config = dispatcher.config
        return LeaseTerms(dispatcher.owner, config.lease_seconds, config.per_stream)

    def taken(self, leased: LeasedDeliveries) -> None:
        try:
            deliveries = self._deliveries(leased)
        except Exception:
            # Never leave the reservation standing (it holds a slot and the stream): the
            # rows' lease runs out instead, and a claim takes them then.
            log.exception("leased deliveries could not be handed over")
            self._dispatcher.unreserve(leased.ref.stream_pk)
            return
        self._dispatcher.adopt(deliveries, leased.started)

    def released(self, ref: StreamRef) -> None:
        self._dispatcher.unreserve(ref.stream_pk)

    @staticmethod
    def _deliveries(leased: LeasedDeliveries) -> list[ClaimedDelivery]:
        key = leased.ref.key
        return [
            ClaimedDelivery(
                delivery_id,
                leased.ref.stream_pk,
                0,  # attempts: a new row
                record.appended_at,  # created_at: the same transaction's now()
                InputEvent(
                    tenant=key.tenant,
                    run_id=key.run_id,
                    stream_id=key.stream_id,
                    sequence=record.sequence,
                    payload=json.loads(record.payload),
                    object=None,  # a record with an object is claimed instead
                    appended_at=record.appended_at.isoformat(),
                ),
                trace,
            )
            for delivery_id, record, trace in zip(
                leased.delivery_ids, leased.records, leased.traces, strict=True
            )
        ]


@contextlib.asynccontextmanager
async def dispatcher_service(runtime: Runtime) -> AsyncIterator[None]:
    """Run one dispatcher for the settings' tenant while the block runs (the process's
    runtime: ``serve``'s or ``workers``')."""
    settings: Settings = runtime.settings
    store = runtime.store
    # Connects on first delivery: Temporal being down delays input (rows back off, with
    # the reason in last_error) but never stops the process from starting.
    # With tracing on, the client carries Temporal's tracing interceptor: each signal's
    # span continues the dispatcher's (docs/operators.md, "Tracing").
    extra: dict[str, Any] = {}
    if tracing.ENABLED:
        # Deferred: Temporal's OpenTelemetry contrib is loaded only when tracing is on.
        from ductor_streams.foundation.temporal_tracing import interceptors

        extra["interceptors"] = interceptors()
    wait_service = TemporalWaitService(connect=temporal_connection.connector(settings, **extra))
    dispatcher = Dispatcher(
        store.pool,
        wait_service,
        tenant=settings.tenant,
        owner=settings.delivery_owner,
        config=DispatcherConfig(**settings.dispatcher_overrides()),
    )
    hub = getattr(store, "hub", None)
    wakes = _InputWakes(store.pool, dispatcher, settings.tenant)
    undo = hub.subscribe_any(wakes, kinds=DUE_WAKES) if hub is not None else None
    store.input_appended = wakes.local
    task = asyncio.get_running_loop().create_task(dispatcher.run(), name="input-dispatcher")
    appender = getattr(store, "appender", None)
    if appender is not None:
        appender.leases = AppendLeases(dispatcher, settings.tenant)
    log.info("input dispatcher started", extra={"owner": dispatcher.owner})
    try:
        yield
    finally:
        if undo is not None:
            undo()
        store.input_appended = None
        if appender is not None:
            appender.leases = None
        dispatcher.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task
