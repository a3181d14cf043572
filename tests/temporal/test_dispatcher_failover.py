"""Two `ductor-streams workers` dispatchers at once, one SIGKILLed while it holds leases:
every input still reaches its workflow exactly once, in order, and no row is left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest
from temporalio.client import Client

from ductor_streams.config import Settings
from ductor_streams.store import Store
from tests.support.server import settings_env
from tests.temporal.conftest import WorkerFactory
from tests.temporal.polling import eventually
from tests.temporal.support import WorkersProcess, append_inputs, deliveries, stream_ref
from tests.temporal.workflows import CollectInput, CollectResult, CollectWorkflow

RUNS = 4
PER_RUN = 60


@pytest.mark.timeout(180)
async def test_sigkilled_dispatcher_is_taken_over_without_loss_or_repeat(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    pool: asyncpg.Pool,
    wf_settings: Settings,
    tmp_path: Path,
) -> None:
    env = {
        **settings_env(wf_settings),
        "DUCTOR_STREAMS_DELIVERY_LEASE_SECONDS": "2",
        "DUCTOR_STREAMS_DELIVERY_BATCH": "5",
        # Each claims at most 2 of the 4 streams per round, so both take part: with no
        # cap, one dispatcher could claim every stream round after round and deliver
        # everything before the other ever held a lease (it did once in CI).
        "DUCTOR_STREAMS_DELIVERY_STREAMS": "2",
    }
    doomed = WorkersProcess({**env, "DUCTOR_STREAMS_DELIVERY_OWNER": "doomed"}, tmp_path / "a.log")
    steady = WorkersProcess({**env, "DUCTOR_STREAMS_DELIVERY_OWNER": "steady"}, tmp_path / "b.log")
    run_ids = [f"{run_id}-{i}" for i in range(RUNS)]
    async with make_worker([CollectWorkflow]):
        handles = [
            await wf_client.start_workflow(
                CollectWorkflow.run, CollectInput(expect=PER_RUN), id=r, task_queue=task_queue
            )
            for r in run_ids
        ]
        refs = [await stream_ref(store, wf_settings.tenant, r, "input") for r in run_ids]
        try:
            doomed.start()
            steady.start()
            await asyncio.gather(doomed.started(), steady.started())
            # Half once both run (one started first could otherwise take a backlog
            # alone), the rest after the kill.
            for ref in refs:
                await append_inputs(store, ref, list(range(0, PER_RUN // 2)))

            async def leased_by_doomed() -> int:
                return int(
                    await pool.fetchval(
                        "SELECT count(*) FROM workflow_streams.input_deliveries"
                        " WHERE lease_owner = 'doomed' AND state IN ('pending', 'retrying')"
                        "   AND stream_pk = ANY($1)",
                        [r.stream_pk for r in refs],
                    )
                )

            await eventually(leased_by_doomed, lambda n: n > 0, interval=0.002, what="a lease")
            doomed.kill()  # SIGKILL while it holds leases: no cleanup of any kind
            stranded = await leased_by_doomed()
            for ref in refs:
                await append_inputs(store, ref, list(range(PER_RUN // 2, PER_RUN)))
            results = await asyncio.wait_for(
                asyncio.gather(*(h.result() for h in handles)), timeout=120
            )
        finally:
            doomed.stop()
            steady.stop()
    expected = CollectResult(list(range(1, PER_RUN + 1)), list(range(PER_RUN)), 1)
    assert results == [expected] * RUNS
    for ref in refs:
        rows = await deliveries(pool, ref)
        assert [(r["sequence"], r["state"], r["lease_owner"]) for r in rows] == [
            (n, "delivered", None) for n in range(1, PER_RUN + 1)
        ]
    print(f"stranded leases at kill: {stranded}")
