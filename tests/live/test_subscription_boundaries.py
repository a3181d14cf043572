"""A subscription's duplicate rule at its boundary (unit tests, in-memory): a fanned-out
batch that starts at or below the last sent sequence and runs past it is cut, so each
sequence goes out once; one that ends at or below it is dropped whole."""

from __future__ import annotations

import asyncio

import pytest

from ductor_streams.live.events import LiveBatch
from ductor_streams.live.subscription import Subscription
from tests.live.test_direct_delivery import FakeStore, batch, idle, no_gap_evidence

pytestmark = pytest.mark.timeout(30)


async def primed(latest: int) -> tuple[Subscription, FakeStore]:
    store = FakeStore(latest=latest)
    sub = Subscription(
        0, read=store.read, record_gap=no_gap_evidence, buffer_records=100, page_records=100
    )
    await sub.prime()
    first = await sub.next(5.0)
    assert isinstance(first, list)
    assert [r.sequence for b in first for r in b.records] == list(range(1, latest + 1))
    return sub, store


def sequences(got: object) -> list[int]:
    assert isinstance(got, list), got
    return [r.sequence for b in got for r in b.records]


async def test_a_batch_overlapping_the_last_sent_sequence_sends_only_what_is_new():
    sub, store = await primed(15)
    assert sub.last_sent == 15
    store.latest = 18
    sub.offer(batch(14, 18))
    assert sequences(await sub.next(5.0)) == [16, 17, 18]
    assert sub.last_sent == 18 and store.reads == [(0, 100)]


async def test_a_batch_starting_exactly_at_the_last_sent_sequence_drops_that_one():
    sub, store = await primed(15)
    store.latest = 16
    sub.offer(batch(15, 16))
    assert sequences(await sub.next(5.0)) == [16]


async def test_a_batch_ending_at_the_last_sent_sequence_is_dropped_whole():
    sub, store = await primed(15)
    store.latest = 17
    sub.offer(batch(13, 15))
    sub.offer(batch(16, 17))
    assert sequences(await sub.next(5.0)) == [16, 17]
    assert store.reads == [(0, 100)]


async def test_an_overlapping_batch_offered_to_an_idle_edge_with_a_sink_is_cut_too():
    sub, store = await primed(15)
    taken: list[list[int]] = []

    def sink(b: LiveBatch) -> bool:
        taken.append([r.sequence for r in b.records])
        return True

    sub.attach_sink(sink)
    edge = asyncio.ensure_future(sub.next(5.0))
    await idle(sub)
    store.latest = 18
    sub.offer(batch(14, 18))
    # Not contiguous with 15, so not the direct path: the edge wakes and cuts it.
    assert sequences(await asyncio.wait_for(edge, 5)) == [16, 17, 18]
    assert taken == []


async def test_a_shorter_idle_wait_after_a_longer_one_ends_at_its_own_deadline():
    # A wait's timer is armed for the wait that set it; a later, shorter wait must not
    # sit out the earlier one's deadline (it did: next(0.1) after next(30.0) took 30 s).
    sub, store = await primed(3)
    waiting = asyncio.ensure_future(sub.next(30.0))
    await asyncio.sleep(0)  # it waits, its timer armed for 30 s
    assert not waiting.done()
    store.latest = 4
    sub.offer(batch(4, 4))
    assert sequences(await waiting) == [4]
    # The bound is the 30 s the first wait armed, not a measurement: None comes first.
    async with asyncio.timeout(15):
        assert await sub.next(0.1) is None
