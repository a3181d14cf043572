"""Wakes that carry their records (store/wake_format.py): what fits in one, that a
follower in another process fans them out without a read, exactly as a read returns
them, and that whatever does not follow on is still read."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import pytest

from ductor_streams.config import LiveSettings
from ductor_streams.live.followers import Followers
from ductor_streams.live.hub import NotificationHub, parse_wake
from ductor_streams.store import Store, encode_batch
from ductor_streams.store.models import Record
from ductor_streams.store.read import read_page
from ductor_streams.store.wake_format import MAX_PAYLOAD_BYTES, parse_record_wake, record_wake
from tests.live.test_followers import add, new_stream
from tests.support.live import eventually

AT = datetime(2026, 12, 1, 19, 30, 5, 123456, tzinfo=UTC)


def records(first: int, payloads: list[str], at: datetime = AT) -> list[Record]:
    return [Record(first + i, p, len(p.encode()), at, None) for i, p in enumerate(payloads)]


def test_a_record_wake_round_trips_exactly() -> None:
    sent = records(41, ['{"token":"héllo:"}', "null", '"a\\u001eb"', "[1,2]"])
    payload = record_wake(7, sent)
    assert payload is not None and payload.startswith("R7:44:41:")
    assert parse_wake(payload) == (7, 44)
    assert parse_record_wake(payload) == (7, 44, sent)
    # On the whole second, too (isoformat drops the microseconds of both alike).
    whole = records(1, ["1"], AT.replace(microsecond=0))
    assert parse_record_wake(record_wake(7, whole) or "") == (7, 1, whole)


@pytest.mark.parametrize(
    "case",
    ["gap", "object", "too_large", "separator", "empty"],
)
def test_records_that_cannot_go_in_a_wake(case: str) -> None:
    sent = records(1, ["1", "2"])
    if case == "gap":
        sent = [sent[0], Record(3, "3", 1, AT, None)]
    elif case == "object":
        sent = [Record(1, "{}", 2, AT, {"key": "k"})]
    elif case == "too_large":
        sent = records(1, ['"' + "x" * (MAX_PAYLOAD_BYTES // 2) + '"'] * 2)
    elif case == "separator":
        sent = records(1, ['"a\x1eb"'])
    else:
        sent = []
    assert record_wake(1, sent) is None


@pytest.mark.parametrize(
    "payload",
    ["R5:3:2:1:x", "R5:3:1:x:a\x1eb\x1ec", "R5:3:1:1", "R5:x:1:1:a", "Rx:1:1:1:a"],
)
def test_malformed_record_wakes_carry_no_records(payload: str) -> None:
    assert parse_record_wake(payload) is None


# workflow_streams.records_wake: the wake an append statement sends at its own commit, built in SQL.
SQL_WAKE = (
    "SELECT workflow_streams.records_wake($1, $2, $3::text[], $4::integer[], $5::jsonb[])"
    " AS wake, now() AS at"
)
OBJECT = '{"object_id": "o-1"}'


def _sql_case(case: str) -> tuple[list[str], list[str | None]]:
    """Payloads and objects (jsonb text or None) of one case."""
    if case == "corners":
        payloads = ['{"token":"h\u00e9llo:"}', "null", '"a\\u001eb"', "[1,2]", '"é€𝄞"']
    elif case == "one":
        payloads = ["1"]
    elif case in ("at_the_limit", "over_the_limit"):
        # record_wake's estimate: the sizes, one byte a record and 64 bytes of head.
        size = MAX_PAYLOAD_BYTES - 2 - 64 + (case == "over_the_limit")
        payloads = ['"' + "x" * (size - 2 - 1) + '"', "1"]
    elif case == "many":
        payloads = ["1"] * 3_900
    elif case == "too_many":
        payloads = ["1"] * 4_000
    elif case == "separator":
        payloads = ['"a\x1eb"', "2"]
    else:
        assert case == "object"
        return ["1", "2"], [None, OBJECT]
    return payloads, [None] * len(payloads)


@pytest.mark.parametrize(
    ("case", "carries"),
    [
        ("corners", True),
        ("one", True),
        ("at_the_limit", True),
        ("many", True),
        ("over_the_limit", False),
        ("too_many", False),
        ("separator", False),
        ("object", False),
    ],
)
async def test_the_commit_wake_is_the_one_record_wake_builds(
    pool: asyncpg.Pool, case: str, carries: bool
) -> None:
    payloads, objects = _sql_case(case)
    sizes = [len(p.encode()) for p in payloads]
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(SQL_WAKE, 7, 41, payloads, sizes, objects)
    at: datetime = row["at"]  # the transaction's now(): its records' appended_at
    sent = [
        Record(41 + i, p, size, at, None if o is None else {"object_id": "o-1"})
        for i, (p, size, o) in enumerate(zip(payloads, sizes, objects, strict=True))
    ]
    last = 41 + len(payloads) - 1
    assert row["wake"] == (record_wake(7, sent) or f"r7:{last}")
    assert row["wake"].startswith("R7:") is carries
    if carries:
        assert parse_record_wake(row["wake"]) == (7, last, sent)


async def test_another_process_records_arrive_from_the_wake_without_a_read(
    pool: asyncpg.Pool, database_url: str, tenant: str
) -> None:
    # This process follows; "the other process" is a store of its own, unfed, whose
    # appender sends its statements' wakes through its WakeSender.
    hub = NotificationHub(database_url)
    await hub.start()
    followers = Followers(pool, hub, LiveSettings(poll_seconds=3600))
    writer = Store(pool)
    ref = await new_stream(writer, tenant)
    other = await new_stream(writer, tenant)
    await add(writer, ref, ["before"])
    sub = await followers.subscribe(ref.stream_pk, 0)
    follower = followers.follower(ref.stream_pk)
    assert follower is not None
    try:
        # A statement of the writer held in flight (its stream's row locked here), so
        # that the next one does not notify inside its own transaction: 64 records go
        # beside it (store/append.py PARALLEL_RECORDS) and are announced after it.
        async with pool.acquire() as blocker:
            transaction = blocker.transaction()
            await transaction.start()
            await blocker.execute(
                "SELECT 1 FROM workflow_streams.streams WHERE stream_pk = $1 FOR UPDATE",
                other.stream_pk,
            )
            held = asyncio.create_task(add(writer, other, ["held"]))
            await eventually(lambda: writer.appender._in_flight == 1, what="in flight")
            payloads = [{"token": i} for i in range(64)]
            result = await writer.append(ref, encode_batch(payloads, idempotency_key=None))
            assert (result.first_sequence, result.last_sequence) == (2, 65)
            delivered: list[Record] = []
            first = await sub.next(5.0)  # the backfill: "before"
            assert isinstance(first, list)
            delivered.extend(r for batch in first for r in batch.records)
            while len(delivered) < 65:
                item = await sub.next(5.0)
                assert isinstance(item, list), item
                delivered.extend(r for batch in item for r in batch.records)
            await transaction.rollback()
        await held
        assert [r.sequence for r in delivered] == list(range(1, 66))
        # Fed from the wake, without a read, exactly what a read returns.
        assert follower.reads == 0 and follower.fed_batches == 1
        page = await read_page(pool, ref.stream_pk, 0, 100)
        assert delivered == page.records
        # An append alone in flight notifies inside its own transaction, and that wake
        # carries its record too (records_wake): still no read.
        await add(writer, ref, ["alone"])
        item = await sub.next(5.0)
        assert isinstance(item, list)
        alone = [r for batch in item for r in batch.records]
        assert [r.sequence for r in alone] == [66]
        assert follower.reads == 0 and follower.fed_batches == 2
        assert alone == (await read_page(pool, ref.stream_pk, 65, 1)).records  # exactly
        # A plain wake still reads: a record too large to go in one.
        await add(writer, ref, ["x" * MAX_PAYLOAD_BYTES])
        item = await sub.next(5.0)
        assert isinstance(item, list)
        assert [r.sequence for batch in item for r in batch.records] == [67]
        assert follower.reads == 1 and follower.fed_batches == 2
    finally:
        followers.release(ref.stream_pk, sub)
        await followers.close()
        await hub.close()


async def test_a_record_wake_that_does_not_follow_on_is_read(
    pool: asyncpg.Pool, database_url: str, tenant: str
) -> None:
    """A wake carrying 3..4 reaches a follower that delivered only 1: it reads 2..4
    (each once), it does not skip 2 nor deliver 3..4 twice."""
    hub = NotificationHub(database_url)
    followers = Followers(pool, hub, LiveSettings(poll_seconds=3600))
    writer = Store(pool)
    ref = await new_stream(writer, tenant)
    await add(writer, ref, ["one"])
    sub = await followers.subscribe(ref.stream_pk, 0)
    follower = followers.follower(ref.stream_pk)
    assert follower is not None
    try:
        got: list[int] = []
        item = await sub.next(5.0)
        assert isinstance(item, list)
        got.extend(r.sequence for batch in item for r in batch.records)
        await add(writer, ref, ["two"])
        await add(writer, ref, ["three", "four"])
        page = await read_page(pool, ref.stream_pk, 2, 10)
        payload = record_wake(ref.stream_pk, page.records)
        assert payload is not None
        # Delivered by hand, as the hub's LISTEN callback does (this hub never LISTENs).
        hub._on_notify(None, 0, "workflow_streams", payload)
        while got[-1] < 4:
            item = await sub.next(5.0)
            assert isinstance(item, list), item
            got.extend(r.sequence for batch in item for r in batch.records)
        assert got == [1, 2, 3, 4]
        assert follower.reads == 1 and follower.fed_batches == 0
        # The same wake again (delivered already) changes nothing and reads nothing.
        hub._on_notify(None, 0, "workflow_streams", payload)
        assert await sub.next(0.2) is None
        assert follower.reads == 1 and follower.fed_batches == 0
    finally:
        followers.release(ref.stream_pk, sub)
        await followers.close()
