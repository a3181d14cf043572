"""Activities of the activity-stream tests, with hooks the tests set (the worker runs in
the test's process and event loop, except in ``activity_worker_process``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from ductor_streams.plugin.streaming import stream_reader, stream_writer
from ductor_streams.plugin.streaming.attempt import attempt_state
from tests.temporal.stream_workflows import (
    READ_MESSAGES,
    WRITE_TOKENS,
    ReadResult,
    TokensInput,
    TokensResult,
)

# ``on_token(attempt, index)`` after each write; ``finished`` gets the monotonic time at
# which an attempt left its writer.
HOOKS: dict[str, Any] = {}
TokenHook = Callable[[int, int], Awaitable[None]]


@activity.defn(name=WRITE_TOKENS)
async def write_tokens(request: TokensInput) -> TokensResult:
    attempt = activity.info().attempt
    hook: TokenHook | None = HOOKS.get("on_token")
    written = attempt_state().previous_writers.get(f"{activity.info().workflow_id}/output")
    heartbeat = [[a["attempt"], a["data"]] for a in (written or {}).get("attempts", [])]
    async with stream_writer(request.stream_id, credit_timeout=request.credit_timeout) as out:
        if request.oversize_first:
            await out.write({"text": "x" * 70_000})
        for i in range(request.tokens):
            if attempt == 1 and request.fail_after and i == request.fail_after:
                await out.flush()
                raise ApplicationError(f"injected: attempt 1 fails after {i} tokens")
            await out.write({"token": i, "attempt": attempt})
            if hook is not None:
                await hook(attempt, i)
            if request.delay_s:
                await asyncio.sleep(request.delay_s)
        await out.flush()
        earlier = [o.records for o in out.earlier_attempts]
        last = out.last_sequence
    HOOKS.setdefault("finished", []).append((attempt, time.monotonic()))
    assert last is not None
    return TokensResult(attempt, last, earlier, heartbeat)


@activity.defn(name=READ_MESSAGES)
async def read_messages() -> ReadResult:
    """Reads ``messages`` until a ``{"done": true}`` record."""
    attempt = activity.info().attempt
    sequences: list[int] = []
    payloads: list[Any] = []
    async with stream_reader("messages") as messages:
        async for record in messages:
            sequences.append(record.sequence)
            payloads.append(record.payload)
            if isinstance(record.payload, dict) and record.payload.get("done"):
                break
    return ReadResult(attempt, sequences, payloads)
