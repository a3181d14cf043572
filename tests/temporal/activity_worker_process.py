"""A worker in a process of its own, for tests that kill it: ``python -m
tests.temporal.activity_worker_process <task queue>`` runs the activity-stream test
activities with the StreamsPlugin (settings from the environment) until killed."""

from __future__ import annotations

import asyncio
import sys

from temporalio.worker import Worker

from ductor_streams import temporal_connection
from ductor_streams.config import Settings
from ductor_streams.plugin import StreamsPlugin
from tests.temporal.stream_activities import read_messages, write_tokens


async def main(task_queue: str) -> None:
    settings = Settings.from_env()
    client = await temporal_connection.connect(settings, plugins=[StreamsPlugin(settings)])
    worker = Worker(client, task_queue=task_queue, activities=[read_messages, write_tokens])
    print("activity worker polling", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
