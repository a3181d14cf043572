"""Records, input deliveries and append receipts carry no per-row foreign key (the
``streams_delete_rows`` trigger instead): nothing names a missing stream all the same,
and deleting a stream still takes its rows.

Only the append functions write them, under the stream's row lock, which a DELETE of the
stream waits for; the delete's trigger then removes what that append committed."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from ductor_streams.errors import NotFound
from ductor_streams.store import Store
from ductor_streams.store.models import StreamRef
from tests.support.credit import append, make_stream
from tests.support.live import eventually

ROWS = """
SELECT (SELECT count(*) FROM workflow_streams.records WHERE stream_pk = $1),
       (SELECT count(*) FROM workflow_streams.input_deliveries WHERE stream_pk = $1),
       (SELECT count(*) FROM workflow_streams.append_receipts WHERE stream_pk = $1)"""
ORPHANS = """
SELECT (SELECT count(*) FROM workflow_streams.records r
         WHERE NOT EXISTS (SELECT 1 FROM workflow_streams.streams s
                            WHERE s.stream_pk = r.stream_pk)),
       (SELECT count(*) FROM workflow_streams.input_deliveries d
         WHERE NOT EXISTS (SELECT 1 FROM workflow_streams.streams s
                            WHERE s.stream_pk = d.stream_pk)),
       (SELECT count(*) FROM workflow_streams.append_receipts a
         WHERE NOT EXISTS (SELECT 1 FROM workflow_streams.streams s
                            WHERE s.stream_pk = a.stream_pk))"""
DELETE = "DELETE FROM workflow_streams.streams WHERE stream_pk = $1"


async def rows(pool: asyncpg.Pool, ref: StreamRef) -> tuple[int, int, int]:
    """The stream's records, input deliveries and append receipts."""
    row = await pool.fetchrow(ROWS, ref.stream_pk)
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


async def test_deleting_a_stream_deletes_its_records_and_deliveries(
    pool: asyncpg.Pool, store: Store
) -> None:
    gone = await make_stream(store, direction="input", max_unread_items=None)
    kept = await make_stream(store, direction="input", max_unread_items=None)
    for ref in (gone, kept):
        await append(store, ref, [1, 2, 3], key="k-1")
        await append(store, ref, [4])
    assert await rows(pool, gone) == (4, 4, 1)
    assert await pool.execute(DELETE, gone.stream_pk) == "DELETE 1"
    assert await rows(pool, gone) == (0, 0, 0)
    assert await rows(pool, kept) == (4, 4, 1)  # only the deleted stream's rows went
    with pytest.raises(NotFound):
        await append(store, gone, [5], key="k-2")
    assert await rows(pool, gone) == (0, 0, 0)


async def test_a_delete_racing_appends_leaves_no_record_behind(pool: asyncpg.Pool) -> None:
    """Appends run back to back on their own appender while the stream is deleted: the
    delete waits for the append holding the row lock, and every append after it is
    refused; no record or delivery of the stream is left."""
    for _ in range(5):
        store = Store(pool)
        ref = await make_stream(store, direction="input", max_unread_items=None)

        async def appends(store: Store = store, ref: StreamRef = ref) -> int:
            n = 0
            while True:
                outcomes = await asyncio.gather(
                    *(append(store, ref, [n, n], key=f"k-{n}-{i}") for i in range(4)),
                    return_exceptions=True,
                )
                failed = [o for o in outcomes if isinstance(o, BaseException)]
                if failed:
                    assert all(isinstance(o, NotFound) for o in failed), failed
                    return n
                n += 1

        task = asyncio.create_task(appends())
        await eventually(lambda ref=ref: _at_least(pool, ref, 40), what="40 records")
        assert await pool.execute(DELETE, ref.stream_pk) == "DELETE 1"
        rounds = await asyncio.wait_for(task, 30)
        assert rounds >= 5
        assert await rows(pool, ref) == (0, 0, 0)
    assert tuple(await pool.fetchrow(ORPHANS)) == (0, 0, 0)


async def _at_least(pool: asyncpg.Pool, ref: StreamRef, n: int) -> bool:
    return (await rows(pool, ref))[0] >= n
