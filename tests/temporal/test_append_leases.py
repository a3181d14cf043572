"""Leases taken by the append (``append_requests_leasing``): an input append of a process leases its
deliveries to that process's dispatcher in its own transaction, only when they are the
stream's head, and the dispatcher signals them with no claim between. Order and
exactly-once hold as with claims, also with two processes appending to the same streams,
and a lease whose owner never sends is taken over once it runs out."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator

import asyncpg

from ductor_streams.delivery import Dispatcher, InputEvent, outbox
from ductor_streams.delivery.outbox import ClaimedDelivery
from ductor_streams.foundation import metrics
from ductor_streams.process.dispatcher import AppendLeases
from ductor_streams.schema import QUERIES
from ductor_streams.store import Store, StreamRef, encode_batch
from ductor_streams.store.append import LeasedDeliveries
from tests.temporal.polling import eventually
from tests.temporal.support import append_inputs, deliveries, settled
from tests.temporal.test_dispatcher import FAST, RecordingWaitService, input_stream, states

# Long leases, so that nothing a test counts comes from a lease running out.
LEASING = dataclasses.replace(FAST, lease_seconds=30.0, idle_poll=0.05)


@contextlib.asynccontextmanager
async def leasing(
    store: Store, dispatcher: Dispatcher, leases: AppendLeases | None = None
) -> AsyncIterator[Dispatcher]:
    """``dispatcher`` running as ``serve`` runs it (process/dispatcher.py): the store's
    appends lease to it, and their commits wake it directly."""
    store.appender.leases = leases or AppendLeases(dispatcher, dispatcher_tenant(dispatcher))
    store.input_appended = lambda ref, last: dispatcher.notify(ref.stream_pk, last)
    task = asyncio.get_running_loop().create_task(dispatcher.run())
    try:
        await eventually(
            lambda: asyncio.sleep(0, dispatcher.claims), lambda n: n > 0, what="running"
        )
        yield dispatcher
    finally:
        store.appender.leases = None
        store.input_appended = None
        dispatcher.stop()
        await task


async def delivered_by_another(
    pool: asyncpg.Pool, wait: RecordingWaitService, tenant: str, ref: StreamRef, count: int
) -> None:
    """Until a dispatcher of no store's (it only claims) has every delivery of ``ref``
    delivered."""
    other = Dispatcher(pool, wait, tenant=tenant, owner="other", config=FAST)
    task = asyncio.create_task(other.run())
    try:
        await eventually(
            lambda: states(pool, [ref]), lambda s: s == ["delivered"] * count, what="delivered"
        )
    finally:
        other.stop()
        await task


def dispatcher_tenant(dispatcher: Dispatcher) -> str:
    return dispatcher._tenant  # the tests build their dispatchers with a tenant each


async def _append_leasing(
    pool: asyncpg.Pool, ref: StreamRef, count: int, *, owner: str = "p1", most: int = 100
) -> list[asyncpg.Record]:
    """One request of ``count`` records through append_requests_leasing."""
    payloads = "\x1e".join(f'{{"n":{i}}}' for i in range(count))
    sizes = ",".join(str(len(f'{{"n":{i}}}')) for i in range(count))
    return await pool.fetch(
        QUERIES["records_append_group_leasing"],
        ref.stream_pk,
        [count],
        [None],
        [None],
        payloads,
        sizes,
        None,
        False,
        None,
        owner,
        30.0,
        most,
    )


def _answer(rows: list[asyncpg.Record]) -> list[tuple[int, str, int | None, int | None]]:
    return [
        (r["request_index"], r["outcome"], r["first_sequence"], r["last_sequence"]) for r in rows
    ]


async def test_an_append_leases_its_deliveries_only_at_the_head(
    store: Store, pool: asyncpg.Pool
) -> None:
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-head")
    rows = await _append_leasing(pool, ref, 3)
    assert _answer(rows) == [(1, "appended", 1, 3), (0, "leased", 1, 3)]
    ids = [r["delivery_id"] for r in await _delivery_ids(pool, ref)]
    assert list(rows[1]["leased"]) == ids
    leases = await pool.fetch(
        "SELECT lease_owner, lease_expires_at - now() > interval '29 seconds' AS long"
        "  FROM workflow_streams.input_deliveries WHERE stream_pk = $1 ORDER BY sequence",
        ref.stream_pk,
    )
    assert [(r["lease_owner"], r["long"]) for r in leases] == [("p1", True)] * 3
    # Sequences 1-3 are open (leased to p1): the next append is not the head.
    assert _answer(await _append_leasing(pool, ref, 2, owner="p2")) == [(1, "appended", 4, 5)]
    assert [r["lease_owner"] for r in await deliveries(pool, ref)] == ["p1"] * 3 + [None] * 2
    # Nor behind a head that backs off, unleased.
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET state = 'retrying', lease_owner = NULL,"
        " lease_expires_at = NULL, next_attempt_at = now() + interval '1 hour'"
        " WHERE stream_pk = $1 AND sequence = 1",
        ref.stream_pk,
    )
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET state = 'delivered', lease_owner = NULL,"
        " lease_expires_at = NULL WHERE stream_pk = $1 AND sequence BETWEEN 2 AND 5",
        ref.stream_pk,
    )
    assert _answer(await _append_leasing(pool, ref, 1, owner="p2")) == [(1, "appended", 6, 6)]
    # Once every earlier one is delivered or dead, the append is the head again; it
    # leases at most the dispatcher's share, the rest waits for a claim.
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET state = 'dead'"
        " WHERE stream_pk = $1 AND sequence = 1",
        ref.stream_pk,
    )
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET state = 'delivered'"
        " WHERE stream_pk = $1 AND sequence = 6",
        ref.stream_pk,
    )
    assert _answer(await _append_leasing(pool, ref, 4, owner="p3", most=2)) == [
        (1, "appended", 7, 10),
        (0, "leased", 7, 8),
    ]
    tail = [(r["sequence"], r["lease_owner"]) for r in await deliveries(pool, ref)][6:]
    assert tail == [(7, "p3"), (8, "p3"), (9, None), (10, None)]


async def test_an_append_that_appends_nothing_leases_nothing(
    store: Store, pool: asyncpg.Pool
) -> None:
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-closed")
    await store.close(ref)
    assert _answer(await _append_leasing(pool, ref, 1)) == [(1, "stream_closed", None, None)]
    assert await deliveries(pool, ref) == []


async def test_a_lease_whose_owner_never_sends_is_taken_over(
    store: Store, pool: asyncpg.Pool
) -> None:
    """The owner died right after its append committed: the rows wait out the lease,
    then any dispatcher delivers them, in order, once."""
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-orphan")
    rows = await pool.fetch(
        QUERIES["records_append_group_leasing"],
        ref.stream_pk,
        [2],
        [None],
        [None],
        '{"n":1}\x1e{"n":2}',
        "7,7",
        None,
        False,
        None,
        "dead-owner",
        0.5,
        100,
    )
    assert _answer(rows)[-1] == (0, "leased", 1, 2)
    wait = RecordingWaitService()
    await delivered_by_another(pool, wait, tenant, ref, 2)
    assert wait.by_run() == {"run-orphan": [1, 2]}


async def test_the_dispatcher_signals_what_its_process_appended_without_a_claim(
    quiet_pool: asyncpg.Pool,
) -> None:
    pool = quiet_pool  # it counts claims (tests/temporal/conftest.py)
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    store = Store(pool)
    ref = await input_stream(store, tenant, "run-local")
    wait = RecordingWaitService()
    # No idle poll: every claim here is one a wake or a delivery's end set off.
    quiet = dataclasses.replace(LEASING, idle_poll=30.0)
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="local", config=quiet)
    leased_before = metrics.DELIVERY_APPEND_LEASED._value.get()
    async with leasing(store, dispatcher):
        await settled(dispatcher)
        claims = dispatcher.claims
        for n in range(1, 11):
            await append_inputs(store, ref, [n])
            # Signalled and recorded: the stream is idle again (a stream whose head is
            # still open, recorded or not, is claimed: the next test).
            await eventually(
                lambda: asyncio.sleep(0, dispatcher.delivered),
                lambda c: c == n,  # noqa: B023 (awaited here)
                what=f"record {n} delivered",
            )
        assert await states(pool, [ref]) == ["delivered"] * 10
        # Not one claim: neither for a record, nor after one (its append's own wake
        # announces nothing past what the dispatcher held).
        assert dispatcher.claims == claims
    assert wait.by_run() == {"run-local": list(range(1, 11))}
    # Every record was taken by its own append's lease, none by a claim.
    assert dispatcher.adopted == 10
    assert dispatcher.delivered == 10
    assert metrics.DELIVERY_APPEND_LEASED._value.get() - leased_before == 10
    rows = await pool.fetch(
        "SELECT attempts, lease_owner FROM workflow_streams.input_deliveries WHERE stream_pk = $1",
        ref.stream_pk,
    )
    assert [(r["attempts"], r["lease_owner"]) for r in rows] == [(1, None)] * 10


async def test_the_signal_carries_what_a_claim_would_have_read(pool: asyncpg.Pool) -> None:
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    store = Store(pool)
    ref = await input_stream(store, tenant, "run-same")
    events: list[InputEvent] = []

    class Capturing(RecordingWaitService):
        async def deliver(self, event: InputEvent) -> None:
            events.append(event)
            await super().deliver(event)

    wait = Capturing()
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="local", config=LEASING)
    async with leasing(store, dispatcher):
        await store.append(ref, encode_batch([{"b": [1, 2.5, "x"], "a": {"z": None}}]))
        await eventually(lambda: asyncio.sleep(0, len(events)), lambda n: n == 1, what="sent")
    assert dispatcher.adopted == 1
    # The same record, claimed: the event a claim builds from the rows.
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET state = 'pending' WHERE stream_pk = $1",
        ref.stream_pk,
    )
    claimed = await outbox.claim(
        pool,
        owner="reader",
        tenant=tenant,
        lease_seconds=30,
        max_streams=1,
        per_stream=1,
        stream=ref.stream_pk,
    )
    assert [d.event for d in claimed[ref.stream_pk]] == events
    assert list(events[0].payload) == ["b", "a"]  # as sent, key order kept


async def test_two_processes_appending_to_the_same_streams_deliver_once_in_order(
    pool: asyncpg.Pool,
) -> None:
    """Two stores (two processes' appenders), each with a leasing dispatcher, append to
    the same streams at once: some records are leased by their append, the rest claimed,
    and every stream is delivered once, in sequence order."""
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    first_store, second_store = Store(pool), Store(pool)
    refs = [await input_stream(first_store, tenant, f"run-{i}") for i in range(4)]
    wait = RecordingWaitService(delay=0.002)
    shared = dataclasses.replace(LEASING, max_streams=3)
    first = Dispatcher(pool, wait, tenant=tenant, owner="one", config=shared)
    second = Dispatcher(pool, wait, tenant=tenant, owner="two", config=shared)
    async with leasing(first_store, first), leasing(second_store, second):
        for chunk in range(10):
            stores = (first_store, second_store) if chunk % 2 else (second_store, first_store)
            await asyncio.gather(
                *(
                    append_inputs(store, ref, [chunk * 2 + k])
                    for ref in refs
                    for k, store in enumerate(stores)
                )
            )
            if chunk % 3 == 0:  # now and then the streams go idle: the next appends lease
                await eventually(
                    lambda: states(pool, refs),
                    lambda s: s == ["delivered"] * 8 * (chunk + 1),  # noqa: B023
                    what="idle",
                )
        await eventually(
            lambda: states(pool, refs), lambda s: s == ["delivered"] * 80, what="all delivered"
        )
        mixed = first.adopted + second.adopted
        # Then each process appends to idle streams, one record at a time: all leased.
        for store, dispatcher in ((first_store, first), (second_store, second)):
            for ref in refs:
                before = dispatcher.adopted, dispatcher.delivered
                await append_inputs(store, ref, [0])
                await eventually(
                    lambda: asyncio.sleep(0, dispatcher.delivered),  # noqa: B023
                    lambda n: n == before[1] + 1,  # noqa: B023
                    what="delivered",
                )
                assert dispatcher.adopted == before[0] + 1
    assert dict(wait.by_run()) == {f"run-{i}": list(range(1, 23)) for i in range(4)}
    assert first.delivered + second.delivered == 88
    assert mixed > 0


async def test_a_dispatcher_stopped_before_it_takes_the_lease_over_gives_it_back(
    pool: asyncpg.Pool,
) -> None:
    """The append leased to a dispatcher that stopped before the deliveries reached it:
    the rows are given back at once, not after the lease, and another dispatcher
    delivers them."""
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    store = Store(pool)
    ref = await input_stream(store, tenant, "run-stopped")
    wait = RecordingWaitService()
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="stopping", config=LEASING)

    class StopFirst(AppendLeases):
        def taken(self, leased: LeasedDeliveries) -> None:
            dispatcher.stop()
            super().taken(leased)

    async with leasing(store, dispatcher, StopFirst(dispatcher, tenant)):
        await append_inputs(store, ref, [1, 2])
    assert dispatcher.adopted == 1
    assert wait.calls == []
    rows = await deliveries(pool, ref)
    assert [(r["state"], r["lease_owner"]) for r in rows] == [("pending", None)] * 2
    await delivered_by_another(pool, wait, tenant, ref, 2)
    assert wait.by_run() == {"run-stopped": [1, 2]}


async def test_no_lease_is_taken_for_a_stream_the_dispatcher_holds(pool: asyncpg.Pool) -> None:
    """While the dispatcher delivers a stream, the next append of it is claimed after,
    not leased: one owner of a stream's head at a time."""
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    store = Store(pool)
    ref = await input_stream(store, tenant, "run-busy")
    release = asyncio.Event()

    class Slow(RecordingWaitService):
        async def deliver(self, event: InputEvent) -> None:
            if event.sequence == 1:
                await release.wait()
            await super().deliver(event)

    wait = Slow()
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="busy", config=LEASING)
    async with leasing(store, dispatcher):
        await append_inputs(store, ref, [1])
        await append_inputs(store, ref, [2])  # sequence 1 is being signalled
        assert [r["lease_owner"] for r in await deliveries(pool, ref)] == ["busy", None]
        release.set()
        await eventually(
            lambda: states(pool, [ref]), lambda s: s == ["delivered"] * 2, what="delivered"
        )
    assert wait.by_run() == {"run-busy": [1, 2]}
    assert dispatcher.adopted == 1


