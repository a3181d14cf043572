"""Wakes off the commit path (issue 9): the group's transaction carries no NOTIFY; the
wake is sent after the commit returned, coalesced, and retried when sending fails.

A lone append notifies at commit only when its stream is watched by a live follower
(``streams.watched_until``; tests/live/test_watches.py), so the streams here are watched first, as
a follower in another process would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from ductor_streams.live.hub import parse_wake
from ductor_streams.schema import QUERIES
from ductor_streams.store import Store
from ductor_streams.store.append import PARALLEL_RECORDS, Appender
from ductor_streams.store.models import StreamRef
from ductor_streams.store.wakes import WakeSender
from tests.support.commit_wakes import commit_wake
from tests.support.credit import append, make_stream


class Listener:
    """A LISTEN connection that keeps every payload, in arrival order, and on each
    record wake (``r<pk>:<seq>``, ``R<pk>:<seq>:...``) reads (through the pool) what is
    committed at that moment."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.payloads: list[str] = []
        self.visible_at_wake: list[tuple[int, int]] = []
        self.announced: list[tuple[int, int]] = []  # (stream_pk, the wake's sequence)
        self.arrived = asyncio.Event()
        self._reads: list[asyncio.Task[None]] = []

    def on_notify(self, _c: object, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.append(payload)
        wake = parse_wake(payload)  # r<pk>:<seq>, or R<pk>:<seq>:... with the records
        if payload[:1] in ("r", "R") and wake is not None and wake[1] is not None:
            stream_pk, latest = wake
            self.announced.append((stream_pk, latest))
            self._reads.append(asyncio.ensure_future(self._read(stream_pk)))
        self.arrived.set()

    async def _read(self, stream_pk: int) -> None:
        latest = await self.pool.fetchval(
            "SELECT latest_sequence FROM workflow_streams.streams WHERE stream_pk = $1",
            stream_pk,
        )
        self.visible_at_wake.append((stream_pk, int(latest)))

    async def settle(self, store: Store) -> None:
        """Wait until every wake sent so far has arrived and been read: the wake sender is
        drained, then a sentinel follows (notifications of different transactions arrive
        in commit order, so everything sent before it has arrived when it has)."""
        await store.wakes.drain()
        await self.pool.execute("SELECT pg_notify('workflow_streams', 'settled')")
        await self.wait_for("settled")

    async def wait_for(self, payload: str, deadline: float = 5.0) -> None:
        async with asyncio.timeout(deadline):
            while payload not in self.payloads:
                self.arrived.clear()
                await self.arrived.wait()
        await asyncio.gather(*self._reads)


async def watched_stream(store: Store, **ceilings: Any) -> StreamRef:
    """A new output stream, watched as a live follower watches it."""
    ref = await make_stream(store, **ceilings)
    await store.pool.fetchval(QUERIES["live_stream_watch"], ref.stream_pk, 60.0)
    return ref


@pytest.fixture
async def listener(database_url: str, pool: asyncpg.Pool) -> AsyncIterator[Listener]:
    conn = await asyncpg.connect(database_url)
    listener = Listener(pool)
    await conn.add_listener("workflow_streams", listener.on_notify)
    try:
        yield listener
    finally:
        await conn.close()


async def test_the_wake_follows_the_commit(store: Store, listener: Listener) -> None:
    ref = await watched_stream(store)
    for n in range(1, 6):
        await append(store, ref, [n])
        await listener.wait_for(await commit_wake(store.pool, ref.stream_pk, n, n))
        # Whenever the wake arrived, what it announces was already visible.
        assert listener.visible_at_wake[-1] == (ref.stream_pk, n)
        listener.payloads.clear()


async def test_many_streams_each_get_a_wake_after_their_last_commit(
    store: Store, listener: Listener
) -> None:
    refs = [await watched_stream(store) for _ in range(12)]
    await asyncio.gather(*(append(store, ref, [i]) for ref in refs for i in range(4)))
    await listener.settle(store)
    for ref in refs:
        announced = [seq for pk, seq in listener.announced if pk == ref.stream_pk]
        # Each wake says how far some commit reached; the last commit's is among them.
        assert announced and set(announced) <= {1, 2, 3, 4} and max(announced) == 4
        seen = [latest for pk, latest in listener.visible_at_wake if pk == ref.stream_pk]
        assert seen and max(seen) == 4  # never a wake without the commit behind it


async def test_the_group_transaction_itself_sends_no_notify(
    pool: asyncpg.Pool, store: Store, listener: Listener
) -> None:
    ref = await make_stream(store)
    await pool.fetch(
        QUERIES["records_append_group"],
        ref.stream_pk,
        [1],
        [None],
        ["h"],
        "1",
        "1",
        None,
        False,
        None,  # no trace contexts
    )
    # Notifications of one session arrive in order: the sentinel comes after anything
    # the append's commit could have sent.
    await pool.execute("SELECT pg_notify('workflow_streams', 'sentinel')")
    await listener.wait_for("sentinel")
    assert [pk for pk, _ in listener.announced if pk == ref.stream_pk] == []


async def test_the_seven_argument_form_still_notifies_at_commit(
    pool: asyncpg.Pool, store: Store, listener: Listener
) -> None:
    # Callers that append inside a transaction of their own (object commit) use it.
    ref = await watched_stream(store)
    rows = await pool.fetch(
        QUERIES["records_append"], ref.stream_pk, [1], [None], ["h"], ["1"], [1], [None]
    )
    assert rows[0]["outcome"] == "appended"
    await listener.wait_for(await commit_wake(pool, ref.stream_pk, 1, 1))


class FakePool:
    """Stands in for asyncpg.Pool in the WakeSender unit tests."""

    def __init__(self, failures: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.failures = failures

    async def fetchval(self, _query: str, payloads: list[str]) -> int:
        self.calls.append(list(payloads))
        if self.failures:
            self.failures -= 1
            raise asyncpg.exceptions.ConnectionFailureError("down")
        return len(payloads)

    def is_closing(self) -> bool:
        return False

    # The wake sender keeps a connection across statements (store/held.py): this fake
    # is its own connection.
    async def acquire(self) -> FakePool:
        return self

    async def release(self, _conn: object) -> None:
        pass

    def is_closed(self) -> bool:
        return False

    async def fetch(self, query: str, payloads: list[str]) -> list[int]:
        return [await self.fetchval(query, payloads)]


async def test_wakes_queued_together_go_in_one_statement() -> None:
    fake = FakePool()
    sender = WakeSender(fake)  # type: ignore[arg-type]
    for payload in ["r1", "r2", "r1", "r3"]:
        sender.announce(payload)
    await sender.drain()
    assert fake.calls == [["r1", "r2", "r3"]]
    sender.announce("r2")
    await sender.drain()
    assert fake.calls[-1] == ["r2"]
    assert sender.statements == 2


async def test_a_failed_wake_send_is_retried() -> None:
    fake = FakePool(failures=2)
    sender = WakeSender(fake, retry_delay=0.001)  # type: ignore[arg-type]
    sender.announce("r7")
    await sender.drain()
    assert fake.calls == [["r7"], ["r7"], ["r7"]]
    assert sender.statements == 1


async def test_of_a_stream_s_queued_wakes_only_the_last_goes_out() -> None:
    # Announced in commit order, the last says the most (r<pk>:<latest sequence>); it
    # goes in the place of the stream's first.
    fake = FakePool()
    sender = WakeSender(fake)  # type: ignore[arg-type]
    for payload in ["r1:5", "r2:3", "r1:7", "c1", "r2:4"]:
        sender.announce(payload)
    await sender.drain()
    assert fake.calls == [["r1:7", "r2:4", "c1"]]


async def test_a_retried_wake_gives_way_to_a_newer_one_of_its_stream() -> None:
    sender: WakeSender

    class Failing(FakePool):
        async def fetchval(self, query: str, payloads: list[str]) -> int:
            if len(self.calls) == 0:
                sender.announce("r7:2")  # committed while the first send failed
                sender.announce("r8:1")
            return await super().fetchval(query, payloads)

    fake = Failing(failures=1)
    sender = WakeSender(fake, retry_delay=0.001)  # type: ignore[arg-type]
    sender.announce("r7:1")
    await sender.drain()
    assert fake.calls == [["r7:1"], ["r7:2", "r8:1"]]
    assert sender.statements == 1


async def test_wake_send_commits_without_waiting_for_a_wal_flush(pool: asyncpg.Pool) -> None:
    # The notifying transaction is asynchronous-commit: its setting is local to it.
    async with pool.acquire() as conn:
        await conn.fetchval(QUERIES["wake_send"], ["probe"])
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
        value: Any = await conn.fetchval(
            "SELECT count(*) FROM unnest($1::text[]) w, "
            "set_config('synchronous_commit', 'off', true) s WHERE s = 'off'",
            ["x"],
        )
        assert value == 1


async def test_a_lone_append_notifies_in_its_own_transaction(
    pool: asyncpg.Pool, listener: Listener
) -> None:
    store = Store(pool)  # its own appender: nothing else of it in flight
    ref = await watched_stream(store)
    for n in range(1, 4):
        await append(store, ref, [n])
        # It carries the record it announces (records_wake).
        wake = await commit_wake(pool, ref.stream_pk, n, n)
        assert wake.startswith(f"R{ref.stream_pk}:{n}:{n}:")
        await listener.wait_for(wake)
        assert listener.visible_at_wake[-1] == (ref.stream_pk, n)
        listener.payloads.clear()
    # Each wake came with its commit: no wake statement of its own.
    assert store.wakes.statements == 0


async def test_concurrent_groups_announce_after_commit_instead(
    pool: asyncpg.Pool, listener: Listener
) -> None:
    store = Store(pool)
    # Several statements at once (batches large enough to run beside each other): all
    # but the first start with another in flight.
    store.appender = Appender(pool, store.wakes, max_statements=6)
    refs = [await watched_stream(store, max_unread_items=None) for _ in range(6)]
    batch = list(range(PARALLEL_RECORDS))
    await asyncio.gather(*(append(store, ref, batch) for ref in refs for _ in range(3)))
    await listener.settle(store)
    for ref in refs:
        announced = [seq for pk, seq in listener.announced if pk == ref.stream_pk]
        # Each wake says how far its commit reached, and the last commit's is among them.
        # They may arrive out of order: a wake queued after one commit can be overtaken
        # by the NOTIFY of the stream's next statement, sent alone and so at its commit.
        # Readers take the largest (the follower's max).
        assert announced and set(announced) <= {PARALLEL_RECORDS * k for k in (1, 2, 3)}
        assert max(announced) == 3 * PARALLEL_RECORDS
        seen = [latest for pk, latest in listener.visible_at_wake if pk == ref.stream_pk]
        assert seen and max(seen) == 3 * PARALLEL_RECORDS  # the last commit's wake
    assert 1 <= store.wakes.statements < 6 * 3


class CountingPool:
    """The real pool, counting the connections the wake sender takes from it."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.acquired = 0

    async def acquire(self) -> Any:
        self.acquired += 1
        return await self.pool.acquire()

    async def release(self, conn: Any) -> None:
        await self.pool.release(conn)

    def is_closing(self) -> bool:
        return self.pool.is_closing()


async def test_wake_statements_that_follow_each_other_keep_one_connection(
    store: Store, pool: asyncpg.Pool, listener: Listener
) -> None:
    # Through the pool, each wake statement would wait for the previous one's release
    # reset (a second round trip); held (store/held.py), they share one connection.
    counting = CountingPool(pool)
    sender = WakeSender(counting, min_interval=0.0)  # type: ignore[arg-type]
    ref = await watched_stream(store)
    sent: list[str] = []
    try:
        for n in range(1, 11):
            payload = f"r{ref.stream_pk}:{n}"
            sender.announce(payload)
            await sender.drain()
            sent.append(payload)
        await listener.wait_for(sent[-1])
        assert [p for p in listener.payloads if p in sent] == sent
        assert sender.statements == 10 and counting.acquired == 1
    finally:
        sender._connection.release()
