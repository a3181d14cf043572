"""Appends of this process reach its subscribers without a read (store.append.CommitFeed):
the fed records are exactly what a read returns, a fed batch that does not follow on
is dropped and the wake's read delivers it, and nothing is lost or repeated when fed
batches race reads and another process's appends."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import NamedTuple

import asyncpg
import pytest

from ductor_streams.config import LiveSettings
from ductor_streams.live import followers as followers_module
from ductor_streams.live.followers import Followers
from ductor_streams.live.hub import NotificationHub
from ductor_streams.live.stream_follower import StreamFollower
from ductor_streams.live.subscription import Subscription
from ductor_streams.store import Store, encode_batch
from ductor_streams.store.append import committed_records
from ductor_streams.store.models import StreamRef
from ductor_streams.store.outcomes import AppendOutcome
from ductor_streams.store.read import read_page
from tests.live.test_followers import add, drain, new_stream
from tests.support.live import eventually


def feeding_store(pool: asyncpg.Pool, followers: Followers) -> Store:
    store = Store(pool)  # its own appender: the session's store stays unfed
    store.appender.feed = followers
    return store


class ByHand(NamedTuple):
    """One subscriber following a stream through a hub that never LISTENs: the test
    delivers the wakes itself (``hub._wake``). ``store`` feeds the followers, as this
    process's appender does, when asked for."""

    hub: NotificationHub
    followers: Followers
    store: Store
    ref: StreamRef
    sub: Subscription
    follower: StreamFollower


async def by_hand(pool, database_url, tenant, *, feeding: bool) -> ByHand:
    hub = NotificationHub(database_url)
    followers = Followers(pool, hub, LiveSettings(poll_seconds=3600))
    store = feeding_store(pool, followers) if feeding else Store(pool)
    ref = await new_stream(store, tenant)
    sub = await followers.subscribe(ref.stream_pk, 0)
    follower = followers.follower(ref.stream_pk)
    assert follower is not None
    return ByHand(hub, followers, store, ref, sub, follower)


async def test_fed_records_arrive_without_a_read_exactly_as_read(pool, database_url, tenant):
    # A hub that never LISTENs and no safety poll: only the feed can deliver.
    followers = Followers(pool, NotificationHub(database_url), LiveSettings(poll_seconds=3600))
    store = feeding_store(pool, followers)
    ref = await new_stream(store, tenant)
    await add(store, ref, ["before"])
    sub = await followers.subscribe(ref.stream_pk, 0)
    follower = followers.follower(ref.stream_pk)
    assert follower is not None
    delivered = []
    for payloads in (["a"], [{"b": [1, 2]}, "c"], [None]):
        await add(store, ref, payloads)
    while len(delivered) < 5:
        item = await sub.next(5.0)
        assert isinstance(item, list), item
        delivered.extend(r for batch in item for r in batch.records)
    assert [r.sequence for r in delivered] == [1, 2, 3, 4, 5]
    # Without a read; fed batches that queued up meanwhile may have gone out as one.
    assert follower.reads == 0 and 1 <= follower.fed_batches <= 3
    # Exactly what a read returns: payload text, size, appended_at, object.
    page = await read_page(pool, ref.stream_pk, 0, 10)
    assert delivered == page.records
    followers.release(ref.stream_pk, sub)


async def test_batches_fed_meanwhile_go_out_as_one(pool, database_url, tenant):
    # The store feeds nothing: the batches are fed by hand.
    hub, followers, store, ref, sub, follower = await by_hand(
        pool, database_url, tenant, feeding=False
    )
    await add(store, ref, ["a", "b", "c", "d"])
    r = (await read_page(pool, ref.stream_pk, 0, 10)).records
    # A wake that announces nothing new is pending, so the follower has yet to run (an
    # idle one would deliver each batch within its feed: the next test). Fed meanwhile:
    # an overlap is trimmed, a batch that skips ahead is dropped, and what follows on
    # goes out as ONE batch.
    hub._wake(ref.stream_pk, 0)
    followers.committed(ref.stream_pk, [r[0]])
    followers.committed(ref.stream_pk, [r[0], r[1]])
    followers.committed(ref.stream_pk, [r[3]])
    followers.committed(ref.stream_pk, [r[2]])
    item = await sub.next(5.0)
    assert isinstance(item, list)
    assert [[x.sequence for x in batch.records] for batch in item] == [[1, 2, 3]]
    assert follower.fed_batches == 1 and follower.reads == 0
    assert await sub.next(0.1) is None  # sequence 4 waits for a read
    followers.release(ref.stream_pk, sub)


