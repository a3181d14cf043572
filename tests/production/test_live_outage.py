"""Live delivery when its own Postgres read meets an outage: the subscription ends with
``Interrupted`` (the SSE response ends, the client resumes from Last-Event-ID) instead of
raising; any other error still raises."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import pytest

from ductor_streams.live.events import Interrupted
from ductor_streams.live.subscription import Subscription
from ductor_streams.store.models import Page, Record

PAGE = 2


def page(after: int) -> Page:
    records = [
        Record(seq, str(seq), 1, datetime.now(UTC), None) for seq in range(after + 1, after + 3)
    ]
    return Page(records, after + PAGE, 1, 100, False)


def subscription(failure: Exception) -> Subscription:
    reads = 0

    async def read(after: int, limit: int) -> Page:
        nonlocal reads
        reads += 1
        if reads > 1:
            raise failure
        return page(after)  # a full page: the subscriber goes on catching up

    async def record_gap(expected: int, received: int, repaired: int) -> None:
        return None

    return Subscription(0, read=read, record_gap=record_gap, buffer_records=100, page_records=PAGE)


async def test_a_catch_up_read_in_an_outage_ends_the_response() -> None:
    sub = subscription(asyncpg.exceptions.CannotConnectNowError("starting up"))
    await sub.prime()
    first = await sub.next(1.0)
    assert isinstance(first, list) and [r.sequence for r in first[0].records] == [1, 2]
    assert isinstance(await sub.next(1.0), Interrupted)
    assert sub.finished and sub.last_sent == 2  # the client resumes after 2


async def test_any_other_failure_still_raises() -> None:
    sub = subscription(ValueError("a bug"))
    await sub.prime()
    await sub.next(1.0)
    with pytest.raises(ValueError):
        await sub.next(1.0)
