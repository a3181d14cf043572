"""EchoWorkflow: echoes every input record to the output stream.

Started by type name ``EchoWorkflow`` with no arguments on task queue
``ductor-streams-examples``; the workflow ID is the run ID of its streams. It creates
input stream ``input`` and output stream ``output``; for each input record it appends
``{"echo": <payload>}`` to ``output``, in order; on ``{"done": true}`` it closes
``output`` and returns how many records it echoed.

Run its worker from the repository root: ``python -m examples.workflows.echo``
(``DUCTOR_STREAMS_TEMPORAL_ADDRESS``, default ``localhost:7233``, and
``DUCTOR_STREAMS_DATABASE_URL`` say where Temporal and Postgres are).
"""

from __future__ import annotations

import json
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from ductor_streams.plugin.workflow import Streams

TASK_QUEUE = "ductor-streams-examples"


# Temporal refuses payloads over 2 MB (and warns from 512 KB): one append carries at
# most about this much, so a batch of large records goes out in several appends.
MAX_APPEND_BYTES = 256 * 1024


def is_done(payload: Any) -> bool:
    return isinstance(payload, dict) and payload.get("done") is True


def in_groups(payloads: list[Any], max_bytes: int = MAX_APPEND_BYTES) -> list[list[Any]]:
    """Consecutive groups, each at most ``max_bytes`` of JSON (or a single payload)."""
    groups: list[list[Any]] = []
    size = 0
    for payload in payloads:
        length = len(json.dumps(payload, separators=(",", ":")))
        if groups and size + length <= max_bytes:
            groups[-1].append(payload)
            size += length
        else:
            groups.append([payload])
            size = length
    return groups


@workflow.defn(name="EchoWorkflow")
class EchoWorkflow:
    def __init__(self) -> None:
        self.streams = Streams()

    @workflow.run
    async def run(self) -> int:
        await self.streams.create("input", "input")
        await self.streams.create("output", "output")
        echoed = 0
        while True:
            # Everything that is ready goes out in one append: one activity per batch,
            # not per record, and still in order.
            batch = await self.streams.next_batch("input")
            echoes: list[Any] = []
            done = False
            for record in batch:
                if is_done(record.payload):
                    done = True
                    break
                echoes.append({"echo": record.payload})
            for group in in_groups(echoes):
                await self.streams.append_many("output", group)
                echoed += len(group)
            if done:
                await self.streams.close("output")
                await self.streams.flush_acks()
                return echoed


async def main() -> None:
    from examples.run_worker import run_worker

    await run_worker([EchoWorkflow])


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