async def test_a_batch_fed_to_an_idle_follower_goes_out_within_the_feed(pool, database_url, tenant):
    # The store feeds nothing: the batches are fed by hand.
    hub, followers, store, ref, sub, follower = await by_hand(
        pool, database_url, tenant, feeding=False
    )
    await add(store, ref, ["a", "b", "c", "d"])
    r = (await read_page(pool, ref.stream_pk, 0, 10)).records
    assert follower._parked  # its task waits for a wake, with nothing pending
    # Each batch that follows on is fanned out before feed returns: no turn of the
    # event loop (nothing is awaited in between), no read.
    followers.committed(ref.stream_pk, [r[0]])
    assert (follower.last_read, follower.fed_batches) == (1, 1)
    followers.committed(ref.stream_pk, [r[0], r[1]])  # the overlap is trimmed
    assert (follower.last_read, follower.fed_batches) == (2, 2)
    followers.committed(ref.stream_pk, [r[1]])  # delivered already: nothing
    assert (follower.last_read, follower.fed_batches) == (2, 2)
    item = await sub.next(5.0)
    assert isinstance(item, list)
    assert [[x.sequence for x in batch.records] for batch in item] == [[1], [2]]
    # A batch that does not follow on (sequence 3 was never delivered) is left to the
    # task, which drops it; the wake of its commit brings the read that delivers both.
    followers.committed(ref.stream_pk, [r[3]])
    assert (follower.last_read, follower.fed_batches) == (2, 2)
    assert await sub.next(0.2) is None and follower.reads == 0
    hub._wake(ref.stream_pk, 4)
    got: list[int] = []
    await drain(sub, got, 4)
    assert got == [3, 4] and follower.reads == 1 and follower.fed_batches == 2
    followers.release(ref.stream_pk, sub)


async def test_a_fan_out_failing_within_the_feed_is_read_instead(
    pool, database_url, tenant, monkeypatch
):
    _hub, followers, store, ref, sub, follower = await by_hand(
        pool, database_url, tenant, feeding=False
    )
    await add(store, ref, ["a"])
    r = (await read_page(pool, ref.stream_pk, 0, 10)).records
    offer = sub.offer
    calls: list[int] = []

    def failing_once(batch):  # type: ignore[no-untyped-def]
        calls.append(batch.records[0].sequence)
        if len(calls) == 1:
            raise RuntimeError("a subscriber broke")
        offer(batch)

    monkeypatch.setattr(sub, "offer", failing_once)
    followers.committed(ref.stream_pk, [r[0]])  # the caller (an appender) sees nothing
    assert follower.fed_batches == 0 and follower.last_read == 0
    item = await sub.next(5.0)
    assert isinstance(item, list)
    assert [x.sequence for batch in item for x in batch.records] == [1]
    assert follower.reads == 1 and calls == [1, 1]
    followers.release(ref.stream_pk, sub)


async def test_a_stream_with_many_subscribers_is_read_not_fed(
    pool, database_url, tenant, monkeypatch
):
    monkeypatch.setattr(followers_module, "FEED_MAX_SUBSCRIBERS", 2)
    followers = Followers(pool, NotificationHub(database_url))
    store = feeding_store(pool, followers)
    ref = await new_stream(store, tenant)
    subs = [await followers.subscribe(ref.stream_pk, 0) for _ in range(2)]
    assert followers.follows(ref.stream_pk)
    subs.append(await followers.subscribe(ref.stream_pk, 0))
    assert not followers.follows(ref.stream_pk)  # a fan-out this long reads instead
    await add(store, ref, ["x"])
    follower = followers.follower(ref.stream_pk)
    assert follower is not None and follower.fed_batches == 0
    for sub in subs:
        followers.release(ref.stream_pk, sub)


async def test_a_stream_nobody_follows_is_not_fed(pool, database_url, tenant):
    followers = Followers(pool, NotificationHub(database_url))
    store = feeding_store(pool, followers)
    calls: list[int] = []
    followers.committed = lambda pk, records: calls.append(pk)  # type: ignore[method-assign]
    ref = await new_stream(store, tenant)
    await add(store, ref, ["x"])
    assert calls == []


