"""Live delivery's own Prometheus counters: the Postgres reads it makes, by kind, and
the buffers it dropped. (The batches it fanned out without a read are counted by
``metrics.LIVE_FED``, a plain int: it is bumped per batch.)

Registered in the process registry of ``ductor_streams.foundation.metrics`` (served at /metrics).
What subscribers cost Postgres is read off it: ``follower`` reads are one per wake per
stream however many subscribers there are; ``subscriber`` reads are backfills, overflow
catch-ups and gap repairs; ``start`` is one per follower started.
"""

from __future__ import annotations

from prometheus_client import Counter

from ductor_streams.foundation.metrics import REGISTRY

LIVE_READS = Counter(
    "ductor_streams_live_reads",
    "Postgres reads made by live delivery, by kind (follower, subscriber, start).",
    ["kind"],
    registry=REGISTRY,
)
for _kind in ("follower", "subscriber", "start"):
    LIVE_READS.labels(_kind)

LIVE_OVERFLOWS = Counter(
    "ductor_streams_live_overflows",
    "Subscriber buffers dropped for going over their record or byte budget; the "
    "subscriber reads Postgres instead when it is ready.",
    registry=REGISTRY,
)

SLOW_SUBSCRIBER_DISCONNECTS = Counter(
    "ductor_streams_slow_subscriber_disconnects",
    "SSE connections cut because the client accepted no data for the stall timeout "
    "(DUCTOR_STREAMS_SSE_STALL_SECONDS); the client resumes with Last-Event-ID.",
    registry=REGISTRY,
)
