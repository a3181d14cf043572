"""The workflow of ``bench.takeover`` (a module of its own: the sandbox re-imports
workflow modules, and ``__main__`` cannot be)."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from ductor_streams.plugin.workflow import INPUT_SIGNAL


@workflow.defn
class SequencesWorkflow:
    """Takes bare ``ductor_streams.input`` signals until it has seen sequences 1..expect;
    returns how many signals repeated a sequence it had already seen."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.repeats = 0

    @workflow.signal(name=INPUT_SIGNAL)
    def on_input(self, event: dict[str, Any]) -> None:
        sequence = int(event["sequence"])
        if sequence in self.seen:
            self.repeats += 1
        self.seen.add(sequence)

    @workflow.run
    async def run(self, expect: int) -> int:
        await workflow.wait_condition(lambda: len(self.seen) >= expect)
        return self.repeats
