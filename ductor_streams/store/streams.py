"""Stream definitions: create (immutable, idempotent), look up (cached), state, close, hold."""

from __future__ import annotations

import json

import asyncpg

from ductor_streams.errors import DefinitionConflict, NotFound, TenantQuotaExhausted
from ductor_streams.foundation.definitions import StreamDefinition, definition_from_json
from ductor_streams.schema import QUERIES
from ductor_streams.store.models import ConsumerState, StreamKey, StreamRef, StreamState

# Streams a tenant may have unless the deployment says otherwise
# (DUCTOR_STREAMS_TENANT_MAX_STREAMS; docs/security.md, "Tenant isolation").
DEFAULT_TENANT_MAX_STREAMS = 100_000


class StreamDirectory:
    """Finds streams by key. Definitions never change, so a found stream is cached for
    the life of the process; a miss is never cached (the stream may be created later).

    Creates stay within ``tenant_max_streams`` streams per tenant, decided in Postgres
    under the tenant's row lock (``workflow_streams.create_stream``)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        max_entries: int = 100_000,
        tenant_max_streams: int = DEFAULT_TENANT_MAX_STREAMS,
    ) -> None:
        self._pool = pool
        self._cache: dict[StreamKey, StreamRef] = {}
        self._max_entries = max_entries
        self.tenant_max_streams = tenant_max_streams

    def remember(self, ref: StreamRef) -> StreamRef:
        """Cache a stream known to exist (created in a transaction that has committed)."""
        return self._remember(ref)

    def _remember(self, ref: StreamRef) -> StreamRef:
        if len(self._cache) >= self._max_entries:
            self._cache.clear()
        self._cache[ref.key] = ref
        return ref

    async def find(self, key: StreamKey) -> StreamRef | None:
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        row = await self._pool.fetchrow(
            QUERIES["stream_get_by_key"], key.tenant, key.run_id, key.stream_id
        )
        if row is None:
            return None
        definition = definition_from_json(json.loads(row["definition"]))
        return self._remember(StreamRef(key, row["stream_pk"], definition))

    async def get(self, key: StreamKey) -> StreamRef:
        ref = await self.find(key)
        if ref is None:
            raise NotFound(f"stream {key.stream_id!r} of run {key.run_id!r} does not exist")
        return ref

    async def create(
        self,
        key: StreamKey,
        definition: StreamDefinition,
        *,
        connection: asyncpg.Connection | None = None,
        exact: bool = True,
    ) -> tuple[StreamRef, bool]:
        """Create the stream, or return the existing one when the definition is identical.

        Returns ``(ref, created)``; a different stored definition is a DefinitionConflict
        (``exact=False``: the existing stream is returned whatever its definition, for the
        caller to compare). A new stream past the tenant's quota is TenantQuotaExhausted
        (an existing one is answered as ever). On ``connection`` (a transaction of the
        caller's) a created stream is not cached: the caller ``remember``s it once the
        transaction commits; the tenant's row stays locked until then.
        """
        body = json.dumps(definition.to_json_dict(), separators=(",", ":"))
        row = await (connection or self._pool).fetchrow(
            QUERIES["stream_insert"],
            key.tenant,
            key.run_id,
            key.stream_id,
            definition.direction,
            body,
            list(definition.consumers),
            self.tenant_max_streams,
        )
        assert row is not None
        if row["outcome"] == "created":
            ref = StreamRef(key, row["stream_pk"], definition)
            return (ref if connection is not None else self._remember(ref)), True
        if row["outcome"] == "tenant_quota":
            raise TenantQuotaExhausted(
                f"the tenant has {self.tenant_max_streams:,} streams, as many as it may; "
                "no stream was created"
            )
        existing = await self.get(key)
        if exact and existing.definition.to_json_dict() != definition.to_json_dict():
            raise DefinitionConflict(
                f"stream {key.stream_id!r} already exists with a different definition"
            )
        return existing, False


async def stream_state(pool: asyncpg.Pool, ref: StreamRef) -> StreamState:
    row = await pool.fetchrow(QUERIES["stream_state"], ref.stream_pk)
    if row is None:
        raise NotFound("stream does not exist")
    return StreamState(
        latest_sequence=row["latest_sequence"],
        earliest_sequence=row["earliest_sequence"],
        closed=row["closed"],
        legal_hold=row["legal_hold"],
        legal_hold_reason=row["legal_hold_reason"],
        total_items=row["total_items"],
        total_bytes=row["total_bytes"],
        unread_items=row["unread_items"],
        unread_bytes=row["unread_bytes"],
        consumers=[ConsumerState(**c) for c in json.loads(row["consumers"])],
    )


async def close_stream(pool: asyncpg.Pool, ref: StreamRef) -> int:
    """Close the stream (idempotent); return its last sequence."""
    latest = await pool.fetchval(QUERIES["stream_close"], ref.stream_pk)
    if latest is None:
        raise NotFound("stream does not exist")
    return int(latest)


async def set_legal_hold(
    pool: asyncpg.Pool, ref: StreamRef, enabled: bool, reason: str | None
) -> None:
    await pool.execute(QUERIES["stream_set_legal_hold"], ref.stream_pk, enabled, reason)