def test_records_with_an_object_are_left_to_the_read() -> None:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        at = datetime(2026, 1, 1, tzinfo=UTC)
        plain = encode_batch(["a", "b"], idempotency_key=None)
        records = committed_records([(plain, future)], [(AppendOutcome.APPENDED, 4, 5)], at)
        assert [(r.sequence, r.payload, r.size, r.appended_at) for r in records] == [
            (4, '"a"', 3, at),
            (5, '"b"', 3, at),
        ]
        # A replayed or refused request appended nothing.
        assert committed_records([(plain, future)], [(AppendOutcome.REPLAYED, 4, 5)], at) == []
        assert (
            committed_records([(plain, future)], [(AppendOutcome.STREAM_CLOSED, None, None)], at)
            == []
        )
        with_object = plain.__class__(
            payloads=['"o"'],
            sizes=[3],
            objects=['{"id": "x"}'],
            idempotency_key=None,
            request_hash="h",
        )
        both = [(plain, future), (with_object, future)]
        assert (
            committed_records(
                both, [(AppendOutcome.APPENDED, 1, 2), (AppendOutcome.APPENDED, 3, 3)], at
            )
            == []
        )
    finally:
        loop.close()


async def test_a_fed_batch_that_does_not_follow_on_waits_for_the_read(pool, database_url, tenant):
    hub, followers, ours, ref, sub, follower = await by_hand(
        pool, database_url, tenant, feeding=True
    )
    other = Store(pool)  # another process: it commits and announces, it never feeds
    assert await add(other, ref, ["theirs"]) == 1
    assert await add(ours, ref, ["ours"]) == 2  # fed, but sequence 1 was never read
    assert await sub.next(0.2) is None  # nothing skipped ahead of sequence 1
    assert follower.fed_batches == 0 and follower.reads == 0
    hub._wake(ref.stream_pk)  # the wake of either commit
    got: list[int] = []
    await drain(sub, got, 2)
    assert got == [1, 2] and sub.gaps == 0
    assert follower.reads == 1
    followers.release(ref.stream_pk, sub)


@pytest.mark.parametrize("theirs", ["small", "large"])
async def test_fed_batches_racing_reads_and_another_writer_deliver_each_record_once(
    pool, database_url, hub, tenant, theirs
):
    followers = Followers(pool, hub, LiveSettings(poll_seconds=3600))
    ours = feeding_store(pool, followers)
    other = Store(pool)
    ref = await new_stream(ours, tenant)
    subs = [await followers.subscribe(ref.stream_pk, 0) for _ in range(3)]
    received: list[list[int]] = [[] for _ in subs]

    # The other writer's commits announce themselves with wakes that carry their records
    # ("small", ``records_wake``) or, too large for a wake, with plain ones that the
    # follower must read ("large").
    pad = "x" * 8_000 if theirs == "large" else ""

    async def write(store: Store, tag: str, appends: int) -> None:
        for i in range(appends):
            payload = f"{tag}{i}{pad}" if store is other else f"{tag}{i}"
            await store.append(ref, encode_batch([payload] * (1 + i % 3), idempotency_key=None))

    # The other writer stops halfway. While both write, their commits mostly alternate
    # (each waits for the row lock behind the other), so nearly every fed batch has the
    # other's records before it and is dropped for the read; afterwards our fed batches
    # follow on. Both paths and the hand-over between them run in every run.
    await asyncio.gather(*(write(ours, f"o{n}", 40) for n in range(4)), write(other, "t", 20))
    latest = await pool.fetchval(
        "SELECT latest_sequence FROM workflow_streams.streams WHERE stream_pk = $1", ref.stream_pk
    )
    assert latest == 4 * (14 * 1 + 13 * 2 + 13 * 3) + (7 * 1 + 7 * 2 + 6 * 3)
    await asyncio.gather(*(drain(s, got, latest) for s, got in zip(subs, received, strict=True)))
    for got, sub in zip(received, subs, strict=True):
        assert got == list(range(1, latest + 1))
        assert sub.gaps == 0 and sub.overflows == 0
    follower = followers.follower(ref.stream_pk)
    assert follower is not None and follower.fed_batches > 0
    if theirs == "large":
        assert follower.reads > 0
    for s in subs:
        followers.release(ref.stream_pk, s)


async def test_a_wake_during_an_own_append_is_read_after_it(pool, database_url, tenant):
    # The store's appends stand for another process's: committed, never fed.
    hub, followers, other, ref, sub, follower = await by_hand(
        pool, database_url, tenant, feeding=False
    )
    followers.appending(ref.stream_pk, True)  # a statement of ours is in flight
    assert await add(other, ref, ["theirs"]) == 1
    hub._wake(ref.stream_pk)
    assert await sub.next(0.2) is None  # the read waits for our statement's end
    assert follower.reads == 0
    assert await add(other, ref, ["ours, as if"]) == 2  # what our statement committed
    ours = (await read_page(pool, ref.stream_pk, 1, 10)).records
    followers.committed(ref.stream_pk, ours)  # fed, but 1 was never delivered: dropped
    followers.appending(ref.stream_pk, False)
    got: list[int] = []
    await drain(sub, got, 2)
    assert got == [1, 2] and follower.reads == 1 and sub.gaps == 0
    followers.release(ref.stream_pk, sub)


