"""The ``block`` credit policy: wait for acks to free unread credit, up to a deadline.

The decision itself is never made here: every attempt goes through the append function,
which decides under the stream's row lock from durable state. This module only chooses
when to try again: on a wake of the stream (an ack, a close, another append), after a
safety interval in case a wake was lost, and once more at the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from ductor_streams.errors import CreditExhausted
from ductor_streams.live.hub import NotificationHub
from ductor_streams.store.append import Appender
from ductor_streams.store.encoding import EncodedBatch
from ductor_streams.store.models import AppendResult, StreamRef

# With a hub, wakes arrive within milliseconds; this only bounds the delay a lost wake
# can cause. Without a hub it is the polling interval.
LOST_WAKE_RECHECK_SECONDS = 1.0


def never_fits(ref: StreamRef, batch: EncodedBatch) -> bool:
    """True when the batch alone passes an unread ceiling: no ack can ever make room."""
    if not ref.definition.consumers:
        return False  # no consumers: nothing is ever unread
    credit = ref.definition.credit
    return (credit.max_unread_items is not None and batch.count > credit.max_unread_items) or (
        credit.max_unread_bytes is not None and batch.bytes > credit.max_unread_bytes
    )


async def append_blocking(
    appender: Appender,
    hub: NotificationHub | None,
    ref: StreamRef,
    batch: EncodedBatch,
    *,
    wait_seconds: float,
    poll_interval: float,
) -> AppendResult:
    """Append, waiting up to ``wait_seconds`` while the unread ceiling refuses it.

    Raises CreditExhausted after the deadline (after one last attempt at it), or at
    once when the batch can never fit (waiting could not help).
    """
    deadline = time.monotonic() + wait_seconds
    recheck = LOST_WAKE_RECHECK_SECONDS if hub is not None else poll_interval
    while True:
        # Watch BEFORE the attempt, so an ack committed between the refusal and the
        # wait still wakes us.
        with _wakes(hub, ref.stream_pk) as woken:
            try:
                return await appender.append(
                    ref.stream_pk, batch, ref=ref if ref.is_input else None
                )
            except CreditExhausted:
                if never_fits(ref, batch) or deadline - time.monotonic() <= 0:
                    raise
                remaining = deadline - time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), min(remaining, recheck))


@contextlib.contextmanager
def _wakes(hub: NotificationHub | None, stream_pk: int) -> Iterator[asyncio.Event]:
    if hub is None:
        yield asyncio.Event()  # nobody sets it: the caller re-checks every poll interval
        return
    with hub.watch(stream_pk) as event:
        yield event
