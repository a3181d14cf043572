"""The input dispatcher on real Postgres: order per stream, exactly-once between two
dispatchers, backoff, lease takeover (fake wait service: a unit test of the claim
logic), and a completed or missing workflow ending as `dead` (real Temporal)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client

from ductor_streams.delivery import DeliveryFailed, Dispatcher, DispatcherConfig, InputEvent, outbox
from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.store import Store, StreamKey, StreamRef
from tests.temporal.conftest import WorkerFactory
from tests.temporal.polling import eventually
from tests.temporal.support import (
    append_inputs,
    deliveries,
    running_dispatcher,
    settled,
    stream_ref,
)
from tests.temporal.workflows import QuickWorkflow

FAST = DispatcherConfig(idle_poll=0.02, base_delay=0.05, max_delay=0.2, per_stream=7)


class RecordingWaitService:
    """Records every delivery; optionally fails chosen (stream, sequence) attempts."""

    def __init__(self, fail: dict[tuple[str, int], int] | None = None, delay: float = 0) -> None:
        self.calls: list[tuple[str, str, int, float]] = []
        self._fail = dict(fail or {})
        self._delay = delay

    async def deliver(self, event: InputEvent) -> None:
        if self._delay:
            await asyncio.sleep(self._delay)
        key = (event.run_id, event.sequence)
        if self._fail.get(key, 0) > 0:
            self._fail[key] -= 1
            raise DeliveryFailed("injected: temporal unavailable")
        self.calls.append((event.run_id, event.stream_id, event.sequence, time.monotonic()))

    def by_run(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        for run_id, _stream, sequence, _at in self.calls:
            out[run_id].append(sequence)
        return out


async def input_stream(store: Store, tenant: str, run_id: str) -> StreamRef:
    definition = parse_definition(
        {"stream_id": "input", "direction": "input"},
        region="local",
        object_store_regions=frozenset(),
    )
    ref, _ = await store.create_stream(StreamKey(tenant, run_id, "input"), definition)
    return ref


async def states(pool: asyncpg.Pool, refs: list[StreamRef]) -> list[str]:
    rows = await pool.fetch(
        "SELECT state FROM workflow_streams.input_deliveries WHERE stream_pk = ANY($1)",
        [r.stream_pk for r in refs],
    )
    return [r["state"] for r in rows]


async def test_two_dispatchers_deliver_each_record_once_in_order(
    store: Store, pool: asyncpg.Pool
) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    refs = [await input_stream(store, tenant, f"run-{i}") for i in range(6)]
    wait = RecordingWaitService(delay=0.001)
    # Each claims at most 3 of the 6 streams per round, so whichever polls second always
    # finds streams the other holds no lease on: both take part however fast the appends
    # are (with no cap, one dispatcher could take every stream round after round).
    shared = dataclasses.replace(FAST, max_streams=3)
    first = Dispatcher(pool, wait, tenant=tenant, owner="one", config=shared)
    second = Dispatcher(pool, wait, tenant=tenant, owner="two", config=shared)
    tasks = [asyncio.create_task(d.run()) for d in (first, second)]
    try:
        # Appends race with both dispatchers' claims.
        for chunk in range(4):
            await asyncio.gather(
                *(
                    append_inputs(store, ref, list(range(chunk * 10, chunk * 10 + 10)))
                    for ref in refs
                )
            )
        await eventually(
            lambda: states(pool, refs),
            lambda s: s == ["delivered"] * 240,
            what="all delivered",
        )
    finally:
        for d in (first, second):
            d.stop()
        await asyncio.gather(*tasks)
    assert dict(wait.by_run()) == {f"run-{i}": list(range(1, 41)) for i in range(6)}
    assert first.delivered > 0 and second.delivered > 0
    assert first.delivered + second.delivered == 240


async def test_failed_attempt_backs_off_and_blocks_later_records(
    store: Store, pool: asyncpg.Pool
) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-retry")
    await append_inputs(store, ref, [1, 2, 3])
    wait = RecordingWaitService(fail={("run-retry", 1): 2})
    # A backoff of at least 0.25 s (FAST's 25-50 ms was shorter than the two claims
    # below take on a busy machine, and the second one then found the row due).
    backoff = dataclasses.replace(FAST, base_delay=0.5, max_delay=0.5)
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="solo", config=backoff)
    assert await dispatcher.run_once() == 3  # claimed all three, first one failed
    rows = await deliveries(pool, ref)
    assert [(r["state"], r["attempts"], r["lease_owner"]) for r in rows] == [
        ("retrying", 1, None),
        ("pending", 0, None),
        ("pending", 0, None),
    ]
    assert rows[0]["last_error"] == "injected: temporal unavailable"
    assert wait.calls == []
    # Backing off: nothing is claimable until next_attempt_at, not even sequence 2.
    assert await dispatcher.run_once() == 0
    task = asyncio.create_task(dispatcher.run())
    try:
        await eventually(
            lambda: deliveries(pool, ref),
            lambda rs: [r["state"] for r in rs] == ["delivered"] * 3,
            what="delivered after retries",
        )
    finally:
        dispatcher.stop()
        await task
    rows = await deliveries(pool, ref)
    assert [r["attempts"] for r in rows] == [3, 1, 1]
    assert [r["last_error"] for r in rows] == [None, None, None]
    assert [c[2] for c in wait.calls] == [1, 2, 3]


async def test_expired_lease_is_taken_over(store: Store, pool: asyncpg.Pool) -> None:
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-lease")
    await append_inputs(store, ref, [1, 2])
    # A dispatcher that claimed and then died: its lease blocks the stream until expiry.
    claimed_at = time.monotonic()
    claimed = await outbox.claim(
        pool, owner="ghost", tenant=tenant, lease_seconds=0.5, max_streams=10, per_stream=10
    )
    assert [d.event.sequence for d in claimed[ref.stream_pk]] == [1, 2]
    wait = RecordingWaitService()
    survivor = Dispatcher(pool, wait, tenant=tenant, owner="survivor", config=FAST)
    assert await survivor.run_once() == 0
    task = asyncio.create_task(survivor.run())
    try:
        await eventually(lambda: states(pool, [ref]), lambda s: s == ["delivered"] * 2)
    finally:
        survivor.stop()
        await task
    assert [c[2] for c in wait.calls] == [1, 2]
    assert wait.calls[0][3] >= claimed_at + 0.5


async def test_completed_workflow_deliveries_end_dead_with_reason(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    pool: asyncpg.Pool,
    wf_settings,  # type: ignore[no-untyped-def]
) -> None:
    async with make_worker([QuickWorkflow]):
        handle = await wf_client.start_workflow(QuickWorkflow.run, id=run_id, task_queue=task_queue)
        assert await handle.result() == "done"
    ref = await stream_ref(store, wf_settings.tenant, run_id, "input")
    await append_inputs(store, ref, [1, 2])
    async with running_dispatcher(pool, wf_client, wf_settings.tenant) as dispatcher:
        rows = await eventually(
            lambda: deliveries(pool, ref),
            lambda rs: [r["state"] for r in rs] == ["dead", "dead"],
            what="dead deliveries",
        )
        await append_inputs(store, ref, [3])
        rows = await eventually(
            lambda: deliveries(pool, ref),
            lambda rs: [r["state"] for r in rs] == ["dead"] * 3,
            what="third dead",
        )
        # Nothing is retried: more rounds change nothing.
        for _ in range(3):
            assert await dispatcher.run_once() == 0
    rows = await deliveries(pool, ref)
    reason = f"workflow {run_id!r} has completed"
    assert [(r["state"], r["attempts"], r["last_error"]) for r in rows] == [
        ("dead", 1, reason),
        ("dead", 0, reason),  # went down with the first: same run, never attempted
        ("dead", 1, reason),
    ]


async def test_missing_workflow_waits_out_the_grace_then_dead(
    wf_client: Client,
    store: Store,
    pool: asyncpg.Pool,
    wf_settings,  # type: ignore[no-untyped-def]
) -> None:
    run_id = f"never-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, wf_settings.tenant, run_id)
    await append_inputs(store, ref, [1])
    async with running_dispatcher(
        pool, wf_client, wf_settings.tenant, not_found_grace=60.0, base_delay=5.0
    ):
        rows = await eventually(
            lambda: deliveries(pool, ref), lambda rs: rs[0]["state"] == "retrying"
        )
    assert rows[0]["last_error"] == f"run not found: no workflow with ID {run_id!r}"
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET next_attempt_at = now() WHERE stream_pk = $1",
        ref.stream_pk,
    )
    async with running_dispatcher(pool, wf_client, wf_settings.tenant, not_found_grace=0.0):
        rows = await eventually(lambda: deliveries(pool, ref), lambda rs: rs[0]["state"] == "dead")
    assert (rows[0]["attempts"], rows[0]["last_error"]) == (2, f"no workflow with ID {run_id!r}")


async def test_unreachable_temporal_is_a_retryable_failure(
    store: Store, pool: asyncpg.Pool
) -> None:
    from ductor_streams.delivery.temporal import TemporalWaitService
    from tests.support.server import free_port

    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-offline")
    await append_inputs(store, ref, [1, 2])
    wait = TemporalWaitService.connecting(f"127.0.0.1:{free_port()}", "default")
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="offline", config=FAST)
    # An unreachable Temporal is an error per delivery, not a hang.
    assert await asyncio.wait_for(dispatcher.run_once(), 60) == 2
    rows = await deliveries(pool, ref)
    assert [(r["state"], r["attempts"], r["lease_owner"]) for r in rows] == [
        ("retrying", 1, None),
        ("pending", 0, None),
    ]
    assert rows[0]["last_error"].startswith("temporal unreachable: ")


# Long enough that a record waiting for the idle poll or a lapsed lease fails the test.
PATIENT = DispatcherConfig(idle_poll=30.0, lease_seconds=5.0, per_stream=7)


async def one_stream(
    store: Store, pool: asyncpg.Pool, run_id: str
) -> tuple[StreamRef, RecordingWaitService, Dispatcher]:
    """An input stream of a tenant of its own, and a PATIENT dispatcher for that tenant
    recording what it delivers (not yet running)."""
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, run_id)
    wait = RecordingWaitService()
    return ref, wait, Dispatcher(pool, wait, tenant=tenant, owner="one", config=PATIENT)


@contextlib.asynccontextmanager
async def running(dispatcher: Dispatcher) -> AsyncIterator[Dispatcher]:
    """``dispatcher`` runs while the block does."""
    task = asyncio.create_task(dispatcher.run())
    try:
        yield dispatcher
    finally:
        dispatcher.stop()
        await task


class GatedWaitService(RecordingWaitService):
    """Records deliveries; each waits until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.gate = asyncio.Event()

    async def deliver(self, event: InputEvent) -> None:
        self.started.set()
        await self.gate.wait()
        await super().deliver(event)


