"""metrics.LoopHistogram (the request path's lock-free histogram) renders exactly what
prometheus_client's own Histogram renders for the same observations."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.registry import Collector

from ductor_streams.foundation import metrics

BUCKETS = (0.001, 0.01, 0.1, 1, 10)
# On a bound, just past one, below the first, past the last: every "le" edge.
VALUES = (0.0, 0.0005, 0.001, 0.0010001, 0.05, 0.1, 1.0, 9.99, 10.0, 10.5, 1e9)


def _without_created(text: bytes) -> list[str]:
    # prometheus_client's Histogram adds a _created sample (its creation time); the
    # loop histogram has none, and the time differs anyway.
    return [line for line in text.decode().splitlines() if "_created" not in line]


def _rendered(collector: Collector) -> list[str]:
    registry = CollectorRegistry()
    registry.register(collector)
    return _without_created(generate_latest(registry))


def test_same_text_as_prometheus_histogram_with_labels() -> None:
    reference_registry = CollectorRegistry()
    reference = Histogram(
        "x_seconds", "help text", ["method", "status"], buckets=BUCKETS, registry=reference_registry
    )
    ours = metrics.LoopHistogram("x_seconds", "help text", ("method", "status"), BUCKETS)
    for i, value in enumerate(VALUES):
        labels = ("GET", "200") if i % 3 else ("POST", "201")
        reference.labels(*labels).observe(value)
        ours.labels(*labels).observe(value)

    expected = _without_created(generate_latest(reference_registry))
    assert _rendered(metrics._LoopHistogramCollector(ours)) == expected
    assert any('le="0.001"' in line and line.endswith(" 2.0") for line in expected)


def test_same_text_without_labels_and_with_integer_buckets() -> None:
    reference_registry = CollectorRegistry()
    reference = Histogram(
        "n_requests", "group size", buckets=(1, 2, 4), registry=reference_registry
    )
    ours = metrics.LoopHistogram("n_requests", "group size", (), (1, 2, 4))
    for value in (1, 1, 2, 3, 4, 5, 64):
        reference.observe(value)
        ours.observe(value)
    assert _rendered(metrics._LoopHistogramCollector(ours)) == _without_created(
        generate_latest(reference_registry)
    )


def test_request_and_statement_metrics_count_each_observation() -> None:
    before = metrics.REGISTRY.get_sample_value("ductor_streams_append_group_requests_count") or 0.0
    seconds_before = (
        metrics.REGISTRY.get_sample_value(
            "ductor_streams_append_statement_seconds_bucket", {"le": "0.001"}
        )
        or 0.0
    )
    metrics.observe_statement(3, 0.0004)
    metrics.observe_statement(5, 0.5)
    assert metrics.REGISTRY.get_sample_value("ductor_streams_append_group_requests_count") == (
        before + 2
    )
    assert metrics.REGISTRY.get_sample_value(
        "ductor_streams_append_statement_seconds_bucket", {"le": "0.001"}
    ) == (seconds_before + 1)

    labels = {"method": "PATCH", "route": "/test/loop-histogram", "status": "418"}
    metrics.observe_request("PATCH", "/test/loop-histogram", 418, 0.002)
    metrics.observe_request("PATCH", "/test/loop-histogram", 418, 0.003)
    name = "ductor_streams_http_request_duration_seconds"
    assert metrics.REGISTRY.get_sample_value(f"{name}_count", labels) == 2
    assert metrics.REGISTRY.get_sample_value(f"{name}_sum", labels) == 0.005
    assert metrics.REGISTRY.get_sample_value(f"{name}_bucket", {**labels, "le": "0.0025"}) == 1
