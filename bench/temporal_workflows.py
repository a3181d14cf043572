"""Workflows of ``bench.temporal_delivery`` (a module of their own: the sandbox re-imports
workflow modules, and ``__main__`` cannot be)."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from ductor_streams.plugin.workflow import INPUT_SIGNAL, Streams


@workflow.defn
class SinkWorkflow:
    """Consumes its input stream through the helpers until ``{"done": true}``."""

    def __init__(self) -> None:
        self.streams = Streams(ack_every=100)

    @workflow.run
    async def run(self) -> int:
        await self.streams.create("input", "input")
        consumed = 0
        while True:
            for record in await self.streams.next_batch("input", max_records=1000):
                if isinstance(record.payload, dict) and record.payload.get("done") is True:
                    await self.streams.flush_acks()
                    return consumed
                consumed += 1


@workflow.defn
class CountWorkflow:
    """Counts ``ductor_streams.input`` signals (no helper: the bare signal path)."""

    def __init__(self) -> None:
        self.count = 0

    @workflow.signal(name=INPUT_SIGNAL)
    def on_input(self, event: dict[str, Any]) -> None:
        self.count += 1

    @workflow.run
    async def run(self, expect: int) -> int:
        await workflow.wait_condition(lambda: self.count >= expect)
        return self.count
