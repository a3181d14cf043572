"""The agent example: streamed chunks, continue-as-new every two turns, the reply timeout."""

from __future__ import annotations

import asyncpg
import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from ductor_streams.config import Settings
from ductor_streams.store import Store, StreamKey, encode_batch
from examples.workflows.agent import AgentInput, AgentWorkflow, draft_answer
from tests.temporal.conftest import WorkerFactory
from tests.temporal.support import output_payloads, running_dispatcher, stream_ref


@pytest.mark.timeout(120)
async def test_agent_turns_continue_as_new_and_time_out(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    pool: asyncpg.Pool,
    wf_settings: Settings,
) -> None:
    async with (
        make_worker([AgentWorkflow], activities=[draft_answer]),
        running_dispatcher(pool, wf_client, wf_settings.tenant),
    ):
        handle = await wf_client.start_workflow(
            AgentWorkflow.run,
            AgentInput(reply_timeout_s=3.0, turns_per_run=2),
            id=run_id,
            task_queue=task_queue,
        )
        messages = await stream_ref(store, wf_settings.tenant, run_id, "messages")
        # All three at once: the third reaches the first run, which continues as new after
        # two turns; the second run must read it back from the store.
        await store.append(
            messages, encode_batch([{"text": "one"}, {"text": "two"}, {"text": "three"}])
        )
        assert await handle.result() == 3
        first = wf_client.get_workflow_handle(run_id, run_id=handle.first_execution_run_id)
        assert (await first.describe()).status == WorkflowExecutionStatus.CONTINUED_AS_NEW
    output = await output_payloads(
        store, await store.get_stream(StreamKey(wf_settings.tenant, run_id, "output"))
    )
    kinds = [(p["type"], p.get("turn")) for p in output]
    chunks = {
        turn: [p["text"] for p in output if p["type"] == "chunk" and p["turn"] == turn]
        for turn in (1, 2, 3)
    }
    assert kinds[:2] == [("chunk", 0), ("waiting", 0)]
    assert [k for k in kinds if k[0] != "chunk"] == [
        ("waiting", 0),
        ("turn_end", 1),
        ("waiting", 1),
        ("turn_end", 2),
        ("waiting", 2),
        ("turn_end", 3),
        ("waiting", 3),
        ("goodbye", None),
    ]
    assert output[-1] == {"type": "goodbye", "reason": "timeout"}
    for turn, word in ((1, "one"), (2, "two"), (3, "three")):
        assert "".join(chunks[turn]).startswith(f"You said: {word}.")
    state = await store.state(messages)
    assert [(c.consumer_id, c.acked_sequence) for c in state.consumers] == [("workflow", 3)]
