"""Groups of several streams in one transaction (store/append.py, ``append_stream_groups``).

With a bound on the append statements in flight, groups of other streams that become
ready meanwhile go together in one transaction; each stream's requests must still get
exactly the answers they would get alone, and one stream's failure must not touch the
others."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from ductor_streams.errors import DatabaseUnavailable
from ductor_streams.schema import QUERIES
from ductor_streams.schema.migrate import migrate
from ductor_streams.store import EncodedBatch, Store, encode_batch
from ductor_streams.store.append import Appender, statement_arguments
from ductor_streams.store.db import create_pool
from tests.speed.mixed import workload
from tests.speed.test_group_commit import (
    answer_of,
    fresh_model,
    mixed_stream,
    stored_log,
)
from tests.support.credit import make_stream
from tests.support.live import eventually
from tests.support.postgres import TestDatabase


def combining_store(pool: asyncpg.Pool, max_statements: int = 1) -> Store:
    """A Store whose appender runs at most ``max_statements`` statements at once."""
    store = Store(pool)
    store.appender = Appender(pool, store.wakes, max_statements=max_statements)
    return store


class ManyCalls:
    """Counts the several-stream statements of an appender and what they raised."""

    def __init__(self, appender: Appender) -> None:
        self.calls = 0
        self.streams: list[int] = []
        self.errors: list[BaseException] = []
        inner = appender._call_many

        async def spy(groups: Any, notify_inline: bool) -> Any:
            self.calls += 1
            self.streams.append(len(groups))
            try:
                return await inner(groups, notify_inline)
            except BaseException as exc:
                self.errors.append(exc)
                raise

        appender._call_many = spy  # type: ignore[method-assign]


async def test_ready_groups_of_many_streams_share_one_transaction(pool: asyncpg.Pool) -> None:
    store = combining_store(pool)
    refs = [await make_stream(store) for _ in range(12)]
    many = ManyCalls(store.appender)
    results = await asyncio.gather(
        *(
            store.append(ref, encode_batch([f"{ref.stream_pk}-{i}"]))
            for i in range(5)
            for ref in refs
        )
    )
    for n, ref in enumerate(refs):
        mine = results[n :: len(refs)]
        # Each stream's requests in arrival order, 1..5, as if the stream were alone.
        assert [(r.first_sequence, r.last_sequence) for r in mine] == [(i, i) for i in range(1, 6)]
        stored = await stored_log(pool, ref)
        assert stored == {i + 1: f'"{ref.stream_pk}-{i}"' for i in range(5)}
    # 60 requests: the first statement went alone, the rest were combined.
    assert store.appender.statements <= 10, store.appender.statements
    assert many.calls >= 1 and max(many.streams) >= 6
    assert many.errors == []


async def test_each_stream_of_a_combined_transaction_answers_as_if_alone(
    pool: asyncpg.Pool,
) -> None:
    store = combining_store(pool)
    refs = [await mixed_stream(store) for _ in range(4)]
    many = ManyCalls(store.appender)
    loads = {ref.stream_pk: workload(f"g{n}") for n, ref in enumerate(refs)}
    expected = {}
    for ref in refs:
        model = fresh_model()
        expected[ref.stream_pk] = [model.decide(r) for r in loads[ref.stream_pk]]
    # Interleaved across the streams; each stream's own requests keep their order.
    calls = [(ref, r) for i in range(80) for ref in refs for r in [loads[ref.stream_pk][i]]]
    answers = await asyncio.gather(*(answer_of(store, ref, r) for ref, r in calls))
    for ref in refs:
        mine = [a for (owner, _), a in zip(calls, answers, strict=True) if owner is ref]
        assert mine == expected[ref.stream_pk]
        stored = await stored_log(pool, ref)
        assert sorted(stored) == list(range(1, max(stored) + 1))
    assert many.calls >= 1 and max(many.streams) == len(refs)


async def test_one_streams_bad_group_does_not_fail_the_other_streams(
    pool: asyncpg.Pool,
) -> None:
    store = combining_store(pool)
    refs = [await make_stream(store) for _ in range(4)]
    many = ManyCalls(store.appender)
    blocker = await make_stream(store)
    # Not producible over HTTP: an object column Postgres refuses, to force a DB error.
    bad = EncodedBatch(["{}"], [2], ["{not json"], None, "bad")
    first = asyncio.ensure_future(store.append(blocker, encode_batch(["first"])))
    await asyncio.sleep(0)  # the blocker's statement is in flight: the rest queue up
    batches: list[tuple[Any, EncodedBatch]] = [
        (ref, encode_batch([f"ok-{n}"])) for n, ref in enumerate(refs)
    ]
    batches.insert(2, (refs[1], bad))
    results = await asyncio.gather(
        *(store.append(ref, b) for ref, b in batches), return_exceptions=True
    )
    await first
    assert isinstance(results[2], asyncpg.PostgresError)
    good = [r for i, r in enumerate(results) if i != 2]
    assert [(r.first_sequence, r.last_sequence) for r in good] == [(1, 1)] * 4  # type: ignore[union-attr]
    # The combined statement failed as a whole, then each group went alone.
    assert len(many.errors) == 1 and isinstance(many.errors[0], asyncpg.PostgresError)
    for n, ref in enumerate(refs):
        assert await stored_log(pool, ref) == {1: f'"ok-{n}"'}


async def test_two_processes_combining_the_same_streams_never_deadlock(
    pool: asyncpg.Pool,
) -> None:
    stores = [combining_store(pool), combining_store(pool)]
    refs = [await make_stream(stores[0]) for _ in range(16)]
    gate = await make_stream(stores[0])
    spies = [ManyCalls(s.appender) for s in stores]
    for round_ in range(3):
        async with pool.acquire() as conn, conn.transaction():
            # Hold the gate stream's row: each store's one statement waits on it while
            # the 16 streams queue up behind, in opposite orders in the two stores.
            await conn.execute(
                "SELECT 1 FROM workflow_streams.streams WHERE stream_pk = $1 FOR UPDATE",
                gate.stream_pk,
            )
            gated = [asyncio.ensure_future(s.append(gate, encode_batch(["gate"]))) for s in stores]
            await eventually(lambda: all(s.appender._in_flight == 1 for s in stores), timeout=5)
            writes = [
                asyncio.ensure_future(stores[k].append(ref, encode_batch([f"{k}-{round_}"])))
                for k, order in ((0, refs), (1, refs[::-1]))
                for ref in order
            ]
            await eventually(lambda: all(len(s.appender._ready) == 16 for s in stores), timeout=5)
        # Released: both stores now send one 16-stream statement at about the same time.
        await asyncio.gather(*gated, *writes)
    # Rows are locked in ascending stream order, whatever the arrival order: without
    # it, the two statements would deadlock and fall back.
    assert [e for s in spies for e in s.errors] == []
    assert sorted(n for s in spies for n in s.streams) == [16] * 6
    for ref in refs:
        stored = await stored_log(pool, ref)
        assert sorted(stored) == list(range(1, 7))


async def test_requests_keep_arriving_while_statements_are_bounded(pool: asyncpg.Pool) -> None:
    # Two statements at most: 200 requests over 20 streams all get answers, in order.
    store = combining_store(pool, max_statements=2)
    refs = [await make_stream(store) for _ in range(20)]
    results = await asyncio.gather(
        *(store.append(ref, encode_batch([i])) for i in range(10) for ref in refs)
    )
    for n in range(len(refs)):
        mine = results[n :: len(refs)]
        assert [r.first_sequence for r in mine] == list(range(1, 11))
    assert store.appender.statements < 200
    assert store.appender._ready_records == 0 and not store.appender._ready


async def test_small_appends_wait_to_share_the_next_commit_large_ones_do_not(
    pool: asyncpg.Pool,
) -> None:
    store = combining_store(pool, max_statements=4)
    appender = store.appender
    gate = await make_stream(store)
    small = [await make_stream(store) for _ in range(10)]
    large = [await make_stream(store) for _ in range(2)]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT 1 FROM workflow_streams.streams WHERE stream_pk = $1 FOR UPDATE",
            gate.stream_pk,
        )
        gated = asyncio.ensure_future(store.append(gate, encode_batch(["gate"])))
        await eventually(lambda: appender._in_flight == 1, timeout=5)
        # Ten one-record appends: not worth a statement of their own beside the gate's.
        smalls = [asyncio.ensure_future(store.append(r, encode_batch(["s"]))) for r in small]
        await eventually(lambda: len(appender._ready) == 10, timeout=5)
        assert appender._in_flight == 1
        assert appender._ready_records == 10  # kept as requests come (not summed each time)
        # A 100-record batch is: it starts at once (and takes the small ones with it).
        larges = [
            asyncio.ensure_future(store.append(r, encode_batch(list(range(100))))) for r in large
        ]
        done, _ = await asyncio.wait([*smalls, *larges], timeout=5)
        assert set(done) == {*smalls, *larges}
        assert appender._in_flight == 1  # only the gate's statement still waits
        assert appender.statements == 3  # gate; smalls + first large; second large
    await gated
    assert [(r.result().first_sequence, r.result().last_sequence) for r in larges] == [(1, 100)] * 2
    assert [r.result().first_sequence for r in smalls] == [1] * 10


async def test_a_lost_connection_fails_only_the_groups_of_its_statement(
    pool: asyncpg.Pool,
) -> None:
    store = combining_store(pool)
    appender = store.appender
    refs = [await make_stream(store) for _ in range(3)]
    inner = appender._call_many
    failures = [asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed")]

    async def flaky(groups: Any, notify_inline: bool) -> Any:
        if failures:
            raise failures.pop()
        return await inner(groups, notify_inline)

    appender._call_many = flaky  # type: ignore[method-assign]
    gate = await make_stream(store)
    first = asyncio.ensure_future(store.append(gate, encode_batch(["gate"])))
    await asyncio.sleep(0)  # the gate's statement is in flight: the three queue up
    lost = await asyncio.gather(
        *(store.append(ref, encode_batch(["lost"])) for ref in refs), return_exceptions=True
    )
    await first
    assert all(isinstance(r, asyncpg.exceptions.ConnectionDoesNotExistError) for r in lost)
    # Nothing of the failed statement was kept; the streams take appends again at once.
    again = await asyncio.gather(*(store.append(ref, encode_batch(["again"])) for ref in refs))
    assert [(r.first_sequence, r.last_sequence) for r in again] == [(1, 1)] * 3
    for ref in refs:
        assert await stored_log(pool, ref) == {1: '"again"'}
    assert appender._in_flight == 0 and not appender._ready and not appender._queues
    assert appender._ready_records == 0


async def test_a_group_whose_connection_failed_is_not_retried(pool: asyncpg.Pool) -> None:
    # Its statement may have committed: retrying each request alone could append twice.
    store = Store(pool)
    appender = store.appender
    ref = await make_stream(store)
    inner = appender._call
    calls: list[int] = []

    async def flaky(stream_pk: int, batches: Any, notify_inline: bool = False) -> Any:
        calls.append(len(batches))
        if len(calls) == 2:
            raise asyncpg.exceptions.ConnectionFailureError("connection lost")
        return await inner(stream_pk, batches, notify_inline)

    appender._call = flaky  # type: ignore[method-assign]
    results = await asyncio.gather(
        *(store.append(ref, encode_batch([i])) for i in range(6)), return_exceptions=True
    )
    # The first request went alone, the other five as one group, which failed as a whole.
    assert calls == [1, 5]
    assert results[0].first_sequence == 1  # type: ignore[union-attr]
    # Each of the five gets the failure as an unavailable database (503 at the edge).
    assert all(
        isinstance(r, DatabaseUnavailable)
        and isinstance(r.__cause__, asyncpg.exceptions.ConnectionFailureError)
        for r in results[1:]
    )


async def test_records_travel_joined_and_come_back_exact(pool: asyncpg.Pool) -> None:
    # Payloads and sizes go to Postgres joined into one text each (wakes.sql); objects
    # only when a record has one. Whatever the payload holds, it comes back as sent.
    store = combining_store(pool)
    refs = [await make_stream(store) for _ in range(3)]
    tricky: list[Any] = [
        "a\x1eb",  # the separator inside a string: escaped in compact JSON
        {"k": "x,y", "u": "é☃", "n": [1, 2, {"z": None}]},
        ",",
        "",
    ]
    batches = [
        encode_batch(tricky),
        encode_batch(["plain"], objects=[{"key": "o-1", "size": 3}]),
        encode_batch([1, 2.5, True, None]),
    ]
    assert all("\x1e" not in text for b in batches for text in b.payloads)
    results = await asyncio.gather(*(store.append(ref, batch) for ref in refs for batch in batches))
    assert [(r.first_sequence, r.last_sequence) for r in results[:3]] == [(1, 4), (5, 5), (6, 9)]
    for ref in refs:
        rows = await pool.fetch(
            "SELECT sequence, payload, size, object FROM workflow_streams.records"
            " WHERE stream_pk = $1 ORDER BY sequence",
            ref.stream_pk,
        )
        expected = [t for b in batches for t in b.payloads]
        assert [r["payload"] for r in rows] == expected
        assert [r["size"] for r in rows] == [s for b in batches for s in b.sizes]
        assert [r["object"] for r in rows] == [None] * 4 + ['{"key": "o-1", "size": 3}'] + [
            None
        ] * 4


def test_a_payload_with_a_raw_separator_is_refused() -> None:
    # Not producible by encode_batch (compact JSON escapes control characters).
    bad = EncodedBatch(['"a\x1eb"'], [5], [None], None, "h")
    with pytest.raises(ValueError, match="separator"):
        statement_arguments([encode_batch(["ok"]), bad])
    assert statement_arguments([encode_batch(["ok"])])[3:] == ('"ok"', "4", None)


async def test_a_key_stored_meanwhile_by_another_transaction_is_replayed(
    pool: asyncpg.Pool,
) -> None:
    # A combined statement looks its keys up before it locks the rows.
    # Another transaction holding a stream's row lock stores the same key meanwhile;
    # once it commits, the combined statement's receipt insert fails, the statement
    # commits nothing, and each group alone finds the key: replayed, never appended
    # twice.
    store = combining_store(pool)
    many = ManyCalls(store.appender)
    keyed, other, gate = [await make_stream(store) for _ in range(3)]
    request = encode_batch(["once"], idempotency_key="k-race")
    async with pool.acquire() as holder, pool.acquire() as gate_holder:
        holder_tx = holder.transaction()
        await holder_tx.start()
        rows = await holder.fetch(
            QUERIES["records_append_group"],
            keyed.stream_pk,
            *statement_arguments([request]),
            False,
            None,
        )
        assert [(r["outcome"], r["first_sequence"]) for r in rows] == [("appended", 1)]
        # The gate's statement in flight: the keyed and the other stream's requests
        # queue behind it and go together once it is released.
        gate_tx = gate_holder.transaction()
        await gate_tx.start()
        await gate_holder.execute(
            "SELECT 1 FROM workflow_streams.streams WHERE stream_pk = $1 FOR UPDATE",
            gate.stream_pk,
        )
        gated = asyncio.ensure_future(store.append(gate, encode_batch(["gate"])))
        await eventually(lambda: store.appender._in_flight == 1, timeout=5)
        raced = asyncio.ensure_future(store.append(keyed, request))
        beside = asyncio.ensure_future(store.append(other, encode_batch(["beside"])))
        await eventually(lambda: len(store.appender._ready) == 2, timeout=5)
        await gate_tx.commit()
        await gated
        # The combined statement has looked at the keys and waits for the keyed row.
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '%append_stream_groups%'"
        )

        async def blocked() -> bool:
            return bool(await gate_holder.fetchval(waiting))

        await eventually(blocked, timeout=5, what="the combined statement waiting")
        await holder_tx.commit()
    replayed, appended = await asyncio.gather(raced, beside)
    assert (replayed.first_sequence, replayed.last_sequence, replayed.replayed) == (1, 1, True)
    assert (appended.first_sequence, appended.replayed) == (1, False)
    assert [type(e) for e in many.errors] == [asyncpg.exceptions.UniqueViolationError]
    assert await stored_log(pool, keyed) == {1: '"once"'}
    assert await stored_log(pool, other) == {1: '"beside"'}


@pytest.fixture
async def quiet_pool(test_database: TestDatabase) -> AsyncIterator[asyncpg.Pool]:
    """A pool on a database of its own that nothing else uses.

    Pruning old row versions waits for every snapshot open in the database; on the
    session's database the app, dispatchers and loops of other tests hold some now and
    then, and rows of their streams share the pages, so what fits on a page there
    depends on them. Autovacuum is off on its tables: an ANALYZE that the test's own
    updates set off holds a snapshot too, for as long as a loaded machine takes to run
    it (the test failed that way under load even on a database of its own)."""
    dsn, drop = await asyncio.to_thread(test_database.fresh)
    try:
        await migrate(dsn)
        conn = await asyncpg.connect(dsn)
        try:
            tables = await conn.fetch(
                "SELECT format('%I.%I', schemaname, tablename) AS name FROM pg_tables"
                " WHERE schemaname = 'workflow_streams'"
            )
            for table in tables:
                await conn.execute(f"ALTER TABLE {table['name']} SET (autovacuum_enabled = off)")
        finally:
            await conn.close()
        pool = await create_pool(dsn, min_size=1, max_size=2)
        try:
            yield pool
        finally:
            await pool.close()
    finally:
        await asyncio.to_thread(drop)


async def test_the_rows_a_statement_moves_stay_on_their_pages(quiet_pool: asyncpg.Pool) -> None:
    # One UPDATE moves every stream of a several-stream statement. The
    # new versions of its rows must fit on their pages beside the old ones (HOT updates:
    # no index entries, the table keeps its size); with the default fillfactor 44% of
    # them left their page and the table grew by a page every few statements. Counted
    # by Postgres itself (n_tup_hot_upd). A HOT update can still miss when the page is
    # pinned by another process just as it would be pruned (the checkpointer writing it;
    # on a server shared with other tests' databases, the checkpoints their CREATE and
    # DROP DATABASE ask for): on a loaded machine that moved up to 25 rows of 4,800 in
    # one round. So up to three rounds, each on streams of its own: the fillfactor's
    # effect shows in every one of them, such noise hardly twice in a row.
    moved = []
    for _ in range(3):
        moved.append(await _rows_that_left_their_page(quiet_pool))
        if moved[-1] <= 300 * 16 // 200:
            break
    # At most 0.5% in a round: here 0 on most runs; with Postgres's default fillfactor
    # (100), 77 in each.
    assert min(moved) <= 300 * 16 // 200, moved


async def _rows_that_left_their_page(pool: asyncpg.Pool) -> int:
    """300 statements appending to 16 new streams at once; how many of their 4,800 row
    updates of the streams table were not HOT."""
    store = Store(pool)
    pks = sorted([(await make_stream(store)).stream_pk for _ in range(16)])
    statement = QUERIES["records_append_stream_groups"]
    async with pool.acquire() as conn:
        updated_before, hot_before = await _updates(conn)
        for n in range(300):
            arguments = statement_arguments([encode_batch([n])] * 16)
            rows = await conn.fetch(statement, pks, [1] * 16, [1] * 16, *arguments, False, None)
            assert [r["outcome"] for r in rows] == ["appended"] * 16
        updated, hot = await _updates(conn)
    assert updated - updated_before == 300 * 16
    assert (
        await pool.fetchval(
            "SELECT array_agg(latest_sequence ORDER BY stream_pk) FROM workflow_streams.streams"
            " WHERE stream_pk = ANY ($1)",
            pks,
        )
        == [300] * 16
    )
    return (updated - updated_before) - (hot - hot_before)


async def _updates(conn: asyncpg.Connection) -> tuple[int, int]:
    """The streams table's updates so far and how many of them were HOT (this
    connection's counts flushed first)."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    row = await conn.fetchrow(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
        " WHERE relid = 'workflow_streams.streams'::regclass"
    )
    assert row is not None
    return int(row["n_tup_upd"]), int(row["n_tup_hot_upd"])


