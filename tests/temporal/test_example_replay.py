"""The examples' workflows replay deterministically from their histories (the Temporal
Replayer), including the agent whose answers are streamed from its activity."""

from __future__ import annotations

import asyncpg
import pytest
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from ductor_streams.config import Settings
from ductor_streams.plugin import StreamsPlugin
from ductor_streams.store import Store, encode_batch
from examples.workflows.agent import AgentInput, AgentWorkflow, draft_answer
from examples.workflows.echo import EchoWorkflow
from tests.temporal.conftest import WorkerFactory, strict_runner
from tests.temporal.polling import eventually
from tests.temporal.support import running_dispatcher, stream_ref


@pytest.mark.timeout(120)
async def test_echo_and_agent_histories_replay(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    pool: asyncpg.Pool,
    wf_settings: Settings,
    plugin: StreamsPlugin,
) -> None:
    echo_id, agent_id = f"{run_id}-echo", f"{run_id}-agent"
    async with (
        make_worker([EchoWorkflow, AgentWorkflow], activities=[draft_answer]),
        running_dispatcher(pool, wf_client, wf_settings.tenant),
    ):
        echo = await wf_client.start_workflow(EchoWorkflow.run, id=echo_id, task_queue=task_queue)
        agent = await wf_client.start_workflow(
            AgentWorkflow.run,
            AgentInput(reply_timeout_s=2.0, turns_per_run=1),
            id=agent_id,
            task_queue=task_queue,
        )
        echo_input = await stream_ref(store, wf_settings.tenant, echo_id, "input")
        await store.append(echo_input, encode_batch(["a", {"b": 1}, {"done": True}]))
        messages = await stream_ref(store, wf_settings.tenant, agent_id, "messages")
        await store.append(messages, encode_batch([{"text": "one"}, {"text": "two"}]))
        assert await echo.result() == 2
        assert await agent.result() == 2
    histories: list[WorkflowHistory] = [await echo.fetch_history()]

    async def agent_runs() -> list[str]:
        query = f"WorkflowId = '{agent_id}'"
        return [e.run_id async for e in wf_client.list_workflows(query)]

    # Every run of the agent (it continued as new after each turn): two turns, then the
    # timeout. Visibility may lag the runs by a moment.
    runs = await eventually(agent_runs, lambda r: len(r) == 3, what="three agent runs")
    for agent_run in runs:
        handle = wf_client.get_workflow_handle(agent_id, run_id=agent_run)
        histories.append(await handle.fetch_history())
    replayer = Replayer(
        workflows=[EchoWorkflow, AgentWorkflow],
        plugins=[plugin],
        workflow_runner=strict_runner(),
    )
    for history in histories:
        await replayer.replay_workflow(history)  # raises on any nondeterminism
