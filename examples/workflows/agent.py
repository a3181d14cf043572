"""AgentWorkflow: an agent-style run that streams its answer to a UI and waits for a
person's reply, with a timeout.

Streams of the run (workflow ID = run ID):
- ``output`` (``model_output``): what a UI renders live over SSE:
  ``{"type": "chunk", "turn": n, "text": ...}`` pieces of an answer,
  ``{"type": "turn_end", "turn": n}``, ``{"type": "waiting", "turn": n, "timeout_s": ...}``
  and finally ``{"type": "goodbye", "reason": "timeout" | "bye"}``.
- ``messages`` (input): what the person types: ``{"text": "..."}``.

Each turn: take the person's message, let the "model" (an activity; swap in a real one)
draft the answer, stream it out in chunks, then wait for the next message up to
``reply_timeout_s``. Every ``turns_per_run`` turns the run continues as new, carrying
its stream position, so history stays small however long the conversation runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from ductor_streams.plugin.workflow import Streams, StreamsSnapshot


@dataclass
class AgentInput:
    greeting: str = "Hello! What can I help you with?"
    reply_timeout_s: float = 300.0
    turns_per_run: int = 20
    turn: int = 0
    snapshot: StreamsSnapshot | None = None
    transcript_tail: list[str] = field(default_factory=list)


@activity.defn(name="examples.draft_answer")
async def draft_answer(prompt: str) -> list[str]:
    """Stand-in for a model call: returns the answer as the chunks a model would stream."""
    await asyncio.sleep(0)  # a real model call is I/O
    words = f"You said: {prompt}. Here is a considered answer, in a few pieces.".split()
    return [" ".join(words[i : i + 3]) + " " for i in range(0, len(words), 3)]


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
            chunks = await workflow.execute_activity(
                draft_answer, text, start_to_close_timeout=timedelta(seconds=60)
            )
            # A UI shows chunks as they land; two per append keeps it lively and cheap.
            for i in range(0, len(chunks), 2):
                await self.streams.append_many(
                    "output",
                    [{"type": "chunk", "turn": turn, "text": c} for c in chunks[i : i + 2]],
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
