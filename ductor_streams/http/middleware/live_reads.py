"""Live reads per tenant: how many SSE responses and waiting long-polls one tenant
may hold open at once in this server process.

A live read holds a connection (and a subscription, a task) for as long as it lasts,
so one token opening thousands could take every connection the server has, and then
``/healthz`` and every other tenant's requests are refused with it. Native subscribe
(http/routes/subscribe.py), Durable Streams SSE (http/fronts/ds/sse.py) and the long-polls of
the DS endpoint while they wait (http/fronts/ds/reads.py) each take a place of their tenant
(the token's ``tenant`` claim) here, and give it back when they end, however they end.
Past ``limit`` a new one is refused, ``429 too_many_live_reads`` with ``Retry-After``,
after the checks of who may read what (401, 404, 403 come first) and before any read.

The default is half the connection cap (``DUCTOR_STREAMS_MAX_CONNECTIONS``, itself the
file limit less a reserve): one tenant's live reads can never hold more than half of
the server's connections, which leaves the other half for other tenants and for every
short request (appends, reads, probes); and a deployment with one tenant (the common
case) can still spend half its connections on live reads without setting anything. A
smaller fraction would cap such a deployment well below what it can serve. The count
is per process: each replica counts its own.
"""

from __future__ import annotations

from ductor_streams.compat.uvicorn_protocol import default_max_connections
from ductor_streams.config import Settings
from ductor_streams.errors import TooManyLiveReads
from ductor_streams.foundation import metrics

# The default limit is the connection cap divided by this.
DEFAULT_SHARE_OF_CONNECTIONS = 2


def tenant_live_limit(settings: Settings) -> int:
    """``DUCTOR_STREAMS_TENANT_MAX_LIVE``, or half the connection cap."""
    if settings.tenant_max_live is not None:
        return settings.tenant_max_live
    cap = settings.max_connections or default_max_connections()
    return max(1, cap // DEFAULT_SHARE_OF_CONNECTIONS)


class LiveReads:
    """The live reads open in this process, counted per tenant, at most ``limit`` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def count(self, tenant: str) -> int:
        """How many live reads ``tenant`` has open."""
        return self._open.get(tenant, 0)

    def enter(self, tenant: str) -> LiveRead:
        """A place for one more live read of ``tenant``, given back by ``LiveRead.close``;
        TooManyLiveReads when the tenant holds ``limit`` already."""
        held = self._open.get(tenant, 0)
        if held >= self.limit:
            metrics.LIVE_READS_REFUSED.inc()
            raise TooManyLiveReads(
                f"this token's tenant has {held} live reads open, the most this server "
                "allows; retry once one of them has ended"
            )
        self._open[tenant] = held + 1
        return LiveRead(self, tenant)

    def _leave(self, tenant: str) -> None:
        held = self._open[tenant] - 1
        if held:
            self._open[tenant] = held
        else:
            del self._open[tenant]


class LiveRead:
    """One live read's place; ``close`` gives it back (once, however often called)."""

    __slots__ = ("_reads", "_tenant")

    def __init__(self, reads: LiveReads, tenant: str) -> None:
        self._reads: LiveReads | None = reads
        self._tenant = tenant

    def close(self) -> None:
        reads = self._reads
        if reads is not None:
            self._reads = None
            reads._leave(self._tenant)

    def __enter__(self) -> LiveRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
