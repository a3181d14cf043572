"""Follower reads batched per turn of the event loop (live/read_batch.py): each page is
what a read of its own returns, errors included, in one statement."""

from __future__ import annotations

import asyncio

import pytest

from ductor_streams.errors import CursorInFuture, NotFound
from ductor_streams.live.read_batch import ReadBatcher
from ductor_streams.store.read import read_page
from tests.live.test_followers import add, new_stream


async def test_reads_of_one_turn_go_as_one_statement_with_the_pages_of_single_reads(
    store, pool, tenant
) -> None:
    refs = [await new_stream(store, tenant) for _ in range(4)]
    for n, ref in enumerate(refs[1:], start=1):  # 0, 3, 6 and 9 records
        await add(store, ref, [{"n": n, "i": i, "pad": "x" * 100} for i in range(n * 3)])
    batcher = ReadBatcher(pool, page_bytes=350)  # 3 records of ~130 bytes pass it
    asks = [(refs[0].stream_pk, 0, 10), (refs[1].stream_pk, 1, 10)]
    asks += [(refs[2].stream_pk, 0, 2), (refs[3].stream_pk, 2, 10), (refs[3].stream_pk, 9, 10)]
    asks += [(10**12, 0, 10), (refs[1].stream_pk, 7, 10)]
    results = await asyncio.gather(*(batcher.read(*ask) for ask in asks), return_exceptions=True)
    assert batcher.statements == 1
    for ask, result in zip(asks[:5], results[:5], strict=True):
        assert result == await read_page(pool, *ask, max_bytes=350), ask
    # Cursor, limit and byte budget each cut a page somewhere.
    assert [len(r.records) for r in results[:5]] == [0, 2, 2, 3, 0]  # type: ignore[union-attr]
    assert isinstance(results[5], NotFound)
    assert isinstance(results[6], CursorInFuture)
    # Alone in its turn, a read is a plain read.
    page = await batcher.read(refs[3].stream_pk, 0, 10)
    assert batcher.statements == 2
    assert page == await read_page(pool, refs[3].stream_pk, 0, 10, max_bytes=350)


@pytest.mark.parametrize("cancel_first", [True, False])
async def test_a_cancelled_read_leaves_the_others_theirs(store, pool, tenant, cancel_first) -> None:
    refs = [await new_stream(store, tenant) for _ in range(2)]
    for ref in refs:
        await add(store, ref, [1, 2])
    batcher = ReadBatcher(pool, page_bytes=1 << 20)
    tasks = [asyncio.ensure_future(batcher.read(ref.stream_pk, 0, 10)) for ref in refs]
    await asyncio.sleep(0)
    tasks[0 if cancel_first else 1].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    kept = done[1 if cancel_first else 0]
    assert [r.sequence for r in kept.records] == [1, 2]  # type: ignore[union-attr]


async def test_a_turn_with_more_reads_than_a_statement_holds_sends_two(store, pool, tenant):
    ref = await new_stream(store, tenant)
    await add(store, ref, [1])
    batcher = ReadBatcher(pool, page_bytes=1 << 20)
    pages = await asyncio.gather(*(batcher.read(ref.stream_pk, 0, 10) for _ in range(70)))
    assert batcher.statements == 2  # 64, then 6
    assert all([r.sequence for r in p.records] == [1] for p in pages)


class CountingPool:
    """The pool, counting the connections taken from it."""

    def __init__(self, pool) -> None:
        self.pool = pool
        self.acquired = 0

    async def acquire(self):
        self.acquired += 1
        return await self.pool.acquire()

    async def release(self, conn) -> None:
        await self.pool.release(conn)


async def test_reads_that_follow_each_other_keep_one_connection(store, pool, tenant) -> None:
    # Through the pool, each read's answer would wait for the release's reset (a second
    # round trip); kept, reads follow each other on one connection.
    refs = [await new_stream(store, tenant) for _ in range(2)]
    for ref in refs:
        await add(store, ref, [1, 2])
    counting = CountingPool(pool)
    batcher = ReadBatcher(counting, page_bytes=1 << 20)  # type: ignore[arg-type]
    try:
        for _ in range(5):
            page = await batcher.read(refs[0].stream_pk, 0, 10)  # alone: a plain read
            assert [r.sequence for r in page.records] == [1, 2]
            both = await asyncio.gather(*(batcher.read(r.stream_pk, 1, 10) for r in refs))
            assert [[r.sequence for r in p.records] for p in both] == [[2], [2]]
        assert batcher.statements == 10 and counting.acquired == 1
    finally:
        batcher.release()
