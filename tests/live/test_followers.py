"""Live delivery in-process, on real Postgres: one read per wake for many subscribers,
duplicates dropped, gaps repaired with evidence, overflow falling back to Postgres."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from ductor_streams.config import LiveSettings
from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.live.events import End, LiveBatch
from ductor_streams.live.followers import Followers
from ductor_streams.live.hub import NotificationHub
from ductor_streams.live.subscription import Subscription
from ductor_streams.store import StreamKey, StreamRef, encode_batch
from ductor_streams.store.read import read_page
from tests.support.live import eventually


async def new_stream(store, tenant: str) -> StreamRef:
    key = StreamKey(tenant, f"run-{uuid.uuid4().hex[:8]}", "s")
    definition = parse_definition(
        {"stream_id": "s", "direction": "output"}, region="local", object_store_regions=frozenset()
    )
    ref, created = await store.create_stream(key, definition)
    assert created
    return ref


async def add(store, ref: StreamRef, payloads: list[object]) -> int:
    result = await store.append(ref, encode_batch(payloads, idempotency_key=None))
    return result.last_sequence


async def drain(subscription: Subscription, into: list[int], stop_at: int) -> None:
    while not into or into[-1] < stop_at:
        item = await subscription.next(5.0)
        assert isinstance(item, list), item
        into.extend(r.sequence for batch in item for r in batch.records)


@pytest.fixture
async def hub(database_url):
    hub = NotificationHub(database_url)
    await hub.start()
    try:
        yield hub
    finally:
        await hub.close()


# A payload too large for a wake to carry (store/wake_format.py MAX_PAYLOAD_BYTES).
LARGE = "x" * 8_000


@pytest.mark.parametrize("payload", ["small", "large"])
async def test_one_read_per_wake_fanned_out_to_50_subscribers(store, pool, hub, tenant, payload):
    ref = await new_stream(store, tenant)
    await add(store, ref, ["a", "b"])
    followers = Followers(pool, hub, LiveSettings(poll_seconds=3600))
    subs = [await followers.subscribe(ref.stream_pk, 0) for _ in range(50)]
    received: list[list[int]] = [[] for _ in subs]
    follower = followers.follower(ref.stream_pk)
    assert follower is not None and follower.subscriber_count == 50
    for latest in range(3, 23):
        record = latest if payload == "small" else f"{LARGE}{latest}"
        assert await add(store, ref, [record]) == latest
        await asyncio.gather(
            *(drain(s, got, latest) for s, got in zip(subs, received, strict=True))
        )
    for got in received:
        assert got == list(range(1, 23))
    if payload == "small":
        # Each append's own wake carried its record (``records_wake``): no read at all.
        assert (follower.reads, follower.fed_batches) == (0, 20)
    else:
        # 20 appends, 20 plain wakes: about 20 follower reads in all, not 20 x 50.
        assert 1 <= follower.reads <= 25, follower.reads
        assert follower.fed_batches == 0
    assert {s.postgres_reads for s in subs} == {1}  # each read Postgres once: its backfill
    assert {s.gaps for s in subs} == {0} and {s.overflows for s in subs} == {0}
    for s in subs:
        followers.release(ref.stream_pk, s)
    assert followers.follower(ref.stream_pk) is None
    await follower.wait_stopped()


async def test_duplicates_dropped_and_gap_repaired_with_evidence(store, pool, database_url, tenant):
    ref = await new_stream(store, tenant)
    await add(store, ref, list(range(1, 16)))
    # A hub that never LISTENs: only the batches offered by hand reach the subscriber.
    followers = Followers(pool, NotificationHub(database_url), LiveSettings(page_records=10))
    sub = await followers.subscribe(ref.stream_pk, 0)
    got: list[int] = []
    await drain(sub, got, 15)
    assert got == list(range(1, 16))

    await add(store, ref, list(range(16, 26)))
    page = await read_page(pool, ref.stream_pk, 0, 25)
    records = {r.sequence: r for r in page.records}
    sub.offer(LiveBatch([records[s] for s in range(5, 12)], 25, False))  # all duplicates
    assert await sub.next(0.05) is None
    sub.offer(LiveBatch([records[s] for s in range(20, 26)], 25, False))  # 16..19 missing
    item = await sub.next(1.0)
    assert isinstance(item, list)
    assert [r.sequence for b in item for r in b.records] == [16, 17, 18, 19]  # repaired
    item = await sub.next(1.0)
    assert isinstance(item, list)
    assert [r.sequence for b in item for r in b.records] == [20, 21, 22, 23, 24, 25]
    assert sub.gaps == 1
    rows = await pool.fetch(
        "SELECT expected_sequence, received_sequence, repaired_records, detected_by"
        " FROM workflow_streams.gap_evidence WHERE stream_pk = $1",
        ref.stream_pk,
    )
    assert [tuple(r) for r in rows] == [(16, 20, 4, followers.detected_by)]
    followers.release(ref.stream_pk, sub)


async def test_overflow_falls_back_to_postgres_and_close_ends(store, pool, database_url, tenant):
    ref = await new_stream(store, tenant)
    followers = Followers(
        pool, NotificationHub(database_url), LiveSettings(buffer_records=3, page_records=4)
    )
    sub = await followers.subscribe(ref.stream_pk, 0)
    await add(store, ref, list(range(1, 11)))
    page = await read_page(pool, ref.stream_pk, 0, 10)
    for record in page.records:  # ten one-record batches into a 3-record buffer
        sub.offer(LiveBatch([record], record.sequence, False))
    assert sub.overflows == 1
    got: list[int] = []
    await drain(sub, got, 10)
    assert got == list(range(1, 11))
    assert sub.postgres_reads == 1 + 3  # the backfill, then 4 + 4 + 2 from Postgres
    await store.close(ref)
    sub.offer(LiveBatch([], 10, True))
    assert await sub.next(1.0) == End(10)
    followers.release(ref.stream_pk, sub)


async def test_a_cursor_problem_unregisters_the_subscriber(store, pool, hub, tenant):
    from ductor_streams.errors import CursorInFuture

    ref = await new_stream(store, tenant)
    followers = Followers(pool, hub)
    with pytest.raises(CursorInFuture):
        await followers.subscribe(ref.stream_pk, 5)
    assert followers.follower(ref.stream_pk) is None


async def test_records_committed_while_listen_is_down_arrive_after_reconnect(
    store, pool, database_url, tenant
):
    """The LISTEN connection is killed and held down while records commit: their wakes
    are lost, so only the reconnect's re-read can deliver them (no safety poll here)."""
    hub = NotificationHub(database_url)
    await hub.start()
    gate = asyncio.Event()
    connect = hub._connect

    async def gated_connect() -> None:
        await gate.wait()
        await connect()

    try:
        ref = await new_stream(store, tenant)
        followers = Followers(pool, hub, LiveSettings(poll_seconds=3600))
        sub = await followers.subscribe(ref.stream_pk, 0)
        got: list[int] = []
        await add(store, ref, [1, 2])
        await drain(sub, got, 2)
        hub._connect = gated_connect  # type: ignore[method-assign]
        pid = hub.backend_pid
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", pid)
        await eventually(lambda: not hub.connected, what="the hub to notice")
        await add(store, ref, [3, 4, 5])  # announced while nobody listens
        assert await sub.next(0.3) is None  # nothing arrives while LISTEN is down
        gate.set()
        await drain(sub, got, 5)
        assert got == [1, 2, 3, 4, 5]
        assert hub.reconnects == 1 and hub.backend_pid != pid
        followers.release(ref.stream_pk, sub)
    finally:
        await hub.close()


