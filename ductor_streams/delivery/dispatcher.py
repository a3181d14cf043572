"""The input dispatcher: claims due deliveries and hands them to the wait service.

Per stream, deliveries go one at a time in sequence order; different streams go
concurrently, each claimed stream delivered by a task of its own, and one that finishes
frees its slot for the next claim at once. Claims are leases in Postgres (``delivery_claim``),
kept short and renewed by a heartbeat while their owner lives (``delivery_renew``), so a
replica takes over a crashed one's leases within about one lease. An owner sends only
within ``LEASE_GUARD`` of a lease after its last renewal began, so while nothing crashes
no two owners ever send the same record. A repeat after a takeover is harmless: the
event id is deterministic and the workflow helper drops what it has seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from ductor_streams.compat.asyncio_tasks import start_now
from ductor_streams.delivery import outbox
from ductor_streams.delivery.outbox import ClaimedDelivery
from ductor_streams.delivery.wait_service import (
    DeliveryFailed,
    RunGone,
    RunNotFound,
    WaitService,
)
from ductor_streams.foundation import metrics, tracing
from ductor_streams.store.db import DRIVER_ERRORS

log = logging.getLogger(__name__)

# Streams named since the last claim that are claimed one by one (a statement each);
# more at once are claimed by one claim of every stream, which costs about as much as
# 8 named claims with 1,000 other streams waiting and less with fewer (bench/claims.py).
NAMED_CLAIMS_AT_MOST = 8

# An owner sends a signal only within this fraction of a lease after the start of the
# last renewal (or claim) that covered every row of the stream: Postgres counts the lease
# from a later moment (the statement's start), so the 20% left over absorbs clock rate
# and scheduling jitter and the owner has stopped before any other replica may claim.
LEASE_GUARD = 0.8
# The heartbeat renews this many times per lease: two renewals in a row may fail (or a
# stall eat half a lease) before a live owner's guard runs out.
RENEWALS_PER_LEASE = 4

# A stream records what it has sent at least this often (and at its end), so that a row
# is `delivered` soon after its signal, not after the whole claim: what a crash leaves
# to be sent again (and a takeover's figures) stays small. One UPDATE per period.
RECORD_EVERY = 0.2

_DB_ERRORS = DRIVER_ERRORS


@dataclass(frozen=True)
class DispatcherConfig:
    """Tuning of one dispatcher; the defaults suit a small deployment."""

    # Short, renewed every lease/4 while held: a dead owner's rows are claimable at most
    # this long after its last renewal (docs/temporal.md, "Leases": why 1.5 s).
    lease_seconds: float = 1.5
    max_streams: int = 32  # streams held and delivered concurrently
    per_stream: int = 100  # deliveries leased per stream per claim
    idle_poll: float = 1.0  # re-check this often even without a wake (lost notifications)
    base_delay: float = 0.5  # first retry after about this long, doubling, with jitter
    max_delay: float = 60.0
    max_attempts: int = 100  # then dead: nothing is retried forever
    not_found_grace: float = 30.0  # a run that does not exist yet may still be starting
    # After stop(), a signal already in flight may finish for this long; then it is
    # abandoned and its delivery given back with the rest (sent again by another replica).
    stop_grace: float = 3.0
    # An input append of this process to an idle stream leases its deliveries to this
    # dispatcher in its own transaction, sparing the claim's round trip
    # (``append_requests_leasing``).
    take_append_leases: bool = True


def backoff_delay(attempts: int, config: DispatcherConfig) -> float:
    """Exponential backoff with jitter (50-100% of the capped exponential)."""
    ceiling = min(config.max_delay, config.base_delay * 2 ** max(0, attempts - 1))
    return ceiling * random.uniform(0.5, 1.0)


@dataclass(eq=False)
class _ClaimedStream:
    """One claimed stream's deliveries while this dispatcher holds their leases."""

    deliveries: list[ClaimedDelivery]
    # Sequences still leased to us (a delivery is named by its stream and sequence in
    # every statement: outbox.py): one leaves before the statement that records or gives
    # it back is sent, so a renewal that misses one still here has found a lease lost.
    held: set[int]
    # Monotonic start of the claim, then of the last renewal that covered all of `held`.
    renewed_at: float
    lost: bool = False
    # The dispatcher's wake count when the claim that took it was sent (``notify``).
    wakes_at_claim: int = 0
    # Every delivery sent and recorded (no retry, death, give-back or failure).
    clean: bool = False
    # A wake for this stream came while it was held (``notify(stream_pk)``) that may
    # announce records past ``deliveries``.
    more: bool = False
    # For a reservation (no deliveries yet): the latest sequence its wakes announced.
    seen: int = 0
    # Leased by its own append (``adopt``), under the stream's row lock: every later
    # commit of the stream has a wake of its own, which ``more`` records.
    adopted: bool = False

    @property
    def stream_pk(self) -> int:
        """The stream (of a claim, not a reservation): every statement on its rows names
        it beside their sequences, so that each stays on the stream's shard (docs/scale.md)."""
        return self.deliveries[0].stream_pk


