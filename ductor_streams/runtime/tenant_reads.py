"""Per-tenant fairness for catch-up reads: at most ``max_reads`` at once per tenant.

A catch-up read (a native page, a DS catch-up page, an object download) costs the
server Postgres time, event-loop time and a stream of body bytes; a tenant running a
hundred of them at once took the whole process, and another tenant's one-record append
waited seconds behind them (docs/security.md, "Tenant isolation"). Here each tenant
(the token's ``tenant`` claim) holds at most ``max_reads`` read slots in this process; a
read past that waits up to ``wait_seconds`` for one (first come, first served), then is
refused with ``TooManyReads`` (429 ``too_many_reads`` with ``Retry-After``). The wait
makes a client that retries at once pace itself at the rate reads finish.

A slot is held from the read's first query until its body has been written (or its
connection cut: http/middleware/write_budget.py), so a tenant's stalled readers count against that
tenant alone. Other tenants' reads are never held back by it.
"""

from __future__ import annotations

import asyncio
import collections

from ductor_streams.errors import ClientGone, TooManyReads
from ductor_streams.foundation import metrics
from ductor_streams.store.gone import CallerGone, unless_gone

# What a refused reader is told to wait: reads take well under a second each.
RETRY_AFTER_SECONDS = 1


class ReadSlot:
    """One admitted read; ``release`` (idempotent) gives the slot to the next waiter."""

    __slots__ = ("_reads", "_tenant")

    def __init__(self, reads: TenantReads, tenant: str) -> None:
        self._reads: TenantReads | None = reads
        self._tenant = tenant

    def release(self) -> None:
        reads, self._reads = self._reads, None
        if reads is not None:
            reads._release(self._tenant)

    def __del__(self) -> None:
        # A read whose body was abandoned unsent (its task cancelled before the body's
        # iterator ran) still gives its slot back.
        self.release()


class TenantReads:
    """The read slots of every tenant of this process."""

    def __init__(self, max_reads: int, wait_seconds: float) -> None:
        self.max_reads = max_reads
        self.wait_seconds = wait_seconds
        # Tenants with a read in progress (no entry: none); their waiters, oldest first.
        self._active: dict[str, int] = {}
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}

    def active(self, tenant: str) -> int:
        """The tenant's reads in progress."""
        return self._active.get(tenant, 0)

    async def admit(self, tenant: str, caller_gone: CallerGone | None = None) -> ReadSlot:
        """A slot for one read of ``tenant``, at once or after a wait of up to
        ``wait_seconds``; TooManyReads when none came free in time. ``caller_gone``
        (store/gone.py) ends the wait with ClientGone once the caller has gone: a
        reader that left holds no place in the queue."""
        active = self._active.get(tenant, 0)
        # Below the cap nobody of the tenant waits: a release hands its slot to a waiter
        # before the count drops.
        if active < self.max_reads:
            self._active[tenant] = active + 1
            return ReadSlot(self, tenant)
        await self._wait(tenant, caller_gone)
        return ReadSlot(self, tenant)

    async def _wait(self, tenant: str, caller_gone: CallerGone | None) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        queue = self._waiting.setdefault(tenant, collections.deque())
        queue.append(waiter)
        timer = loop.call_later(self.wait_seconds, _expire, waiter)
        try:
            if caller_gone is None:
                await waiter
            else:
                try:
                    await unless_gone(waiter, caller_gone())
                except ClientGone:
                    metrics.WAITS_ABANDONED.labels(reason="read_slot").inc()
                    raise
        except BaseException:
            # Refused, or cancelled (the client went away). A slot handed over just as
            # the task was cancelled is handed on.
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release(tenant)
            raise
        finally:
            timer.cancel()
            if waiter in queue:
                queue.remove(waiter)
            if not queue and self._waiting.get(tenant) is queue:
                del self._waiting[tenant]

    def _release(self, tenant: str) -> None:
        queue = self._waiting.get(tenant)
        while queue:
            waiter = queue.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on: the count stays
                return
        active = self._active.get(tenant, 0) - 1
        if active > 0:
            self._active[tenant] = active
        else:
            self._active.pop(tenant, None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        metrics.READS_REFUSED.inc()
        waiter.set_exception(
            TooManyReads(
                "too many catch-up reads of this tenant are in progress",
                retry_after=RETRY_AFTER_SECONDS,
            )
        )
