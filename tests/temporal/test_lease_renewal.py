"""Short delivery leases renewed by a heartbeat (real Postgres, fake wait service): a live
owner keeps its lease however long its signals take, so nothing is sent twice while
nothing crashed; an owner whose renewals fail stops sending before its lease runs out,
so it never overlaps the dispatcher that takes the rows over."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg

from ductor_streams.delivery import Dispatcher, DispatcherConfig, InputEvent, outbox
from ductor_streams.store import Store, StreamRef
from tests.temporal.polling import eventually
from tests.temporal.support import append_inputs, deliveries
from tests.temporal.test_dispatcher import input_stream, states


class SlowWaitService:
    """Each signal takes ``seconds``; notes when each one started and ended (or was
    abandoned: cancelled by its dispatcher)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = asyncio.Event()
        self.sends: list[dict[str, Any]] = []

    async def deliver(self, event: InputEvent) -> None:
        send: dict[str, Any] = {"sequence": event.sequence, "start": time.monotonic()}
        self.sends.append(send)
        self.started.set()
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            send["abandoned"] = time.monotonic()
            raise
        send["end"] = time.monotonic()

    def completed(self) -> list[int]:
        return [s["sequence"] for s in self.sends if "end" in s]

    def last_activity(self) -> float:
        return max(s.get("end", s.get("abandoned", float("inf"))) for s in self.sends)


class UnreachablePool:
    """A pool that becomes unreachable on demand for the uses named in ``down``
    (``"acquire"`` is the renewal's, ``"fetch"`` the claim's, ``"*"`` every use): they
    raise, as a database that is down or cut off by the network does. The test's other
    dispatcher still reaches the database through the real pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self.down: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        if name in self.down or "*" in self.down:
            raise ConnectionRefusedError("database unreachable (test)")
        return getattr(self._pool, name)


async def _running(dispatcher: Dispatcher) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(dispatcher.run())


async def _stop(*pairs: tuple[Dispatcher, asyncio.Task[None]]) -> None:
    for dispatcher, _ in pairs:
        dispatcher.stop()
    await asyncio.gather(*(task for _, task in pairs))


async def _lease_end(pool: asyncpg.Pool, ref: StreamRef) -> float:
    """The latest lease end of the stream's rows, on this process's monotonic clock."""
    seconds = await pool.fetchval(
        "SELECT extract(epoch FROM max(lease_expires_at) - clock_timestamp())::float8"
        "  FROM workflow_streams.input_deliveries WHERE stream_pk = $1",
        ref.stream_pk,
    )
    return time.monotonic() + float(seconds)


async def test_a_live_owner_keeps_its_lease_through_signals_longer_than_the_lease(
    store: Store, pool: asyncpg.Pool
) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-slow")
    await append_inputs(store, ref, [1, 2, 3])
    lease = DispatcherConfig(lease_seconds=0.6, idle_poll=0.02)
    slow_service, eager_service = SlowWaitService(1.0), SlowWaitService(0.0)
    slow = Dispatcher(pool, slow_service, tenant=tenant, owner="slow", config=lease)
    eager = Dispatcher(pool, eager_service, tenant=tenant, owner="eager", config=lease)
    slow_task = await _running(slow)
    await asyncio.wait_for(slow_service.started.wait(), 10)
    # Every signal takes longer than the whole lease; the other polls every 20 ms.
    eager_task = await _running(eager)
    try:
        await eventually(lambda: states(pool, [ref]), lambda s: s == ["delivered"] * 3, timeout=20)
    finally:
        await _stop((slow, slow_task), (eager, eager_task))
    assert slow_service.completed() == [1, 2, 3]
    assert [s for s in slow_service.sends if "abandoned" in s] == []
    assert eager_service.sends == []  # never took the lease: nothing was sent twice
    assert slow.renewals >= 6  # ~3 s of signals, a renewal every 0.15 s when due
    rows = await deliveries(pool, ref)
    assert [(r["state"], r["attempts"], r["lease_owner"]) for r in rows] == [
        ("delivered", 1, None)
    ] * 3


async def _cut_off_mid_claim(
    store: Store, pool: asyncpg.Pool, down: set[str]
) -> tuple[Dispatcher, SlowWaitService, SlowWaitService, float, StreamRef]:
    """An owner claims 10 slow deliveries (0.3 s each, lease 1 s) and, once its first
    signal is on its way, loses the database uses in ``down``; a taker with the default
    idle poll runs beside it until all are delivered. Returns the owner, both wait
    services, the end of the owner's lease (monotonic) and the stream."""
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-cut")
    await append_inputs(store, ref, list(range(10)))
    cut_off = UnreachablePool(pool)
    cut_service, taker_service = SlowWaitService(0.3), SlowWaitService(0.01)
    owner = Dispatcher(
        cut_off,  # type: ignore[arg-type]
        cut_service,
        tenant=tenant,
        owner="cut-off",
        config=DispatcherConfig(lease_seconds=1.0, idle_poll=0.02),
    )
    # The taker polls at the default idle interval (1 s): when it takes a lapsed lease
    # over, it was woken by the lease's end, which the next-due query counts.
    taker = Dispatcher(
        pool,
        taker_service,
        tenant=tenant,
        owner="taker",
        config=DispatcherConfig(lease_seconds=1.0),
    )
    owner_task = await _running(owner)
    await asyncio.wait_for(cut_service.started.wait(), 10)
    cut_off.down = down
    # No renewal can have happened yet (the first is due 0.25 s after the claim): the
    # lease ends where the claim put it.
    lease_end = await _lease_end(pool, ref)
    taker_task = await _running(taker)
    try:
        await eventually(lambda: states(pool, [ref]), lambda s: s == ["delivered"] * 10, timeout=20)
    finally:
        await _stop((owner, owner_task), (taker, taker_task))
    assert owner.renewals == 0
    return owner, cut_service, taker_service, lease_end, ref


