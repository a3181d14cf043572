"""The stream store: definitions, append, read, ack, close and legal hold, on asyncpg.

Knows nothing of HTTP or Temporal; the edges (``http``, ``activities``) call ``Store``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg

from ductor_streams.definitions import StreamDefinition
from ductor_streams.errors import CreditExhausted
from ductor_streams.live.hub import NotificationHub
from ductor_streams.store import acks, streams
from ductor_streams.store.append import Appender
from ductor_streams.store.encoding import EncodedBatch, encode_batch
from ductor_streams.store.models import (
    AppendResult,
    Page,
    Record,
    StreamKey,
    StreamRef,
    StreamState,
)
from ductor_streams.store.read import read_page

__all__ = [
    "AppendResult",
    "EncodedBatch",
    "Page",
    "Record",
    "Store",
    "StreamKey",
    "StreamRef",
    "StreamState",
    "encode_batch",
]


class Store:
    """One process's access to the stream store over a pool.

    ``hub`` (optional) wakes producers blocked on credit when an ack commits; without
    it they re-check every ``poll_interval`` seconds.
    """

    def __init__(
        self, pool: asyncpg.Pool, *, hub: NotificationHub | None = None, poll_interval: float = 0.05
    ) -> None:
        self.pool = pool
        self.hub = hub
        self.directory = streams.StreamDirectory(pool)
        self.appender = Appender(pool)
        self._poll_interval = poll_interval

    async def create_stream(
        self, key: StreamKey, definition: StreamDefinition
    ) -> tuple[StreamRef, bool]:
        return await self.directory.create(key, definition)

    async def get_stream(self, key: StreamKey) -> StreamRef:
        return await self.directory.get(key)

    async def state(self, ref: StreamRef) -> StreamState:
        return await streams.stream_state(self.pool, ref)

    async def append(self, ref: StreamRef, batch: EncodedBatch) -> AppendResult:
        """Append one request under the stream's credit policy.

        Policy ``block`` waits up to ``block_timeout_ms`` for acks to free credit,
        re-deciding under the row lock after each wake; then CreditExhausted as for
        ``reject``.
        """
        credit = ref.definition.credit
        if credit.on_unread_full != "block" or credit.block_timeout_ms <= 0:
            return await self.appender.append(ref.stream_pk, batch)
        deadline = time.monotonic() + credit.block_timeout_ms / 1000
        while True:
            with self._wakes(ref.stream_pk) as woken:
                try:
                    return await self.appender.append(ref.stream_pk, batch)
                except CreditExhausted:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise
                    timeout = (
                        remaining if self.hub is not None else min(remaining, self._poll_interval)
                    )
                    try:
                        await asyncio.wait_for(woken.wait(), timeout)
                    except TimeoutError:
                        if time.monotonic() >= deadline:
                            raise CreditExhausted() from None

    def _wakes(self, stream_pk: int) -> Any:
        if self.hub is not None:
            return self.hub.watch(stream_pk)
        return _never_set()

    async def read(self, ref: StreamRef, cursor: int, limit: int) -> Page:
        return await read_page(self.pool, ref.stream_pk, cursor, limit)

    async def ack(self, ref: StreamRef, consumer_id: str, sequence: int) -> int:
        return await acks.ack(self.pool, ref.stream_pk, consumer_id, sequence)

    async def close(self, ref: StreamRef) -> int:
        return await streams.close_stream(self.pool, ref)

    async def set_legal_hold(
        self, ref: StreamRef, enabled: bool, reason: str | None
    ) -> StreamState:
        await streams.set_legal_hold(self.pool, ref, enabled, reason)
        return await self.state(ref)


class _never_set:
    """Stand-in for a hub watch: an event nobody sets (the caller polls)."""

    def __enter__(self) -> asyncio.Event:
        return asyncio.Event()

    def __exit__(self, *exc: object) -> None:
        return None
