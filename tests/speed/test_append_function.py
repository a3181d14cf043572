"""workflow_streams.append_requests called directly with one group of requests (its loop
only decides; one insert appends every accepted record afterwards).

Each request's answer is the one it would get alone, in order; the records are 1..N
gap-free, in request order, with exact running byte totals; an input stream gets one
delivery row per appended record and no other."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import asyncpg

from ductor_streams.schema import QUERIES
from ductor_streams.store import EncodedBatch, Store, StreamRef, encode_batch
from ductor_streams.store.append import statement_arguments
from tests.support.commit_wakes import commit_wake
from tests.support.credit import make_stream
from tests.support.live import eventually

APPEND = """
SELECT request_index, outcome, first_sequence, last_sequence
  FROM workflow_streams.append_requests($1, $2::integer[], $3::text[], $4::text[],
                                        $5::text[], $6::integer[], $7::jsonb[], $8)
"""

Row = tuple[int, str, int | None, int | None]

CALLS_OF_APPEND_REQUESTS = (
    "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
    " WHERE schemaname = 'workflow_streams' AND funcname = 'append_requests'"
)


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


async def append_group(
    pool: asyncpg.Pool, ref: StreamRef, group: list[EncodedBatch], *, notify: bool = False
) -> list[Row]:
    rows = await pool.fetch(
        APPEND,
        ref.stream_pk,
        [b.count for b in group],
        [b.idempotency_key for b in group],
        [b.request_hash for b in group],
        [p for b in group for p in b.payloads],
        [s for b in group for s in b.sizes],
        [o for b in group for o in b.objects],
        notify,
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


@dataclass(frozen=True)
class Case:
    """A stream (made twice, alike) and the group of requests it gets."""

    group: list[EncodedBatch]
    whole: bool  # every request appended, so append_stream_groups need not decide it
    direction: str = "output"
    consumers: tuple[str, ...] = ()
    ceilings: tuple[tuple[str, int], ...] = ()
    acked: int | None = None  # what consumer "c" acks of the two records put in first
    first_key: str | None = None  # the key of the two records put in first
    closed: bool = False
    watched: bool = False


def _cases() -> list[Case]:
    return [
        Case([batch("p1"), batch("p2", {"p": 3}), batch([4])], whole=True, watched=True),
        Case([batch("i1", "i2"), batch({"i": 3})], whole=True, direction="input"),
        # Reaching a ceiling is allowed: 2 put in first + 3 = 5.
        Case([batch("a"), batch("b", "c")], whole=True, ceilings=(("max_total_items", 5),)),
        # One record past it: the group is decided request by request.
        Case(
            [batch("a"), batch("b", "c"), batch("d")],
            whole=False,
            ceilings=(("max_total_items", 5),),
        ),
        # The byte ceiling reached exactly: '"first"' twice, then 32 and 3 bytes.
        Case(
            [batch("x" * 30), batch("y")],
            whole=True,
            ceilings=(("max_total_bytes", 2 * len('"first"') + 32 + 3),),
        ),
        # Unread credit after the ack: 2 - 1 + 2 fits 3, + 1 more does not.
        Case(
            [batch("u1", "u2"), batch("u3")],
            whole=False,
            consumers=("c",),
            ceilings=(("max_unread_items", 3),),
            acked=1,
        ),
        Case(
            [batch("u1", "u2")],
            whole=True,
            consumers=("c",),
            ceilings=(("max_unread_items", 3),),
            acked=1,
        ),
        # The byte ceiling passed by one byte: decided request by request.
        Case(
            [batch("x" * 30), batch("yy")],
            whole=False,
            ceilings=(("max_total_bytes", 2 * len('"first"') + 32 + 3),),
        ),
        # Unread bytes after the ack: 7 of the two records put in first stay unread, and
        # the group's two 5-byte records reach a 17-byte ceiling exactly ...
        Case(
            [batch("aaa"), batch("bbb")],
            whole=True,
            consumers=("c",),
            ceilings=(("max_unread_bytes", len('"first"') + 5 + 5),),
            acked=1,
        ),
        # ... and 5 + 6 passes it by one byte: the first request goes in, the second is
        # refused for credit.
        Case(
            [batch("aaa"), batch("bbbb")],
            whole=False,
            consumers=("c",),
            ceilings=(("max_unread_bytes", len('"first"') + 5 + 5),),
            acked=1,
        ),
        # Fresh keys: appended whole, their receipts stored.
        Case([batch("k1"), batch("k2", key="k"), batch("k3", key="k3")], whole=True),
        # A key with a receipt (a replay, and one reused with another body), and a key
        # twice in one group: decided request by request.
        Case([batch("first", "first", key="f"), batch("r2")], whole=False, first_key="f"),
        Case([batch("other", key="f"), batch("r2")], whole=False, first_key="f"),
        Case([batch("t1", key="t"), batch("t1", key="t"), batch("t2")], whole=False),
        Case([batch("t1", key="t"), batch("t2", key="t")], whole=False),
        Case([batch("late")], whole=False, closed=True),
        Case([batch("o1", "o2", obj={"object_id": "o-9"}), batch("o3")], whole=True),
        # Watched, so each sends a wake at commit: one with an object (a plain wake), and
        # one decided request by request with its last request refused (the wake carries
        # only what was appended).
        Case([batch("o1", "o2", obj={"object_id": "o-8"}), batch("o3")], whole=True, watched=True),
        Case(
            [batch("a"), batch("b", "c"), batch("d")],
            whole=False,
            ceilings=(("max_total_items", 5),),
            watched=True,
        ),
    ]


async def _make_case(pool: asyncpg.Pool, store: Store, case: Case) -> StreamRef:
    ref = await make_stream(
        store, direction=case.direction, consumers=list(case.consumers), **dict(case.ceilings)
    )
    await store.append(ref, batch("first", "first", key=case.first_key))
    if case.acked is not None:
        await store.ack(ref, "c", case.acked)
    if case.closed:
        await store.close(ref)
    if case.watched:
        await pool.execute(
            "UPDATE workflow_streams.streams SET watched_until = now() + interval '1 hour'"
            " WHERE stream_pk = $1",
            ref.stream_pk,
        )
    return ref


async def _state(pool: asyncpg.Pool, ref: StreamRef) -> tuple[object, ...]:
    deliveries = await pool.fetch(
        "SELECT sequence FROM workflow_streams.input_deliveries"
        " WHERE stream_pk = $1 ORDER BY sequence",
        ref.stream_pk,
    )
    return (
        await stored(pool, ref),
        await counters(pool, ref),
        await receipts(pool, ref),
        [d["sequence"] for d in deliveries],
    )


async def test_stream_groups_answer_and_store_as_each_group_alone(
    pool: asyncpg.Pool, store: Store
) -> None:
    # append_stream_groups appends a group that nothing can refuse
    # itself (keys with no receipt, none twice in the group, count as nothing
    # that can refuse), in one pass with the others, and leaves every other group to
    # append_requests.
    await _answers_as_each_group_alone(pool, store, _cases())


def _one_request_cases() -> list[Case]:
    """Groups of one request each, as an activity's writers send them."""
    return [
        Case([batch("k1", key="fresh")], whole=True, watched=True),
        Case([batch("plain")], whole=True),
        Case([batch("i1", key="i")], whole=True, direction="input"),
        # A replay (the same key and body as the records put in first), and the key
        # reused with another body.
        Case([batch("first", "first", key="f")], whole=False, first_key="f"),
        Case([batch("other", key="f")], whole=False, first_key="f"),
        Case([batch("late", key="l")], whole=False, closed=True),
        Case([batch("a", "b", key="c")], whole=False, ceilings=(("max_total_items", 3),)),
    ]