async def test_an_owner_whose_renewals_fail_stops_at_its_guard_and_gives_back(
    store: Store, pool: asyncpg.Pool
) -> None:
    # Renewals (pool.acquire) and claims (pool.fetch) fail; recording still works.
    _, cut_service, taker_service, lease_end, ref = await _cut_off_mid_claim(
        store, pool, {"acquire", "fetch"}
    )
    # It sent in order until 80% of the lease after its claim, abandoned the signal then
    # in flight, recorded what it had sent and gave the rest back at once (with a wake).
    sent = cut_service.completed()
    assert 1 <= len(sent) < 10 and sent == list(range(1, len(sent) + 1))
    assert [s["sequence"] for s in cut_service.sends if "abandoned" in s] == [len(sent) + 1]
    owner_done = cut_service.last_activity()
    assert owner_done < lease_end - 0.1
    # The taker went on from there: no overlap, and nothing sent twice.
    assert min(s["start"] for s in taker_service.sends) >= owner_done
    assert taker_service.completed() == list(range(len(sent) + 1, 11))
    rows = await deliveries(pool, ref)
    assert [(r["state"], r["attempts"]) for r in rows] == [("delivered", 1)] * 10


async def test_an_owner_cut_off_from_the_database_never_overlaps_the_taker(
    store: Store, pool: asyncpg.Pool
) -> None:
    _, cut_service, taker_service, lease_end, _ = await _cut_off_mid_claim(store, pool, {"*"})
    # It sent in order and stopped (at its first failed record, at the latest at its
    # guard), well before its lease ended.
    sent = cut_service.completed()
    assert 1 <= len(sent) < 10 and sent == list(range(1, len(sent) + 1))
    owner_done = cut_service.last_activity()
    assert owner_done < lease_end - 0.1
    # The taker started only once the lease had lapsed, and soon after it (woken by the
    # lease's end, not by its 1 s idle poll). It sent everything in order: what the owner
    # sent but could not record is a repeat the workflow helper drops.
    taker_first = min(s["start"] for s in taker_service.sends)
    assert owner_done < lease_end <= taker_first + 0.05
    assert taker_first < lease_end + 0.5
    assert taker_service.completed() == list(range(1, 11))


