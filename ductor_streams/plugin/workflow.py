"""Workflow helpers: safe in the sandbox, deterministic under replay.

Use them from workflow code (the ``StreamsPlugin`` must be on the client or worker)::

    from temporalio import workflow

    with workflow.unsafe.imports_passed_through():
        from ductor_streams.plugin.workflow import Streams, StreamsSnapshot

    @workflow.defn
    class Chat:
        def __init__(self) -> None:
            self.streams = Streams()      # registers the `ductor_streams.input` signal

        @workflow.run
        async def run(self) -> None:
            await self.streams.create("input", "input")
            await self.streams.create("output", "output")
            async for record in self.streams.records("input", idle_timeout=timedelta(hours=1)):
                await self.streams.append("output", {"echo": record.payload})

Input: each record reaches the workflow code once, in sequence order. The dispatcher may
signal a record twice (after a takeover) or out of order (after an operator retry); the
helper drops what it has seen, holds early arrivals, and reads a missing range from the
store (``read`` activity) when the gap does not fill by itself. It acknowledges what the
workflow consumed (consumer ``workflow``) through the ``ack`` activity, in batches, so
producers regain credit. ``snapshot()`` carries the position across Continue-As-New.

Output: ``append`` goes through the ``append`` activity with the idempotency key
``ductor_streams:<workflow_id>:<stream_id>:<n>`` (n counts this workflow's appends to the
stream, carried across Continue-As-New), so activity retries and replays never
duplicate a record.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from ductor_streams.activities import error_types
from ductor_streams.activities.models import (
    ACK,
    APPEND,
    CLOSE,
    CREATE_STREAM,
    READ,
    AckInput,
    AckResult,
    AppendInput,
    AppendResult,
    CloseInput,
    CloseResult,
    CreateStreamInput,
    CreateStreamResult,
    ReadInput,
    ReadResult,
    StreamRecord,
)
from ductor_streams.foundation.signals import INPUT_SIGNAL, InputSignal

WORKFLOW_CONSUMER = "workflow"

__all__ = [
    "INPUT_SIGNAL",
    "InputPosition",
    "InputSignal",
    "StreamRecord",
    "Streams",
    "StreamsSnapshot",
    "error_types",
]


@dataclass
class InputPosition:
    """How far the workflow got in one input stream."""

    next_sequence: int = 1  # the next sequence the workflow code will receive
    acked: int = 0  # acknowledged for consumer `workflow`
    highest_seen: int = 0  # highest sequence that reached this run (or its predecessor)


@dataclass
class StreamsSnapshot:
    """Everything the helper must carry across Continue-As-New (small: no payloads)."""

    inputs: dict[str, InputPosition] = field(default_factory=dict)
    append_counts: dict[str, int] = field(default_factory=dict)


@dataclass
class _Inbox:
    """One input stream inside this run."""

    position: InputPosition
    held: dict[int, StreamRecord] = field(default_factory=dict)
    catch_up: bool = False  # read the store before waiting (after Continue-As-New)
    idle: bool = False  # the workflow waits on this stream right now
    ack_task: asyncio.Task[None] | None = None


class Streams:
    """The run's streams, from inside its workflow. Create it in the workflow's
    ``__init__`` (so the input signal handler exists from the first task), passing the
    snapshot that came with Continue-As-New, if any. One per workflow: it owns the
    ``ductor_streams.input`` signal handler.

    ``ack_every``: acknowledge at least every this many consumed records (and whenever
    the workflow waits with everything consumed). ``gap_timeout``: how long a missing
    sequence may stay missing while later ones wait, before it is read from the store.
    """

    def __init__(
        self,
        snapshot: StreamsSnapshot | None = None,
        *,
        ack_every: int = 50,
        gap_timeout: timedelta = timedelta(seconds=2),
        activity_timeout: timedelta = timedelta(seconds=30),
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        snapshot = snapshot or StreamsSnapshot()
        self._inboxes: dict[str, _Inbox] = {
            # Records that reached the predecessor but were not consumed are read back.
            stream_id: _Inbox(
                InputPosition(p.next_sequence, p.acked, p.highest_seen),
                catch_up=p.highest_seen >= p.next_sequence,
            )
            for stream_id, p in snapshot.inputs.items()
        }
        self._append_counts = dict(snapshot.append_counts)
        self._ack_every = max(1, ack_every)
        self._gap_timeout = gap_timeout
        self._activity_timeout = activity_timeout
        self._retry_policy = retry_policy or RetryPolicy(
            initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
        )
        self.duplicates_dropped = 0
        workflow.set_signal_handler(INPUT_SIGNAL, self._on_input)

    # ---- streams -------------------------------------------------------------------

    async def create(self, stream_id: str, direction: str, **definition: Any) -> CreateStreamResult:
        """Create a stream of this run (idempotent: the same definition again is fine).

        ``definition`` takes the other fields of the HTTP create body (``consumers``,
        ``credit``, ``retention``, ...); omitted ones get their defaults.
        """
        body = {"stream_id": stream_id, "direction": direction, **definition}
        result: CreateStreamResult = await workflow.execute_activity(
            CREATE_STREAM,
            CreateStreamInput(self._run_id(), body),
            result_type=CreateStreamResult,
            **self._options(),
        )
        if direction == "input":
            self._inbox(stream_id)
        return result

    async def append(self, stream_id: str, *payloads: Any) -> AppendResult:
        """Append the payloads (1 to 1,000) as one atomic batch; returns their sequences."""
        return await self.append_many(stream_id, list(payloads))

    async def append_many(self, stream_id: str, payloads: list[Any]) -> AppendResult:
        """Append a list of payloads as one atomic batch (idempotent under retries)."""
        count = self._append_counts.get(stream_id, 0) + 1
        self._append_counts[stream_id] = count
        key = f"ductor_streams:{self._run_id()}:{stream_id}:{count}"
        result: AppendResult = await workflow.execute_activity(
            APPEND,
            AppendInput(self._run_id(), stream_id, payloads, key),
            result_type=AppendResult,
            **self._options(),
        )
        return result

    async def close(self, stream_id: str) -> int:
        """Close a stream of this run; returns its last sequence."""
        result: CloseResult = await workflow.execute_activity(
            CLOSE, CloseInput(self._run_id(), stream_id), result_type=CloseResult, **self._options()
        )
        return result.last_sequence

    # ---- input -----------------------------------------------------------------------

    # `timeout` parameters (ASYNC109): in a workflow the wait must be a workflow timer
    # inside wait_condition, which an outer asyncio.timeout would not make replay-safe.
    async def next(
        self,
        stream_id: str,
        *,
        timeout: timedelta | None = None,  # noqa: ASYNC109
    ) -> StreamRecord:
        """The next input record, in sequence order; TimeoutError after ``timeout``."""
        records = await self.next_batch(stream_id, max_records=1, timeout=timeout)
        return records[0]

    async def next_batch(
        self,
        stream_id: str,
        *,
        max_records: int = 100,
        timeout: timedelta | None = None,  # noqa: ASYNC109
    ) -> list[StreamRecord]:
        """Every record ready now (at least one, at most ``max_records``), in order.

        Waits for the first one up to ``timeout`` (None: forever), then TimeoutError.
        """
        inbox = self._inbox(stream_id)
        deadline = None if timeout is None else workflow.time() + timeout.total_seconds()
        while True:
            if inbox.catch_up and inbox.position.next_sequence not in inbox.held:
                await self._fetch(stream_id, inbox, until=None)
            ready = self._take(inbox, max_records)
            if ready:
                self._maybe_ack(stream_id, inbox)
                return ready
            remaining = None if deadline is None else max(0.0, deadline - workflow.time())
            if remaining == 0.0:
                raise TimeoutError(f"no input on {stream_id!r} in time")
            gap = bool(inbox.held) or inbox.position.highest_seen >= inbox.position.next_sequence
            wait = remaining
            if gap:
                gap_wait = self._gap_timeout.total_seconds()
                wait = gap_wait if wait is None else min(wait, gap_wait)
            inbox.idle = True
            self._maybe_ack(stream_id, inbox)
            try:
                await workflow.wait_condition(
                    lambda: inbox.position.next_sequence in inbox.held,
                    timeout=None if wait is None else timedelta(seconds=wait),
                )
            except TimeoutError:
                if gap and inbox.position.next_sequence not in inbox.held:
                    await self._fetch(stream_id, inbox, until=min(inbox.held, default=None))
            finally:
                inbox.idle = False

    async def records(
        self, stream_id: str, *, idle_timeout: timedelta | None = None
    ) -> AsyncIterator[StreamRecord]:
        """Iterate the input records in order; ends when none came for ``idle_timeout``."""
        while True:
            try:
                batch = await self.next_batch(stream_id, timeout=idle_timeout)
            except TimeoutError:
                return
            for record in batch:
                yield record

    async def flush_acks(self) -> None:
        """Acknowledge everything consumed so far, and wait for it."""
        for stream_id, inbox in self._inboxes.items():
            if inbox.ack_task is not None:
                await inbox.ack_task
            consumed = inbox.position.next_sequence - 1
            if consumed > inbox.position.acked:
                await self._ack(stream_id, inbox, consumed)

    async def prepare_continue_as_new(self) -> StreamsSnapshot:
        """Flush the acks and return the snapshot to hand to the next run."""
        await self.flush_acks()
        return self.snapshot()

    def snapshot(self) -> StreamsSnapshot:
        """The position of every input stream and the append counters (no payloads: the
        next run reads anything received but not consumed back from the store)."""
        return StreamsSnapshot(
            inputs={
                stream_id: InputPosition(
                    inbox.position.next_sequence, inbox.position.acked, inbox.position.highest_seen
                )
                for stream_id, inbox in self._inboxes.items()
            },
            append_counts=dict(self._append_counts),
        )

    def position(self, stream_id: str) -> InputPosition:
        return self._inbox(stream_id).position

    # ---- internals ---------------------------------------------------------------------

    def _run_id(self) -> str:
        return workflow.info().workflow_id

    def _options(self) -> dict[str, Any]:
        return {
            "start_to_close_timeout": self._activity_timeout,
            "retry_policy": self._retry_policy,
        }

    def _inbox(self, stream_id: str) -> _Inbox:
        inbox = self._inboxes.get(stream_id)
        if inbox is None:
            inbox = self._inboxes[stream_id] = _Inbox(InputPosition())
        return inbox

    def _on_input(self, event: InputSignal) -> None:
        record = StreamRecord(
            stream_id=event.stream_id,
            sequence=event.sequence,
            payload=event.payload,
            object=event.object,
            appended_at=event.appended_at,
        )
        self._hold(self._inbox(record.stream_id), record)

    def _hold(self, inbox: _Inbox, record: StreamRecord) -> None:
        position = inbox.position
        position.highest_seen = max(position.highest_seen, record.sequence)
        if record.sequence < position.next_sequence or record.sequence in inbox.held:
            self.duplicates_dropped += 1
            return
        inbox.held[record.sequence] = record

    def _take(self, inbox: _Inbox, max_records: int) -> list[StreamRecord]:
        ready: list[StreamRecord] = []
        while len(ready) < max_records:
            record = inbox.held.pop(inbox.position.next_sequence, None)
            if record is None:
                break
            ready.append(record)
            inbox.position.next_sequence += 1
        return ready

    async def _fetch(self, stream_id: str, inbox: _Inbox, *, until: int | None) -> None:
        """Read missing records from the store: from the next expected sequence up to (not
        including) ``until``, or up to the highest sequence this run has heard of. One page
        (at most 1 MiB); ``catch_up`` stays set while the range is not complete."""
        start = inbox.position.next_sequence
        last = (until - 1) if until is not None else inbox.position.highest_seen
        wanted = max(1, min(1000, last - start + 1))
        page: ReadResult = await workflow.execute_activity(
            READ,
            ReadInput(self._run_id(), stream_id, start - 1, wanted),
            result_type=ReadResult,
            **self._options(),
        )
        for record in page.records:
            self._hold(inbox, record)
        inbox.catch_up = bool(page.records) and page.records[-1].sequence < last

    def _maybe_ack(self, stream_id: str, inbox: _Inbox) -> None:
        if inbox.ack_task is not None and not inbox.ack_task.done():
            return  # one at a time; its completion looks again
        consumed = inbox.position.next_sequence - 1
        owed = consumed - inbox.position.acked
        if owed > 0 and (inbox.idle or owed >= self._ack_every):
            inbox.ack_task = asyncio.create_task(self._ack_then_look(stream_id, inbox, consumed))

    async def _ack_then_look(self, stream_id: str, inbox: _Inbox, sequence: int) -> None:
        await self._ack(stream_id, inbox, sequence)
        inbox.ack_task = None
        self._maybe_ack(stream_id, inbox)

    async def _ack(self, stream_id: str, inbox: _Inbox, sequence: int) -> None:
        try:
            result: AckResult = await workflow.execute_activity(
                ACK,
                AckInput(self._run_id(), stream_id, WORKFLOW_CONSUMER, sequence),
                result_type=AckResult,
                **self._options(),
            )
        except ActivityError as exc:
            # Credit only: a lost ack never loses input. Say so, keep going.
            workflow.logger.warning("ack of %s up to %d failed: %s", stream_id, sequence, exc)
            return
        inbox.position.acked = max(inbox.position.acked, result.acked_sequence)
