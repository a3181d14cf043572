"""Runs a Temporal worker for the examples on task queue ``ductor-streams-examples``.

``python -m examples.run_worker`` runs every example; ``python -m examples.workflows.echo``
only the echo. Configuration comes from the environment (docs/configuration.md), read
by ``Settings.from_env``: Temporal as every client of the project connects
(``DUCTOR_STREAMS_TEMPORAL_ADDRESS``/``_NAMESPACE``, else the standard ``TEMPORAL_*``
variables and profiles with TLS and API keys; docs/temporal.md), ``localhost:7233`` when
none names an address; ``DUCTOR_STREAMS_DATABASE_URL`` and ``_TENANT`` (the activities'
store).
"""

from __future__ import annotations

from collections.abc import Sequence

import uvloop
from temporalio.worker import Worker

from ductor_streams import temporal_connection
from ductor_streams.config import Settings
from ductor_streams.plugin import StreamsPlugin

TASK_QUEUE = "ductor-streams-examples"
DEFAULT_ADDRESS = "localhost:7233"


def all_workflows() -> list[type]:
    from examples.workflows.agent import AgentWorkflow
    from examples.workflows.echo import EchoWorkflow

    return [EchoWorkflow, AgentWorkflow]


def all_activities() -> list[object]:
    from examples.workflows.agent import draft_answer

    return [draft_answer]


async def run_worker(workflows: Sequence[type] | None = None) -> None:
    """Connect with the StreamsPlugin and poll the examples' task queue until interrupted."""
    settings = Settings.from_env()
    if temporal_connection.configured_address(settings) is None:
        settings = settings.with_overrides(temporal_address=DEFAULT_ADDRESS)
    client = await temporal_connection.connect(settings, plugins=[StreamsPlugin(settings)])
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=list(workflows or all_workflows()),
        activities=all_activities(),  # type: ignore[arg-type]
    )
    print(f"example worker polling {TASK_QUEUE!r}", flush=True)
    await worker.run()


if __name__ == "__main__":
    # uvloop: less CPU per streamed record than asyncio's own loop (docs/temporal.md,
    # "Run the worker on uvloop").
    uvloop.run(run_worker())
