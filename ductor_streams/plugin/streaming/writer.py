"""``StreamWriter``: an activity's records out to a stream, batched through the store's
group commit, under the stream's credit, safe across database failures and retries.

``write`` queues a record (compact JSON, checked against the inline limit at once) and
returns; a task of the writer sends what is queued as one append per batch, one batch
in flight at a time, so the writer's records get ascending sequences in write order.
Batches leave at most every ``linger`` seconds: a record written after a quiet spell
(the last batch left at least ``linger`` ago) goes at once, alone; records written
sooner wait until ``linger`` after the last batch left, and go together. A batch goes
at once when it is full (``max_batch_records`` / ``max_batch_bytes``) or on ``flush()``
and exit, and while one is in flight the next fills up. So a token every 20 ms goes
out with no added delay, and a writer as fast as it can sends large batches. (A linger
counted from each batch's first record would delay every record of a slow writer by
``linger`` and batch nothing, as it did with 100 writers at 50 records/s each.)
``write`` waits while ``max_pending_records`` are queued: a stream out of credit holds
the producer back.

Each batch has the idempotency key ``ds:act:<digest>:<attempt>:<n>`` (attempt.py): a
batch whose database call failed (connection lost, server restarting) is sent again
with the same key and body, and a commit whose answer was lost is answered with its
original sequences, so nothing is stored twice. See retry.py for attempts >= 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from types import TracebackType
from typing import Any

from ductor_streams.activities.application_errors import to_application_error
from ductor_streams.activities.streams import StreamsActivities
from ductor_streams.errors import CreditExhausted, StreamsError
from ductor_streams.plugin.streaming.attempt import AttemptState
from ductor_streams.plugin.streaming.retry import (
    AttemptOutput,
    RetryInfo,
    RetryPolicy,
    default_policy,
    merge_range,
    retry_payloads,
)
from ductor_streams.store import AppendResult, EncodedBatch, StreamKey, StreamRef
from ductor_streams.store.credit_wait import never_fits
from ductor_streams.store.db import database_unavailable, translate_db_error
from ductor_streams.store.encoding import (
    MAX_BATCH_RECORDS,
    batch_of_encoded,
    check_record_size,
    encode_payload,
)

# A batch that meets an unavailable database is sent again after this delay, doubling
# up to the maximum, until the writer's ``database_timeout``.
RETRY_DELAY_SECONDS = 0.05
MAX_RETRY_DELAY_SECONDS = 1.0
# While it waits (credit, the database), the writer heartbeats at least this often.
WAIT_SLICE_SECONDS = 1.0
# On an exit by exception, queued records are still sent for at most this long.
EXIT_FLUSH_SECONDS = 5.0
# The watch of an append to a stream that credit cannot refuse: none.
_NO_WATCH: contextlib.nullcontext[None] = contextlib.nullcontext()


class StreamWriter:
    """Writes one stream from inside an activity; use ``stream_writer(...)``."""

    def __init__(
        self,
        current: StreamsActivities,
        state: AttemptState,
        run_id: str,
        stream_id: str,
        *,
        linger: float,
        max_batch_records: int,
        max_batch_bytes: int,
        max_pending_records: int,
        credit_timeout: float,
        database_timeout: float,
        on_retry: RetryPolicy | None,
    ) -> None:
        if linger < 0 or max_batch_records < 1 or max_batch_bytes < 1 or max_pending_records < 1:
            raise ValueError("linger >= 0 and positive batch and queue bounds, please")
        self._current = current
        self._state = state
        self.run_id = run_id
        self.stream_id = stream_id
        self._linger = linger
        self._max_records = min(max_batch_records, MAX_BATCH_RECORDS)
        self._max_bytes = max_batch_bytes
        self._max_pending = max(max_pending_records, self._max_records)
        self._credit_timeout = credit_timeout
        self._database_timeout = database_timeout
        self._on_retry = on_retry
        self._ref: StreamRef | None = None
        # Whether credit can refuse an append (consumers and an unread ceiling): only
        # then does an append watch the stream's wakes for the acks that free credit.
        self._refusable = False
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._sent_at = float("-inf")  # loop time at which the last batch left
        self._written = 0  # records written so far
        self._sent = 0  # records committed so far
        self._flushing = False
        self._closing = False
        self._arrived = asyncio.Event()  # records were queued (the sender waits on it)
        self._committed = asyncio.Event()  # replaced after each commit (flush waits on it)
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._progress: dict[str, Any] = {}
        self.attempt = state.attempt
        self.last_sequence: int | None = None
        """The sequence of the last record of this writer that has committed."""
        self.earlier_attempts: list[AttemptOutput] = []
        """What earlier attempts of this activity appended to the stream (attempt >= 2)."""

    @property
    def ref(self) -> StreamRef:
        if self._ref is None:
            raise RuntimeError("the writer is not open (use `async with stream_writer(...)`)")
        return self._ref

    @property
    def records_written(self) -> int:
        """Records of this writer that have committed (a retry marker not counted)."""
        return self._sent

    # -- the author's side ---------------------------------------------------------------

    async def write(self, payload: Any) -> None:
        """Queue one record; waits while too many are queued (credit holds them back).

        Raises the ApplicationError of the writer's failure, if it failed, and
        ``record_too_large`` (as HTTP answers 413) for a payload over the inline limit.
        """
        self._check()
        try:
            raw = encode_payload(payload)
            check_record_size(raw)
        except StreamsError as exc:
            raise to_application_error(exc) from exc
        while len(self._pending) >= self._max_pending:
            await self._committed.wait()
            self._check()
        self._pending.append(raw)
        self._pending_bytes += len(raw)
        self._written += 1
        self._arrived.set()

    async def flush(self) -> int | None:
        """Wait until every record written so far has committed; ``last_sequence``."""
        target = self._written
        while self._sent < target:
            self._check()
            self._flushing = True
            self._arrived.set()
            await self._committed.wait()
        self._check()
        return self.last_sequence

    # -- lifetime -------------------------------------------------------------------------

    async def __aenter__(self) -> StreamWriter:
        store = self._current.store
        key = StreamKey(self._current.settings.tenant, self.run_id, self.stream_id)
        try:
            self._ref = await store.get_stream(key)
        except StreamsError as exc:
            raise to_application_error(exc) from exc
        definition = self._ref.definition
        if definition.consumers:
            # A batch over an unread ceiling could never fit: cap batches below them.
            credit = definition.credit
            if credit.max_unread_items is not None:
                self._max_records = max(1, min(self._max_records, credit.max_unread_items))
            if credit.max_unread_bytes is not None:
                self._max_bytes = max(1, min(self._max_bytes, credit.max_unread_bytes))
            self._refusable = (
                credit.max_unread_items is not None or credit.max_unread_bytes is not None
            )
        self._progress = {"attempt": self.attempt, "ranges": []}
        self._state.opened()
        try:
            if self.attempt >= 2:
                await self._start_retry()
        except BaseException:
            self._state.closed()
            raise
        self._task = asyncio.get_running_loop().create_task(self._send_loop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                await self.flush()
            else:
                # The body failed: what it wrote still goes out (the next attempt's
                # marker accounts for it), but not for long.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.flush(), EXIT_FLUSH_SECONDS)
        finally:
            self._closing = True
            self._arrived.set()
            if self._task is not None:
                if exc is not None or self._error is not None:
                    self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            if self._state.writers.get(self._writer_key()) == self.progress:
                self._state.writers[self._writer_key()] = self.progress()  # frozen
            self._state.closed()

    # -- retries of the activity ------------------------------------------------------------

    async def _start_retry(self) -> None:
        """Attempt n >= 2: learn what earlier attempts appended, then apply the policy."""
        self.earlier_attempts = await self._earlier_attempts()
        info = self._state.info
        policy = self._on_retry or default_policy(self.ref.definition.content_class)
        retry = RetryInfo(
            attempt=self.attempt,
            activity_id=info.activity_id,
            activity_type=info.activity_type,
            run_id=self.run_id,
            stream_id=self.stream_id,
            earlier=self.earlier_attempts,
        )
        payloads = retry_payloads(policy, retry)
        if payloads:
            try:
                raws = [encode_payload(p) for p in payloads]
                for raw in raws:
                    check_record_size(raw)
                batch = batch_of_encoded(raws, idempotency_key=self._state.key("m"))
                result = await self._append(batch)
            except StreamsError as exc:
                raise to_application_error(exc) from exc
            self._committed_batch(result, len(raws))

    async def _earlier_attempts(self) -> list[AttemptOutput]:
        """Per earlier attempt, the ranges its batches appended: from the heartbeat
        details, completed by the stream's receipts (exact even when the last heartbeat
        of an attempt never reached Temporal, e.g. its worker was killed)."""
        ranges: dict[int, list[list[int]]] = {}
        previous = self._state.previous_writers.get(self._writer_key()) or {}
        for entry in previous.get("attempts") or []:
            if int(entry.get("attempt", 0)) < self.attempt:
                ranges[int(entry["attempt"])] = [list(r) for r in entry.get("data") or []]
        prefix = self._state.key_prefix
        try:
            receipts = await self._current.store.receipts(self.ref, prefix)
        except Exception as exc:
            if not database_unavailable(exc):
                raise
            receipts = []  # the heartbeat details alone, then
        found: dict[int, list[list[int]]] = {}
        for receipt in receipts:
            attempt_text, _, batch = receipt.idempotency_key[len(prefix) :].partition(":")
            if not attempt_text.isdigit() or batch.startswith("m"):
                continue
            attempt = int(attempt_text)
            if attempt < self.attempt:
                merge_range(
                    found.setdefault(attempt, []), receipt.first_sequence, receipt.last_sequence
                )
        ranges.update(found)  # receipts, when there are any, are exact
        return [
            AttemptOutput(attempt, [(first, last) for first, last in ranges[attempt]])
            for attempt in sorted(ranges)
        ]

    def _writer_key(self) -> str:
        return f"{self.run_id}/{self.stream_id}"

    # -- the sending task -------------------------------------------------------------------

    def _check(self) -> None:
        if self._error is not None:
            error = self._error
            if isinstance(error, StreamsError):
                raise to_application_error(error) from error
            raise error
        if self._closing:
            raise RuntimeError("the stream writer is closed")

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        return
                    self._arrived.clear()
                    await self._arrived.wait()
                    continue
                wait = self._sent_at + self._linger - loop.time()
                if wait > 0 and not self._flushing and not self._closing and not self._full():
                    await asyncio.sleep(wait)
                self._sent_at = loop.time()
                raws = self._take()
                if not self._pending:
                    self._flushing = False
                number = self._state.next_batch(self.ref.stream_pk)
                batch = batch_of_encoded(raws, idempotency_key=self._state.key(str(number)))
                result = await self._append(batch)
                self._committed_batch(result, len(raws), data=True)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._error = translate_db_error(exc) if not isinstance(exc, StreamsError) else exc
            self._wake_waiters()

    def _full(self) -> bool:
        return len(self._pending) >= self._max_records or self._pending_bytes >= self._max_bytes

    def _take(self) -> list[bytes]:
        raws: list[bytes] = []
        size = 0
        pending = self._pending
        while pending and len(raws) < self._max_records:
            raw = pending[0]
            if raws and size + len(raw) > self._max_bytes:
                break
            raws.append(pending.popleft())
            size += len(raw)
        self._pending_bytes -= size
        return raws

    def _committed_batch(self, result: AppendResult, count: int, *, data: bool = False) -> None:
        self.last_sequence = result.last_sequence
        self._sent += count if data else 0
        if data:
            merge_range(self._progress["ranges"], result.first_sequence, result.last_sequence)
        self._record_progress()
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        committed, self._committed = self._committed, asyncio.Event()
        committed.set()

    def _record_progress(self) -> None:
        """Heartbeat this attempt's output (``progress``, built when the heartbeat goes)."""
        self._state.writers[self._writer_key()] = self.progress
        self._state.heartbeat()

    def progress(self) -> dict[str, Any]:
        """What the attempts so far appended (the heartbeat details of this stream)."""
        attempts = [
            {"attempt": o.attempt, "data": [list(r) for r in o.ranges]}
            for o in self.earlier_attempts
        ]
        attempts.append({"attempt": self.attempt, "data": self._progress["ranges"]})
        return {"attempts": attempts, "last_sequence": self.last_sequence}

    async def _append(self, batch: EncodedBatch) -> AppendResult:
        """One batch, again with the same key while the database is unavailable (for at
        most ``database_timeout``) and while credit refuses it (``credit_timeout``)."""
        store = self._current.store
        ref = self.ref
        credit_deadline: float | None = None
        database_deadline: float | None = None
        delay = RETRY_DELAY_SECONDS
        hub = self._current.runtime.hub  # an ack wakes an append refused credit
        while True:
            # Watched from before the attempt, so that an ack committed between the
            # refusal and the wait still wakes it. A stream credit cannot refuse needs no
            # watch, and a watch per batch was a visible share of the worker's CPU at 100
            # writers (docs/speed.md, "Credit watch only where credit can refuse").
            watch = hub.watch(ref.stream_pk) if self._refusable else _NO_WATCH
            with watch as woken:
                try:
                    return await store.append(ref, batch)
                except CreditExhausted as exc:
                    if never_fits(ref, batch):
                        raise
                    now = time.monotonic()
                    if credit_deadline is None:
                        credit_deadline = now + self._credit_timeout
                    if now >= credit_deadline:
                        raise
                    self._state.heartbeat()
                    wait = min(float(exc.retry_after), credit_deadline - now, WAIT_SLICE_SECONDS)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for((woken or asyncio.Event()).wait(), wait)
                except Exception as exc:
                    if not database_unavailable(exc):
                        raise
                    now = time.monotonic()
                    if database_deadline is None:
                        database_deadline = now + self._database_timeout
                    if now >= database_deadline:
                        raise
                    self._state.heartbeat()
                    await asyncio.sleep(min(delay, database_deadline - now))
                    delay = min(delay * 2, MAX_RETRY_DELAY_SECONDS)
