"""The SSE backfill's framed pages (``records_read_sse_frames``, store/read_frames.py)
are byte for byte what the record-by-record path writes (``read_page`` records framed by
http/routes/subscribe.py ``_record_frames``): page by page, through a whole
subscription (boundaries, objects, close), and over HTTP; the cursor rules are the
same."""

from __future__ import annotations

import asyncpg
import httpx
import msgspec
import pytest

from ductor_streams.config import LiveSettings
from ductor_streams.errors import CursorExpired, CursorInFuture, NotFound
from ductor_streams.http.routes.subscribe import _record_frames
from ductor_streams.live.events import End, LiveBatch
from ductor_streams.live.followers import Followers
from ductor_streams.live.hub import NotificationHub
from ductor_streams.store import Store
from ductor_streams.store.models import StreamRef
from ductor_streams.store.read import read_page
from ductor_streams.store.read_frames import FramedPage, read_sse_frames
from tests.support.credit import append, make_stream
from tests.support.live import API, close, create_stream, eventually, stream_pk
from tests.support.live import append as http_append
from tests.support.read_streams import PAYLOADS, edge_stream

pytestmark = pytest.mark.timeout(60)

BIG = 1 << 30  # a byte budget no page here reaches
SET_OBJECT = (
    "UPDATE workflow_streams.records SET object = $3::jsonb WHERE stream_pk = $1 AND sequence = $2"
)


async def _both(
    pool: asyncpg.Pool, ref: StreamRef, cursor: int, limit: int, max_bytes: int = BIG
) -> tuple[FramedPage, bytes, int]:
    """The framed page, the record path's frames of the same records, and the record
    path's page's last sequence (the cursor when it is empty)."""
    framed = await read_sse_frames(pool, ref.stream_pk, cursor, limit, max_bytes)
    assert framed is not None
    page = await read_page(pool, ref.stream_pk, cursor, limit, max_bytes=max_bytes)
    # Only the framed page's records: it stops before a record with an object.
    records = [r for r in page.records if r.sequence <= framed.last_sequence]
    batch = LiveBatch(records, page.latest_sequence, page.closed)
    assert (framed.earliest_sequence, framed.latest_sequence, framed.closed) == (
        page.earliest_sequence,
        page.latest_sequence,
        page.closed,
    )
    assert framed.count == len(records)
    return framed, _record_frames(batch, [], ()), page.next_cursor


async def test_framed_pages_are_the_record_paths_bytes(pool: asyncpg.Pool, store: Store) -> None:
    ref = await edge_stream(store, pool)
    total = 2 * len(PAYLOADS)
    cases = [
        (0, 1000, BIG),  # the whole stream in one page
        (0, total, BIG),  # exactly one page
        (0, 1, BIG),
        (3, 5, BIG),  # a page boundary inside the stream
        (total - 1, 10, BIG),  # the last record
        (total, 10, BIG),  # the cursor at the end: an empty page
        (0, 1000, 1),  # the byte budget: at least one record
        (9, 1000, 1),  # ... even when that one record passes it
        (0, 1000, 120),  # the budget ends a page before the record that would pass it
    ]
    for cursor, limit, max_bytes in cases:
        framed, slow, next_cursor = await _both(pool, ref, cursor, limit, max_bytes)
        assert framed.frames == slow, (cursor, limit, max_bytes)
        assert framed.last_sequence == next_cursor, (cursor, limit, max_bytes)
    framed, _, _ = await _both(pool, ref, 0, 1000)
    assert framed.count == total and framed.last_sequence == total
    assert framed.frames.startswith(b"event: record\nid: 1\ndata: {")
    first = framed.frames.split(b"\n\n")[0].split(b"\ndata: ")[1]
    assert msgspec.json.decode(first)["appended_at"] == "2026-01-02T03:04:05+00:00"
    empty, _, _ = await _both(pool, ref, total, 10)
    assert (empty.frames, empty.count, empty.last_sequence) == (b"", 0, total)
    await store.close(ref)
    framed, slow, _ = await _both(pool, ref, 2, 3)
    assert framed.frames == slow and framed.closed is True


async def test_an_empty_stream_reads_an_empty_framed_page(pool: asyncpg.Pool, store: Store) -> None:
    ref = await make_stream(store, max_unread_items=None)
    framed = await read_sse_frames(pool, ref.stream_pk, 0, 500, BIG)
    assert framed == FramedPage(b"", 0, 0, 1, 0, False)


