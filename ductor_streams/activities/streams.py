"""Thin activities over the Store: create, append, close, ack, read.

Each one turns its dataclass input into one Store call, inside ``domain_errors()`` (the
single domain -> ApplicationError mapping). The tenant is the plugin's
(``DUCTOR_STREAMS_TENANT``); the run is named by the caller, normally the calling
workflow's ID (the helpers pass ``workflow.info().workflow_id``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from temporalio import activity

from ductor_streams.activities import models
from ductor_streams.activities.application_errors import domain_errors
from ductor_streams.config import Settings
from ductor_streams.errors import EgressDenied
from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.runtime import Runtime, open_runtime
from ductor_streams.store import Store, StreamKey, StreamRef, encode_batch
from ductor_streams.store.fingerprint import record_fingerprint


class StreamsActivities:
    """The activities, bound to one ``Runtime`` (ductor_streams/runtime/__init__.py).

    ``lifetime()`` opens the runtime from the settings (pool, LISTEN hub, store,
    followers, object service, in the runtime's order) and closes it, unless one was
    given: then the caller opened it and closes it. While a lifetime runs,
    ``StreamsActivities.current()`` is the instance (the object helpers and the activity
    stream helpers, ``activities.objects`` and ``plugin.streaming``, use its runtime).
    """

    _current: StreamsActivities | None = None

    def __init__(self, settings: Settings, *, runtime: Runtime | None = None) -> None:
        self._settings = settings
        self._given = runtime
        self._runtime = runtime

    @classmethod
    def current(cls) -> StreamsActivities:
        if cls._current is None:
            raise RuntimeError("no StreamsPlugin worker is running in this process")
        return cls._current

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def runtime(self) -> Runtime:
        """The runtime's parts: pool, hub, store, followers, object service."""
        if self._runtime is None:
            raise RuntimeError("StreamsActivities used outside its lifetime() (no runtime)")
        return self._runtime

    @property
    def store(self) -> Store:
        return self.runtime.store

    @contextlib.asynccontextmanager
    async def lifetime(self) -> AsyncIterator[None]:
        """Open the runtime for the worker's life (the plugin's ``run_context``)."""
        previous = StreamsActivities._current
        StreamsActivities._current = self
        try:
            if self._given is not None:
                yield
                return
            async with open_runtime(
                self._settings,
                name="activities",
                pool_min_size=min(1, self._settings.pool_min_size),
                # Its activities wait for wakes only now and then (a reader, a credit
                # wait): it need not take every wake of the deployment meanwhile.
                listen_on_demand=True,
            ) as runtime:
                self._runtime = runtime
                try:
                    yield
                finally:
                    self._runtime = None
        finally:
            StreamsActivities._current = previous

    def all(self) -> list[Callable[..., Any]]:
        """Every activity, for ``Worker(activities=...)`` or a plugin."""
        return [self.create_stream, self.append, self.close, self.ack, self.read]

    def _key(self, run_id: str, stream_id: str) -> StreamKey:
        return StreamKey(self._settings.tenant, run_id, stream_id)

    def check_egress(self, ref: StreamRef) -> None:
        """Payloads read here land in workflow history: this worker's region must be
        one the stream's data may go to (``client_egress_regions``)."""
        if not ref.definition.allows_egress(self._settings.region):
            raise EgressDenied(
                f"this worker's region {self._settings.region!r} may not receive this stream's data"
            )

    @activity.defn(name=models.CREATE_STREAM)
    async def create_stream(self, request: models.CreateStreamInput) -> models.CreateStreamResult:
        """Create the stream, or find it when the same definition exists (idempotent)."""
        with domain_errors():
            definition = parse_definition(
                request.definition,
                region=self._settings.region,
                object_store_regions=self._settings.object_store_regions,
            )
            ref, created = await self.store.create_stream(
                self._key(request.run_id, definition.stream_id), definition
            )
            state = await self.store.state(ref)
        return models.CreateStreamResult(
            stream_id=definition.stream_id,
            created=created,
            definition=ref.definition.to_json_dict(),
            latest_sequence=state.latest_sequence,
        )

    @activity.defn(name=models.APPEND)
    async def append(self, request: models.AppendInput) -> models.AppendResult:
        """Append one batch; the same idempotency key and body again returns the original."""
        with domain_errors():
            batch = encode_batch(request.payloads, idempotency_key=request.idempotency_key)
            ref = await self.store.get_stream(self._key(request.run_id, request.stream_id))
            result = await self.store.append(ref, batch)
        return models.AppendResult(result.first_sequence, result.last_sequence, result.replayed)

    @activity.defn(name=models.CLOSE)
    async def close(self, request: models.CloseInput) -> models.CloseResult:
        with domain_errors():
            ref = await self.store.get_stream(self._key(request.run_id, request.stream_id))
            return models.CloseResult(await self.store.close(ref))

    @activity.defn(name=models.ACK)
    async def ack(self, request: models.AckInput) -> models.AckResult:
        with domain_errors():
            ref = await self.store.get_stream(self._key(request.run_id, request.stream_id))
            acked = await self.store.ack(ref, request.consumer_id, request.sequence)
        return models.AckResult(acked)

    @activity.defn(name=models.READ)
    async def read(self, request: models.ReadInput) -> models.ReadResult:
        """Records after the cursor, unredacted: the run reads its own streams."""
        with domain_errors():
            ref = await self.store.get_stream(self._key(request.run_id, request.stream_id))
            self.check_egress(ref)
            page = await self.store.read(ref, request.cursor, max(1, min(request.limit, 1000)))
        records: list[models.StreamRecord] = []
        total = 0
        for r in page.records:
            total += r.size
            if records and total > request.max_bytes:
                break
            records.append(
                models.StreamRecord(
                    stream_id=request.stream_id,
                    sequence=r.sequence,
                    payload=json.loads(r.payload),
                    object=r.object,
                    appended_at=r.appended_at.isoformat(),
                    fingerprint=record_fingerprint(r.sequence, r.appended_at, r.size),
                )
            )
        return models.ReadResult(
            records=records,
            next_cursor=records[-1].sequence if records else request.cursor,
            earliest_sequence=page.earliest_sequence,
            latest_sequence=page.latest_sequence,
            closed=page.closed,
        )
