"""Streams from inside activities: write records out live, read input records in.

Inside any activity of a worker whose client has the ``StreamsPlugin`` (the worker's own
store: no HTTP, no token)::

    from ductor_streams.plugin.streaming import stream_reader, stream_writer

    @activity.defn
    async def answer(prompt: str) -> str:
        async with stream_writer("output") as out:        # run: this workflow's ID
            async for token in model.stream(prompt):
                await out.write({"type": "token", "text": token})
        return ...

    @activity.defn
    async def tool() -> None:
        async with stream_reader("messages") as messages:
            async for record in messages:                 # waits live, heartbeats
                ...

``stream_writer`` batches records through the store's group commit (``linger``,
``max_batch_records``, ``max_batch_bytes``; flushed on ``flush()`` and exit), honours the
stream's credit, heartbeats its progress and stores nothing twice when a database call
is retried. On attempt n >= 2 it knows what earlier attempts wrote
(``writer.earlier_attempts``) and applies its retry policy (``on_retry``; retry.py):
by default a ``model_output`` stream gets a marker record naming the sequences to
discard. ``stream_reader`` yields ``StreamRecord``s after the cursor and resumes, on a
retried attempt, after the last record the previous attempt consumed.

Errors are ``ApplicationError``s through the activities' one mapping
(``activities.application_errors``): the first detail carries the domain code, the same as HTTP's
(``record_too_large``, ``credit_exhausted``, ``stream_closed``, ...).
"""

from __future__ import annotations

from typing import Any

from temporalio import activity

from ductor_streams.activities.streams import StreamsActivities
from ductor_streams.plugin.streaming.attempt import HEARTBEAT_KEY, attempt_state
from ductor_streams.plugin.streaming.reader import StreamReader
from ductor_streams.plugin.streaming.retry import (
    RETRY_MARKER_TYPE,
    AttemptOutput,
    RetryInfo,
    RetryPolicy,
    retry_marker,
)
from ductor_streams.plugin.streaming.writer import StreamWriter

__all__ = [
    "HEARTBEAT_KEY",
    "RETRY_MARKER_TYPE",
    "AttemptOutput",
    "RetryInfo",
    "RetryPolicy",
    "StreamReader",
    "StreamWriter",
    "heartbeat",
    "previous_heartbeat",
    "retry_marker",
    "stream_reader",
    "stream_writer",
]

# Defaults of ``stream_writer`` (docs/temporal.md "From activities" explains the choice).
LINGER_SECONDS = 0.002
MAX_BATCH_RECORDS = 1000
MAX_BATCH_BYTES = 512 * 1024
MAX_PENDING_RECORDS = 10_000
CREDIT_TIMEOUT_SECONDS = 60.0
DATABASE_TIMEOUT_SECONDS = 60.0


def _run_id(run_id: str | None) -> str:
    if run_id is not None:
        return run_id
    workflow_id = activity.info().workflow_id
    if not workflow_id:
        raise ValueError("give run_id: this activity was not started by a workflow")
    return workflow_id


def stream_writer(
    stream_id: str,
    *,
    run_id: str | None = None,
    linger: float = LINGER_SECONDS,
    max_batch_records: int = MAX_BATCH_RECORDS,
    max_batch_bytes: int = MAX_BATCH_BYTES,
    max_pending_records: int = MAX_PENDING_RECORDS,
    credit_timeout: float = CREDIT_TIMEOUT_SECONDS,
    database_timeout: float = DATABASE_TIMEOUT_SECONDS,
    on_retry: RetryPolicy | None = None,
) -> StreamWriter:
    """An async context manager writing ``stream_id`` of run ``run_id`` (default: the
    activity's workflow ID).

    - ``linger``: batches leave at most this often (seconds; 0: whenever the last
      one has committed). A record written after a quiet spell goes at once; records
      written sooner wait for the rest of the linger and go together. A full batch
      (``max_batch_records``, at most 1,000; ``max_batch_bytes``) goes at once.
      Batches are also capped below the stream's unread ceilings, so one always fits.
    - ``max_pending_records``: ``write`` waits while this many are queued.
    - ``credit_timeout``: how long one batch may wait for credit. A ``block`` stream
      waits in the store (woken by the ack), a ``reject`` stream is tried again on an
      ack's wake or after ``Retry-After``; past it the writer fails with
      ``credit_exhausted``. ``database_timeout``: how long one batch is retried while
      the database is unavailable (same idempotency key: stored once).
    - ``on_retry``: ``"marker"``, ``"none"`` or a callable (``retry.py``); default
      ``"marker"`` for ``model_output`` streams, else ``"none"``.
    """
    current = StreamsActivities.current()
    return StreamWriter(
        current,
        attempt_state(),
        _run_id(run_id),
        stream_id,
        linger=linger,
        max_batch_records=max_batch_records,
        max_batch_bytes=max_batch_bytes,
        max_pending_records=max_pending_records,
        credit_timeout=credit_timeout,
        database_timeout=database_timeout,
        on_retry=on_retry,
    )


def stream_reader(
    stream_id: str,
    *,
    run_id: str | None = None,
    cursor: int | None = None,
    fingerprint: str | None = None,
    idle_heartbeat: float = 1.0,
) -> StreamReader:
    """An async iterator (and async context manager, which releases it) over the
    records of ``stream_id`` of run ``run_id`` (default: the activity's workflow ID)
    after ``cursor`` (default 0), waiting live for new ones; it ends when the stream is
    closed and everything was read. A retried attempt starts after the last record the
    previous attempt consumed, when that is later than ``cursor``. While nothing
    arrives it heartbeats every ``idle_heartbeat`` seconds.

    ``fingerprint``: that of the record at ``cursor`` (``StreamRecord.fingerprint``),
    when the caller has it. The reader resumes with the fingerprint of the last record
    it has (a retried attempt, one from the previous attempt's heartbeat; a reconnect
    after the database went away, its own): when the stream's record there differs (a
    failover lost commits), it raises ``ApplicationError`` of type
    ``ductor_streams.HistoryDiverged`` (code ``history_diverged``, not retryable).
    """
    current = StreamsActivities.current()
    return StreamReader(
        current,
        attempt_state(),
        _run_id(run_id),
        stream_id,
        cursor=cursor,
        fingerprint=fingerprint,
        idle_heartbeat=idle_heartbeat,
    )


def heartbeat(details: Any) -> None:
    """Heartbeat with ``details`` of your own, kept beside the helpers' progress (a
    plain ``activity.heartbeat`` replaces the helpers' details until their next one)."""
    state = attempt_state()
    state.user = details
    state.heartbeat(force=True)


def previous_heartbeat() -> Any:
    """The ``details`` the previous attempt last gave ``heartbeat``, or None."""
    return attempt_state().user