@pytest.mark.parametrize("wake", ["any", "its_stream"])
async def test_a_record_appended_while_its_stream_is_delivered_goes_out_at_once(
    quiet_store: Store, quiet_pool: asyncpg.Pool, wake: str
) -> None:
    # Its stream's head is leased to the dispatcher while record 1 is signalled, so a
    # claim cannot take record 2 then: the dispatcher must claim again when the stream
    # finishes, not wait for the idle poll (30 s) or a lease (5 s). A wake that names
    # the stream (what serve's own appends and LISTEN give) waits for that end instead
    # of sending a claim that finds nothing; a bare wake sends it.
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(quiet_store, tenant, "run-during")
    wait = GatedWaitService()
    dispatcher = Dispatcher(quiet_pool, wait, tenant=tenant, owner="one", config=PATIENT)
    async with running(dispatcher):
        await settled(dispatcher)
        before = dispatcher.claims
        everywhere = dispatcher.claims_everywhere
        await append_inputs(quiet_store, ref, [1])
        dispatcher.notify(ref.stream_pk)
        await asyncio.wait_for(wait.started.wait(), 5)
        await append_inputs(quiet_store, ref, [2])
        dispatcher.notify(ref.stream_pk if wake == "its_stream" else None)
        if wake == "any":  # its claim runs while record 1 is held: it finds nothing
            await eventually(
                lambda: _claims(dispatcher), lambda n: n >= before + 2, what="the wake's claim"
            )
        wait.gate.set()
        await eventually(
            lambda: states(quiet_pool, [ref]),
            lambda s: s == ["delivered"] * 2,
            timeout=3,
            what="record 2 delivered right after record 1",
        )
        claims = dispatcher.claims - before
    assert [c[2] for c in wait.calls] == [1, 2]
    # Record 1's claim, then record 2's once record 1's stream ended; a bare wake's claim
    # during the delivery found nothing.
    assert claims == (2 if wake == "its_stream" else 3), claims
    # Named wakes, and a stream that saw only its own records meanwhile: each claim
    # looked at that stream alone (test_named_claims.py). Only the bare wake's claim
    # looked everywhere: the one when the stream ended looked at that stream.
    assert dispatcher.claims_everywhere - everywhere == (0 if wake == "its_stream" else 1)


