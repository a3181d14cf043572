"""The workflow of the failover test (module level, as the sandbox wants it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from ductor_streams.plugin.workflow import Streams


@dataclass
class Followed:
    """The input records the workflow consumed, in order: sequences and payload numbers."""

    sequences: list[int] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)


@workflow.defn
class FollowInputWorkflow:
    """Creates its input stream and consumes it one record at a time until a record
    whose ``n`` is negative; returns what it consumed before that one."""

    @workflow.init
    def __init__(self, stream_id: str) -> None:
        self.streams = Streams(ack_every=5)

    @workflow.run
    async def run(self, stream_id: str) -> Followed:
        await self.streams.create(stream_id, "input")
        followed = Followed()
        while True:
            record = await self.streams.next(stream_id)
            number = int(record.payload["n"])
            if number < 0:
                break
            followed.sequences.append(record.sequence)
            followed.numbers.append(number)
        await self.streams.flush_acks()
        return followed
