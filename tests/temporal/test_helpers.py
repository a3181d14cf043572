"""The workflow helpers against a real Temporal dev server and real Postgres: dedupe,
early arrivals, gap repair from the store, batched acks, idempotent appends under
retries, replay from recorded histories, and Continue-As-New."""

from __future__ import annotations

import asyncpg
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    Replayer,
)

from ductor_streams.activities.models import APPEND
from ductor_streams.config import Settings
from ductor_streams.delivery import INPUT_SIGNAL
from ductor_streams.plugin import StreamsPlugin
from ductor_streams.store import Store, StreamKey
from tests.temporal.conftest import WorkerFactory, strict_runner
from tests.temporal.support import (
    append_inputs,
    deliveries,
    output_payloads,
    running_dispatcher,
    stream_ref,
)
from tests.temporal.workflows import (
    AppendInput,
    AppendWorkflow,
    CollectInput,
    CollectResult,
    CollectWorkflow,
    IterateWorkflow,
)


def signal_arg(sequence: int, n: int, stream_id: str = "input") -> dict[str, object]:
    return {
        "event_id": f"{stream_id}:{sequence}",
        "stream_id": stream_id,
        "sequence": sequence,
        "payload": {"n": n},
        "object": None,
        "appended_at": None,
    }


async def replay(plugin: StreamsPlugin, history: WorkflowHistory, *workflows: type) -> None:
    replayer = Replayer(
        workflows=list(workflows), plugins=[plugin], workflow_runner=strict_runner()
    )
    await replayer.replay_workflow(history)


async def test_repeats_dropped_early_arrivals_held_in_order(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
    plugin: StreamsPlugin,
) -> None:
    async with make_worker([CollectWorkflow]):
        handle = await wf_client.start_workflow(
            CollectWorkflow.run, CollectInput(expect=4), id=run_id, task_queue=task_queue
        )
        ref = await stream_ref(store, wf_settings.tenant, run_id, "input")
        assert await append_inputs(store, ref, [10, 20, 30, 40]) == (1, 4)
        # Out of order and repeated, as a dispatcher takeover or operator retry can.
        for sequence in (2, 1, 1, 4, 2, 3):
            await handle.signal(INPUT_SIGNAL, signal_arg(sequence, sequence * 10))
        result = await handle.result()
        assert result == CollectResult([1, 2, 3, 4], [10, 20, 30, 40], 1)
        assert await handle.query(CollectWorkflow.duplicates_dropped) == 2
        state = await store.state(ref)
        assert [(c.consumer_id, c.acked_sequence) for c in state.consumers] == [("workflow", 4)]
        await replay(plugin, await handle.fetch_history(), CollectWorkflow)


async def test_missing_sequence_is_read_from_the_store(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
    plugin: StreamsPlugin,
) -> None:
    async with make_worker([CollectWorkflow]):
        handle = await wf_client.start_workflow(
            CollectWorkflow.run,
            CollectInput(expect=3, gap_timeout_s=0.3),
            id=run_id,
            task_queue=task_queue,
        )
        ref = await stream_ref(store, wf_settings.tenant, run_id, "input")
        await append_inputs(store, ref, [7, 8, 9])
        # Sequence 2 is never signalled: the helper must fetch it after gap_timeout.
        await handle.signal(INPUT_SIGNAL, signal_arg(3, 9))
        await handle.signal(INPUT_SIGNAL, signal_arg(1, 7))
        result = await handle.result()
        assert result.sequences == [1, 2, 3]
        assert result.payloads == [7, 8, 9]
        history = await handle.fetch_history()
        reads = [
            e
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name
            == "ductor_streams.read"
        ]
        assert len(reads) == 1
        await replay(plugin, history, CollectWorkflow)


