"""The append path: group commit per stream, one database round trip per group.

Appends to the same stream that arrive while that stream's transaction is in flight
queue up and go together in the next call of ``workflow_streams.append_requests``,
which decides each request exactly as if it were alone, in arrival order (its own
sequences, receipt, credit, quota and close check). One round trip under the row lock
is the per-stream limit (DESIGN.md "Speed"), so sharing it multiplies throughput.

The group's transaction carries no NOTIFY: once it has committed, the stream's wake is
announced through ``WakeSender`` (store/wakes.py), coalesced with other streams' wakes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

import asyncpg

from ductor_streams.errors import (
    CreditExhausted,
    IdempotencyKeyReused,
    NotFound,
    QuotaExhausted,
    StreamClosed,
    StreamsError,
)
from ductor_streams.schema import QUERIES
from ductor_streams.store.db import translate_db_error
from ductor_streams.store.encoding import EncodedBatch
from ductor_streams.store.models import AppendResult
from ductor_streams.store.wakes import WakeSender

# A group never holds more than this many records, so one transaction stays short.
MAX_GROUP_RECORDS = 5_000

Outcome = tuple[str, int | None, int | None]


@dataclass
class _Lane:
    """The queue of one stream in this process."""

    pending: deque[tuple[EncodedBatch, asyncio.Future[Outcome]]] = field(default_factory=deque)
    draining: bool = False


def outcome_to_result(outcome: Outcome) -> AppendResult:
    """Map the append function's outcome for one request to a result or a domain error."""
    name, first, last = outcome
    if name in ("appended", "replayed"):
        assert first is not None and last is not None
        return AppendResult(first, last, replayed=name == "replayed")
    if name == "stream_closed":
        raise StreamClosed()
    if name == "quota_exhausted":
        raise QuotaExhausted()
    if name == "credit_exhausted":
        raise CreditExhausted()
    if name == "key_reused":
        raise IdempotencyKeyReused()
    if name == "not_found":
        raise NotFound("stream does not exist")
    raise StreamsError(f"unexpected append outcome {name!r}")


class Appender:
    """Appends encoded batches to streams, grouping concurrent ones per stream."""

    def __init__(self, pool: asyncpg.Pool, wakes: WakeSender | None = None) -> None:
        self._pool = pool
        self._lanes: dict[int, _Lane] = {}
        self._in_flight = 0  # group statements running now, all streams
        self.wakes = wakes if wakes is not None else WakeSender(pool)

    async def append(self, stream_pk: int, batch: EncodedBatch) -> AppendResult:
        """Append one request; raises the domain error the request alone would get."""
        return outcome_to_result(await self.submit(stream_pk, batch))

    async def submit(self, stream_pk: int, batch: EncodedBatch) -> Outcome:
        lane = self._lanes.get(stream_pk)
        if lane is None:
            lane = self._lanes[stream_pk] = _Lane()
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        lane.pending.append((batch, future))
        if not lane.draining:
            lane.draining = True
            asyncio.get_running_loop().create_task(self._drain(stream_pk, lane))
        # A caller that goes away cancels only its own future: the group runs in the
        # drain task and skips a future that is already done (no shield needed).
        return await future

    async def _drain(self, stream_pk: int, lane: _Lane) -> None:
        try:
            while lane.pending:
                group: list[tuple[EncodedBatch, asyncio.Future[Outcome]]] = []
                records = 0
                while lane.pending and (
                    not group or records + lane.pending[0][0].count <= MAX_GROUP_RECORDS
                ):
                    item = lane.pending.popleft()
                    group.append(item)
                    records += item[0].count
                await self._run_group(stream_pk, group)
        except BaseException as exc:
            # Cancelled (shutdown): nobody will drain what is still queued; fail it
            # rather than leave its callers waiting forever. Nothing of it was sent.
            while lane.pending:
                _settle(lane.pending.popleft()[1], exc)
            raise
        finally:
            lane.draining = False
            if not lane.pending:
                self._lanes.pop(stream_pk, None)

    async def _run_group(
        self, stream_pk: int, group: list[tuple[EncodedBatch, asyncio.Future[Outcome]]]
    ) -> None:
        self._in_flight += 1
        try:
            outcomes = await self._call(stream_pk, [batch for batch, _ in group])
        except asyncpg.PostgresError as exc:
            if len(group) == 1:
                _settle(group[0][1], translate_db_error(exc))
                return
            # One request's bad data must not fail the others: decide each alone.
            for item in group:
                await self._run_group(stream_pk, [item])
            return
        except BaseException as exc:
            for _, future in group:
                _settle(future, exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._in_flight -= 1
        if any(outcome[0] == "appended" for outcome in outcomes):
            # The statement returned, so the group's transaction has committed. When
            # other groups are in flight or queued, its wake may share their statement.
            lane = self._lanes.get(stream_pk)
            more_coming = self._in_flight > 0 or (lane is not None and bool(lane.pending))
            self.wakes.announce(f"r{stream_pk}", more_coming=more_coming)
        for (_, future), outcome in zip(group, outcomes, strict=True):
            if not future.done():
                future.set_result(outcome)

    async def _call(self, stream_pk: int, batches: list[EncodedBatch]) -> list[Outcome]:
        payloads: list[str] = []
        sizes: list[int] = []
        objects: list[str | None] = []
        for batch in batches:
            payloads.extend(batch.payloads)
            sizes.extend(batch.sizes)
            objects.extend(batch.objects)
        rows = await self._pool.fetch(
            QUERIES["records_append_group"],
            stream_pk,
            [b.count for b in batches],
            [b.idempotency_key for b in batches],
            [b.request_hash for b in batches],
            payloads,
            sizes,
            objects,
        )
        return [(r["outcome"], r["first_sequence"], r["last_sequence"]) for r in rows]


def _settle(future: asyncio.Future[Outcome], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)
