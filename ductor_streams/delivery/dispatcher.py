"""The input dispatcher: claims due deliveries and hands them to the wait service.

Per stream, deliveries go one at a time in sequence order; different streams go
concurrently. Claims are leases in Postgres (``delivery_claim``), so any replica takes
over a lease that a crashed one left behind. A repeat after a takeover is harmless: the
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
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from ductor_streams import metrics
from ductor_streams.delivery import outbox
from ductor_streams.delivery.outbox import ClaimedDelivery
from ductor_streams.delivery.wait_service import (
    DeliveryFailed,
    RunGone,
    RunNotFound,
    WaitService,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DispatcherConfig:
    """Tuning of one dispatcher; the defaults suit a small deployment."""

    lease_seconds: float = 30.0
    max_streams: int = 32  # streams claimed (and delivered concurrently) per round
    per_stream: int = 100  # deliveries leased per stream per round
    idle_poll: float = 1.0  # re-check this often even without a wake (lost notifications)
    base_delay: float = 0.5  # first retry after about this long, doubling, with jitter
    max_delay: float = 60.0
    max_attempts: int = 100  # then dead: nothing is retried forever
    not_found_grace: float = 30.0  # a run that does not exist yet may still be starting


def backoff_delay(attempts: int, config: DispatcherConfig) -> float:
    """Exponential backoff with jitter (50-100% of the capped exponential)."""
    ceiling = min(config.max_delay, config.base_delay * 2 ** max(0, attempts - 1))
    return ceiling * random.uniform(0.5, 1.0)


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
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self.delivered = 0

    def notify(self) -> None:
        """Something may be due now (an append committed): look without waiting."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def run(self) -> None:
        """Claim and deliver until ``stop()``; waits for wakes or the idle poll between."""
        failures = 0
        while not self._stop.is_set():
            # Cleared before the claim, so that a wake during it is not lost.
            self._wake.clear()
            try:
                claimed = await self.run_once()
                failures = 0
                if claimed:
                    continue
                due = await outbox.seconds_until_due(self._pool, self._tenant)
                timeout = self.config.idle_poll if due is None else due
                timeout = min(max(timeout, 0.005), self.config.idle_poll)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                failures += 1
                timeout = min(self.config.max_delay, 0.2 * 2 ** min(failures, 8))
                log.warning("dispatcher round failed", extra={"error_type": type(exc).__name__})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def run_once(self) -> int:
        """One round: claim, deliver every claimed stream; returns how many were claimed."""
        claimed_at = time.monotonic()
        lanes = await outbox.claim(
            self._pool,
            owner=self.owner,
            tenant=self._tenant,
            lease_seconds=self.config.lease_seconds,
            max_streams=self.config.max_streams,
            per_stream=self.config.per_stream,
        )
        if not lanes:
            return 0
        await asyncio.gather(*(self._deliver_lane(lane, claimed_at) for lane in lanes.values()))
        return sum(len(lane) for lane in lanes.values())

    async def _deliver_lane(self, lane: list[ClaimedDelivery], claimed_at: float) -> None:
        done: list[int] = []
        # Stop well before the lease ends, so a takeover never overlaps this owner.
        lease_end = claimed_at + self.config.lease_seconds * 0.8
        try:
            for index, delivery in enumerate(lane):
                if time.monotonic() >= lease_end or self._stop.is_set():
                    await self._flush(done)
                    await outbox.release(
                        self._pool, [d.delivery_id for d in lane[index:]], owner=self.owner
                    )
                    return
                try:
                    await self._wait.deliver(delivery.event)
                except RunGone as exc:
                    if isinstance(exc, RunNotFound) and self._young(delivery):
                        await self._retry(done, lane, index, f"run not found: {exc}")
                    else:
                        metrics.DELIVERY_ATTEMPTS.labels("dead").inc()
                        await self._flush(done)
                        await outbox.mark_dead(
                            self._pool,
                            [d.delivery_id for d in lane[index:]],
                            attempted=delivery.delivery_id,
                            error=str(exc),
                        )
                        log.info(
                            "input delivery dead",
                            extra={
                                "run_id": delivery.event.run_id,
                                "stream_id": delivery.event.stream_id,
                                "sequence": delivery.event.sequence,
                                "reason": str(exc),
                            },
                        )
                    return
                except DeliveryFailed as exc:
                    await self._retry(done, lane, index, str(exc))
                    return
                except Exception as exc:  # an unclassified failure is retryable
                    log.exception("wait service raised", extra={"delivery": delivery.delivery_id})
                    await self._retry(done, lane, index, f"{type(exc).__name__}: {exc}")
                    return
                metrics.DELIVERY_ATTEMPTS.labels("delivered").inc()
                metrics.DELIVERY_LATENCY.observe(
                    max(0.0, (datetime.now(UTC) - delivery.created_at).total_seconds())
                )
                done.append(delivery.delivery_id)
            await self._flush(done)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # The lease runs out and another round (or replica) repeats what is unrecorded.
            log.warning("recording deliveries failed", extra={"error_type": type(exc).__name__})

    def _young(self, delivery: ClaimedDelivery) -> bool:
        age = (datetime.now(UTC) - delivery.created_at).total_seconds()
        return age < self.config.not_found_grace

    async def _flush(self, done: list[int]) -> None:
        await outbox.mark_delivered(self._pool, done)
        self.delivered += len(done)
        done.clear()

    async def _retry(
        self, done: list[int], lane: list[ClaimedDelivery], index: int, error: str
    ) -> None:
        await self._flush(done)
        failed = lane[index]
        attempts = failed.attempts + 1
        metrics.DELIVERY_ATTEMPTS.labels(
            "dead" if attempts >= self.config.max_attempts else "retrying"
        ).inc()
        if attempts >= self.config.max_attempts:
            await outbox.mark_dead(
                self._pool,
                [d.delivery_id for d in lane[index:]],
                attempted=failed.delivery_id,
                error=f"gave up after {attempts} attempts: {error}",
            )
            return
        await outbox.mark_retrying(
            self._pool,
            failed.delivery_id,
            owner=self.owner,
            error=error[:1000],
            delay=backoff_delay(attempts, self.config),
        )
        await outbox.release(
            self._pool, [d.delivery_id for d in lane[index + 1 :]], owner=self.owner
        )