async def test_a_connections_first_small_statements_leave_it_generic_plans(
    pool: asyncpg.Pool,
) -> None:
    # Which plans a connection uses must not depend on its history. On a
    # connection whose first statements were small, Postgres kept choosing custom plans
    # for the function's UPDATE (the average custom cost stayed below the generic one)
    # and planned it again on every call: a third of the backend's CPU for a statement of
    # 1-4 streams. Postgres's auto_explain shows the plan each nested statement ran with:
    # a generic plan refers to the function's variables as parameters ($n), a custom
    # plan has their values folded in.
    store = Store(pool)
    pk = (await make_stream(store)).stream_pk
    statement = QUERIES["records_append_stream_groups"]
    plans: list[str] = []
    async with pool.acquire() as conn:
        try:
            await conn.execute("LOAD 'auto_explain'")
        except asyncpg.PostgresError as exc:  # a server without the contrib modules
            pytest.skip(f"auto_explain is not available: {exc}")
        await conn.execute(
            "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
            " SET auto_explain.log_verbose = on; SET client_min_messages = log"
        )

        def logged(_conn: Any, message: Any) -> None:
            plans.append(message.message)

        conn.add_log_listener(logged)
        try:
            for n in range(10):
                arguments = statement_arguments([encode_batch([n])])
                rows = await conn.fetch(statement, [pk], [1], [1], *arguments, False, None)
                assert [(r["outcome"], r["last_sequence"]) for r in rows] == [("appended", n + 1)]
        finally:
            await conn.execute("RESET client_min_messages; RESET auto_explain.log_min_duration")
            conn.remove_log_listener(logged)
    updates = [p for p in plans if "UPDATE workflow_streams.streams s" in p]
    assert len(updates) == 10
    # The generic plan's function scan reads the arrays from parameters; a custom plan's
    # reads constants ('{...}'::bigint[]).
    generic = ["unnest($" in p for p in updates]
    assert generic == [True] * 10, [p for p in updates if "unnest($" not in p][:1]