async def test_records_one_at_a_time_cost_one_claim_each(
    quiet_store: Store, quiet_pool: asyncpg.Pool
) -> None:
    # Each record's wake claims it; its stream then ends clean with nothing new since,
    # so no second claim follows (before: one more per record, and a due-time query).
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(quiet_store, tenant, "run-single")
    wait = RecordingWaitService()
    dispatcher = Dispatcher(quiet_pool, wait, tenant=tenant, owner="one", config=PATIENT)
    async with running(dispatcher):
        await eventually(lambda: _claims(dispatcher), lambda n: n >= 1, what="first claim")
        before = dispatcher.claims
        for sequence in range(1, 11):
            await append_inputs(quiet_store, ref, [sequence])
            dispatcher.notify(ref.stream_pk)
            await eventually(
                lambda: states(quiet_pool, [ref]),
                lambda s: s == ["delivered"] * sequence,  # noqa: B023 (awaited here)
                timeout=3,
                what=f"record {sequence} delivered",
            )
        claims = dispatcher.claims - before
    assert [c[2] for c in wait.calls] == list(range(1, 11))
    assert claims == 10, claims


async def test_a_claimed_record_is_signalled_in_the_claims_own_turn_of_the_loop(
    store: Store, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not from a task queued behind whatever this turn has queued already (the HTTP
    # answers, other wakes): that wait was in every input record's path, and long in the
    # tail (docs/temporal.md, "Input delivery").
    ref, wait, dispatcher = await one_stream(store, pool, "run-turn")
    seen_next_turn: list[int] = []
    claim = dispatcher._claim

    async def claim_then_look(max_streams: int, named: int | None = None) -> Any:
        claimed = await claim(max_streams, named)
        # Runs in the next turn: by then the signal has been sent, or it has not.
        asyncio.get_running_loop().call_soon(lambda: seen_next_turn.append(len(wait.calls)))
        return claimed

    monkeypatch.setattr(dispatcher, "_claim", claim_then_look)
    await append_inputs(store, ref, [1])
    async with running(dispatcher):
        await eventually(lambda: _delivered(wait), lambda n: n == 1, what="the signal")
    assert seen_next_turn[0] == 1


async def _delivered(wait: RecordingWaitService) -> int:
    return len(wait.calls)


async def test_a_stream_longer_than_a_claim_share_goes_on_at_once(
    store: Store, pool: asyncpg.Pool
) -> None:
    # A claim leases 7 of the stream's 10 records (per_stream): the other 3 are claimed
    # as soon as those are delivered, with no new wake.
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-long")
    wait = RecordingWaitService()
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="one", config=PATIENT)
    await append_inputs(store, ref, list(range(10)))
    async with running(dispatcher):
        await eventually(
            lambda: states(pool, [ref]),
            lambda s: s == ["delivered"] * 10,
            timeout=3,
            what="all 10 delivered",
        )
    assert [c[2] for c in wait.calls] == list(range(1, 11))


async def test_a_failed_attempt_is_retried_at_its_backoff_not_at_the_idle_poll(
    store: Store, pool: asyncpg.Pool
) -> None:
    # The stream ends unclean (a retry scheduled 0.05-0.1 s on): the dispatcher looks
    # again, and waits for that due time rather than the idle poll or its old lease.
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    ref = await input_stream(store, tenant, "run-retry")
    wait = RecordingWaitService(fail={("run-retry", 1): 1})
    config = dataclasses.replace(PATIENT, base_delay=0.1)
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="one", config=config)
    await append_inputs(store, ref, [1])
    async with running(dispatcher):
        await eventually(
            lambda: states(pool, [ref]),
            lambda s: s == ["delivered"],
            timeout=3,
            what="record 1 delivered on its second attempt",
        )
    assert [c[2] for c in wait.calls] == [1]


async def test_a_stream_left_for_want_of_a_slot_is_claimed_when_one_frees(
    store: Store, pool: asyncpg.Pool
) -> None:
    # One slot, two streams due: the second is claimed when the first one's delivery
    # frees the slot, with no new wake.
    tenant = f"d-{uuid.uuid4().hex[:8]}"
    refs = [await input_stream(store, tenant, f"run-slot-{i}") for i in range(2)]
    wait = RecordingWaitService()
    config = dataclasses.replace(PATIENT, max_streams=1)
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="one", config=config)
    for ref in refs:
        await append_inputs(store, ref, [1, 2])
    async with running(dispatcher):
        await eventually(
            lambda: states(pool, refs),
            lambda s: s == ["delivered"] * 4,
            timeout=3,
            what="both streams delivered",
        )
    assert dict(wait.by_run()) == {"run-slot-0": [1, 2], "run-slot-1": [1, 2]}


async def _claims(dispatcher: Dispatcher) -> int:
    return dispatcher.claims
