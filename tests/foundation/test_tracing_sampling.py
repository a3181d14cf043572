"""Head sampling of requests (tracing.sample_request): a request without a parent is
drawn at the configured ratio before any span exists; one with a parent follows it
under a parent-based sampler; the sampler takes a request drawn here as sampled."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision

from ductor_streams.foundation import tracing

SAMPLED = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
UNSAMPLED = "00-" + "a" * 32 + "-" + "b" * 16 + "-00"


def _parent(traceparent: str) -> object:
    return tracing.request_context([(b"traceparent", traceparent.encode())])


def test_requests_are_head_sampled_at_the_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_parent_based", True)
    monkeypatch.setattr(tracing, "_root_ratio", 0.0)
    assert tracing.sample_request(None) is None  # never at ratio 0
    assert tracing.sample_request(_parent(UNSAMPLED)) is None
    assert tracing.sample_request(_parent(SAMPLED)) == {}  # the parent decided
    monkeypatch.setattr(tracing, "_root_ratio", 1.0)
    assert tracing.sample_request(None) == {tracing.HEAD_SAMPLED: True}
    monkeypatch.setattr(tracing, "_root_ratio", 0.5)
    drawn = [tracing.sample_request(None) is not None for _ in range(4000)]
    assert 1600 < sum(drawn) < 2400
    # Not parent-based: the SDK's ratio sampler decides for a request with a parent.
    monkeypatch.setattr(tracing, "_parent_based", False)
    assert tracing.sample_request(_parent(UNSAMPLED)) == {}
    # A provider given to install (tests): no shortcut, the SDK's sampler decides.
    monkeypatch.setattr(tracing, "_root_ratio", None)
    assert tracing.sample_request(None) == {}


def test_the_sampler_takes_a_request_drawn_here_as_sampled() -> None:
    sampler = tracing._HeadSampled(ALWAYS_OFF)
    drawn = sampler.should_sample(None, 1, "POST", attributes={tracing.HEAD_SAMPLED: True, "a": 1})
    assert drawn.decision is Decision.RECORD_AND_SAMPLE
    assert dict(drawn.attributes) == {"a": 1}
    assert sampler.should_sample(None, 1, "x", attributes={"a": 1}).decision is Decision.DROP
