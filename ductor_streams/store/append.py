"""The append path: group commit per stream and across streams, one round trip each.

Appends to the same stream that arrive while that stream's transaction is in flight
queue up and go together in the next call of ``workflow_streams.append_requests``,
which decides each request exactly as if it were alone, in arrival order (its own
sequences, receipt, credit, quota and close check). One round trip under the row lock
is the per-stream limit (docs/speed.md), so sharing it multiplies throughput.

Across streams, every commit costs a WAL flush, which caps one-append-per-transaction
traffic at the disk's flush rate however many streams there are. So while a statement
of this process is in flight, small appends of other streams wait, and the groups that
became ready meanwhile go together in the next transaction
(``append_stream_groups``: each stream's group decided by ``append_requests`` as
alone, rows locked in ascending stream order so that no two transactions deadlock).
Only enough ready records (``PARALLEL_RECORDS``) start another statement beside it, up
to ``max_statements``: large batches are work, not commits, and run in parallel.

While other statements of this process are in flight, a statement carries no NOTIFY:
once it has committed, its streams' wakes are announced through ``WakeSender``
(store/wakes.py), coalesced, each carrying its records when they are few and small
(store/wake_format.py: followers elsewhere then fan them out without a read). A
statement alone in flight notifies inside its own transaction, at commit (one round
trip, no wake statement), with the same payload built in SQL (``workflow_streams.records_wake``).

Statements run on one connection kept while they follow each other (store/held.py),
not a pool acquire and release each. A statement is sent from the turn of the event
loop that decided it (compat/asyncio_tasks.py), not after the request tasks that turn has
queued already.

Live delivery of this process does not wait for either wake: right after a statement
returned, the records it appended to a stream this process follows are handed to
``feed`` (``live.Followers``), built from the request's own payloads, the sequences
and the transaction's ``appended_at``, so local subscribers get them without a read.
The wake still goes out for every commit: followers in other processes (and this one,
should it have skipped the fed records) read Postgres as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import asyncpg
from opentelemetry import trace

from ductor_streams.compat.asyncio_tasks import start_now
from ductor_streams.errors import (
    CreditExhausted,
    IdempotencyKeyReused,
    NotFound,
    QuotaExhausted,
    StreamClosed,
    StreamsError,
)
from ductor_streams.foundation import metrics, tracing
from ductor_streams.schema import QUERIES
from ductor_streams.store.db import database_unavailable, translate_db_error
from ductor_streams.store.encoding import EncodedBatch
from ductor_streams.store.held import HeldConnection
from ductor_streams.store.models import AppendResult, Record, StreamRef
from ductor_streams.store.outcomes import AppendOutcome
from ductor_streams.store.wake_format import record_wake
from ductor_streams.store.wakes import WakeSender

# A statement never holds more than this many records, so one transaction stays short.
MAX_GROUP_RECORDS = 5_000
# At most this many append statements of one process run at once (see the docstring).
MAX_STATEMENTS = 4
# Beside a statement in flight, another starts only for at least this many ready
# records: small appends wait to share the next commit (a commit, not the work, is
# their cost); large ones run in parallel (their work would otherwise queue on one
# backend: 4 clients appending 100-record batches to 4 streams, ~36,000 records/s with
# one statement at a time).
PARALLEL_RECORDS = 64
# A statement for several streams holds at most this many streams' groups.
MAX_STREAMS_PER_STATEMENT = 64

# One request's outcome: what the append function decided, and its first and last sequence.
Outcome = tuple[AppendOutcome, int | None, int | None]
Item = tuple[EncodedBatch, "asyncio.Future[Outcome]"]


@dataclass
class _StreamQueue:
    """The queue of one stream in this process."""

    pending: deque[Item] = field(default_factory=deque)
    busy: bool = False  # a group of this stream is in flight
    records: int = 0  # the records of ``pending``
    # The stream, when it is an input stream whose appends may lease their deliveries.
    ref: StreamRef | None = None

    def take_group(self) -> list[Item]:
        """The next group: queued requests in arrival order, up to MAX_GROUP_RECORDS.

        A request whose caller has gone (its future cancelled) before it was sent is
        dropped here: nothing is sent for it, so it can never be appended later (a
        client's retry with the same idempotency key is safe either way). Empty when
        every queued request was such."""
        group: list[Item] = []
        records = 0
        while self.pending and (
            not group or records + self.pending[0][0].count <= MAX_GROUP_RECORDS
        ):
            item = self.pending.popleft()
            self.records -= item[0].count
            if item[1].done():
                continue
            group.append(item)
            records += item[0].count
        return group


class CommitFeed(Protocol):
    """Takes records whose commit has just returned (live delivery of this process)."""

    def follows(self, stream_pk: int) -> bool:
        """Whether anyone in this process follows the stream (else nothing is built)."""

    def committed(self, stream_pk: int, records: list[Record]) -> None:
        """Consecutive records of one stream, committed; must not block."""

    def appending(self, stream_pk: int, underway: bool) -> None:
        """A statement appending to the stream starts (True) or has ended (False):
        whatever it committed has been handed to ``committed`` by then."""


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """The lease an input append takes for this process's dispatcher
    (``append_requests_leasing``)."""

    owner: str
    seconds: float
    max_deliveries: int


@dataclass(frozen=True, slots=True)
class LeasedDeliveries:
    """Deliveries that an append leased in its own transaction, now committed."""

    ref: StreamRef
    # Monotonic time before the statement was sent: Postgres counts the lease from the
    # transaction's start, later, so a guard counted from here ends early, never late.
    started: float
    delivery_ids: list[int]
    records: list[Record]  # the leased records, in sequence order
    traces: list[str | None]  # each leased record's request's traceparent


class LeaseTaker(Protocol):
    """This process's dispatcher, as the append path sees it."""

    def reserve(self, ref: StreamRef) -> LeaseTerms | None:
        """Terms if the dispatcher can take this stream's next deliveries now (a free
        slot, the stream not held); it then keeps the stream for this append's answer:
        ``taken`` or ``released`` follows, exactly once."""

    def taken(self, leased: LeasedDeliveries) -> None:
        """The append committed and leased these deliveries: deliver them; must not block."""

    def released(self, ref: StreamRef) -> None:
        """The append leased nothing (not the stream's head, refused, or failed)."""


def _outcome(row: asyncpg.Record) -> Outcome:
    """One row of an append function's answer as a typed outcome."""
    return (AppendOutcome.parse(row["outcome"]), row["first_sequence"], row["last_sequence"])


def outcome_to_result(outcome: Outcome) -> AppendResult:
    """Map the append function's outcome for one request to a result or a domain error."""
    name, first, last = outcome
    if name in (AppendOutcome.APPENDED, AppendOutcome.REPLAYED):
        assert first is not None and last is not None
        return AppendResult(first, last, replayed=name == AppendOutcome.REPLAYED)
    if name == AppendOutcome.STREAM_CLOSED:
        raise StreamClosed()
    if name == AppendOutcome.QUOTA_EXHAUSTED:
        raise QuotaExhausted()
    if name == AppendOutcome.CREDIT_EXHAUSTED:
        raise CreditExhausted()
    if name == AppendOutcome.KEY_REUSED:
        raise IdempotencyKeyReused()
    if name == AppendOutcome.NOT_FOUND:
        raise NotFound("stream does not exist")
    raise StreamsError(f"unexpected append outcome {name!r}")


class Appender:
    """Appends encoded batches to streams, grouping concurrent ones per stream and
    combining ready groups of several streams into one transaction."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        wakes: WakeSender | None = None,
        *,
        max_statements: int = MAX_STATEMENTS,
    ) -> None:
        self._pool = pool
        self._connection = HeldConnection(pool)  # kept across back-to-back statements
        self._queues: dict[int, _StreamQueue] = {}
        self._ready: dict[int, None] = {}  # streams with requests and no group in flight
        # The records queued for the streams in ``_ready``, kept as they come and go: a
        # sum over the ready streams at each request grows with the writers, and showed
        # in an activity worker's profile with 100 of them.
        self._ready_records = 0
        self._in_flight = 0  # append statements running now
        self._max_statements = max_statements
        self.statements = 0  # append statements sent (tests and benchmarks read it)
        self._tasks: set[asyncio.Future[None]] = set()
        self.wakes = wakes if wakes is not None else WakeSender(pool)
        self.feed: CommitFeed | None = None
        # This process's dispatcher, when it runs (process/dispatcher.py): an append alone
        # in its statement to an input stream may then lease its own deliveries.
        self.leases: LeaseTaker | None = None

    async def append(
        self, stream_pk: int, batch: EncodedBatch, *, ref: StreamRef | None = None
    ) -> AppendResult:
        """Append one request; raises the domain error the request alone would get.
        ``ref``: the stream, when it is an input stream (its deliveries may be leased)."""
        return outcome_to_result(await self.submit(stream_pk, batch, ref=ref))

    async def submit(
        self, stream_pk: int, batch: EncodedBatch, *, ref: StreamRef | None = None
    ) -> Outcome:
        if tracing.ENABLED and batch.trace is None:
            traceparent = tracing.current_traceparent()
            if traceparent is not None:
                batch = dataclasses.replace(batch, trace=traceparent)
        queue = self._queues.get(stream_pk)
        if queue is None:
            queue = self._queues[stream_pk] = _StreamQueue()
        if ref is not None:
            queue.ref = ref
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        queue.pending.append((batch, future))
        queue.records += batch.count
        if not queue.busy:
            self._ready[stream_pk] = None
            self._ready_records += batch.count
            self._dispatch()
        # A caller that goes away cancels only its own future: the statement runs in
        # its own task and skips a future that is already done (no shield needed); a
        # request not yet sent is dropped (``take_group``).
        return await future

    def _dispatch(self) -> None:
        """Start statements for ready streams: at once if none is in flight, else while
        fewer than ``max_statements`` run and enough records are ready to be worth one."""
        while (
            self._ready
            and self._in_flight < self._max_statements
            and (self._in_flight == 0 or self._ready_records >= PARALLEL_RECORDS)
        ):
            groups: list[tuple[int, list[Item]]] = []
            records = 0
            for stream_pk in list(self._ready):
                if groups and (
                    len(groups) >= MAX_STREAMS_PER_STATEMENT or records >= MAX_GROUP_RECORDS
                ):
                    break
                del self._ready[stream_pk]
                queue = self._queues[stream_pk]
                self._ready_records -= queue.records
                group = queue.take_group()
                if not group:  # every caller of its queue has gone
                    del self._queues[stream_pk]
                    continue
                queue.busy = True
                records += sum(batch.count for batch, _ in group)
                groups.append((stream_pk, group))
            if not groups:
                continue  # nothing left to send: ``_ready`` is empty now
            # Alone in flight, a statement may carry its own NOTIFY: no other commit of
            # this process waits behind the notify lock (one round trip per append with
            # one client).
            notify_inline = self._in_flight == 0
            self._in_flight += 1
            # Sent now, not after the tasks this turn of the loop has queued already
            # (compat/asyncio_tasks.py); the rest of the statement runs as a task.
            task = start_now(self._run(groups, notify_inline))
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)

    async def _run(self, groups: list[tuple[int, list[Item]]], notify_inline: bool) -> None:
        # Local followers of these streams learn that records of theirs are on the way,
        # so they do not read Postgres for this commit's wake before it is fed to them.
        feed = self.feed
        followed = [pk for pk, _ in groups if feed.follows(pk)] if feed is not None else []
        self._tell_appending(followed, True)
        requests = sum(len(group) for _, group in groups)
        started = time.perf_counter()
        span = _statement_span(groups, requests) if tracing.ENABLED else None
        try:
            if len(groups) == 1:
                await self._run_group(*groups[0], notify_inline=notify_inline, may_lease=True)
            else:
                await self._run_groups(sorted(groups, key=lambda g: g[0]), notify_inline)
        except Exception as exc:  # the connection failed: these requests get the error
            for _, group in groups:
                for _, future in group:
                    _settle(future, exc)
        except BaseException as exc:
            # Cancelled (shutdown): the statement's requests get the cancellation, and
            # what is queued behind them fails too rather than leave its callers
            # waiting forever (none of it was sent).
            for stream_pk, group in groups:
                for _, future in group:
                    _settle(future, exc)
                queue = self._queues.pop(stream_pk, None)
                if stream_pk in self._ready:
                    del self._ready[stream_pk]
                    self._ready_records -= queue.records if queue is not None else 0
                while queue is not None and queue.pending:
                    _settle(queue.pending.popleft()[1], exc)
            raise
        finally:
            metrics.observe_statement(requests, time.perf_counter() - started)
            if span is not None:
                span.end()
            self._tell_appending(followed, False)
            self._in_flight -= 1
            for stream_pk, _ in groups:
                queue = self._queues.get(stream_pk)
                if queue is None:
                    continue
                queue.busy = False
                if queue.pending:
                    self._ready[stream_pk] = None
                    self._ready_records += queue.records
                else:
                    del self._queues[stream_pk]
            self._dispatch()

    def _tell_appending(self, streams: list[int], underway: bool) -> None:
        if self.feed is not None:
            for stream_pk in streams:
                self.feed.appending(stream_pk, underway)

    async def _run_groups(self, groups: list[tuple[int, list[Item]]], notify_inline: bool) -> None:
        """Several streams' groups in one transaction, or each alone if that fails."""
        try:
            outcomes, appended_at = await self._call_many(
                [(stream_pk, [batch for batch, _ in group]) for stream_pk, group in groups],
                notify_inline,
            )
        except asyncpg.PostgresError as exc:
            if _outcome_unknown(exc) or database_unavailable(exc):
                # _run answers every request of the statement with the error (splitting
                # the statement would only meet the same outage once per stream).
                raise
            # One stream's bad data must not fail the others: each group alone.
            for stream_pk, group in groups:
                await self._run_group(stream_pk, group, notify_inline=False)
            return
        for (stream_pk, group), group_outcomes in zip(groups, outcomes, strict=True):
            self._settle_group(stream_pk, group, group_outcomes, notify_inline, appended_at)

    async def _run_group(
        self, stream_pk: int, group: list[Item], *, notify_inline: bool, may_lease: bool = False
    ) -> None:
        """One stream's group in one transaction, or each request alone if that fails.
        With ``may_lease``, an input stream's deliveries may be leased by the statement."""
        batches = [batch for batch, _ in group]
        leases, ref, terms = self._reserve(stream_pk, batches) if may_lease else (None, None, None)
        taken: LeasedDeliveries | None = None
        taker: LeaseTaker | None = None
        try:
            if leases is None or ref is None or terms is None:
                outcomes, appended_at = await self._call(stream_pk, batches, notify_inline)
            else:
                started = time.monotonic()
                outcomes, appended_at, leased = await self._call_leasing(
                    stream_pk, batches, notify_inline, terms
                )
                if leased is None:
                    leases.released(ref)
                else:
                    taken = _leased_deliveries(ref, started, group, outcomes, appended_at, *leased)
                    taker = leases
                leases = None  # answered
        except asyncpg.PostgresError as exc:
            if len(group) == 1 or _outcome_unknown(exc) or database_unavailable(exc):
                for _, future in group:
                    _settle(future, translate_db_error(exc))
                return
            # One request's bad data must not fail the others: decide each alone.
            for item in group:
                await self._run_group(stream_pk, [item], notify_inline=False)
            return
        finally:
            if leases is not None and ref is not None:
                leases.released(ref)  # the statement failed: no lease is known
        self._settle_group(stream_pk, group, outcomes, notify_inline, appended_at)
        if taken is not None and taker is not None:
            # Handed over after the answers: the requests' tasks, woken by
            # ``_settle_group``, run first, and then the signal starts (starting one is a
            # share of this loop's time that each answer would otherwise wait for).
            asyncio.get_running_loop().call_soon(taker.taken, taken)

    def _reserve(
        self, stream_pk: int, batches: list[EncodedBatch]
    ) -> tuple[LeaseTaker | None, StreamRef | None, LeaseTerms | None]:
        """The dispatcher's terms for leasing this group's deliveries, if it takes them:
        an input stream, no record with an object, not a staged statement."""
        leases = self.leases
        queue = self._queues.get(stream_pk)
        ref = queue.ref if queue is not None else None
        if (
            leases is None
            or ref is None
            or _staged(batches)
            or any(o is not None for batch in batches for o in batch.objects)
        ):
            return None, None, None
        terms = leases.reserve(ref)
        if terms is None:
            return None, None, None
        return leases, ref, terms

    def _settle_group(
        self,
        stream_pk: int,
        group: list[Item],
        outcomes: list[Outcome],
        notify_inline: bool,
        appended_at: datetime,
    ) -> None:
        feed = self.feed
        followed = feed is not None and feed.follows(stream_pk)
        records: list[Record] | None = None
        if not notify_inline:
            appended = [
                last
                for name, _, last in outcomes
                if name == AppendOutcome.APPENDED and last is not None
            ]
            latest = max(appended, default=0)
            if latest:
                # The statement returned, so its transaction has committed. When other
                # statements are in flight or queued, this wake may share their wake's.
                # It carries the stream's latest sequence, as the function's own does
                # (``r<pk>:<seq>``): the last sequence this group appended; and, when
                # they are few and small, the records themselves, which spares the
                # followers in other processes a read (store/wake_format.py).
                records = committed_records(group, outcomes, appended_at)
                wake = record_wake(stream_pk, records) or f"r{stream_pk}:{latest}"
                self.wakes.announce(wake, more_coming=self._in_flight > 1 or bool(self._ready))
        # Fed before the answers are set: the follower and the requests' tasks each wake
        # one turn of the event loop later, in that order, so the fan-out goes first.
        # A subscriber's write costs a small fraction of an answer's path, so the
        # subscribers' waits together are shortest this way. A stream is fed only while
        # it has at most 128 subscribers here (live FEED_MAX_SUBSCRIBERS), so an answer
        # waits for at most that many writes (docs/decisions.md, "Wakes and live
        # delivery").
        if feed is not None and followed:
            if records is None:
                records = committed_records(group, outcomes, appended_at)
            if records:
                feed.committed(stream_pk, records)
        for (_, future), outcome in zip(group, outcomes, strict=True):
            if not future.done():
                future.set_result(outcome)

    async def _call(
        self, stream_pk: int, batches: list[EncodedBatch], notify_inline: bool = False
    ) -> tuple[list[Outcome], datetime]:
        """The outcome of each request, and the transaction's ``appended_at``."""
        self.statements += 1
        rows = await self._send("records_append_group", (stream_pk,), batches, notify_inline)
        outcomes = [_outcome(r) for r in rows]
        return outcomes, rows[0]["appended_at"]

    async def _call_leasing(
        self, stream_pk: int, batches: list[EncodedBatch], notify_inline: bool, terms: LeaseTerms
    ) -> tuple[list[Outcome], datetime, tuple[int, list[int]] | None]:
        """``_call`` that leases the appended deliveries when they are the stream's head:
        also the first leased sequence and the leased ids, or None."""
        self.statements += 1
        rows = await self._send(
            "records_append_group_leasing",
            (stream_pk,),
            batches,
            notify_inline,
            terms.owner,
            terms.seconds,
            terms.max_deliveries,
        )
        leased = None
        if rows[-1]["request_index"] == 0:
            row = rows.pop()
            leased = (row["first_sequence"], list(row["leased"]))
        return [_outcome(r) for r in rows], rows[0]["appended_at"], leased

    async def _send(
        self,
        name: str,
        head: tuple[Any, ...],
        batches: list[EncodedBatch],
        notify_inline: bool,
        *tail: Any,
    ) -> list[asyncpg.Record]:
        """Run append statement ``name`` with its leading arguments ``head``, the batches'
        arguments, ``notify_inline`` and the traces, then ``tail``: plain on the held
        connection, or its ``_staged`` form when the batches carry more than
        STAGED_STATEMENT_BYTES (a statement with a ``tail`` is never staged)."""
        traces = statement_traces(batches)
        if tail or not _staged(batches):
            return await self._connection.fetch(
                QUERIES[name], *head, *statement_arguments(batches), notify_inline, traces, *tail
            )
        counts, keys, hashes, _, sizes, objects = statement_arguments(batches, joined=False)
        return await self._fetch_staged(
            batches,
            QUERIES[name + "_staged"],
            *head,
            counts,
            keys,
            hashes,
            sizes,
            objects,
            notify_inline,
            traces,
        )

    async def _fetch_staged(
        self, batches: list[EncodedBatch], query: str, *args: Any
    ) -> list[asyncpg.Record]:
        """Run a staged append statement: its payloads COPYed first, in one transaction
        on a pool connection of its own (beside the held one)."""
        payloads = ((index, p) for index, p in enumerate(p for b in batches for p in b.payloads))
        metrics.STAGED_STATEMENTS.inc()
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(QUERIES["append_stage_payloads"])
            await conn.copy_records_to_table("append_staged_payloads", records=payloads)
            rows: list[asyncpg.Record] = await conn.fetch(query, *args)
        return rows

    async def _call_many(
        self, groups: list[tuple[int, list[EncodedBatch]]], notify_inline: bool
    ) -> tuple[list[list[Outcome]], datetime]:
        """Each group's outcomes, and the transaction's ``appended_at``."""
        self.statements += 1
        batches = [batch for _, group in groups for batch in group]
        shape = (
            [stream_pk for stream_pk, _ in groups],
            [len(group) for _, group in groups],
            [sum(b.count for b in group) for _, group in groups],
        )
        rows = await self._send("records_append_stream_groups", shape, batches, notify_inline)
        outcomes: list[list[Outcome]] = [[] for _ in groups]
        for r in rows:
            outcomes[r["group_index"] - 1].append(_outcome(r))
        return outcomes, rows[0]["appended_at"]


def _statement_span(groups: list[tuple[int, list[Item]]], requests: int) -> Any:
    """The span of one append statement: a child of its first traced request's span,
    linked to the others' (a statement carries many requests, of many traces)."""
    traces = [batch.trace for _, group in groups for batch, _ in group if batch.trace]
    if not traces and not trace.get_current_span().is_recording():
        # No sampled request in it (most, at a low sampling ratio), nor a traced caller
        # (an activity under a traced span): no span, not even an unsampled one.
        return None
    return tracing.tracer().start_span(
        "append statement",
        context=tracing.context_of(traces[0]) if traces else None,
        links=tracing.links_to(traces[1:]),
        attributes={
            "ductor_streams.group_requests": requests,
            "ductor_streams.group_records": sum(
                batch.count for _, group in groups for batch, _ in group
            ),
            "ductor_streams.group_streams": len(groups),
            "db.system.name": "postgresql",
        },
    )


# A statement carrying more payload bytes than this sends them with COPY, in chunks, in
# its own transaction (``_fetch_staged``; append_stage_payloads in wakes.sql), instead of
# as one argument: asyncpg builds and writes a statement's whole Bind message in one
# step, holding the event loop for tens of milliseconds on a 60 MB batch, while COPY
# yields between chunks (docs/speed.md, "Staged statements"). Smaller statements go as one
# argument, on the held connection, from the turn that decided them.
STAGED_STATEMENT_BYTES = 8 * 1024 * 1024


def _staged(batches: list[EncodedBatch]) -> bool:
    return sum(sum(batch.sizes) for batch in batches) > STAGED_STATEMENT_BYTES


def committed_records(
    group: list[Item], outcomes: list[Outcome], appended_at: datetime
) -> list[Record]:
    """The records a group appended, as a read would return them; empty when one of
    them carries an object (its stored form is jsonb's: those are left to the read)."""
    records: list[Record] = []
    for (batch, _), (name, first, _last) in zip(group, outcomes, strict=True):
        if name != AppendOutcome.APPENDED:
            continue
        assert first is not None
        if any(o is not None for o in batch.objects):
            return []
        records.extend(
            Record(sequence, payload, size, appended_at, None)
            for sequence, payload, size in zip(
                range(first, first + batch.count), batch.payloads, batch.sizes, strict=True
            )
        )
    return records


def _leased_deliveries(
    ref: StreamRef,
    started: float,
    group: list[Item],
    outcomes: list[Outcome],
    appended_at: datetime,
    first: int,
    delivery_ids: list[int],
) -> LeasedDeliveries:
    """The leased deliveries ``first`` .. of a group, with their records and traces."""
    records: list[Record] = []
    traces: list[str | None] = []
    for (batch, _), (name, start, _last) in zip(group, outcomes, strict=True):
        if name != AppendOutcome.APPENDED:
            continue
        assert start is not None
        for sequence, payload, size in zip(
            range(start, start + batch.count), batch.payloads, batch.sizes, strict=True
        ):
            if first <= sequence < first + len(delivery_ids):
                records.append(Record(sequence, payload, size, appended_at, None))
                traces.append(batch.trace)
    return LeasedDeliveries(ref, started, delivery_ids, records, traces)


def _outcome_unknown(exc: asyncpg.PostgresError) -> bool:
    """Whether the statement may have committed: the connection failed before its answer.

    Then nothing may be retried (it could append twice); its requests get the error. Any
    other error was Postgres refusing the statement, whose transaction did not commit."""
    return isinstance(exc, asyncpg.exceptions.PostgresConnectionError)


# Joins a statement's payloads into one text (see records_append_group in wakes.sql).
RECORD_SEPARATOR = "\x1e"


def statement_arguments(batches: list[EncodedBatch], *, joined: bool = True) -> tuple[Any, ...]:
    """The append statements' request and record arguments, in order: per request counts,
    keys, hashes; the records' payloads and sizes joined into one text each, and their
    objects (None when no record has one). ``joined=False`` leaves the payloads out
    (None in their place): a staged statement COPYs them instead."""
    payloads: list[str] = []
    sizes: list[int] = []
    objects: list[str | None] = []
    for batch in batches:
        payloads.extend(batch.payloads)
        sizes.extend(batch.sizes)
        objects.extend(batch.objects)
    text = None
    if joined:
        text = RECORD_SEPARATOR.join(payloads)
        _check_separators(text, len(payloads))
    return (
        [b.count for b in batches],
        [b.idempotency_key for b in batches],
        [b.request_hash for b in batches],
        text,
        ",".join(map(str, sizes)),
        objects if any(o is not None for o in objects) else None,
    )


def statement_traces(batches: list[EncodedBatch]) -> list[str | None] | None:
    """Each request's traceparent for its delivery rows; None (no array at all) when
    no request has one, as always while tracing is off."""
    for batch in batches:
        if batch.trace is not None:
            return [b.trace for b in batches]
    return None


def _check_separators(joined: str, count: int) -> None:
    if joined.count(RECORD_SEPARATOR) != count - 1:
        # Compact JSON escapes control characters; a payload from elsewhere might not.
        raise ValueError("a payload holds the record separator U+001E unescaped")


def _settle(future: asyncio.Future[Outcome], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)