class Dispatcher:
    """Delivers input records of ``tenant`` through ``wait_service`` until stopped."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        wait_service: WaitService,
        *,
        tenant: str,
        owner: str | None = None,
        config: DispatcherConfig | None = None,
    ) -> None:
        self._pool = pool
        self._wait = wait_service
        self._tenant = tenant
        self.owner = owner or f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"
        self.config = config or DispatcherConfig()
        self._guard = self.config.lease_seconds * LEASE_GUARD
        self._renew_every = self.config.lease_seconds / RENEWALS_PER_LEASE
        self._wake = asyncio.Event()
        self._wakes = 0  # notify() calls so far: what a finished stream compares
        # What the next claim looks at: only the streams wakes have named since the last
        # claim, unless something else may be due (``_look_everywhere``; see run()).
        self._named: set[int] = set()
        self._look_everywhere = True
        self._stop = asyncio.Event()
        self._stopped_at: float | None = None
        self._streams: set[_ClaimedStream] = set()
        self._held: dict[int, _ClaimedStream] = {}  # stream_pk -> its claim, while delivered
        # The task delivering each claimed stream, while ``run`` runs.
        self._tasks: dict[asyncio.Future[None], _ClaimedStream] = {}
        # A claim may have left due streams behind for want of a free slot.
        self._starved = False
        self._running = False
        # Streams kept for an append that may lease their deliveries (``reserve``): each
        # takes a slot, and its placeholder stands in ``_held`` until ``adopt`` or
        # ``unreserve`` (unless a claim took the stream meanwhile: then the claim's).
        self._reserved: dict[int, _ClaimedStream] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self.delivered = 0
        self.renewals = 0  # renewal statements that succeeded (tests, metrics)
        self.claims = 0  # claim statements sent (tests)
        self.claims_everywhere = 0  # of which looked at every stream of the tenant (tests)
        self.adopted = 0  # streams delivered from leases their append took (tests)

    def notify(self, stream_pk: int | None = None, latest: int | None = None) -> None:
        """Something may be due now (an append committed, to ``stream_pk`` when known,
        up to sequence ``latest`` when known): look without waiting. A stream this
        dispatcher is delivering is looked at again when its delivery ends instead: a
        claim now could not take it (its head is leased here); and not at all for a wake
        whose records it holds already (appends commit in sequence order, so a claim
        that took a sequence at or past ``latest`` saw every open one before it)."""
        if stream_pk is not None:
            held = self._held.get(stream_pk)
            if held is not None:
                if latest is None:
                    held.more = True
                elif held.deliveries:
                    held.more = held.more or latest > held.deliveries[-1].event.sequence
                else:  # a reservation: what its append leased is known at ``adopt``
                    held.seen = max(held.seen, latest)
                return
            self._named.add(stream_pk)
        else:
            self._look_everywhere = True
        self._wakes += 1
        self._wake.set()

    def stop(self) -> None:
        """Claim nothing more; streams give back what they have not sent (see stop_grace)."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self._stop.set()
        self._wake.set()

    async def run(self) -> None:
        """Claim and deliver until ``stop()``; waits for wakes or the idle poll between.

        Each claimed stream is delivered by a task of its own: a claim happens whenever a
        slot is free and something may be due, not only once every stream of the previous
        claim has finished, so a lease that lapses is taken over while this dispatcher is
        busy with long streams of its own.
        """
        failures = 0
        tasks = self._tasks
        self._running = True
        async with self._renewing():
            try:
                # When the next claim must look at every stream: at the due time or the
                # idle poll that the last such claim found.
                everywhere_at = 0.0
                while not self._stop.is_set():
                    # Cleared before the claim, so that a wake during it is not lost.
                    self._wake.clear()
                    timeout = self.config.idle_poll
                    try:
                        free = self.config.max_streams - len(tasks) - len(self._reserved)
                        # No slot for what may be due: look everywhere when one frees,
                        # unless only named streams wait (they stay named till then).
                        self._starved = free <= 0 and (
                            self._look_everywhere
                            or not self._named
                            or time.monotonic() >= everywhere_at
                        )
                        if free > 0:
                            # Read before the claim is sent: a wake after it may be for a
                            # commit the claim did not see.
                            wakes = self._wakes
                            # Only wakes that named streams since the last claim, and no
                            # due time reached: those streams are all that may be due.
                            # They are claimed one by one, one per round (a claim of one
                            # stream is an index lookup; one of every stream walks every
                            # stream with an open delivery).
                            named: int | None = None
                            if (
                                0 < len(self._named) <= NAMED_CLAIMS_AT_MOST
                                and not self._look_everywhere
                                and time.monotonic() < everywhere_at
                            ):
                                named = min(self._named)
                                self._named.discard(named)
                                if self._named:
                                    self._wake.set()  # the next round claims the next one
                            else:
                                self._named = set()  # this claim looks at them all
                                self._look_everywhere = False
                            try:
                                claimed = await self._claim(free, named)
                            except BaseException:
                                self._look_everywhere = True  # what was named is not lost
                                raise
                            failures = 0
                            for stream in claimed:
                                stream.wakes_at_claim = wakes
                                # Started in this turn: its first signal is on its way
                                # before anything else this loop does (compat/asyncio_tasks.py).
                                self._start(stream)
                            if named is None and claimed and len(claimed) == free:
                                self._starved = True
                                self._look_everywhere = True
                                continue  # every slot taken: more may be due at once
                            # Fewer than the free slots: nothing else was due at the claim,
                            # so no second claim now; a wake since (cleared above) or a
                            # stream's end (``finished``) claims again.
                            if named is None:
                                due = await outbox.seconds_until_due(self._pool, self._tenant)
                                if due is not None:
                                    timeout = min(max(due, 0.005), self.config.idle_poll)
                                everywhere_at = time.monotonic() + timeout
                            else:
                                # Claiming named streams moves no other stream's due time.
                                timeout = max(0.0, everywhere_at - time.monotonic())
                    except _DB_ERRORS as exc:
                        failures += 1
                        self._look_everywhere = True
                        timeout = min(self.config.max_delay, 0.2 * 2 ** min(failures, 8))
                        log.warning(
                            "dispatcher round failed", extra={"error_type": type(exc).__name__}
                        )
                    # asyncio.timeout, not wait_for: no task of its own, so a wake
                    # resumes this loop one turn after it is set, not three.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(timeout):
                            await self._wake.wait()
            finally:
                # Also when cancelled or crashed: the deliveries see the stop before their next
                # signal and give back the rest, instead of running on unwatched.
                self._running = False
                self.stop()
                if tasks:
                    await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, stream: _ClaimedStream) -> None:
        """Deliver a claimed stream from a task of its own, started in this turn: its first
        signal is on its way before anything else this loop does (compat/asyncio_tasks.py)."""
        task = start_now(self._deliver_stream(stream))
        self._tasks[task] = stream
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future[None]) -> None:
        stream = self._tasks.pop(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("delivery of a claimed stream crashed", exc_info=task.exception())
        # A slot is free. Claim again at once only if something may be due that no
        # claim could take meanwhile. Its claim took a full share (more may follow),
        # it did not end clean (a retry, a give-back), or slots ran out: look at
        # every stream. A wake came while this stream was held (its new records wait
        # behind its leased head), or any wake since its claim was sent (it may have
        # been for a commit of this stream the claim did not see; not so for rows an
        # append leased, which saw every commit before its own): claim this stream
        # (any other stream a wake named has been claimed by name meanwhile, and a
        # wake that named none makes the next claim look everywhere).
        # Otherwise nothing was appended since its claim, and the idle wait (the next
        # due time, the idle poll) stands: one claim per record instead of two.
        if self._starved or not stream.clean or len(stream.deliveries) >= self.config.per_stream:
            self._look_everywhere = True
            self._wake.set()
        elif stream.more or (not stream.adopted and stream.wakes_at_claim != self._wakes):
            self._named.add(stream.stream_pk)
            self._wake.set()
        elif self._named:
            self._wake.set()  # streams named while every slot was taken

    # -- leases taken by an append of this process (append_requests_leasing) -----------

    def reserve(self, stream_pk: int) -> bool:
        """Keep a slot and the stream for an append that may lease its deliveries to this
        dispatcher: True if it may (running, a slot free, the stream not held here).
        ``adopt`` or ``unreserve`` must follow. Until then the stream counts as held: a
        wake for it is kept for when it is given up (``_ClaimedStream.more``)."""
        if (
            not self._running
            or self._stop.is_set()
            or not self.config.take_append_leases
            or stream_pk in self._held
            or len(self._tasks) + len(self._reserved) >= self.config.max_streams
        ):
            return False
        placeholder = _ClaimedStream([], set(), time.monotonic())
        self._reserved[stream_pk] = self._held[stream_pk] = placeholder
        return True

    def _unhold(self, stream_pk: int) -> _ClaimedStream | None:
        """Ends a reservation; its placeholder, if it still stood for the stream."""
        placeholder = self._reserved.pop(stream_pk, None)
        if placeholder is not None and self._held.get(stream_pk) is placeholder:
            del self._held[stream_pk]
            return placeholder
        return None

    def adopt(self, deliveries: list[ClaimedDelivery], started: float) -> None:
        """Deliver what the reserved stream's append leased (``started``: monotonic, before
        its statement was sent), as if a claim sent then had taken it."""
        stream_pk = deliveries[0].stream_pk
        placeholder = self._unhold(stream_pk)
        stream = _ClaimedStream(deliveries, {d.event.sequence for d in deliveries}, started)
        stream.more = placeholder is not None and (
            placeholder.more or placeholder.seen > deliveries[-1].event.sequence
        )
        stream.adopted = True
        self.adopted += 1
        metrics.DELIVERY_APPEND_LEASED.inc(len(deliveries))
        self._streams.add(stream)
        self._held[stream_pk] = stream
        # Stopped meanwhile: the task gives everything back at once, waking the others.
        self._start(stream)

    def unreserve(self, stream_pk: int) -> None:
        """The reserved stream's append leased nothing: a wake that came meanwhile claims
        it now."""
        placeholder = self._unhold(stream_pk)
        if placeholder is not None and (placeholder.more or placeholder.seen):
            self.notify(stream_pk)

    async def run_once(self) -> int:
        """One claim, every claimed stream delivered; returns how many were claimed."""
        async with self._renewing():
            streams = await self._claim(self.config.max_streams)
            await asyncio.gather(*(self._deliver_stream(stream) for stream in streams))
        return sum(len(stream.deliveries) for stream in streams)

    async def _claim(self, max_streams: int, named: int | None = None) -> list[_ClaimedStream]:
        # Taken before the claim (and its pool acquire): the lease Postgres grants starts
        # later, so a guard counted from here ends early, never late.
        started = time.monotonic()
        started_ns = time.time_ns()
        self.claims += 1
        self.claims_everywhere += named is None
        claimed = await outbox.claim(
            self._pool,
            owner=self.owner,
            tenant=self._tenant,
            lease_seconds=self.config.lease_seconds,
            max_streams=max_streams,
            per_stream=self.config.per_stream,
            stream=named,
        )
        metrics.DELIVERY_CLAIM_SECONDS.observe(time.monotonic() - started)
        if tracing.ENABLED and claimed:
            _claim_span(claimed, started_ns)
        streams = [
            _ClaimedStream(deliveries, {d.event.sequence for d in deliveries}, started)
            for deliveries in claimed.values()
        ]
        self._streams.update(streams)
        for stream in streams:
            self._held[stream.stream_pk] = stream
        return streams

    # -- the lease heartbeat ---------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _renewing(self) -> AsyncIterator[None]:
        """Runs the heartbeat while the block runs (once, however deeply entered)."""
        if self._heartbeat is not None:
            yield
            return
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._beat(), name="delivery-lease-heartbeat"
        )
        try:
            yield
        finally:
            heartbeat, self._heartbeat = self._heartbeat, None
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._renew_every)
            now = time.monotonic()
            # A stream claimed or renewed less than half a period ago is left for the next
            # beat (it is then at most 1.5 periods old, well inside the guard): most
            # streams finish in milliseconds and never cost a renewal.
            due = [
                stream
                for stream in self._streams
                if stream.held
                and not stream.lost
                and now - stream.renewed_at >= self._renew_every / 2
            ]
            if not due:
                continue
            try:
                await self._renew(due)
            except (*_DB_ERRORS, TimeoutError) as exc:
                # The guards keep running out: if this goes on, the streams stop sending
                # before their leases lapse, and whoever claims them next sends the rest.
                log.warning("lease renewal failed", extra={"error_type": type(exc).__name__})
            except Exception:
                # Never let the heartbeat die: without it every stream gives back at its guard.
                log.exception("lease renewal raised")

    async def _renew(self, streams: list[_ClaimedStream]) -> None:
        held: dict[int, set[int]] = {}
        for stream in streams:
            held.setdefault(stream.stream_pk, set()).update(stream.held)
        # Bounded by a guard: a renewal that took longer extends nothing (its start plus
        # the guard has passed), but a slow one that succeeds within it still counts (a
        # new pool connection under load can take most of a second).
        async with self._pool.acquire(timeout=self._guard) as conn:
            # Taken once the connection is ours: a wait for the pool is not renewal time.
            started = time.monotonic()
            renewed = await outbox.renew(
                conn,
                held,
                owner=self.owner,
                lease_seconds=self.config.lease_seconds,
                timeout=self._guard,
            )
        self.renewals += 1
        for stream in streams:
            # `held` may have shrunk meanwhile; whatever is still in it must be renewed.
            if stream.held <= renewed.get(stream.stream_pk, set()):
                stream.renewed_at = max(stream.renewed_at, started)
            elif not stream.lost:
                # Lapsed (a stall longer than the guard's margin) or taken: this stream's
                # guard is never extended again, and it ran out before the lease did.
                stream.lost = True
                log.warning(
                    "delivery lease lost",
                    extra={"stream_pk": stream.stream_pk, "owner": self.owner},
                )

    def _deadline(self, stream: _ClaimedStream) -> float:
        """Monotonic time after which this stream must not have a signal in flight."""
        deadline = stream.renewed_at + self._guard
        if self._stopped_at is not None:
            deadline = min(deadline, self._stopped_at + self.config.stop_grace)
        return deadline

    # -- one stream ----------------------------------------------------------------------

    async def _send(self, stream: _ClaimedStream, delivery: ClaimedDelivery) -> bool:
        """Signal one delivery within the stream's deadline (which renewals move on).

        False if the deadline passed first: the signal was abandoned and may or may not
        have reached the run (whoever sends it again is deduplicated by the helper).
        Timed (``DELIVERY_SIGNAL_SECONDS``) and, with tracing on, a span of its own that
        continues the appending request's trace.
        """
        started = time.monotonic()
        if not tracing.ENABLED:
            try:
                return await self._send_within_deadline(stream, delivery)
            finally:
                metrics.DELIVERY_SIGNAL_SECONDS.observe(time.monotonic() - started)
        from opentelemetry import context, trace

        span = _signal_span(delivery)
        # Current while the signal is sent: Temporal's tracing interceptor (in the
        # client's task, which copies this context) puts its span under this one.
        token = context.attach(trace.set_span_in_context(span))
        try:
            sent = await self._send_within_deadline(stream, delivery)
            if not sent:
                span.set_attribute("ductor_streams.abandoned", True)
            return sent
        except BaseException as exc:
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            context.detach(token)
            span.end()
            metrics.DELIVERY_SIGNAL_SECONDS.observe(time.monotonic() - started)

    async def _send_within_deadline(
        self, stream: _ClaimedStream, delivery: ClaimedDelivery
    ) -> bool:
        # Sent from this turn of the loop, not from a task queued behind others.
        task = start_now(self._wait.deliver(delivery.event))
        try:
            while True:
                remaining = self._deadline(stream) - time.monotonic()
                if remaining <= 0:
                    task.cancel()
                    await asyncio.wait({task})
                    if not task.cancelled():
                        task.exception()  # retrieved: its outcome no longer matters
                    return False
                # Wakes at least once per renewal period to see a moved deadline.
                done, _ = await asyncio.wait({task}, timeout=min(remaining, self._renew_every))
                if done:
                    task.result()  # the wait service's failure, if any
                    return True
        except asyncio.CancelledError:
            task.cancel()
            raise

    async def _deliver_stream(self, stream: _ClaimedStream) -> None:
        done: list[int] = []  # sequences sent and not yet recorded
        deliveries = stream.deliveries
        recorded_at = time.monotonic()
        try:
            for index, delivery in enumerate(deliveries):
                if self._stop.is_set() or time.monotonic() >= self._deadline(stream):
                    await self._give_back(stream, done, index)
                    return
                try:
                    sent = await self._send(stream, delivery)
                except RunGone as exc:
                    if isinstance(exc, RunNotFound) and self._young(delivery):
                        await self._retry(done, stream, index, f"run not found: {exc}")
                    else:
                        await self._dead(done, stream, index, str(exc))
                    return
                except DeliveryFailed as exc:
                    await self._retry(done, stream, index, str(exc))
                    return
                except Exception as exc:  # an unclassified failure is retryable
                    log.exception("wait service raised", extra={"delivery": delivery.delivery_id})
                    await self._retry(done, stream, index, f"{type(exc).__name__}: {exc}")
                    return
                if not sent:
                    await self._give_back(stream, done, index)
                    return
                metrics.DELIVERY_ATTEMPTS.labels("delivered").inc()
                metrics.DELIVERY_LATENCY.observe(
                    max(0.0, (datetime.now(UTC) - delivery.created_at).total_seconds())
                )
                done.append(delivery.event.sequence)
                if time.monotonic() - recorded_at >= RECORD_EVERY:
                    await self._flush(stream, done)
                    recorded_at = time.monotonic()
            await self._flush(stream, done)
            stream.clean = True
        except _DB_ERRORS as exc:
            # The lease runs out and another claim (or replica) repeats what is unrecorded.
            log.warning("recording deliveries failed", extra={"error_type": type(exc).__name__})
        finally:
            self._streams.discard(stream)
            if self._held.get(stream.stream_pk) is stream:
                del self._held[stream.stream_pk]

    def _young(self, delivery: ClaimedDelivery) -> bool:
        age = (datetime.now(UTC) - delivery.created_at).total_seconds()
        return age < self.config.not_found_grace

    def _let_go(self, stream: _ClaimedStream, index: int) -> list[int]:
        """The sequences of deliveries[index:], no longer held (before any statement on
        them)."""
        sequences = [d.event.sequence for d in stream.deliveries[index:]]
        stream.held.difference_update(sequences)
        return sequences

    async def _flush(self, stream: _ClaimedStream, done: list[int]) -> None:
        stream.held.difference_update(done)
        await outbox.mark_delivered(self._pool, stream.stream_pk, done)
        self.delivered += len(done)
        done.clear()

    async def _give_back(self, stream: _ClaimedStream, done: list[int], index: int) -> None:
        """Stopping or out of lease: record what was sent, give back the rest at once,
        and wake the other dispatchers to take it."""
        if not self._stop.is_set():
            # Renewals failed or lagged (database trouble, a stalled event loop).
            log.warning(
                "delivery lease guard ran out: giving the rest of a claim back",
                extra={"stream_pk": stream.stream_pk, "lost": stream.lost},
            )
        await self._flush(stream, done)
        await outbox.release(
            self._pool, stream.stream_pk, self._let_go(stream, index), owner=self.owner, wake=True
        )

    async def _dead(self, done: list[int], stream: _ClaimedStream, index: int, error: str) -> None:
        delivery = stream.deliveries[index]
        metrics.DELIVERY_ATTEMPTS.labels("dead").inc()
        await self._flush(stream, done)
        await outbox.mark_dead(
            self._pool,
            stream.stream_pk,
            self._let_go(stream, index),
            attempted=delivery.event.sequence,
            error=error,
        )
        log.info(
            "input delivery dead",
            extra={
                "run_id": delivery.event.run_id,
                "stream_id": delivery.event.stream_id,
                "sequence": delivery.event.sequence,
                "reason": error,
            },
        )

    async def _retry(self, done: list[int], stream: _ClaimedStream, index: int, error: str) -> None:
        await self._flush(stream, done)
        failed = stream.deliveries[index]
        attempts = failed.attempts + 1
        metrics.DELIVERY_ATTEMPTS.labels(
            "dead" if attempts >= self.config.max_attempts else "retrying"
        ).inc()
        rest = self._let_go(stream, index)
        if attempts >= self.config.max_attempts:
            await outbox.mark_dead(
                self._pool,
                stream.stream_pk,
                rest,
                attempted=failed.event.sequence,
                error=f"gave up after {attempts} attempts: {error}",
            )
            return
        await outbox.mark_retrying(
            self._pool,
            stream.stream_pk,
            failed.event.sequence,
            owner=self.owner,
            error=error[:1000],
            delay=backoff_delay(attempts, self.config),
        )
        # Behind a head that backs off: nothing to wake anyone for.
        await outbox.release(self._pool, stream.stream_pk, rest[1:], owner=self.owner)