async def test_a_record_with_an_object_ends_the_framed_part(
    pool: asyncpg.Pool, store: Store
) -> None:
    ref = await edge_stream(store, pool)
    await pool.execute(SET_OBJECT, ref.stream_pk, 5, '{"object_id": "o-1", "size": 3}')
    framed, slow, _ = await _both(pool, ref, 0, 10)
    assert framed.count == 4 and framed.last_sequence == 4 and framed.frames == slow
    # A page that starts with it is the record path's to read.
    assert await read_sse_frames(pool, ref.stream_pk, 4, 10, BIG) is None
    framed, slow, _ = await _both(pool, ref, 5, 10)
    assert framed.count == 10 and framed.frames == slow
    # Past the page's limit or budget, an object does not end it.
    framed, slow, _ = await _both(pool, ref, 0, 4)
    assert framed.count == 4 and framed.frames == slow


async def test_the_cursor_rules_are_the_same(pool: asyncpg.Pool, store: Store) -> None:
    ref = await edge_stream(store, pool)
    latest = 2 * len(PAYLOADS)
    with pytest.raises(CursorInFuture):
        await read_sse_frames(pool, ref.stream_pk, latest + 1, 10, BIG)
    with pytest.raises(NotFound):
        await read_sse_frames(pool, 2**62, 0, 10, BIG)
    await pool.execute(
        "UPDATE workflow_streams.streams SET earliest_sequence = 5 WHERE stream_pk = $1",
        ref.stream_pk,
    )
    with pytest.raises(CursorExpired) as fast_error:
        await read_sse_frames(pool, ref.stream_pk, 2, 10, BIG)
    with pytest.raises(CursorExpired) as slow_error:
        await read_page(pool, ref.stream_pk, 2, 10, max_bytes=BIG)
    assert str(fast_error.value) == str(slow_error.value)
    assert vars(fast_error.value) == vars(slow_error.value)
    framed = await read_sse_frames(pool, ref.stream_pk, 4, 10, BIG)
    assert framed is not None and framed.count == 10 and framed.last_sequence == 14


async def _delivered(
    followers: Followers, pk: int, cursor: int, *, sse_frames: bool
) -> tuple[bytes, set[str]]:
    """Everything a subscription after ``cursor`` hands its edge up to the stream's end,
    as the native SSE response writes it, and the kinds of delivery it used."""
    subscription = await followers.subscribe(pk, cursor, sse_frames=sse_frames)
    out: list[bytes] = []
    kinds: set[str] = set()
    try:
        while True:
            item = await subscription.next(5.0)
            if isinstance(item, FramedPage):
                kinds.add("framed")
                out.append(item.frames)
            elif isinstance(item, list):
                kinds.add("records")
                out.extend(_record_frames(batch, [], ()) for batch in item)
            elif isinstance(item, End):
                out.append(b"end %d" % item.last_sequence)
                return b"".join(out), kinds
            else:
                raise AssertionError(f"unexpected {item!r}")
    finally:
        followers.release(pk, subscription)


@pytest.mark.parametrize("records", [0, 1, 7, 8, 14, 22])
async def test_a_whole_backfill_is_the_same_bytes_either_way(
    pool: asyncpg.Pool, store: Store, hub: NotificationHub, records: int
) -> None:
    """Pages of 7 records: an empty stream, one record, exactly one page, one past it,
    exactly two pages, and PAYLOADS twice; from every cursor (the start, page
    boundaries, the end)."""
    ref = await make_stream(store, max_unread_items=None)
    payloads = (PAYLOADS * 2)[:records]
    if payloads:
        await append(store, ref, payloads)
    await store.close(ref)
    followers = Followers(pool, hub, LiveSettings(page_records=7))
    try:
        for cursor in range(records + 1):
            fast, fast_kinds = await _delivered(followers, ref.stream_pk, cursor, sse_frames=True)
            slow, slow_kinds = await _delivered(followers, ref.stream_pk, cursor, sse_frames=False)
            assert fast == slow, cursor
            assert fast.endswith(b"end %d" % records)
            assert fast.count(b"event: record\n") == records - cursor
            assert fast_kinds <= {"framed"} and slow_kinds <= {"records"}
            assert fast_kinds == ({"framed"} if cursor < records else set())
    finally:
        await followers.close()


