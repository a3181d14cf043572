"""Prometheus metrics of this process, served as text at ``/metrics``.

The metric objects live here so that every part (append path, dispatcher, SSE,
maintenance) increments the same ones; none of them carries a run, stream or payload
label, so cardinality stays fixed and nothing of a tenant's data leaks.

Metric objects only. Two figures are not counted in memory but read from Postgres when
scraped, because every replica would otherwise see only its own share: deliveries by
state and the age of the oldest delivery still owed (``ops/gauges.py`` sets them); the
connection pools are read at scrape by store/pool_metrics.py.

Call sites, by metric:
- ``APPENDS``/``APPENDED_RECORDS``/``APPENDED_BYTES`` (``count_append``): the store's
  append (``Store.append``: HTTP and activities) and the object commit.
- ``CREDIT_REJECTIONS``: ``Store.append`` (object commits' refusals are not counted).
- ``DELIVERY_ATTEMPTS``, ``DELIVERY_LATENCY``: the dispatcher, once per signal attempt /
  per delivered record (commit of the record -> Temporal accepted the signal).
- ``SUBSCRIBERS``: the SSE handler (inc on start, dec in ``finally``).
- ``REQUESTS_WAITING``, ``WAITS_ABANDONED``: waits on a caller's behalf, by reason:
  ``credit`` (store/credit_wait.py: appends and object commits), ``long_poll`` (the DS
  long-poll, http/fronts/ds/reads.py). ``CREDIT_RECHECKS``: store/credit_wait.py, per look at
  a waiting request's stream row.
- ``STAGED_STATEMENTS``: the appender, per staged statement (store/append.py).
- ``GAP_REPAIRS``/``GAP_REPAIRED_RECORDS``: where live delivery records gap evidence.
- ``PRUNED_RECORDS``, ``OBJECT_DELETIONS``, ``EXPIRED_INTENTS``: maintenance.
- ``READ_STALL_CUTS``: the write budget of catch-up responses (http/middleware/write_budget.py);
  ``READS_REFUSED``: the tenants' read slots (runtime/tenant_reads.py).
- ``UPKEEP_ERRORS``: maintenance, once per item of a pass that failed and was stepped
  over (``maintenance/isolation.py``).
- ``DELIVERY_RETRIES``: operator retries (``ops.retry_delivery``).
- ``DATABASE_IDENTITY_CHANGES``: store/identity.py, when a new pool connection or a
  scrape finds another timeline or system identifier than the process saw before.
- ``HTTP_REQUEST_DURATION`` (``observe_request``): every HTTP request, by method, route
  template and status (http/middleware/observe.py; the records front passes its route itself).
- ``SSE_EVENTS``, ``SSE_BACKFILL_RECORDS``: the SSE subscription (live/subscription.py);
  ``SSE_CHUNK_WRITES``: the fan-out's direct writes (http/codecs/sse_response.py).
- ``APPEND_STATEMENT_SECONDS``, ``APPEND_GROUP_REQUESTS`` (``observe_statement``): the
  appender, once per append statement (store/append.py).
- ``FOLLOWER_LAG``: live followers, per batch of records fanned out (live/stream_follower.py).
- ``DELIVERY_CLAIM_SECONDS``, ``DELIVERY_SIGNAL_SECONDS``: the dispatcher.
- ``DELIVERY_APPEND_LEASED``: the dispatcher, per delivery an append leased to it
  (``Dispatcher.adopt``; docs/temporal.md, "Leases taken by the append").
- ``ductor_streams_db_pool_*``: every pool given to ``store.pool_metrics.track_pool``.
- ``GC_PAUSE_SECONDS``: a garbage-collector callback that runtime/gc_tuning.py installs;
  ``ductor_streams_gc_frozen_objects``: read at scrape.
"""

from __future__ import annotations

import gc
from bisect import bisect_left
from collections.abc import Iterator

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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = [
    "APPENDED_BYTES",
    "APPENDED_RECORDS",
    "APPENDS",
    "CONTENT_TYPE",
    "CREDIT_RECHECKS",
    "CREDIT_REJECTIONS",
    "DATABASE_IDENTITY_CHANGES",
    "DELIVERIES",
    "DELIVERY_ATTEMPTS",
    "DELIVERY_LATENCY",
    "DELIVERY_OLDEST_OWED",
    "DELIVERY_RETRIES",
    "EXPIRED_INTENTS",
    "GAP_REPAIRED_RECORDS",
    "GAP_REPAIRS",
    "GC_PAUSE_SECONDS",
    "OBJECT_DELETIONS",
    "PRUNED_RECORDS",
    "REGISTRY",
    "REQUESTS_WAITING",
    "STAGED_STATEMENTS",
    "SUBSCRIBERS",
    "UPKEEP_ERRORS",
    "UPKEEP_STEPS",
    "WAITS_ABANDONED",
    "count_append",
    "observe_request",
    "observe_statement",
    "render",
]

