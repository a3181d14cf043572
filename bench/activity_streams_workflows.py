"""Workflows of ``bench.activity_streams`` (module level, as the sandbox wants them).

``BenchTokensWorkflow`` produces ``tokens`` records of ``{"i": n, "t": <wall time the
token was made>}`` into its ``output`` stream, one of three ways (``mode``):

- ``activity``: the ``bench.write_tokens`` activity writes them with ``stream_writer``
  as it makes them (``rate`` per second, 0: as fast as it can);
- ``answer``: ``bench.make_tokens`` makes them at ``rate`` and returns them all, then
  the workflow appends them with ``append_many`` (at most 1,000 per append), what an
  activity had to do before it could stream;
- ``each``: the workflow appends them one ``append`` (one activity) each.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from ductor_streams.plugin.workflow import Streams

TASK_QUEUE = "bench-activity-streams"
WRITE_TOKENS = "bench.write_tokens"
MAKE_TOKENS = "bench.make_tokens"


@dataclass
class TokensRequest:
    mode: str
    tokens: int
    rate: float = 0.0
    start_at: float = 0.0  # wall time (time.time()) at which to make the first token


@dataclass
class TokensReport:
    records: int
    seconds: float  # first token made -> last one committed


@workflow.defn
class BenchTokensWorkflow:
    def __init__(self) -> None:
        self.streams = Streams()

    @workflow.run
    async def run(self, request: TokensRequest) -> TokensReport:
        await self.streams.create("output", "output", content_class="model_output")
        options: dict[str, Any] = {"start_to_close_timeout": timedelta(minutes=10)}
        if request.mode == "activity":
            report: TokensReport = await workflow.execute_activity(
                WRITE_TOKENS, request, result_type=TokensReport, **options
            )
            return report
        if request.mode == "answer":
            payloads: list[Any] = await workflow.execute_activity(
                MAKE_TOKENS, request, result_type=list, **options
            )
            for start in range(0, len(payloads), 1000):
                await self.streams.append_many("output", payloads[start : start + 1000])
            return TokensReport(len(payloads), 0.0)
        started = workflow.time()
        for i in range(request.tokens):
            await self.streams.append("output", {"i": i, "t": workflow.now().timestamp()})
        return TokensReport(request.tokens, workflow.time() - started)
