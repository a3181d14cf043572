"""The stream store: definitions, append, read, ack, close and legal hold, on asyncpg.

Knows nothing of HTTP or Temporal; the edges (``http``, ``activities``) call ``Store``.
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from ductor_streams.errors import ClientGone, CreditExhausted, QuotaExhausted
from ductor_streams.foundation import metrics
from ductor_streams.foundation.definitions import StreamDefinition
from ductor_streams.store import acks, streams
from ductor_streams.store.append import STAGED_STATEMENT_BYTES, Appender
from ductor_streams.store.credit_wait import StreamWakes, append_blocking, never_fits
from ductor_streams.store.encoding import EncodedBatch, encode_batch
from ductor_streams.store.gone import CallerGone, unless_gone
from ductor_streams.store.models import (
    AppendResult,
    Page,
    Record,
    StreamKey,
    StreamRef,
    StreamState,
)
from ductor_streams.store.read import (
    WHOLE_PAGE,
    PageText,
    RangeText,
    read_page,
    read_page_text,
    read_range,
    read_range_text,
    verify_fingerprint,
)
from ductor_streams.store.receipts import Receipt, receipts_with_prefix
from ductor_streams.store.wakes import WakeSender

__all__ = [
    "AppendResult",
    "EncodedBatch",
    "Page",
    "PageText",
    "RangeText",
    "Receipt",
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
    it they re-check every ``poll_interval`` seconds. ``tenant_max_streams``: the
    streams a tenant may create (``DUCTOR_STREAMS_TENANT_MAX_STREAMS``).
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        hub: StreamWakes | None = None,
        poll_interval: float = 0.05,
        tenant_max_streams: int = streams.DEFAULT_TENANT_MAX_STREAMS,
    ) -> None:
        self.pool = pool
        self.hub = hub
        self.directory = streams.StreamDirectory(pool, tenant_max_streams=tenant_max_streams)
        self.wakes = WakeSender(pool)
        self.appender = Appender(pool, self.wakes)
        self._poll_interval = poll_interval
        # Called with the stream once an append to an input stream has committed (this
        # process's dispatcher, process/dispatcher.py); the wake through LISTEN still goes.
        # Set by this process's dispatcher: (stream, last sequence) of each committed
        # input append (process/dispatcher.py).
        self.input_appended: Callable[[StreamRef, int], None] | None = None

    async def create_stream(
        self, key: StreamKey, definition: StreamDefinition
    ) -> tuple[StreamRef, bool]:
        return await self.directory.create(key, definition)

    async def get_stream(self, key: StreamKey) -> StreamRef:
        return await self.directory.get(key)

    async def state(self, ref: StreamRef) -> StreamState:
        return await streams.stream_state(self.pool, ref)

    async def append(
        self, ref: StreamRef, batch: EncodedBatch, *, caller_gone: CallerGone | None = None
    ) -> AppendResult:
        """Append one request under the stream's credit policy.

        Policy ``block`` waits up to ``block_timeout_ms`` for acks to free credit,
        sending the batch again only when the stream's row says it could fit and
        re-deciding under the row lock (store/credit_wait.py); then CreditExhausted as
        for ``reject``. ``caller_gone`` (store/gone.py): the wait ends with ClientGone
        as soon as the caller has gone, and nothing more is sent for it.
        """
        credit = ref.definition.credit
        try:
            if credit.on_unread_full != "block" or credit.block_timeout_ms <= 0:
                sending = self.appender.append(
                    ref.stream_pk, batch, ref=ref if ref.is_input else None
                )
                # A large batch whose caller has gone while it was decoded or queued is
                # not sent (store/gone.py); small ones are not watched: the watch would
                # cost more than the statement.
                if caller_gone is not None and batch.bytes > STAGED_STATEMENT_BYTES:
                    sending = unless_gone(sending, caller_gone())
                try:
                    result = await sending
                except ClientGone:
                    metrics.WAITS_ABANDONED.labels(reason="queued").inc()
                    raise
            else:
                result = await append_blocking(
                    self.appender,
                    self.hub,
                    ref,
                    batch,
                    wait_seconds=credit.block_timeout_ms / 1000,
                    poll_interval=self._poll_interval,
                    pool=self.pool,
                    caller_gone=caller_gone,
                )
            if ref.is_input and not result.replayed and self.input_appended is not None:
                # Committed: this process's dispatcher may claim the deliveries now,
                # without waiting for the wake to come back through LISTEN.
                self.input_appended(ref, result.last_sequence)
            return _counted(ref, batch, result)
        except QuotaExhausted:
            metrics.CREDIT_REJECTIONS.labels(reason="quota").inc()
            raise
        except CreditExhausted:
            metrics.CREDIT_REJECTIONS.labels(reason="credit").inc()
            if never_fits(ref, batch):
                raise CreditExhausted(
                    "the batch alone is larger than the stream's unread ceiling; split it"
                ) from None
            raise

    async def read(
        self, ref: StreamRef, cursor: int, limit: int, max_bytes: int | None = None
    ) -> Page:
        """Records after ``cursor``, at most ``limit`` (and, given ``max_bytes``, those
        within that many payload bytes, at least one): ``store.read.read_page``."""
        return await read_page(self.pool, ref.stream_pk, cursor, limit, max_bytes)

    async def read_text(
        self,
        ref: StreamRef,
        cursor: int,
        limit: int,
        max_bytes: int = WHOLE_PAGE,
        fingerprint: str | None = None,
    ) -> PageText | None:
        """``read`` with the records as the API's JSON text (``store.read.read_page_text``:
        with ``max_bytes``, the page's first piece); None when the page must be read with
        ``read`` (a record refers to an object). With ``fingerprint``, HistoryDiverged
        when the record at ``cursor`` differs."""
        return await read_page_text(self.pool, ref.stream_pk, cursor, limit, max_bytes, fingerprint)

    async def read_range_text(
        self, ref: StreamRef, after: int, last: int, max_bytes: int
    ) -> RangeText | None:
        """A later piece of a page read with ``read_text`` (``store.read.read_range_text``)."""
        return await read_range_text(self.pool, ref.stream_pk, after, last, max_bytes)

    async def read_range(
        self, ref: StreamRef, after: int, last: int, max_bytes: int
    ) -> list[Record]:
        """``read_range_text``'s records as values (``store.read.read_range``)."""
        return await read_range(self.pool, ref.stream_pk, after, last, max_bytes)

    async def verify_fingerprint(self, ref: StreamRef, cursor: int, fingerprint: str) -> None:
        """HistoryDiverged when the record at ``cursor`` is not the one whose
        ``fingerprint`` the reader has (``store.read.verify_fingerprint``)."""
        await verify_fingerprint(self.pool, ref.stream_pk, cursor, fingerprint)

    async def receipts(self, ref: StreamRef, key_prefix: str) -> list[Receipt]:
        """The stream's append receipts whose idempotency key starts with ``key_prefix``."""
        return await receipts_with_prefix(self.pool, ref.stream_pk, key_prefix)

    async def ack(self, ref: StreamRef, consumer_id: str, sequence: int) -> int:
        return await acks.ack(self.pool, ref.stream_pk, consumer_id, sequence)

    async def close(self, ref: StreamRef) -> int:
        return await streams.close_stream(self.pool, ref)

    async def set_legal_hold(
        self, ref: StreamRef, enabled: bool, reason: str | None
    ) -> StreamState:
        await streams.set_legal_hold(self.pool, ref, enabled, reason)
        return await self.state(ref)


def _counted(ref: StreamRef, batch: EncodedBatch, result: AppendResult) -> AppendResult:
    """Count a committed append in the metrics (a replay committed nothing new)."""
    if not result.replayed:
        metrics.count_append(ref.definition.direction, batch.count, batch.bytes)
    return result