# A registry of our own: only these metrics (plus the process's CPU/memory), whatever
# else in the process may register into prometheus_client's global one.
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
CONTENT_TYPE = CONTENT_TYPE_LATEST

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
# Why a request waits on its caller's behalf: for credit (an append or object commit of
# a ``block`` stream, refused once), or at a stream's tail (a Durable Streams long-poll).
WAIT_REASONS = ("credit", "long_poll")
# What else a caller's going ends: a request queued for its append statement, not yet
# sent (queued); a catch-up read waiting for one of its tenant's read slots (read_slot).
ABANDON_REASONS = (*WAIT_REASONS, "queued", "read_slot")
REQUESTS_WAITING = Gauge(
    "ductor_streams_requests_waiting",
    "Requests of this process waiting on their caller's behalf now, by reason "
    "(credit: an append or object commit blocked on credit; long_poll: a DS long-poll).",
    ["reason"],
    registry=REGISTRY,
)
WAITS_ABANDONED = Counter(
    "ductor_streams_waits_abandoned",
    "Waits ended because their caller went away (nothing more was done for it), by reason "
    "(also queued: an append not yet sent; read_slot: a read waiting for a slot).",
    ["reason"],
    registry=REGISTRY,
)
for _reason in WAIT_REASONS:  # exposed at 0 before the first wait
    REQUESTS_WAITING.labels(reason=_reason)
for _reason in ABANDON_REASONS:
    WAITS_ABANDONED.labels(reason=_reason)
CREDIT_RECHECKS = Counter(
    "ductor_streams_credit_rechecks",
    "Looks at a stream's row by a request waiting for credit, after a wake or its "
    "re-check interval, by outcome: sent (it could fit: the request went again) or "
    "still_refused (nothing was sent).",
    ["outcome"],
    registry=REGISTRY,
)
for _outcome in ("sent", "still_refused"):
    CREDIT_RECHECKS.labels(outcome=_outcome)
