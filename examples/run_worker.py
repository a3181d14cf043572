"""Runs a Temporal worker for the examples on task queue ``ductor-streams-examples``.

``python -m examples.run_worker`` runs every example; ``python -m examples.workflows.echo``
only the echo. Configuration comes from the environment (CONTRACT.md section 2):
``DUCTOR_STREAMS_TEMPORAL_ADDRESS`` (default ``localhost:7233``), ``_NAMESPACE``,
``DUCTOR_STREAMS_DATABASE_URL`` and ``_TENANT`` (the activities' store).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.worker import Worker

from ductor_streams.plugin import StreamsPlugin

TASK_QUEUE = "ductor-streams-examples"


def all_workflows() -> list[type]:
    from examples.workflows.agent import AgentWorkflow
    from examples.workflows.echo import EchoWorkflow

    return [EchoWorkflow, AgentWorkflow]


def all_activities() -> list[object]:
    from examples.workflows.agent import draft_answer

    return [draft_answer]


async def run_worker(workflows: Sequence[type] | None = None) -> None:
    """Connect with the StreamsPlugin and poll the examples' task queue until interrupted."""
    client = await Client.connect(
        os.environ.get("DUCTOR_STREAMS_TEMPORAL_ADDRESS", "localhost:7233"),
        namespace=os.environ.get("DUCTOR_STREAMS_TEMPORAL_NAMESPACE", "default"),
        plugins=[StreamsPlugin()],
    )
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=list(workflows or all_workflows()),
        activities=all_activities(),  # type: ignore[arg-type]
    )
    print(f"example worker polling {TASK_QUEUE!r}", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(run_worker())
