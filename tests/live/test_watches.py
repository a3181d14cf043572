"""Appends notify at commit only when something waits for the wake (``streams.watched_until``).

A live follower watches its stream (``live_stream_watch``) before it reads where to
start; an append notifies when its stream is an input stream or watched. These tests
count the wakes on a LISTEN connection of their own: notifications of one session
arrive in commit order, so a sentinel sent after the appends comes after every wake
they could have sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from ductor_streams.config import LiveSettings
from ductor_streams.live.followers import Followers
from ductor_streams.live.hub import NotificationHub, parse_wake
from ductor_streams.schema import QUERIES
from ductor_streams.store import Store, encode_batch
from ductor_streams.store.append import statement_arguments
from ductor_streams.store.models import StreamRef
from tests.support.credit import append, make_stream
from tests.support.live import eventually


class Wakes:
    """Every payload on the channel, in arrival order."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.arrived = asyncio.Event()

    def on_notify(self, _c: object, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.append(payload)
        self.arrived.set()

    def announced(self, ref: StreamRef) -> list[int]:
        """The latest sequence of each record wake of the stream (``r<pk>:<seq>``, or
        ``R<pk>:<seq>:...`` carrying its records: ``records_wake``)."""
        found = []
        for payload in self.payloads:
            wake = parse_wake(payload) if payload[:1] in ("r", "R") else None
            if wake is not None and wake[0] == ref.stream_pk and wake[1] is not None:
                found.append(wake[1])
        return found

    def of(self, ref: StreamRef) -> int:
        """Record wakes of the stream, with or without a sequence."""
        plain = self.payloads.count(f"r{ref.stream_pk}")
        return plain + len(self.announced(ref))

    async def settle(self, pool: asyncpg.Pool) -> None:
        """Wait until every wake committed so far has arrived."""
        sentinel = f"sentinel-{len(self.payloads)}"
        await pool.execute("SELECT pg_notify('workflow_streams', $1)", sentinel)
        async with asyncio.timeout(5):
            while sentinel not in self.payloads:
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
async def wakes(database_url: str) -> AsyncIterator[Wakes]:
    conn = await asyncpg.connect(database_url)
    wakes = Wakes()
    await conn.add_listener("workflow_streams", wakes.on_notify)
    try:
        yield wakes
    finally:
        await conn.close()


WATCHED_UNTIL = "SELECT watched_until FROM workflow_streams.streams WHERE stream_pk = $1"


async def watch(pool: asyncpg.Pool, ref: StreamRef, seconds: float = 60.0) -> int:
    latest = await pool.fetchval(QUERIES["live_stream_watch"], ref.stream_pk, seconds)
    return int(latest)


async def test_an_unwatched_output_stream_gets_no_wake(pool: asyncpg.Pool, wakes: Wakes) -> None:
    store = Store(pool)  # its own appender: each append is alone, notifying at commit
    ref = await make_stream(store)
    for n in range(1, 4):
        await append(store, ref, [n])
    await wakes.settle(pool)
    assert wakes.of(ref) == 0
    assert store.wakes.statements == 0  # and no wake statement after commit either


async def test_an_input_stream_is_woken_without_a_watch(pool: asyncpg.Pool, wakes: Wakes) -> None:
    # The input dispatcher of any process waits for these.
    store = Store(pool)
    ref = await make_stream(store, direction="input")
    for n in range(1, 4):
        await append(store, ref, [n])
    await wakes.settle(pool)
    assert wakes.of(ref) == 3
    assert wakes.announced(ref) == [1, 2, 3]  # each commit's latest sequence


async def test_a_watched_stream_is_woken_until_the_watch_lapses(
    pool: asyncpg.Pool, wakes: Wakes
) -> None:
    store = Store(pool)
    ref = await make_stream(store)
    assert await watch(pool, ref) == 0
    await append(store, ref, [1])
    await append(store, ref, [2])
    await wakes.settle(pool)
    assert wakes.of(ref) == 2
    await pool.execute(
        "UPDATE workflow_streams.streams SET watched_until = now() - interval '1 second'"
        " WHERE stream_pk = $1",
        ref.stream_pk,
    )
    await append(store, ref, [3])
    await wakes.settle(pool)
    assert wakes.of(ref) == 2
    # A new watch never shortens a longer one.
    await watch(pool, ref, 600)
    await watch(pool, ref, 1)
    assert await pool.fetchval(
        "SELECT watched_until > now() + interval '500 seconds' FROM workflow_streams.streams"
        " WHERE stream_pk = $1",
        ref.stream_pk,
    )
    assert await pool.fetchval(WATCHED_UNTIL, ref.stream_pk) is not None


async def test_a_watch_taken_while_appends_run_misses_no_wake(
    pool: asyncpg.Pool, database_url: str, wakes: Wakes
) -> None:
    """Every append that commits after the watch's start point notifies, exactly once.

    The appends run back to back on one connection, so the watch waits for the row lock
    behind one of them, and the next append's statement starts before the watch commits.
    An append that judged "watched" from anything older than the row it locked would
    miss its wake here."""
    store = Store(pool)
    conn = await asyncpg.connect(database_url)
    try:
        for _ in range(5):
            ref = await make_stream(store, max_unread_items=None)
            stop = asyncio.Event()

            async def appends(ref: StreamRef = ref, stop: asyncio.Event = stop) -> None:
                while not stop.is_set():
                    rows = await conn.fetch(
                        QUERIES["records_append_group"],
                        ref.stream_pk,
                        [1],
                        [None],
                        ["h"],
                        "1",
                        "1",
                        None,
                        True,
                        None,  # no trace contexts
                    )
                    assert rows[0]["outcome"] == "appended"

            task = asyncio.create_task(appends())
            await eventually(lambda ref=ref: _has(pool, ref, 20), what="20 appends")
            started_after = await watch(pool, ref)
            await eventually(
                lambda ref=ref, n=started_after + 20: _has(pool, ref, n), what="20 more"
            )
            stop.set()
            await task
            final = await _latest(pool, ref)
            await wakes.settle(pool)
            assert started_after >= 20
            assert wakes.of(ref) == final - started_after
            assert wakes.announced(ref) == list(range(started_after + 1, final + 1))
    finally:
        await conn.close()


async def _has(pool: asyncpg.Pool, ref: StreamRef, n: int) -> bool:
    return await _latest(pool, ref) >= n


async def _latest(pool: asyncpg.Pool, ref: StreamRef) -> int:
    value = await pool.fetchval(
        "SELECT latest_sequence FROM workflow_streams.streams WHERE stream_pk = $1",
        ref.stream_pk,
    )
    return int(value)


async def test_followers_watch_what_they_follow_and_renew_it(
    pool: asyncpg.Pool, database_url: str, wakes: Wakes
) -> None:
    """Another process's appends reach a follower through wakes alone (no poll, nothing
    fed): the follower's watch makes them notify, and the watch is renewed."""
    hub = NotificationHub(database_url)
    await hub.start()
    followers = Followers(pool, hub, LiveSettings(poll_seconds=3600, watch_seconds=0.6))
    writer = Store(pool)  # "another process": its appends are not fed to these followers
    ref = await make_stream(writer)
    try:
        subscription = await followers.subscribe(ref.stream_pk, 0)
        got: list[int] = []
        for n in range(1, 4):
            await append(writer, ref, [n])
            async with asyncio.timeout(5):
                while len(got) < n:
                    item = await subscription.next(5.0)
                    assert isinstance(item, list), item
                    got.extend(r.sequence for batch in item for r in batch.records)
        assert got == [1, 2, 3]
        # The first lease (0.6 s) runs out; the renewals (every 0.2 s) keep it watched.
        first = await pool.fetchval(WATCHED_UNTIL, ref.stream_pk)
        await eventually(
            lambda: pool.fetchval(
                "SELECT now() > $2 AND watched_until > now() FROM workflow_streams.streams"
                " WHERE stream_pk = $1",
                ref.stream_pk,
                first,
            ),
            what="the first lease past and a renewed one in force",
        )
        await append(writer, ref, [4])
        async with asyncio.timeout(5):
            item = await subscription.next(5.0)
        assert isinstance(item, list) and [r.sequence for b in item for r in b.records] == [4]
        followers.release(ref.stream_pk, subscription)
    finally:
        await followers.close()
        await hub.close()


async def test_renewing_watches_never_deadlocks_with_an_append_to_many_streams(
    pool: asyncpg.Pool,
) -> None:
    """The renewal locks rows in stream_pk order, as a several-stream append does.

    An append to 16 streams holds the first 8 and waits for the 9th (held here); the
    renewal, given the streams in descending order, then starts. Locking in the order
    given, it would take the last 7 and wait for the 9th too: a deadlock once the 9th
    is free. In stream_pk order it waits behind the append instead."""
    store = Store(pool)
    refs = [await make_stream(store) for _ in range(16)]
    pks = sorted(ref.stream_pk for ref in refs)
    batches = [encode_batch([n]) for n in range(16)]
    async with pool.acquire() as holder:
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute(
            "SELECT 1 FROM workflow_streams.streams WHERE stream_pk = $1 FOR UPDATE", pks[8]
        )
        append = asyncio.ensure_future(
            pool.fetch(
                QUERIES["records_append_stream_groups"],
                pks,
                [1] * 16,
                [1] * 16,
                *statement_arguments(batches),
                False,
                None,  # no trace contexts
            )
        )
        await eventually(lambda: _waiting_on_locks(pool, 1), what="the append waits")
        renewal = asyncio.ensure_future(
            pool.execute(QUERIES["live_streams_rewatch"], pks[::-1], 60.0)
        )
        await eventually(lambda: _waiting_on_locks(pool, 2), what="the renewal waits")
        await transaction.rollback()
    rows, status = await asyncio.gather(append, renewal)
    assert [r["outcome"] for r in rows] == ["appended"] * 16
    assert status == "UPDATE 16"


async def _waiting_on_locks(pool: asyncpg.Pool, n: int) -> bool:
    waiting = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return int(waiting) >= n
