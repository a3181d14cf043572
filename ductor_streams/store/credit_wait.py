"""The ``block`` credit policy: wait for acks to free unread credit, up to a deadline.

The decision itself is never made here: every attempt goes through the append function,
which decides under the stream's row lock from durable state. This module only chooses
when to try again: on a wake of the stream (an ack, a close, another append), after a
safety interval in case a wake was lost, and once more at the deadline.

A refused request is not sent again at every such chance, though. Sending a batch costs
its whole size again (over STAGED_STATEMENT_BYTES, a COPY into a staging table that is
read back into one array), and most wakes free too little: abandoned large appends
re-sent at every wake kept a Postgres backend busy until their deadlines
(docs/decisions.md, "Failure and protection"). So after
a refusal each chance is first looked at with ``stream_credit_probe`` (a few columns of
the stream's row, no payload): the batch goes again only when the row says it could
fit now (or something other than credit would decide it). A batch is then sent at most
once per real chance; the row lock still decides.

The wait serves a caller: ``caller_gone`` (store/gone.py), when given, ends it with
ClientGone as soon as the caller goes. Nothing more is sent for it (a statement already
in flight finishes; one still queued is dropped, store/append.py), so an abandoned
batch is never appended later when credit frees; a large one's memory is given back
to the system (ductor_streams/foundation/heap.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

import asyncpg

from ductor_streams.errors import ClientGone, CreditExhausted
from ductor_streams.foundation import heap, metrics
from ductor_streams.schema import QUERIES
from ductor_streams.store.append import STAGED_STATEMENT_BYTES, Appender
from ductor_streams.store.encoding import EncodedBatch
from ductor_streams.store.gone import CallerGone, unless_gone
from ductor_streams.store.models import AppendResult, StreamRef


class StreamWakes(Protocol):
    """What a wait for credit needs of the process's wakes: an event set on every wake
    of one stream while the block runs. The LISTEN hub (live/hub.py) is one; the store
    knows it by this shape only, since live/ is a layer above it."""

    def watch(self, stream_pk: int) -> AbstractContextManager[asyncio.Event]: ...


# With a hub, wakes arrive within milliseconds; this only bounds the delay a lost wake
# can cause. Without a hub it is the polling interval.
LOST_WAKE_RECHECK_SECONDS = 1.0

T = TypeVar("T")


def exceeds_unread_ceiling(ref: StreamRef, count: int, size: int) -> bool:
    """True when ``count`` records of ``size`` bytes alone pass an unread ceiling."""
    if not ref.definition.consumers:
        return False  # no consumers: nothing is ever unread
    credit = ref.definition.credit
    return (credit.max_unread_items is not None and count > credit.max_unread_items) or (
        credit.max_unread_bytes is not None and size > credit.max_unread_bytes
    )


def never_fits(ref: StreamRef, batch: EncodedBatch) -> bool:
    """True when the batch alone passes an unread ceiling: no ack can ever make room."""
    return exceeds_unread_ceiling(ref, batch.count, batch.bytes)


async def worth_sending(
    pool: asyncpg.Pool, stream_pk: int, count: int, size: int, key: str | None
) -> bool:
    """Whether a request refused for credit could go in now, from the stream's row
    (``stream_credit_probe``): False only while credit would still refuse it."""
    return bool(await pool.fetchval(QUERIES["stream_credit_probe"], stream_pk, count, size, key))


async def append_blocking(
    appender: Appender,
    hub: StreamWakes | None,
    ref: StreamRef,
    batch: EncodedBatch,
    *,
    wait_seconds: float,
    poll_interval: float,
    pool: asyncpg.Pool,
    caller_gone: CallerGone | None = None,
) -> AppendResult:
    """Append, waiting up to ``wait_seconds`` while the unread ceiling refuses it.

    Raises CreditExhausted after the deadline (after one last look at it), or at once
    when the batch can never fit (waiting could not help); ClientGone once
    ``caller_gone`` says the caller has gone.
    """
    try:
        return await _append_blocking(
            appender, hub, ref, batch, wait_seconds, poll_interval, pool, caller_gone
        )
    except ClientGone:
        if batch.bytes > STAGED_STATEMENT_BYTES:
            heap.trim_soon()  # its memory is nobody's now (ductor_streams/foundation/heap.py)
        raise


async def _append_blocking(
    appender: Appender,
    hub: StreamWakes | None,
    ref: StreamRef,
    batch: EncodedBatch,
    wait_seconds: float,
    poll_interval: float,
    pool: asyncpg.Pool,
    caller_gone: CallerGone | None,
) -> AppendResult:
    return await retry_on_credit(
        lambda: appender.append(ref.stream_pk, batch, ref=ref if ref.is_input else None),
        hub=hub,
        stream_pk=ref.stream_pk,
        worth_it=lambda: worth_sending(
            pool, ref.stream_pk, batch.count, batch.bytes, batch.idempotency_key
        ),
        hopeless=never_fits(ref, batch),
        wait_seconds=wait_seconds,
        recheck=LOST_WAKE_RECHECK_SECONDS if hub is not None else poll_interval,
        caller_gone=caller_gone,
    )


async def retry_on_credit(
    attempt: Callable[[], Awaitable[T]],
    *,
    hub: StreamWakes | None,
    stream_pk: int,
    worth_it: Callable[[], Awaitable[bool]],
    hopeless: bool,
    wait_seconds: float,
    recheck: float,
    caller_gone: CallerGone | None = None,
) -> T:
    """``attempt()``, and again while it raises CreditExhausted, up to ``wait_seconds``:
    each time the stream wakes (or ``recheck`` seconds pass) and ``worth_it()`` says the
    request could fit now. ``hopeless``: credit can never admit it (refused at once).
    The first attempt goes at once, without a look at the row: most requests fit. At
    the deadline the row is looked at once more (and the request sent if it could fit),
    then CreditExhausted; ClientGone as soon as ``caller_gone`` says the caller went."""
    deadline = time.monotonic() + wait_seconds
    # Watched from BEFORE the first attempt to the end of the wait, so an ack committed
    # between a refusal and the next wait still wakes it.
    with _wakes(hub, stream_pk) as woken:
        try:
            if caller_gone is None:
                return await attempt()
            # Watched too: a request still queued behind other statements when its
            # caller goes is dropped unsent (store/append.py, take_group).
            return await unless_gone(attempt(), caller_gone())
        except ClientGone:
            metrics.WAITS_ABANDONED.labels(reason="queued").inc()
            raise
        except CreditExhausted:
            if hopeless or deadline - time.monotonic() <= 0:
                raise
        waiting = _wait_and_retry(attempt, worth_it, woken, deadline, recheck)
        metrics.REQUESTS_WAITING.labels(reason="credit").inc()
        try:
            if caller_gone is None:
                return await waiting
            try:
                return await unless_gone(waiting, caller_gone())
            except ClientGone:
                metrics.WAITS_ABANDONED.labels(reason="credit").inc()
                raise
        finally:
            metrics.REQUESTS_WAITING.labels(reason="credit").dec()


async def _wait_and_retry(
    attempt: Callable[[], Awaitable[T]],
    worth_it: Callable[[], Awaitable[bool]],
    woken: asyncio.Event,
    deadline: float,
    recheck: float,
) -> T:
    """After a refusal: wait for a wake (or ``recheck``), look, send if worth it."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CreditExhausted()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), min(remaining, recheck))
        # Cleared before the look at the row: a wake after it sets it again, so the
        # next wait returns at once.
        woken.clear()
        if not await worth_it():
            metrics.CREDIT_RECHECKS.labels(outcome="still_refused").inc()
            continue  # credit still refuses it: nothing is sent
        metrics.CREDIT_RECHECKS.labels(outcome="sent").inc()
        with contextlib.suppress(CreditExhausted):  # another request took the room first
            return await attempt()


@contextlib.contextmanager
def _wakes(hub: StreamWakes | None, stream_pk: int) -> Iterator[asyncio.Event]:
    if hub is None:
        yield asyncio.Event()  # nobody sets it: the caller re-checks every poll interval
        return
    with hub.watch(stream_pk) as event:
        yield event
