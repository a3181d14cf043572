"""A Temporal worker in a process of its own, traced as an application would configure it:
``python -m tests.temporal.traced_worker_process <task queue>`` runs CollectWorkflow with
the StreamsPlugin, settings (the OTEL_* variables included) from the environment."""

from __future__ import annotations

import asyncio
import sys

from temporalio.worker import Worker

from ductor_streams import temporal_connection
from ductor_streams.config import Settings
from ductor_streams.plugin import StreamsPlugin
from tests.temporal.conftest import strict_runner
from tests.temporal.workflows import CollectWorkflow


async def main(task_queue: str) -> None:
    settings = Settings.from_env()
    plugin = StreamsPlugin(settings)
    client = await temporal_connection.connect(settings, plugins=[plugin])
    worker = Worker(
        client, task_queue=task_queue, workflows=[CollectWorkflow], workflow_runner=strict_runner()
    )
    traced = any(type(i).__name__ == "StreamsTracingInterceptor" for i in plugin.interceptors or [])
    print(f"traced worker polling (tracing {'on' if traced else 'off'})", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