async def test_one_request_groups_answer_and_store_as_each_group_alone(
    pool: asyncpg.Pool, store: Store
) -> None:
    # append_stream_groups: a statement whose groups hold one request each looks at its keys
    # with one probe per key; a key with a receipt still sends its group to
    # append_requests (replayed, or refused as reused), and the rest go whole.
    await _answers_as_each_group_alone(pool, store, _one_request_cases())


async def _answers_as_each_group_alone(pool: asyncpg.Pool, store: Store, cases: list[Case]) -> None:
    """Each case's stream is made twice: one twin gets all the groups in one
    append_stream_groups statement, the other its group alone through append_requests
    (the reference). Answers, records, counters, receipts, deliveries and wakes must
    match, and append_requests must have been called for exactly the groups that are
    not whole."""
    combined = [await _make_case(pool, store, c) for c in cases]
    alone = [await _make_case(pool, store, c) for c in cases]
    missing = max(r.stream_pk for r in combined + alone) + 1_000  # no such stream
    order = sorted(range(len(cases)), key=lambda i: combined[i].stream_pk)
    groups = [(combined[i].stream_pk, cases[i].group) for i in order]
    groups.append((missing, [batch("nowhere")]))

    wakes: list[str] = []

    def heard(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        wakes.append(payload)

    async with pool.acquire() as listener:
        await listener.add_listener("workflow_streams", heard)
        try:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute("SET LOCAL track_functions = 'pl'")
                # Counted before and after: the view also shows this backend's calls of
                # earlier transactions that the statistics have not taken in yet.
                calls_before = await conn.fetchval(CALLS_OF_APPEND_REQUESTS)
                rows = await conn.fetch(
                    QUERIES["records_append_stream_groups"],
                    [pk for pk, _ in groups],
                    [len(g) for _, g in groups],
                    [sum(b.count for b in g) for _, g in groups],
                    *statement_arguments([b for _, g in groups for b in g]),
                    True,
                    None,  # no trace contexts
                )
                calls = await conn.fetchval(CALLS_OF_APPEND_REQUESTS) - calls_before
            reference = [
                await append_group(pool, ref, c.group, notify=True)
                for ref, c in zip(alone, cases, strict=True)
            ]
            # Each carries the records its call appended (after the two put in first),
            # or only the latest sequence when they do not fit a wake (records_wake).
            expected_wakes = {
                await commit_wake(pool, ref.stream_pk, 3, (await counters(pool, ref))[0])
                for ref, case in zip(combined + alone, cases + cases, strict=True)
                if case.direction == "input" or case.watched
            }
            await eventually(lambda: expected_wakes <= set(wakes), what="the wakes")
        finally:
            await listener.remove_listener("workflow_streams", heard)

    assert calls == sum(not c.whole for c in cases) + 1  # + the missing stream
    answers: dict[int, list[Row]] = {}
    for r in rows:
        pk = groups[r["group_index"] - 1][0]
        answers.setdefault(pk, []).append(
            (r["request_index"], r["outcome"], r["first_sequence"], r["last_sequence"])
        )
    assert answers[missing] == [(1, "not_found", None, None)]
    for case, ref_c, ref_a, expected in zip(cases, combined, alone, reference, strict=True):
        assert answers[ref_c.stream_pk] == expected, case
        assert await _state(pool, ref_c) == await _state(pool, ref_a), case
    # No other record wake of these streams (close sends "c<pk>"; these carry ":").
    ours = {r.stream_pk for r in combined + alone}
    assert {w for w in wakes if ":" in w and int(w[1:].split(":")[0]) in ours} == expected_wakes
