"""AgentWorkflow: an agent-style run that streams its answer to a UI as the model
produces it, and waits for a person's reply, with a timeout.

Streams of the run (workflow ID = run ID):
- ``output`` (``model_output``): what a UI renders live over SSE:
  ``{"type": "chunk", "turn": n, "text": ...}`` tokens of an answer, written by the
  ``draft_answer`` activity while the model runs, ``{"type": "turn_end", "turn": n}``,
  ``{"type": "waiting", "turn": n, "timeout_s": ...}`` and finally
  ``{"type": "goodbye", "reason": "timeout" | "bye"}``. If ``draft_answer`` fails and is
  retried, the retry first appends ``{"type": "ductor_streams.retry", "attempt": n,
  "activity_id": ..., "discard": [[first, last], ...]}``: the UI drops the chunks with
  those sequences (the failed attempt's partial answer) and renders the new one.
- ``messages`` (input): what the person types: ``{"text": "..."}``.

Each turn: take the person's message, let the model (``model_tokens``: a stand-in that
yields tokens with small delays; swap in a real client there) stream the answer from the
``draft_answer`` activity straight into ``output`` (``stream_writer``: the UI sees each
token a few milliseconds after the model produced it, not after the whole answer), then
wait for the next message up to ``reply_timeout_s``. Every ``turns_per_run`` turns the
run continues as new, carrying its stream position, so history stays small however
long the conversation runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from ductor_streams.plugin.streaming import stream_writer
    from ductor_streams.plugin.workflow import Streams, StreamsSnapshot


@dataclass
class AgentInput:
    greeting: str = "Hello! What can I help you with?"
    reply_timeout_s: float = 300.0
    turns_per_run: int = 20
    turn: int = 0
    snapshot: StreamsSnapshot | None = None
    transcript_tail: list[str] = field(default_factory=list)


@dataclass
class DraftInput:
    prompt: str
    turn: int


# Seconds between the stand-in model's tokens.
TOKEN_DELAY_S = 0.02


async def model_tokens(prompt: str) -> AsyncIterator[str]:
    """Stand-in for a streaming model call: the answer's tokens, one at a time, with a
    small delay each. Swap in a real client here, e.g. an async iterator over the
    text deltas of a streaming chat completion."""
    words = f"You said: {prompt}. Here is a considered answer, in a few pieces.".split()
    for word in words:
        await asyncio.sleep(TOKEN_DELAY_S)  # the model thinking
        yield word + " "


@activity.defn(name="examples.draft_answer")
async def draft_answer(request: DraftInput) -> int:
    """Streams the model's answer into ``output`` token by token while the model runs;
    returns how many tokens it wrote. A retried attempt starts the answer again after a
    retry marker (the default for ``model_output`` streams)."""
    tokens = 0
    async with stream_writer("output") as out:
        async for token in model_tokens(request.prompt):
            await out.write({"type": "chunk", "turn": request.turn, "text": token})
            tokens += 1
    return tokens


@workflow.defn(name="AgentWorkflow")
class AgentWorkflow:
    @workflow.init
    def __init__(self, request: AgentInput) -> None:
        self.streams = Streams(request.snapshot)

    @workflow.run
    async def run(self, request: AgentInput) -> int:
        turn = request.turn
        if request.snapshot is None:  # the first run creates the streams
            await self.streams.create("output", "output", content_class="model_output")
            await self.streams.create("messages", "input", schema="chat.message/v1")
            await self.streams.append(
                "output", {"type": "chunk", "turn": 0, "text": request.greeting}
            )
        while True:
            await self.streams.append(
                "output", {"type": "waiting", "turn": turn, "timeout_s": request.reply_timeout_s}
            )
            try:
                message = await self.streams.next(
                    "messages", timeout=timedelta(seconds=request.reply_timeout_s)
                )
            except TimeoutError:
                return await self._goodbye("timeout", turn)
            text = (
                str((message.payload or {}).get("text", ""))
                if isinstance(message.payload, dict)
                else str(message.payload)
            )
            if text.strip().lower() == "bye":
                return await self._goodbye("bye", turn)
            turn += 1
            # The activity streams the answer itself; the workflow only waits for it.
            await workflow.execute_activity(
                draft_answer,
                DraftInput(text, turn),
                start_to_close_timeout=timedelta(minutes=5),
                heartbeat_timeout=timedelta(seconds=30),  # the writer heartbeats per batch
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1)),
            )
            await self.streams.append("output", {"type": "turn_end", "turn": turn})
            if turn % request.turns_per_run == 0:
                snapshot = await self.streams.prepare_continue_as_new()
                workflow.continue_as_new(
                    AgentInput(
                        greeting=request.greeting,
                        reply_timeout_s=request.reply_timeout_s,
                        turns_per_run=request.turns_per_run,
                        turn=turn,
                        snapshot=snapshot,
                    )
                )

    async def _goodbye(self, reason: str, turns: int) -> int:
        await self.streams.append("output", {"type": "goodbye", "reason": reason})
        await self.streams.close("output")
        await self.streams.flush_acks()
        return turns
