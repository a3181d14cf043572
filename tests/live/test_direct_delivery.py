"""The direct fan-out path (unit tests, in-memory): a subscription hands contiguous
batches straight to its edge's sink only while the edge is idle; everything else goes
through the buffer, and a direct write that must wait for the client is never
overtaken."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from ductor_streams.http.codecs.sse_response import DirectWriter
from ductor_streams.live.events import LiveBatch
from ductor_streams.live.subscription import Subscription
from ductor_streams.store.models import Page, Record
from tests.support.live import eventually

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def rec(sequence: int) -> Record:
    return Record(sequence, f'"{sequence}"', 3, NOW, None)


def batch(first: int, last: int) -> LiveBatch:
    return LiveBatch([rec(s) for s in range(first, last + 1)], last, False)


class FakeStore:
    """Pages of records 1..latest, counting reads."""

    def __init__(self, latest: int) -> None:
        self.latest = latest
        self.reads: list[tuple[int, int]] = []

    async def read(self, after: int, limit: int) -> Page:
        self.reads.append((after, limit))
        records = [rec(s) for s in range(after + 1, min(self.latest, after + limit) + 1)]
        return Page(records, after + len(records), 1, self.latest, False)


async def no_gap_evidence(expected: int, received: int, repaired: int) -> None:
    pass


async def idle(subscription: Subscription) -> None:
    """Wait until the edge's ``next`` is parked on its waiter."""
    await eventually(lambda: subscription._waiter is not None, timeout=5, what="edge idle")


async def test_contiguous_batches_go_to_the_sink_without_waking_the_edge():
    store = FakeStore(latest=2)
    sub = Subscription(
        0, read=store.read, record_gap=no_gap_evidence, buffer_records=100, page_records=10
    )
    taken: list[list[int]] = []

    def sink(b: LiveBatch) -> bool:
        taken.append([r.sequence for r in b.records])
        return True

    sub.attach_sink(sink)
    await sub.prime()
    first = await sub.next(5.0)
    assert isinstance(first, list) and [r.sequence for r in first[0].records] == [1, 2]
    edge = asyncio.ensure_future(sub.next(5.0))
    await idle(sub)
    sub.offer(batch(3, 4))
    sub.offer(batch(5, 5))
    assert taken == [[3, 4], [5]] and sub.last_sent == 5 and sub.direct_deliveries == 2
    assert not edge.done()
    # A duplicate and then a gap take the buffer: the edge wakes, repairs 6..7 from
    # Postgres and hands out 8 after it; the sink sees none of them.
    store.latest = 8
    sub.offer(batch(4, 5))
    sub.offer(batch(8, 8))
    got = await asyncio.wait_for(edge, 5)
    assert isinstance(got, list)
    assert [r.sequence for b in got for r in b.records] == [6, 7]
    got = await sub.next(5.0)
    assert isinstance(got, list)
    assert [r.sequence for b in got for r in b.records] == [8]
    assert taken == [[3, 4], [5]] and sub.gaps == 1
    sub.close()


async def test_a_refusing_sink_or_a_busy_edge_leaves_batches_to_next():
    store = FakeStore(latest=0)
    sub = Subscription(
        0, read=store.read, record_gap=no_gap_evidence, buffer_records=100, page_records=10
    )
    sub.attach_sink(lambda b: False)
    await sub.prime()
    sub.offer(batch(1, 2))  # the edge is not waiting in next: buffered
    got = await sub.next(5.0)
    assert isinstance(got, list) and [r.sequence for r in got[0].records] == [1, 2]
    edge = asyncio.ensure_future(sub.next(5.0))
    await idle(sub)
    sub.offer(batch(3, 3))  # the sink refuses: buffered, the edge wakes
    got = await asyncio.wait_for(edge, 5)
    assert isinstance(got, list) and [r.sequence for r in got[0].records] == [3]
    assert sub.direct_deliveries == 0
    sub.close()


async def test_a_write_held_by_flow_control_is_not_overtaken():
    sent: list[bytes] = []
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def send(message: dict) -> None:
        if not sent and not gate.done():
            await gate  # the first write waits, as uvicorn does when writing is paused
        sent.append(message["body"])

    writer = DirectWriter(
        lambda b: b"".join(b"%d;" % r.sequence for r in b.records), max_bytes=64 * 1024
    )
    assert writer(batch(1, 1)) is False  # not bound yet: the generator's path
    writer.bind(send)
    assert writer(batch(1, 2)) is True  # taken, but held
    assert writer(batch(3, 3)) is False  # must not overtake: goes the generator's way
    assert sent == []
    draining = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0)
    assert not draining.done()
    gate.set_result(None)
    await asyncio.wait_for(draining, 5)
    assert sent == [b"1;2;"]
    assert writer(batch(3, 3)) is True and sent == [b"1;2;", b"3;"]
    writer.cancel()
    assert writer(batch(4, 4)) is False
