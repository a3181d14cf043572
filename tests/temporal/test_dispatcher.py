"""The input dispatcher on real Postgres: order per stream, exactly-once between two
dispatchers, backoff, lease takeover (fake wait service: a unit test of the claim
logic), and a completed or missing workflow ending as `dead` (real Temporal)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections import defaultdict

import asyncpg
from temporalio.client import Client

from ductor_streams.definitions import parse_definition
from ductor_streams.delivery import DeliveryFailed, Dispatcher, DispatcherConfig, InputEvent, outbox
from ductor_streams.store import Store, StreamKey, StreamRef
from tests.temporal.conftest import WorkerFactory
from tests.temporal.polling import eventually
from tests.temporal.support import append_inputs, deliveries, running_dispatcher, stream_ref
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
    dispatcher = Dispatcher(pool, wait, tenant=tenant, owner="solo", config=FAST)
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
    started = time.monotonic()
    assert await dispatcher.run_once() == 2
    rows = await deliveries(pool, ref)
    assert [(r["state"], r["attempts"], r["lease_owner"]) for r in rows] == [
        ("retrying", 1, None),
        ("pending", 0, None),
    ]
    assert rows[0]["last_error"].startswith("temporal unreachable: ")
    assert time.monotonic() - started < 15