async def test_a_commit_racing_the_backfill_read_is_delivered(store, pool, hub, tenant):
    """A record commits (and is fanned out) just after the subscriber's backfill read,
    then the stream goes idle: only registering BEFORE the backfill delivers it."""
    ref = await new_stream(store, tenant)
    await add(store, ref, [1, 2])

    class Racing(Followers):
        raced = False

        async def _read(self, stream_pk: int, after: int, limit: int):  # type: ignore[no-untyped-def]
            page = await super()._read(stream_pk, after, limit)
            if not self.raced and after == 0:  # the subscriber's backfill, not the follower
                self.raced = True
                await add(store, ref, [3])
                follower = self.follower(stream_pk)
                assert follower is not None
                await eventually(lambda: follower.last_read == 3, what="the fan-out of 3")
            return page

    followers = Racing(pool, hub, LiveSettings(poll_seconds=3600))
    sub = await followers.subscribe(ref.stream_pk, 0)
    got: list[int] = []
    await drain(sub, got, 3)
    assert got == [1, 2, 3]
    followers.release(ref.stream_pk, sub)


async def test_drain_ends_every_subscription_and_any_started_after_it(store, pool, hub, tenant):
    from ductor_streams.live.events import Draining

    ref = await new_stream(store, tenant)
    await add(store, ref, ["a"])
    followers = Followers(pool, hub, LiveSettings(poll_seconds=3600))
    waiting = [await followers.subscribe(ref.stream_pk, 1) for _ in range(3)]
    nexts = [asyncio.ensure_future(s.next(30.0)) for s in waiting]
    await asyncio.sleep(0)  # each is now waiting for a record
    followers.drain()
    assert [type(item) for item in await asyncio.gather(*nexts)] == [Draining] * 3
    late = await followers.subscribe(ref.stream_pk, 0)
    # The backfill read before the drain is still sent, then the drain ends it.
    first = await late.next(5.0)
    assert isinstance(first, list) and [r.sequence for b in first for r in b.records] == [1]
    assert isinstance(await late.next(5.0), Draining)
    for s in [*waiting, late]:
        followers.release(ref.stream_pk, s)