class _LoseFirstAppendAnswer(Interceptor):
    """Fails every append activity's first attempt AFTER the append committed: the
    retry must get the original sequences back, not append again."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> object:
        result = await super().execute_activity(input)
        info = activity.info()
        if info.activity_type == APPEND and info.attempt == 1:
            raise ApplicationError("injected: the answer was lost after the commit")
        return result


async def test_append_is_idempotent_under_retries_and_replay(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
    plugin: StreamsPlugin,
) -> None:
    async with make_worker([AppendWorkflow], interceptors=[_LoseFirstAppendAnswer()]):
        handle = await wf_client.start_workflow(
            AppendWorkflow.run,
            AppendInput(batches=[[1, 2, 3], [4], [5, 6]]),
            id=run_id,
            task_queue=task_queue,
        )
        assert await handle.result() == [[1, 3], [4, 4], [5, 6]]
    history = await handle.fetch_history()
    retried = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.attempt == 2
    ]
    assert len(retried) == 3  # each append ran twice
    ref = await store.get_stream(StreamKey(wf_settings.tenant, run_id, "output"))
    assert await output_payloads(store, ref) == [{"n": n} for n in range(1, 7)]
    state = await store.state(ref)
    assert (state.latest_sequence, state.closed) == (6, True)
    await replay(plugin, history, AppendWorkflow)
    # Replay is read-only: still six records.
    assert (await store.state(ref)).latest_sequence == 6


async def test_continue_as_new_keeps_the_position(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    pool: asyncpg.Pool,
    wf_settings: Settings,
    plugin: StreamsPlugin,
) -> None:
    async with (
        make_worker([CollectWorkflow]),
        running_dispatcher(pool, wf_client, wf_settings.tenant),
    ):
        handle = await wf_client.start_workflow(
            CollectWorkflow.run,
            CollectInput(expect=30, can_every=7),
            id=run_id,
            task_queue=task_queue,
        )
        first_run = handle.result_run_id
        ref = await stream_ref(store, wf_settings.tenant, run_id, "input")
        numbers = list(range(100, 130))
        for start, end in ((0, 5), (5, 15), (15, 16), (16, 30)):
            await append_inputs(store, ref, numbers[start:end])
        result = await handle.result()
    assert result.sequences == list(range(1, 31))
    assert result.payloads == numbers
    assert result.runs == 5  # continued as new after 7, 14, 21 and 28 records
    state = await store.state(ref)
    assert [(c.consumer_id, c.acked_sequence) for c in state.consumers] == [("workflow", 30)]
    rows = await deliveries(pool, ref)
    assert [r["state"] for r in rows] == ["delivered"] * 30
    first = wf_client.get_workflow_handle(run_id, run_id=first_run)
    await replay(plugin, await first.fetch_history(), CollectWorkflow)
    await replay(plugin, await handle.fetch_history(), CollectWorkflow)


async def test_iteration_ends_after_the_idle_timeout(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
    plugin: StreamsPlugin,
) -> None:
    async with make_worker([IterateWorkflow]):
        handle = await wf_client.start_workflow(
            IterateWorkflow.run, 3.0, id=run_id, task_queue=task_queue
        )
        ref = await stream_ref(store, wf_settings.tenant, run_id, "input")
        await append_inputs(store, ref, [1, 2, 3])
        for sequence in (1, 2, 3):
            await handle.signal(INPUT_SIGNAL, signal_arg(sequence, sequence))
        assert await handle.result() == [1, 2, 3]
        history = await handle.fetch_history()
    timers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED]
    assert len(timers) >= 1  # the idle timeout is a workflow timer: replay-safe
    await replay(plugin, history, IterateWorkflow)


async def test_shuffled_repeated_signals_arrive_once_in_order(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
) -> None:
    import random

    rng = random.Random(5)
    sends = [s for s in range(1, 31) for _ in range(rng.randint(1, 3))]
    rng.shuffle(sends)
    async with make_worker([CollectWorkflow]):
        handle = await wf_client.start_workflow(
            CollectWorkflow.run,
            CollectInput(expect=30, gap_timeout_s=30.0),  # no store reads: signals only
            id=run_id,
            task_queue=task_queue,
        )
        ref = await stream_ref(store, wf_settings.tenant, run_id, "input")
        await append_inputs(store, ref, list(range(1, 31)))
        for sequence in sends:
            await handle.signal(INPUT_SIGNAL, signal_arg(sequence, sequence))
        result = await handle.result()
        assert result.sequences == list(range(1, 31))
        assert result.payloads == list(range(1, 31))
        assert await handle.query(CollectWorkflow.duplicates_dropped) == len(sends) - 30