def _claim_span(claimed: dict[int, list[ClaimedDelivery]], started_ns: int) -> None:
    """The span of a claim that leased something: linked to the appending requests of
    what it leased (a batch of many traces; each signal span is their child)."""
    deliveries = [d for stream in claimed.values() for d in stream]
    span = tracing.tracer().start_span(
        "delivery claim",
        start_time=started_ns,
        links=tracing.links_to(d.trace_context for d in deliveries),
        attributes={
            "ductor_streams.deliveries": len(deliveries),
            "ductor_streams.streams": len(claimed),
        },
    )
    span.end()


def _signal_span(delivery: ClaimedDelivery) -> Any:
    """The span of one input signal: a child of the request that appended the record
    (its stored traceparent), or of nothing when that request was not traced."""
    from opentelemetry import context, trace

    parent = tracing.context_of(delivery.trace_context)
    return tracing.tracer().start_span(
        "delivery signal",
        # No stored context: a root of its own, not a child of whatever is current.
        context=parent if parent is not None else context.Context(),
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "ductor_streams.run_id": delivery.event.run_id,
            "ductor_streams.stream_id": delivery.event.stream_id,
            "ductor_streams.sequence": delivery.event.sequence,
            "ductor_streams.delivery_id": delivery.delivery_id,
            "ductor_streams.attempts": delivery.attempts,
        },
    )
