"""The catch-up read's fast paths answer byte for byte what the record-by-record path
answers: pages whose JSON Postgres writes (``records_read_page_json``), and records
encoded with one bytes format (``codec.encode_record``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import asyncpg
import msgspec
import pytest

from ductor_streams.errors import CursorExpired, CursorInFuture, NotFound
from ductor_streams.http.codecs.json_bodies import (
    encode_json,
    encode_record,
    page_json,
    page_text_json,
)
from ductor_streams.store import Store
from ductor_streams.store.fingerprint import record_fingerprint
from ductor_streams.store.models import Record, StreamRef
from ductor_streams.store.read import read_page, read_page_text
from tests.support.read_streams import PAYLOADS, edge_stream


async def _both(pool: asyncpg.Pool, ref: StreamRef, cursor: int, limit: int) -> tuple[bytes, bytes]:
    text = await read_page_text(pool, ref.stream_pk, cursor, limit)
    assert text is not None
    page = await read_page(pool, ref.stream_pk, cursor, limit)
    return page_text_json(text), encode_json(page_json(page, []))


async def test_pages_written_by_postgres_are_the_same_bytes(
    pool: asyncpg.Pool, store: Store
) -> None:
    ref = await edge_stream(store, pool)
    total = 2 * len(PAYLOADS)
    for cursor, limit in [(0, 1000), (0, 1), (3, 5), (total - 1, 10), (total, 10), (0, total)]:
        fast, slow = await _both(pool, ref, cursor, limit)
        assert fast == slow, (cursor, limit)
    fast, _ = await _both(pool, ref, 0, 1000)
    decoded = msgspec.json.decode(fast)
    assert [r["sequence"] for r in decoded["records"]] == list(range(1, total + 1))
    assert decoded["records"][0]["appended_at"] == "2026-01-02T03:04:05+00:00"
    assert decoded["records"][2]["appended_at"] == "2026-01-02T03:04:05.000001+00:00"
    assert decoded["next_cursor"] == total and decoded["closed"] is False
    await store.close(ref)
    fast, slow = await _both(pool, ref, 2, 3)
    assert fast == slow and msgspec.json.decode(fast)["closed"] is True


async def test_a_page_with_an_object_reference_is_left_to_the_record_path(
    pool: asyncpg.Pool, store: Store
) -> None:
    ref = await edge_stream(store, pool)
    await pool.execute(
        "UPDATE workflow_streams.records SET object = $3::jsonb"
        " WHERE stream_pk = $1 AND sequence = $2",
        ref.stream_pk,
        5,
        '{"object_id": "o-1", "size": 3}',
    )
    assert await read_page_text(pool, ref.stream_pk, 0, 10) is None
    assert await read_page_text(pool, ref.stream_pk, 4, 10) is None
    # Pages without that record still go the fast way, and say the same.
    fast, slow = await _both(pool, ref, 5, 10)
    assert fast == slow
    fast, slow = await _both(pool, ref, 0, 4)
    assert fast == slow


async def test_the_cursor_rules_are_the_same(pool: asyncpg.Pool, store: Store) -> None:
    ref = await edge_stream(store, pool)
    latest = 2 * len(PAYLOADS)
    with pytest.raises(CursorInFuture):
        await read_page_text(pool, ref.stream_pk, latest + 1, 10)
    with pytest.raises(NotFound):
        await read_page_text(pool, 2**62, 0, 10)
    await pool.execute(
        "UPDATE workflow_streams.streams SET earliest_sequence = 5 WHERE stream_pk = $1",
        ref.stream_pk,
    )
    with pytest.raises(CursorExpired) as fast_error:
        await read_page_text(pool, ref.stream_pk, 2, 10)
    with pytest.raises(CursorExpired) as slow_error:
        await read_page(pool, ref.stream_pk, 2, 10)
    assert str(fast_error.value) == str(slow_error.value)
    text = await read_page_text(pool, ref.stream_pk, 4, 10)
    assert text is not None and text.count == 10 and text.next_cursor == 14


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize(
    "at",
    [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=UTC),
    ],
)
def test_a_record_encodes_as_its_dict_does(payload: object, at: datetime) -> None:
    raw = msgspec.json.encode(payload)
    record = Record(sequence=42, payload=raw.decode(), size=len(raw), appended_at=at, object=None)
    dict_path = msgspec.json.encode(
        {
            "sequence": 42,
            "payload": msgspec.Raw(raw),
            "size": len(raw),
            "appended_at": at.isoformat(),
            "object": None,
            "fingerprint": record_fingerprint(42, at, len(raw)),
        }
    )
    assert encode_record(record, []) == dict_path
    with_object = Record(42, raw.decode(), len(raw), at, {"object_id": "o"})
    assert msgspec.json.decode(encode_record(with_object, []))["object"] == {"object_id": "o"}


def test_the_remembered_time_is_only_reused_for_the_same_instant_and_zone() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    later = datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=UTC)
    elsewhere = at.astimezone(timezone(timedelta(hours=2)))
    decoded = [
        msgspec.json.decode(encode_record(Record(1, "1", 1, t, None), []))
        for t in (at, at, later, elsewhere, at)
    ]
    written = [d["appended_at"] for d in decoded]
    # The fingerprint is of the instant, whatever the zone it is written in.
    assert [d["fingerprint"] for d in decoded] == [
        record_fingerprint(1, t, 1) for t in (at, at, later, at, at)
    ]
    assert written == [
        at.isoformat(),
        at.isoformat(),
        later.isoformat(),
        "2026-01-02T05:04:05.000006+02:00",
        at.isoformat(),
    ]
