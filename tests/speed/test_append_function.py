"""workflow_streams.append_requests called directly with one group of requests (migration
0008: the loop only decides; one insert appends every accepted record afterwards).

Each request's answer is the one it would get alone, in order; the records are 1..N
gap-free, in request order, with exact running byte totals; an input stream gets one
delivery row per appended record and no other."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import asyncpg

from ductor_streams.store import EncodedBatch, Store, StreamRef, encode_batch
from tests.support.credit import make_stream

APPEND = """
SELECT request_index, outcome, first_sequence, last_sequence
  FROM workflow_streams.append_requests($1, $2::integer[], $3::text[], $4::text[],
                                        $5::text[], $6::integer[], $7::jsonb[], false)
"""

Row = tuple[int, str, int | None, int | None]


@dataclass(frozen=True)
class Stored:
    sequence: int
    payload: str
    size: int
    cumulative_bytes: int
    object: str | None


def batch(*payloads: object, key: str | None = None, obj: dict | None = None) -> EncodedBatch:
    """A request; ``obj`` is attached to its first record."""
    objects = None if obj is None else [obj] + [None] * (len(payloads) - 1)
    return encode_batch(list(payloads), idempotency_key=key, objects=objects)


async def append_group(pool: asyncpg.Pool, ref: StreamRef, group: list[EncodedBatch]) -> list[Row]:
    rows = await pool.fetch(
        APPEND,
        ref.stream_pk,
        [b.count for b in group],
        [b.idempotency_key for b in group],
        [b.request_hash for b in group],
        [p for b in group for p in b.payloads],
        [s for b in group for s in b.sizes],
        [o for b in group for o in b.objects],
    )
    return [tuple(r) for r in rows]


async def stored(pool: asyncpg.Pool, ref: StreamRef) -> list[Stored]:
    rows = await pool.fetch(
        "SELECT sequence, payload, size, cumulative_bytes, object::text AS object"
        "  FROM workflow_streams.records WHERE stream_pk = $1 ORDER BY sequence",
        ref.stream_pk,
    )
    return [Stored(**dict(r)) for r in rows]


def appended(group: list[EncodedBatch], rows: list[Row]) -> list[tuple[str, int]]:
    """(payload, size) of every record the rows say was appended, in sequence order."""
    out = []
    for b, (_, outcome, _, _) in zip(group, rows, strict=True):
        if outcome == "appended":
            out.extend(zip(b.payloads, b.sizes, strict=True))
    return out


def assert_log(records: list[Stored], expected: list[tuple[str, int]]) -> None:
    """Records 1..N gap-free, the expected payloads in order, exact running byte totals."""
    assert [r.sequence for r in records] == list(range(1, len(expected) + 1))
    assert [(r.payload, r.size) for r in records] == expected
    assert [r.cumulative_bytes for r in records] == list(accumulate(s for _, s in expected))


async def receipts(pool: asyncpg.Pool, ref: StreamRef) -> dict[str, tuple[int, int]]:
    rows = await pool.fetch(
        "SELECT idempotency_key, first_sequence, last_sequence"
        "  FROM workflow_streams.append_receipts WHERE stream_pk = $1",
        ref.stream_pk,
    )
    return {r["idempotency_key"]: (r["first_sequence"], r["last_sequence"]) for r in rows}


async def counters(pool: asyncpg.Pool, ref: StreamRef) -> tuple[int, int, int]:
    row = await pool.fetchrow(
        "SELECT latest_sequence, total_items, total_bytes"
        "  FROM workflow_streams.streams WHERE stream_pk = $1",
        ref.stream_pk,
    )
    return (row["latest_sequence"], row["total_items"], row["total_bytes"])


async def test_one_group_mixing_every_outcome(pool: asyncpg.Pool, store: Store) -> None:
    ref = await make_stream(store, consumers=[], max_total_items=8)
    first_a = batch({"a": 1}, "second record of a", key="a", obj={"object_id": "o-1"})
    group = [
        first_a,  # 1..2
        batch(3, [4, 4], {"five": "5" * 20}),  # 3..5, multi-record, no key
        batch(6, 7, 8, 9),  # 5 + 4 > 8 items: quota, consumes no sequence
        batch({"a": 1}, "second record of a", key="a", obj={"object_id": "o-1"}),  # replay
        batch("other", key="a"),  # same key, another hash
        batch({"b": "bb"}, key="b"),  # 6
        batch("seven", 8),  # 7..8: reaching the ceiling is allowed
        batch(9),  # over it again
        batch({"b": "bb"}, key="b"),  # replay of 6
        batch("c", key="c"),  # refused: leaves no receipt ...
        batch("c", key="c"),  # ... so the same key is decided afresh, refused again
    ]
    assert first_a.request_hash == group[3].request_hash != group[4].request_hash

    rows = await append_group(pool, ref, group)

    assert rows == [
        (1, "appended", 1, 2),
        (2, "appended", 3, 5),
        (3, "quota_exhausted", None, None),
        (4, "replayed", 1, 2),
        (5, "key_reused", None, None),
        (6, "appended", 6, 6),
        (7, "appended", 7, 8),
        (8, "quota_exhausted", None, None),
        (9, "replayed", 6, 6),
        (10, "quota_exhausted", None, None),
        (11, "quota_exhausted", None, None),
    ]
    expected = appended(group, rows)
    records = await stored(pool, ref)
    assert_log(records, expected)
    assert [r.payload for r in records] == [
        '{"a":1}',
        '"second record of a"',
        "3",
        "[4,4]",
        '{"five":"' + "5" * 20 + '"}',
        '{"b":"bb"}',
        '"seven"',
        "8",
    ]
    assert [r.object for r in records] == ['{"object_id": "o-1"}'] + [None] * 7
    assert await receipts(pool, ref) == {"a": (1, 2), "b": (6, 6)}
    assert await counters(pool, ref) == (8, 8, sum(s for _, s in expected))


async def test_input_stream_groups_and_their_deliveries(pool: asyncpg.Pool, store: Store) -> None:
    # An input stream has the "workflow" consumer: unread credit applies from the start.
    ref = await make_stream(store, direction="input", consumers=[], max_unread_items=6)
    group1 = [
        batch("one", "two"),  # 1..2
        batch(*range(5)),  # 2 + 5 unread > 6: credit, consumes no sequence
        batch({"x": "three"}, [4], "five"),  # 3..5
        batch("six", key="k"),  # 6
        batch("seven"),  # 7 unread > 6
        batch("six", key="k"),  # replay of 6
    ]
    rows1 = await append_group(pool, ref, group1)
    assert rows1 == [
        (1, "appended", 1, 2),
        (2, "credit_exhausted", None, None),
        (3, "appended", 3, 5),
        (4, "appended", 6, 6),
        (5, "credit_exhausted", None, None),
        (6, "replayed", 6, 6),
    ]

    assert await store.ack(ref, "workflow", 6) == 6
    # The second group starts from a stream that already holds records and bytes.
    group2 = [
        batch("seven", "eight", "nine"),  # 7..9
        batch("not six", key="k"),
        batch(*range(4)),  # 3 + 4 unread > 6
        batch({"ten": 10}, {"eleven": [11]}),  # 10..11
        batch("six", key="k"),  # still the first answer
    ]
    rows2 = await append_group(pool, ref, group2)
    assert rows2 == [
        (1, "appended", 7, 9),
        (2, "key_reused", None, None),
        (3, "credit_exhausted", None, None),
        (4, "appended", 10, 11),
        (5, "replayed", 6, 6),
    ]

    expected = appended(group1, rows1) + appended(group2, rows2)
    assert_log(await stored(pool, ref), expected)
    deliveries = await pool.fetch(
        "SELECT sequence, state FROM workflow_streams.input_deliveries"
        " WHERE stream_pk = $1 ORDER BY sequence",
        ref.stream_pk,
    )
    assert [(d["sequence"], d["state"]) for d in deliveries] == [
        (n, "pending") for n in range(1, 12)
    ]
    assert await counters(pool, ref) == (11, 11, sum(s for _, s in expected))


async def test_a_large_group_with_every_other_request_refused(
    pool: asyncpg.Pool, store: Store
) -> None:
    # 2,000 requests, alternately refused (a size past the byte quota: the function
    # trusts p_sizes), the first one included, and appended (1 to 3 records): the
    # appended records are still consecutive, each paired with its own payload.
    ref = await make_stream(store, direction="input", consumers=[], max_total_bytes=1_000_000)
    group = []
    for i in range(2000):
        b = batch(*[f"r{i}-{j}" for j in range(1 + i % 3)])
        if i % 2 == 0:
            b = EncodedBatch(b.payloads, [2_000_000] * b.count, b.objects, None, b.request_hash)
        group.append(b)

    rows = await append_group(pool, ref, group)

    assert [r[1] for r in rows] == ["quota_exhausted", "appended"] * 1000
    expected = appended(group, rows)
    last = 0
    for (_, outcome, first, last_seq), b in zip(rows, group, strict=True):
        if outcome == "appended":
            assert (first, last_seq) == (last + 1, last + b.count)
            last = last_seq
    assert last == len(expected)
    assert_log(await stored(pool, ref), expected)
    sequences = await pool.fetch(
        "SELECT sequence FROM workflow_streams.input_deliveries"
        " WHERE stream_pk = $1 ORDER BY sequence",
        ref.stream_pk,
    )
    assert [r["sequence"] for r in sequences] == list(range(1, last + 1))
