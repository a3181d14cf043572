"""Prometheus metrics of this process, served as text at ``/metrics``.

The metric objects live here so that every part (append path, dispatcher, SSE,
maintenance) increments the same ones; none of them carries a run, stream or payload
label, so cardinality stays fixed and nothing of a tenant's data leaks.

Two figures are not counted in memory but read from Postgres when scraped, because
every replica would otherwise see only its own share: deliveries by state and the age
of the oldest delivery still owed (``refresh_from_database``).

Call sites, by metric:
- ``APPENDS``/``APPENDED_RECORDS``/``APPENDED_BYTES`` (``count_append``): the store's
  append (``Store.append``: HTTP and activities) and the object commit.
- ``CREDIT_REJECTIONS``: ``Store.append`` (object commits' refusals are not counted).
- ``DELIVERY_ATTEMPTS``, ``DELIVERY_LATENCY``: the dispatcher, once per signal attempt /
  per delivered record (commit of the record -> Temporal accepted the signal).
- ``SUBSCRIBERS``: the SSE handler (inc on start, dec in ``finally``).
- ``GAP_REPAIRS``/``GAP_REPAIRED_RECORDS``: where live delivery records gap evidence.
- ``PRUNED_RECORDS``, ``OBJECT_DELETIONS``, ``EXPIRED_INTENTS``: maintenance.
- ``UPKEEP_ERRORS``: maintenance, once per item of a pass that failed and was stepped
  over (``maintenance/isolation.py``).
- ``DELIVERY_RETRIES``: operator retries (``ops.retry_delivery``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

if TYPE_CHECKING:
    import asyncpg

__all__ = [
    "APPENDED_BYTES",
    "APPENDED_RECORDS",
    "APPENDS",
    "CONTENT_TYPE",
    "CREDIT_REJECTIONS",
    "DELIVERIES",
    "DELIVERY_ATTEMPTS",
    "DELIVERY_LATENCY",
    "DELIVERY_OLDEST_OWED",
    "DELIVERY_RETRIES",
    "EXPIRED_INTENTS",
    "GAP_REPAIRED_RECORDS",
    "GAP_REPAIRS",
    "OBJECT_DELETIONS",
    "PRUNED_RECORDS",
    "REGISTRY",
    "SUBSCRIBERS",
    "UPKEEP_ERRORS",
    "UPKEEP_STEPS",
    "count_append",
    "refresh_from_database",
    "render",
]

# A registry of our own: only these metrics (plus the process's CPU/memory), whatever
# else in the process may register into prometheus_client's global one.
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
CONTENT_TYPE = CONTENT_TYPE_LATEST

APPENDS = Counter(
    "ductor_streams_appends",
    "Append requests committed (idempotent replays not counted), by stream direction.",
    ["direction"],
    registry=REGISTRY,
)
APPENDED_RECORDS = Counter(
    "ductor_streams_appended_records",
    "Records committed by appends, by stream direction.",
    ["direction"],
    registry=REGISTRY,
)
APPENDED_BYTES = Counter(
    "ductor_streams_appended_bytes",
    "Payload bytes committed by appends (record sizes), by stream direction.",
    ["direction"],
    registry=REGISTRY,
)
CREDIT_REJECTIONS = Counter(
    "ductor_streams_credit_rejections",
    "Append requests refused for credit (reason=credit, 429) or total quota (reason=quota, 409).",
    ["reason"],
    registry=REGISTRY,
)
DELIVERIES = Gauge(
    "ductor_streams_deliveries",
    "Input deliveries by state, all tenants (read from Postgres at scrape time).",
    ["state"],
    registry=REGISTRY,
)
DELIVERY_OLDEST_OWED = Gauge(
    "ductor_streams_delivery_oldest_owed_age_seconds",
    "Age of the oldest pending or retrying input delivery (0 when none; read at scrape).",
    registry=REGISTRY,
)
DELIVERY_ATTEMPTS = Counter(
    "ductor_streams_delivery_attempts",
    "Signal attempts by the dispatcher, by outcome (delivered, retrying, dead).",
    ["outcome"],
    registry=REGISTRY,
)
DELIVERY_LATENCY = Histogram(
    "ductor_streams_delivery_latency_seconds",
    "From an input record's commit to Temporal accepting its signal.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
    registry=REGISTRY,
)
DELIVERY_RETRIES = Counter(
    "ductor_streams_delivery_operator_retries",
    "Dead deliveries re-queued by an operator.",
    registry=REGISTRY,
)
SUBSCRIBERS = Gauge(
    "ductor_streams_subscribers",
    "Live subscriptions (SSE) open in this process.",
    registry=REGISTRY,
)
GAP_REPAIRS = Counter(
    "ductor_streams_gap_repairs",
    "Gaps that live delivery detected and repaired from Postgres.",
    registry=REGISTRY,
)
GAP_REPAIRED_RECORDS = Counter(
    "ductor_streams_gap_repaired_records",
    "Records read from Postgres to repair live-delivery gaps.",
    registry=REGISTRY,
)
PRUNED_RECORDS = Counter(
    "ductor_streams_pruned_records",
    "Records removed by retention.",
    registry=REGISTRY,
)
OBJECT_DELETIONS = Counter(
    "ductor_streams_object_deletions",
    "Object deletions from the deletion outbox, by outcome (done, failed).",
    ["outcome"],
    registry=REGISTRY,
)
EXPIRED_INTENTS = Counter(
    "ductor_streams_expired_object_intents",
    "Object intents swept after expiry or abort.",
    registry=REGISTRY,
)
CONNECTIONS_REFUSED = Counter(
    "ductor_streams_connections_refused_total",
    "Connections closed or refused by the connection guard (http/connection_guard.py), "
    "by reason: head_timeout, head_too_large, too_many, evicted.",
    ["reason"],
    registry=REGISTRY,
)
UPKEEP_ERRORS = Counter(
    "ductor_streams_upkeep_errors",
    "Upkeep items that failed and were stepped over (the pass went on with the rest), by "
    "step: retention (one stream), expiry (one batch of intents), orphan_sweep (one "
    "region), deletion (one queued deletion).",
    ["step"],
    registry=REGISTRY,
)
UPKEEP_STEPS = ("retention", "expiry", "orphan_sweep", "deletion")

# Every known label value from the start, so a dashboard sees 0 rather than no series.
for _direction in ("input", "output"):
    for _counter in (APPENDS, APPENDED_RECORDS, APPENDED_BYTES):
        _counter.labels(_direction)
for _reason in ("credit", "quota"):
    CREDIT_REJECTIONS.labels(_reason)
for _reason in ("head_timeout", "head_too_large", "too_many", "evicted"):
    CONNECTIONS_REFUSED.labels(_reason)
for _outcome in ("delivered", "retrying", "dead"):
    DELIVERY_ATTEMPTS.labels(_outcome)
for _outcome in ("done", "failed"):
    OBJECT_DELETIONS.labels(_outcome)
for _step in UPKEEP_STEPS:
    UPKEEP_ERRORS.labels(_step)


# The append counters' children, bound once: ``labels()`` (a lock and a dict lookup
# per call) three times per append request showed in the append path's profile.
_APPEND_CHILDREN = {
    _direction: (
        APPENDS.labels(_direction),
        APPENDED_RECORDS.labels(_direction),
        APPENDED_BYTES.labels(_direction),
    )
    for _direction in ("input", "output")
}


def count_append(direction: str, records: int, nbytes: int) -> None:
    """One committed append request of ``records`` records and ``nbytes`` bytes."""
    children = _APPEND_CHILDREN.get(direction)
    if children is None:
        children = (
            APPENDS.labels(direction),
            APPENDED_RECORDS.labels(direction),
            APPENDED_BYTES.labels(direction),
        )
    appends, appended_records, appended_bytes = children
    appends.inc()
    appended_records.inc(records)
    appended_bytes.inc(nbytes)


async def refresh_from_database(pool: asyncpg.Pool) -> None:
    """Set the gauges that Postgres knows (all tenants) just before a scrape."""
    from ductor_streams.ops import Visibility, count_by_state

    counts, oldest = await count_by_state(pool, Visibility.everything())
    for state, value in counts.items():
        DELIVERIES.labels(state=state).set(value)
    DELIVERY_OLDEST_OWED.set(oldest or 0.0)


def render() -> bytes:
    """The Prometheus text exposition of every metric above."""
    return generate_latest(REGISTRY)