async def test_a_backfill_through_records_with_objects_is_the_same_bytes(
    pool: asyncpg.Pool, store: Store, hub: NotificationHub
) -> None:
    """Objects at a page's start, inside it and at its end, and two in a row: the framed
    pages stop before them and the record path reads them."""
    ref = await edge_stream(store, pool)
    for sequence in (1, 5, 7, 8, 14, 22):
        await pool.execute(
            SET_OBJECT, ref.stream_pk, sequence, f'{{"object_id": "o-{sequence}", "size": 3}}'
        )
    await store.close(ref)
    followers = Followers(pool, hub, LiveSettings(page_records=7, page_bytes=6000))
    try:
        for cursor in (0, 1, 4, 5, 13, 21, 22):
            fast, fast_kinds = await _delivered(followers, ref.stream_pk, cursor, sse_frames=True)
            slow, _ = await _delivered(followers, ref.stream_pk, cursor, sse_frames=False)
            assert fast == slow, cursor
            assert fast.count(b"event: record\n") == 22 - cursor
            if cursor < 21:
                assert fast_kinds == {"framed", "records"}, cursor
    finally:
        await followers.close()


async def test_the_switch_from_a_framed_backfill_to_live_repeats_and_skips_nothing(
    pool: asyncpg.Pool, store: Store, hub: NotificationHub
) -> None:
    """Records commit (and are fanned out) while the framed backfill reads, then more
    arrive live: every record goes out once, in order, as the record path writes it."""
    ref = await make_stream(store, max_unread_items=None)
    await append(store, ref, list(range(1, 21)))

    class Racing(Followers):
        async def _framed_read(self, stream_pk: int, after: int, limit: int) -> FramedPage | None:
            page = await super()._framed_read(stream_pk, after, limit)
            if after in (0, 7):  # after the backfill's first and second page were read
                last = (await append(store, ref, [f"raced-{after}"])).last_sequence
                follower = self.follower(stream_pk)
                assert follower is not None
                await eventually(lambda: follower.last_read == last, what="the fan-out")
            return page

    followers = Racing(pool, hub, LiveSettings(page_records=7, poll_seconds=3600))
    subscription = await followers.subscribe(ref.stream_pk, 0, sse_frames=True)
    out: list[bytes] = []
    kinds: list[str] = []
    try:
        while True:
            item = await subscription.next(0.2)
            if item is None:  # caught up and idle: now records arrive live
                assert kinds and set(kinds) == {"framed"}
                await append(store, ref, ["live-1", "live-2"])
                await store.close(ref)
                continue
            if isinstance(item, End):
                break
            if isinstance(item, FramedPage):
                kinds.append("framed")
                out.append(item.frames)
            else:
                assert isinstance(item, list), item
                kinds.append("records")
                out.extend(_record_frames(batch, [], ()) for batch in item)
    finally:
        followers.release(ref.stream_pk, subscription)
        await followers.close()
    page = await read_page(pool, ref.stream_pk, 0, 1000)
    assert [r.sequence for r in page.records] == list(range(1, 25))
    expected = _record_frames(LiveBatch(page.records, 24, True), [], ())
    assert b"".join(out) == expected
    assert kinds[0] == "framed" and kinds[-1] == "records"


class _Page(msgspec.Struct):
    records: list[msgspec.Raw]


async def test_the_subscribe_response_is_the_record_paths_bytes(
    server, auth, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    """Over HTTP, a closed stream's whole response from several cursors: each record's
    event carries the bytes a page of ``GET records`` has for it."""
    h = auth()
    path = f"{API}/runs/{run_id}/streams/out"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "out", h)
        for _ in range(60):  # 1,320 records: several backfill pages of 500
            await http_append(c, run_id, "out", PAYLOADS * 2, h)
        pk = await stream_pk(pool, tenant, run_id, "out")
        await pool.execute(SET_OBJECT, pk, 700, '{"object_id": "o-700", "size": 3}')
        last = await close(c, run_id, "out", h)
        page = await c.get(path + "/records", params={"cursor": 0, "limit": 1000}, headers=h)
        rest = await c.get(path + "/records", params={"cursor": 1000, "limit": 1000}, headers=h)
        raw = [
            bytes(r)
            for p in (page, rest)
            for r in msgspec.json.decode(p.content, type=_Page).records
        ]
        assert len(raw) == last == 1320
        for cursor in (0, 499, 500, 699, 1319, 1320):
            expected = b"".join(
                b"event: record\nid: %d\ndata: %s\n\n" % (s, raw[s - 1])
                for s in range(cursor + 1, last + 1)
            ) + (b'event: end\ndata: {"last_sequence":%d}\n\n' % last)
            response = await c.get(path + "/subscribe", params={"cursor": cursor}, headers=h)
            assert response.status_code == 200
            assert response.content == expected, cursor
