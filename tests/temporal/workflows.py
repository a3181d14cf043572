"""Workflows for the Temporal tests (module level, as the sandbox wants them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from ductor_streams.plugin.workflow import Streams, StreamsSnapshot


@dataclass
class CollectInput:
    """Consume ``expect`` records of input stream ``stream_id`` one at a time; continue
    as new every ``can_every`` records (0: never). Returns the sequences seen, in order."""

    expect: int
    stream_id: str = "input"
    can_every: int = 0
    gap_timeout_s: float = 2.0
    seen: list[int] = field(default_factory=list)
    payloads: list[int] = field(default_factory=list)
    snapshot: StreamsSnapshot | None = None
    run_number: int = 1


@dataclass
class CollectResult:
    sequences: list[int]
    payloads: list[int]
    runs: int


@workflow.defn
class CollectWorkflow:
    @workflow.init
    def __init__(self, request: CollectInput) -> None:
        self.streams = Streams(
            request.snapshot, ack_every=5, gap_timeout=timedelta(seconds=request.gap_timeout_s)
        )
        self.consumed = 0

    @workflow.query
    def duplicates_dropped(self) -> int:
        return self.streams.duplicates_dropped

    @workflow.run
    async def run(self, request: CollectInput) -> CollectResult:
        if request.snapshot is None:
            await self.streams.create(request.stream_id, "input")
        seen, payloads = list(request.seen), list(request.payloads)
        while len(seen) < request.expect:
            record = await self.streams.next(request.stream_id)
            seen.append(record.sequence)
            payloads.append(int(record.payload["n"]))
            self.consumed += 1
            if (
                request.can_every
                and self.consumed >= request.can_every
                and len(seen) < request.expect
            ):
                snapshot = await self.streams.prepare_continue_as_new()
                workflow.continue_as_new(
                    CollectInput(
                        expect=request.expect,
                        stream_id=request.stream_id,
                        can_every=request.can_every,
                        gap_timeout_s=request.gap_timeout_s,
                        seen=seen,
                        payloads=payloads,
                        snapshot=snapshot,
                        run_number=request.run_number + 1,
                    )
                )
        await self.streams.flush_acks()
        return CollectResult(seen, payloads, request.run_number)


@dataclass
class AppendInput:
    batches: list[list[int]]
    stream_id: str = "output"


@workflow.defn
class AppendWorkflow:
    """Creates an output stream, appends each batch, closes it; returns the sequences."""

    def __init__(self) -> None:
        self.streams = Streams(activity_timeout=timedelta(seconds=10))

    @workflow.run
    async def run(self, request: AppendInput) -> list[list[int]]:
        await self.streams.create(request.stream_id, "output")
        await self.streams.create(request.stream_id, "output")  # idempotent
        ranges = []
        for batch in request.batches:
            result = await self.streams.append_many(request.stream_id, [{"n": n} for n in batch])
            ranges.append([result.first_sequence, result.last_sequence])
        await self.streams.close(request.stream_id)
        return ranges


@workflow.defn
class QuickWorkflow:
    """Creates its input stream and completes at once: input to it can never arrive."""

    def __init__(self) -> None:
        self.streams = Streams()

    @workflow.run
    async def run(self) -> str:
        await self.streams.create("input", "input")
        return "done"


@workflow.defn
class ArtifactWorkflow:
    """Creates an output stream, stores an artifact from an activity, reads it back."""

    def __init__(self) -> None:
        self.streams = Streams()

    @workflow.run
    async def run(self, size: int) -> list[Any]:
        await self.streams.create("artifacts", "output", content_class="tool_io")
        stored = await workflow.execute_activity(
            "make_artifact",
            size,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1)),
            result_type=dict,
        )
        digest = await workflow.execute_activity(
            "read_artifact",
            stored["object_id"],
            start_to_close_timeout=timedelta(seconds=60),
            result_type=str,
        )
        return [stored, digest]


@workflow.defn
class IterateWorkflow:
    """Iterates its input until it stays idle for the given seconds."""

    def __init__(self) -> None:
        self.streams = Streams()

    @workflow.run
    async def run(self, idle_seconds: float) -> list[int]:
        await self.streams.create("input", "input")
        return [
            record.sequence
            async for record in self.streams.records(
                "input", idle_timeout=timedelta(seconds=idle_seconds)
            )
        ]
