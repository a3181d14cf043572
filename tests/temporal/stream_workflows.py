"""Workflows of the activity-stream tests (module level, as the sandbox wants them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from ductor_streams.plugin.workflow import Streams

WRITE_TOKENS = "tests.write_tokens"
READ_MESSAGES = "tests.read_messages"


@dataclass
class TokensInput:
    """Create output stream ``stream_id`` and have ``write_tokens`` write ``tokens``
    records into it, ``delay_s`` apart; attempt 1 fails after ``fail_after`` (0: never)."""

    tokens: int
    stream_id: str = "output"
    content_class: str = "model_output"
    delay_s: float = 0.0
    fail_after: int = 0
    consumers: list[str] = field(default_factory=list)
    credit: dict[str, Any] | None = None
    max_attempts: int = 3
    credit_timeout: float = 60.0
    oversize_first: bool = False  # write one payload over the inline limit first


@dataclass
class TokensResult:
    attempt: int
    last_sequence: int
    earlier_records: list[int]
    # What the heartbeat details of earlier attempts said they wrote: [attempt, ranges].
    heartbeat: list[Any] = field(default_factory=list)


@workflow.defn
class TokensWorkflow:
    def __init__(self) -> None:
        self.streams = Streams()

    @workflow.run
    async def run(self, request: TokensInput) -> TokensResult:
        definition: dict[str, Any] = {"content_class": request.content_class}
        if request.consumers:
            definition["consumers"] = request.consumers
        if request.credit is not None:
            definition["credit"] = request.credit
        await self.streams.create(request.stream_id, "output", **definition)
        result: TokensResult = await workflow.execute_activity(
            WRITE_TOKENS,
            request,
            start_to_close_timeout=timedelta(seconds=120),
            heartbeat_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=100), maximum_attempts=request.max_attempts
            ),
            result_type=TokensResult,
        )
        return result


@dataclass
class ReadResult:
    attempt: int
    sequences: list[int]
    payloads: list[Any]


@workflow.defn
class ReadMessagesWorkflow:
    """Creates input stream ``messages`` and reads it from an activity until ``done``."""

    def __init__(self) -> None:
        self.streams = Streams()

    @workflow.run
    async def run(self, heartbeat_timeout_s: float) -> ReadResult:
        await self.streams.create("messages", "input")
        result: ReadResult = await workflow.execute_activity(
            READ_MESSAGES,
            start_to_close_timeout=timedelta(seconds=120),
            heartbeat_timeout=timedelta(seconds=heartbeat_timeout_s),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
            result_type=ReadResult,
        )
        return result