async def test_renewal_extends_only_the_owners_live_leases(
    store: Store, pool: asyncpg.Pool
) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-renew")
    await append_inputs(store, ref, [1, 2, 3])
    claimed = await outbox.claim(
        pool, owner="mine", tenant=tenant, lease_seconds=30, max_streams=10, per_stream=10
    )
    ids = [d.delivery_id for d in claimed[ref.stream_pk]]
    # One lapsed, one delivered, one live: only the live one is renewed.
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET lease_expires_at = now() - interval '1 s'"
        " WHERE delivery_id = $1",
        ids[0],
    )
    # The delivery module names a delivery by its stream and sequence.
    stream, sequences = ref.stream_pk, [d.event.sequence for d in claimed[ref.stream_pk]]
    await outbox.mark_delivered(pool, stream, sequences[1:2])
    held = {stream: sequences}
    async with pool.acquire() as conn:
        renewed = await outbox.renew(conn, held, owner="mine", lease_seconds=5)
        assert renewed == {stream: {sequences[2]}}
        taken = await outbox.renew(conn, held, owner="someone else", lease_seconds=5)
        assert taken == {stream: set()}
        # Named with another stream, the rows are not found: each statement is its stream's.
        elsewhere = await outbox.renew(conn, {0: sequences}, owner="mine", lease_seconds=5)
        assert elsewhere == {0: set()}
    left = await pool.fetchval(
        "SELECT extract(epoch FROM lease_expires_at - now())"
        "  FROM workflow_streams.input_deliveries WHERE delivery_id = $1",
        ids[2],
    )
    assert 4 < float(left) <= 5


async def test_one_renewal_renews_each_held_stream_by_its_own_statement(
    store: Store, pool: asyncpg.Pool
) -> None:
    """Several streams, their sequences the same: one call (one statement per stream, in
    one round trip) renews each stream's rows and says which of them it renewed."""
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    refs = [await input_stream(store, tenant, f"run-renew-{i}") for i in range(2)]
    for ref in refs:
        await append_inputs(store, ref, [1, 2])
    claimed = await outbox.claim(
        pool, owner="mine", tenant=tenant, lease_seconds=30, max_streams=10, per_stream=10
    )
    held = {ref.stream_pk: [d.event.sequence for d in claimed[ref.stream_pk]] for ref in refs}
    assert list(held.values()) == [[1, 2], [1, 2]]
    await outbox.mark_delivered(pool, refs[1].stream_pk, [1])
    async with pool.acquire() as conn:
        renewed = await outbox.renew(conn, held, owner="mine", lease_seconds=5)
    assert renewed == {refs[0].stream_pk: {1, 2}, refs[1].stream_pk: {2}}
    left = await pool.fetch(
        "SELECT stream_pk, sequence, extract(epoch FROM lease_expires_at - now()) AS left"
        "  FROM workflow_streams.input_deliveries WHERE stream_pk = ANY($1::bigint[])"
        "   AND lease_owner IS NOT NULL",
        [ref.stream_pk for ref in refs],
    )
    assert len(left) == 3 and all(4 < float(r["left"]) <= 5 for r in left)


async def test_a_release_on_stop_wakes_the_other_dispatchers(
    store: Store, pool: asyncpg.Pool, database_url: str
) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-release")
    await append_inputs(store, ref, [1, 2])
    claimed = await outbox.claim(
        pool, owner="leaving", tenant=tenant, lease_seconds=30, max_streams=10, per_stream=10
    )
    heard: list[str] = []
    listener = await asyncpg.connect(database_url)
    try:
        await listener.add_listener("workflow_streams", lambda *args: heard.append(args[3]))
        stream, sequences = ref.stream_pk, [d.event.sequence for d in claimed[ref.stream_pk]]
        assert await outbox.release(pool, stream, sequences[:1], owner="leaving") == 1
        assert await outbox.release(pool, stream, sequences, owner="leaving", wake=True) == 1
        assert await outbox.release(pool, stream, sequences, owner="leaving", wake=True) == 0
        await eventually(lambda: asyncio.sleep(0, list(heard)), lambda h: h != [])
        await pool.execute("SELECT pg_notify('workflow_streams', 'end')")
        await eventually(lambda: asyncio.sleep(0, list(heard)), lambda h: h[-1:] == ["end"])
    finally:
        await listener.close()
    # Only the release with a wake that gave something back announced it; stream 0 is
    # what the hub hands every dispatcher (process/dispatcher.py).
    assert heard == ["d0", "end"]