async def _delivery_ids(pool: asyncpg.Pool, ref: StreamRef) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT delivery_id FROM workflow_streams.input_deliveries WHERE stream_pk = $1"
        " ORDER BY sequence",
        ref.stream_pk,
    )


async def test_a_wake_for_records_the_dispatcher_holds_claims_nothing_after(
    quiet_store: Store, quiet_pool: asyncpg.Pool
) -> None:
    """A wake whose sequence a held claim covers announces nothing that claim lacks
    (appends commit in sequence order); a later one does, and is claimed after it."""
    store, pool = quiet_store, quiet_pool  # it counts claims (tests/temporal/conftest.py)
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-covered")
    await append_inputs(store, ref, [1, 2, 3])
    release = asyncio.Event()

    class Slow(RecordingWaitService):
        async def deliver(self, event: InputEvent) -> None:
            await release.wait()
            await super().deliver(event)

    wait = Slow()
    quiet = dataclasses.replace(LEASING, idle_poll=30.0)
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="held", config=quiet)
    task = asyncio.create_task(dispatcher.run())
    try:
        await eventually(
            lambda: deliveries(pool, ref),
            lambda rows: [r["lease_owner"] for r in rows] == ["held"] * 3,
            what="claimed",
        )
        claims = dispatcher.claims
        dispatcher.notify(ref.stream_pk, 3)  # the echo of what the claim took
        release.set()
        await eventually(
            lambda: asyncio.sleep(0, dispatcher.delivered), lambda n: n == 3, what="delivered"
        )
        # A claim set off by the delivery's end is counted within a few turns of the
        # loop (the count goes up before the statement is sent).
        await eventually(
            lambda: asyncio.sleep(0, len(dispatcher._tasks)), lambda n: n == 0, what="ended"
        )
        for _ in range(20):
            await asyncio.sleep(0)
        assert dispatcher.claims == claims
        # Now a wake past what it held: claimed at the end of the delivery it waits for.
        release.clear()
        await append_inputs(store, ref, [4])
        dispatcher.notify(ref.stream_pk, 4)
        await eventually(
            lambda: deliveries(pool, ref),
            lambda rows: rows[3]["lease_owner"] == "held",
            what="claimed",
        )
        dispatcher.notify(ref.stream_pk, 5)  # while 4 is held: 5 may be due after it
        await append_inputs(store, ref, [5])
        release.set()
        await eventually(
            lambda: states(pool, [ref]), lambda s: s == ["delivered"] * 5, what="all delivered"
        )
    finally:
        dispatcher.stop()
        await task
    assert wait.by_run() == {"run-covered": [1, 2, 3, 4, 5]}


async def test_a_handover_that_fails_frees_the_slot_and_the_lease_runs_out(
    pool: asyncpg.Pool,
) -> None:
    """Leased rows that could not reach the dispatcher: its reservation ends (the slot
    and the stream are free again) and the rows are claimed once their lease runs out."""
    tenant = f"l-{uuid.uuid4().hex[:8]}"
    store = Store(pool)
    ref = await input_stream(store, tenant, "run-broken")
    wait = RecordingWaitService()
    short = dataclasses.replace(LEASING, lease_seconds=0.5, idle_poll=0.05)
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="broken", config=short)

    class Broken(AppendLeases):
        @staticmethod
        def _deliveries(leased: LeasedDeliveries) -> list[ClaimedDelivery]:
            raise ValueError("injected")

    async with leasing(store, dispatcher, Broken(dispatcher, tenant)):
        await append_inputs(store, ref, [1, 2])
        await eventually(
            lambda: states(pool, [ref]), lambda s: s == ["delivered"] * 2, what="claimed later"
        )
        assert dispatcher._reserved == {}
    assert dispatcher.adopted == 0
    assert wait.by_run() == {"run-broken": [1, 2]}