STAGED_STATEMENTS = Counter(
    "ductor_streams_append_staged_statements",
    "Append statements whose payloads were COPYed into a staging table first (more than "
    "8 MiB of payload: store/append.py STAGED_STATEMENT_BYTES).",
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
    "Connections closed or refused by the connection guard (compat/uvicorn_protocol.py), "
    "by reason: head_timeout, head_too_large, too_many, evicted (it waited for a request "
    "head at the cap), evicted_tenant (the newest of the tenant holding the most, for a "
    "tenant below its fair share).",
    ["reason"],
    registry=REGISTRY,
)
LIVE_READS_REFUSED = Counter(
    "ductor_streams_live_reads_refused_total",
    "Live reads (SSE, long-poll) refused 429 too_many_live_reads: their tenant had as "
    "many open in this process as it may (http/middleware/live_reads.py).",
    registry=REGISTRY,
)
READ_STALL_CUTS = Counter(
    "ductor_streams_read_stall_cuts_total",
    "Catch-up responses whose connection was cut because the client took no piece of "
    "the body within DUCTOR_STREAMS_READ_STALL_SECONDS (http/middleware/write_budget.py), "
    "by route: records, ds, object.",
    ["route"],
    registry=REGISTRY,
)
READS_REFUSED = Counter(
    "ductor_streams_reads_refused_total",
    "Catch-up reads refused with 429 too_many_reads: their tenant had "
    "DUCTOR_STREAMS_TENANT_MAX_READS in progress for the whole wait (runtime/tenant_reads.py).",
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
DATABASE_IDENTITY_CHANGES = Counter(
    "ductor_streams_database_identity_changes",
    "Times this process found Postgres on another timeline (a failover or promotion) or "
    "another cluster (system identifier) than it saw before (store/identity.py); commits "
    "acknowledged before it may be lost unless replication was synchronous.",
    registry=REGISTRY,
)


class Tally:
    """A counter that is a plain int (``tally.n += k``), read at scrape time: for the
    hot paths (the SSE fan-out, appends), where a Counter's lock per update would show.
    Bumped only from the event loop's thread, as ``LoopHistogram`` is observed."""

    __slots__ = ("description", "n", "name")

    def __init__(self, name: str, description: str) -> None:
        self.name = name
        self.description = description
        self.n = 0


class _TallyCollector(Collector):
    def __init__(self, *tallies: Tally) -> None:
        self.tallies = tallies

    def collect(self) -> Iterator[CounterMetricFamily]:
        for tally in self.tallies:
            yield CounterMetricFamily(tally.name, tally.description, value=tally.n)


SSE_EVENTS = Tally(
    "ductor_streams_sse_events_written",
    "Record events written to SSE subscribers (backfill and live).",
)
SSE_CHUNK_WRITES = Tally(
    "ductor_streams_sse_chunk_writes",
    "Batches the live fan-out wrote to an SSE subscriber's connection itself, as one "
    "chunk framed once for all subscribers with the same redaction.",
)
LIVE_FED = Tally(
    "ductor_streams_live_fed_batches",
    "Batches fanned out without a read: this process's own commits, and the records "
    "that commit wakes carry.",
)
REGISTRY.register(_TallyCollector(SSE_EVENTS, SSE_CHUNK_WRITES, LIVE_FED))


class DirectionTally:
    """Tallies by stream direction (``input``, ``output``): a Counter with one label
    whose children are plain ints (``tally.by_direction["input"].n += k``)."""

    __slots__ = ("by_direction", "description", "name")

    def __init__(self, name: str, description: str) -> None:
        self.name = name
        self.description = description
        self.by_direction = {d: Tally(name, description) for d in ("input", "output")}


class _DirectionTallyCollector(Collector):
    def __init__(self, *tallies: DirectionTally) -> None:
        self.tallies = tallies

    def collect(self) -> Iterator[CounterMetricFamily]:
        for tally in self.tallies:
            family = CounterMetricFamily(tally.name, tally.description, labels=["direction"])
            for direction, child in tally.by_direction.items():
                family.add_metric([direction], child.n)
            yield family


# Counted per committed append request (every batch of an activity's writer): three
# locked Counter updates were ~2.5% of a streaming worker's CPU.
APPENDS = DirectionTally(
    "ductor_streams_appends",
    "Append requests committed (idempotent replays not counted), by stream direction.",
)
APPENDED_RECORDS = DirectionTally(
    "ductor_streams_appended_records",
    "Records committed by appends, by stream direction.",
)
APPENDED_BYTES = DirectionTally(
    "ductor_streams_appended_bytes",
    "Payload bytes committed by appends (record sizes), by stream direction.",
)
REGISTRY.register(_DirectionTallyCollector(APPENDS, APPENDED_RECORDS, APPENDED_BYTES))


class LoopHistogram:
    """A histogram of plain ints, without prometheus_client's lock per observation,
    read at scrape time: for the request path, where three locked updates per request
    (the sum and a bucket, per histogram) showed in its profile. Observed only from the
    event loop's thread (everything of the request and append paths runs there); a
    scrape from another thread reads a consistent enough snapshot (each int is read
    once). ``labels(...)`` gives the child for one combination of label values."""

    __slots__ = ("_bounds", "_children", "description", "labelnames", "name")

    def __init__(
        self, name: str, description: str, labelnames: tuple[str, ...], buckets: tuple[float, ...]
    ) -> None:
        self.name = name
        self.description = description
        self.labelnames = labelnames
        self._bounds = tuple(float(b) for b in buckets)
        self._children: dict[tuple[str, ...], LoopHistogramChild] = {}

    def labels(self, *values: str) -> LoopHistogramChild:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = LoopHistogramChild(self._bounds)
        return child

    def observe(self, value: float) -> None:
        """Observe on the child without labels (a histogram with no label names)."""
        self.labels().observe(value)

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.description, labels=self.labelnames)
        bounds = [floatToGoString(b) for b in self._bounds] + ["+Inf"]
        for values, child in list(self._children.items()):
            cumulative, running = [], 0
            for bound, count in zip(bounds, list(child.counts), strict=True):
                running += count
                cumulative.append((bound, running))
            family.add_metric(list(values), cumulative, child.sum)
        return family