async def test_the_safety_poll_reads_even_while_an_own_append_seems_in_flight(
    pool, database_url, tenant
):
    followers = Followers(pool, NotificationHub(database_url), LiveSettings(poll_seconds=0.2))
    other = Store(pool)
    ref = await new_stream(other, tenant)
    sub = await followers.subscribe(ref.stream_pk, 0)
    followers.appending(ref.stream_pk, True)  # and never ends
    await add(other, ref, ["x"])
    got: list[int] = []
    await drain(sub, got, 1)
    assert got == [1]
    followers.release(ref.stream_pk, sub)


async def test_a_wake_for_records_already_delivered_brings_no_read(pool, database_url, tenant):
    """A record wake says how far its commit reached (``r<pk>:<seq>``):
    a follower that already delivered that far skips the read; further, or a wake that
    does not say, reads."""
    hub, followers, ours, ref, sub, follower = await by_hand(
        pool, database_url, tenant, feeding=True
    )
    other = Store(pool)
    assert await add(ours, ref, ["a", "b"]) == 2
    got: list[int] = []
    await drain(sub, got, 2)
    assert follower.fed_batches == 1 and follower.reads == 0
    hub._wake(ref.stream_pk, 2)  # our commit's own wake, after its feed
    hub._wake(ref.stream_pk, 1)  # an older one, late
    assert await sub.next(0.2) is None
    assert follower.reads == 0
    assert await add(other, ref, ["theirs"]) == 3
    hub._wake(ref.stream_pk, 3)  # beyond what was delivered: read
    await drain(sub, got, 3)
    assert got == [1, 2, 3] and follower.reads == 1
    hub._wake(ref.stream_pk, None)  # says nothing about how far: read
    await eventually(lambda: follower.reads == 2, what="a read for a wake without a sequence")
    assert await sub.next(0.1) is None and sub.gaps == 0
    followers.release(ref.stream_pk, sub)


async def test_the_wake_of_an_own_append_arriving_first_brings_no_read(pool, database_url, tenant):
    # The wake often reaches the hub before the statement's answer reaches the appender.
    # The store feeds nothing: the statement is played by hand.
    hub, followers, store, ref, sub, follower = await by_hand(
        pool, database_url, tenant, feeding=False
    )
    followers.appending(ref.stream_pk, True)
    assert await add(store, ref, ["x", "y"]) == 2  # committed
    hub._wake(ref.stream_pk, 2)  # its wake, before its answer
    followers.committed(ref.stream_pk, (await read_page(pool, ref.stream_pk, 0, 10)).records)
    followers.appending(ref.stream_pk, False)
    got: list[int] = []
    await drain(sub, got, 2)
    assert got == [1, 2]
    assert await sub.next(0.2) is None
    assert follower.fed_batches == 1 and follower.reads == 0
    followers.release(ref.stream_pk, sub)


@pytest.mark.parametrize("wake_first", [True, False])
async def test_a_fed_batch_after_unread_records_reads_at_once_beside_own_statements(
    pool, database_url, tenant, wake_first
):
    """Our statements follow each other back to back, so one is always in flight, and
    another writer committed in between: once a fed batch shows the hole, the wake's
    read goes at once (whether the wake came before or after it), rather than when this
    process stops appending."""
    # The store feeds nothing: our statements are played by hand.
    hub, followers, store, ref, sub, follower = await by_hand(
        pool, database_url, tenant, feeding=False
    )
    followers.appending(ref.stream_pk, True)  # our statement A
    assert await add(store, ref, ["theirs"]) == 1  # another process's commit
    if wake_first:
        hub._wake(ref.stream_pk, 1)  # its wake: held back for A
    assert await add(store, ref, ["A"]) == 2  # what A committed
    followers.appending(ref.stream_pk, True)  # B starts before A has ended
    followers.committed(ref.stream_pk, (await read_page(pool, ref.stream_pk, 1, 10)).records)
    followers.appending(ref.stream_pk, False)  # A ends; B goes on
    if not wake_first:
        assert await sub.next(0.2) is None  # no wake yet: nothing read
        assert follower.reads == 0
        hub._wake(ref.stream_pk, 1)
    got: list[int] = []
    await drain(sub, got, 2)
    assert got == [1, 2] and follower.reads == 1 and sub.gaps == 0
    followers.appending(ref.stream_pk, False)
    followers.release(ref.stream_pk, sub)