class LoopHistogramChild:
    """One label combination of a ``LoopHistogram``: bucket counts (the last is +Inf,
    each count not cumulative; ``family`` sums them) and the sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: the first bound >= value, Prometheus's "le" (less or equal).
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value


class _LoopHistogramCollector(Collector):
    def __init__(self, *histograms: LoopHistogram) -> None:
        self.histograms = histograms

    def collect(self) -> Iterator[HistogramMetricFamily]:
        for histogram in self.histograms:
            yield histogram.family()


_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
HTTP_REQUEST_DURATION = LoopHistogram(
    "ductor_streams_http_request_duration_seconds",
    "HTTP requests from arrival to the end of the response (an SSE response: the "
    "subscription's lifetime), by method, route template and status; _count counts them.",
    ("method", "route", "status"),
    (*_FAST, 30, 60, 300, 3600),
)
SSE_BACKFILL_RECORDS = Histogram(
    "ductor_streams_sse_backfill_records",
    "Records a subscription read from Postgres before it went live (its backfill).",
    buckets=(0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000),
    registry=REGISTRY,
)
APPEND_STATEMENT_SECONDS = LoopHistogram(
    "ductor_streams_append_statement_seconds",
    "One append statement (group commit), from send to answer.",
    (),
    _FAST,
)
APPEND_GROUP_REQUESTS = LoopHistogram(
    "ductor_streams_append_group_requests",
    "Append requests that went in one statement (its group size).",
    (),
    (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
GC_PAUSE_SECONDS = LoopHistogram(
    "ductor_streams_gc_pause_seconds",
    "Garbage collections of this process by generation (2: full), each holding the "
    "event loop; observed once the collector is tuned (ductor_streams/runtime/gc_tuning.py).",
    ("generation",),
    _FAST,
)
# Observed per fanned-out batch (for every record at 100 streaming activities): a
# prometheus_client Histogram's two locked updates were ~3% of `serve`'s CPU there.
FOLLOWER_LAG = LoopHistogram(
    "ductor_streams_follower_lag_seconds",
    "From a record's commit (its appended_at) to its fan-out to this process's live "
    "subscribers, per batch (the newest record of it).",
    (),
    _FAST,
)
FOLLOWER_LAG.labels()  # exposed at 0 before the first fan-out, as the Histogram was
REGISTRY.register(
    _LoopHistogramCollector(
        HTTP_REQUEST_DURATION,
        APPEND_STATEMENT_SECONDS,
        APPEND_GROUP_REQUESTS,
        GC_PAUSE_SECONDS,
        FOLLOWER_LAG,
    )
)


class _FrozenObjectsCollector(Collector):
    """The objects this process froze out of garbage collection, read when scraped
    (0 until ductor_streams/runtime/gc_tuning.py has tuned it)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "ductor_streams_gc_frozen_objects",
            "Objects alive at the end of start-up, frozen out of garbage collection.",
            value=gc.get_freeze_count(),
        )


REGISTRY.register(_FrozenObjectsCollector())
DELIVERY_CLAIM_SECONDS = Histogram(
    "ductor_streams_delivery_claim_seconds",
    "One dispatcher claim statement (leasing due deliveries).",
    buckets=_FAST,
    registry=REGISTRY,
)
DELIVERY_APPEND_LEASED = Counter(
    "ductor_streams_delivery_append_leased",
    "Input deliveries leased to this process's dispatcher by their own append (no claim).",
    registry=REGISTRY,
)
DELIVERY_SIGNAL_SECONDS = Histogram(
    "ductor_streams_delivery_signal_seconds",
    "One input signal to Temporal, from send to its answer (any outcome).",
    buckets=(*_FAST, 30),
    registry=REGISTRY,
)

# Every known label value from the start, so a dashboard sees 0 rather than no series
# (the DirectionTally counters above have both directions from the start).
for _reason in ("credit", "quota"):
    CREDIT_REJECTIONS.labels(_reason)
for _reason in ("head_timeout", "head_too_large", "too_many", "evicted"):
    CONNECTIONS_REFUSED.labels(_reason)
for _route in ("records", "ds", "object"):
    READ_STALL_CUTS.labels(_route)
for _outcome in ("delivered", "retrying", "dead"):
    DELIVERY_ATTEMPTS.labels(_outcome)
for _outcome in ("done", "failed"):
    OBJECT_DELETIONS.labels(_outcome)
for _step in UPKEEP_STEPS:
    UPKEEP_ERRORS.labels(_step)


def count_append(direction: str, records: int, nbytes: int) -> None:
    """One committed append request of ``records`` records and ``nbytes`` bytes."""
    APPENDS.by_direction[direction].n += 1
    APPENDED_RECORDS.by_direction[direction].n += records
    APPENDED_BYTES.by_direction[direction].n += nbytes


# (method, route, status) -> the histogram's child: ``labels()`` takes a lock and
# builds a key each call; the hot path's few combinations are bound once.
_REQUEST_CHILDREN: dict[tuple[str, str, int], LoopHistogramChild] = {}


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    """One HTTP request answered ``status`` after ``seconds``."""
    key = (method, route, status)
    child = _REQUEST_CHILDREN.get(key)
    if child is None:
        child = HTTP_REQUEST_DURATION.labels(method, route, str(status))
        if len(_REQUEST_CHILDREN) < 10_000:
            _REQUEST_CHILDREN[key] = child
    child.observe(seconds)


_STATEMENT_SECONDS = APPEND_STATEMENT_SECONDS.labels()
_GROUP_REQUESTS = APPEND_GROUP_REQUESTS.labels()


def observe_statement(requests: int, seconds: float) -> None:
    """One append statement of ``requests`` requests that took ``seconds``."""
    _STATEMENT_SECONDS.observe(seconds)
    _GROUP_REQUESTS.observe(requests)


def render() -> bytes:
    """The Prometheus text exposition of every metric above."""
    return generate_latest(REGISTRY)
