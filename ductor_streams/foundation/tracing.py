"""OpenTelemetry tracing of this process: off unless the OTEL_* variables configure it.

Off (the default), nothing of OpenTelemetry runs on any path: ``ENABLED`` is False,
every call site tests it before it does anything else, and ``tracer()`` is the API's
``NoOpTracer``. On (``Settings.trace_exporters`` names an exporter), the SDK's tracer
provider sends spans to the exporters named by ``OTEL_TRACES_EXPORTER`` (``otlp``:
OTLP over HTTP/protobuf to ``OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT``, batched;
``console``: stdout), sampled by ``OTEL_TRACES_SAMPLER``/``_ARG`` (default
``parentbased_always_on``), as the service ``OTEL_SERVICE_NAME``. docs/operators.md
lists the spans and how the trace crosses the outbox to the workflow.

Context crosses the outbox as a W3C ``traceparent``: the appending request's span is
stored with each input record's delivery row (``current_traceparent``), and the
dispatcher's signal span continues it (``context_of``); only sampled contexts are
stored, so with 1% sampling 99% of the rows carry none.

Call sites keep the cost off the hot path: ``if tracing.ENABLED:`` first, and the SDK
itself is imported only by ``configure_tracing`` when tracing is on.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NoOpTracer, SpanContext, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ductor_streams.config import Settings
from ductor_streams.foundation.logs import JsonFormatter

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

__all__ = [
    "ENABLED",
    "configure_tracing",
    "context_of",
    "current_traceparent",
    "install",
    "links_to",
    "request_context",
    "shutdown",
    "span",
    "tracer",
]

log = logging.getLogger(__name__)

ENABLED = False
_NO_OP = NoOpTracer()
_tracer: Tracer = _NO_OP
_provider: TracerProvider | None = None
_global_set = False
_ours: Any = None  # the provider we made global (never taken for the application's)
# The head-sampling ratio of a request without a (valid) parent, decided here before any
# SDK call (``sample_request``): an unsampled request then costs no span at all. None:
# no shortcut (always_on samplers, or a provider given to ``install``).
_root_ratio: float | None = None
_parent_based = True
# The attribute by which a span decided here tells the sampler (``_HeadSampled``).
HEAD_SAMPLED = "ductor_streams.head_sampled"
_PROPAGATOR = TraceContextTextMapPropagator()
# The instrumentation scope of every span of ours.
SCOPE = "ductor_streams"


def tracer() -> Tracer:
    """The tracer of this process: the no-op tracer unless tracing is on."""
    return _tracer


def configure_tracing(
    settings: Settings, *, service: str, exporter: SpanExporter | None = None
) -> bool:
    """Turn tracing on if ``settings`` (the OTEL_* variables) ask for it, or with
    ``exporter`` (tests: an in-memory exporter, spans handed over as they end).
    ``service`` is the default ``service.name`` (``OTEL_SERVICE_NAME`` wins). Returns
    whether tracing is on. Idempotent per process: a second call keeps the first setup.
    """
    if ENABLED:
        return True
    exporters = settings.trace_exporters
    if exporter is None and not exporters:
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    env = settings.otel_environ
    resource = Resource.create({SERVICE_NAME: env.get("OTEL_SERVICE_NAME") or service})
    provider = TracerProvider(resource=resource, sampler=_HeadSampled(_sampler(env)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    for name in exporters:
        if name == "otlp":
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(env)))
        elif name == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    install(provider)
    global _root_ratio, _parent_based
    name = env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on"
    _parent_based = name.startswith("parentbased_")
    if name.endswith("always_off"):
        _root_ratio = 0.0
    elif name.endswith("traceidratio"):
        _root_ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG") or 1.0)
    log.info(
        "tracing is on",
        extra={
            "exporters": ",".join(exporters) or "given",
            "service": resource.attributes.get(SERVICE_NAME),
        },
    )
    return True


def install(provider: TracerProvider) -> None:
    """Trace through ``provider`` from now on (also the global provider, once, so that
    Temporal's interceptor and the application's own code use the same one)."""
    global ENABLED, _tracer, _provider, _global_set
    _provider = provider
    _tracer = provider.get_tracer(SCOPE)
    ENABLED = True
    JsonFormatter.current_trace = staticmethod(_current_ids)  # type: ignore[method-assign]
    global _ours
    if not _global_set:
        _global_set = True
        _ours = provider
        trace.set_tracer_provider(provider)


@contextlib.contextmanager
def span(name: str, attributes: dict[str, Any] | None = None) -> Iterator[Any]:
    """A span around the block while tracing is on (current inside it), else nothing.
    For the paths off the hot one (objects, maintenance passes)."""
    if not ENABLED:
        yield None
        return
    with _tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current


def installed_provider() -> Any:
    """The provider tracing goes through, or None while tracing is off."""
    return _provider


def application_tracer() -> Tracer | None:
    """The tracer of a provider the application installed itself (set globally before
    ours), or None when it has none; never one while ours is installed."""
    if ENABLED:
        return None
    provider = trace.get_tracer_provider()
    if provider is _ours or isinstance(
        provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider
    ):
        return None
    return provider.get_tracer(SCOPE)


def sample_request(parent: Context | None) -> dict[str, Any] | None:
    """Whether a request continuing ``parent`` (None: none) gets a span: None for no
    span, else the attributes its span starts with. A request without a valid parent is
    head-sampled here at the configured ratio (a random draw instead of an SDK span whose
    sampler says no: docs/speed.md, "Head sampling before spans"); one with a parent
    follows it under a parent-based sampler."""
    ratio = _root_ratio
    if ratio is None:
        return {}
    if parent is not None:
        context = trace.get_current_span(parent).get_span_context()
        if context.is_valid:
            return {} if not _parent_based or context.trace_flags.sampled else None
    return {HEAD_SAMPLED: True} if random.random() < ratio else None


def _HeadSampled(delegate: Sampler) -> Sampler:
    """``delegate``, except that a span marked ``HEAD_SAMPLED`` (decided by
    ``sample_request``) is sampled, without the marker among its attributes."""
    from opentelemetry.sdk.trace.sampling import Decision, SamplingResult
    from opentelemetry.sdk.trace.sampling import Sampler as SdkSampler

    class HeadSampled(SdkSampler):
        def should_sample(
            self,
            parent_context: Context | None,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            if attributes and attributes.get(HEAD_SAMPLED):
                kept = {k: v for k, v in attributes.items() if k != HEAD_SAMPLED}
                return SamplingResult(Decision.RECORD_AND_SAMPLE, kept, trace_state)
            return delegate.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"HeadSampled{{{delegate.get_description()}}}"

    return HeadSampled()


def shutdown() -> None:
    """Flush and stop the provider (spans still queued are exported), tracing off."""
    global ENABLED, _tracer, _provider, _root_ratio
    provider, _provider = _provider, None
    ENABLED = False
    _root_ratio = None
    _tracer = _NO_OP
    JsonFormatter.current_trace = staticmethod(lambda: None)  # type: ignore[method-assign]
    if provider is not None:
        provider.shutdown()


def _sampler(env: dict[str, str]) -> Sampler:
    from opentelemetry.sdk.trace import sampling

    name = env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on"
    ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG") or 1.0)
    root: Sampler = {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
    }.get(name.removeprefix("parentbased_"), None) or sampling.TraceIdRatioBased(ratio)
    return sampling.ParentBased(root) if name.startswith("parentbased_") else root


def _otlp_exporter(env: dict[str, str]) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint:
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
        endpoint = base.rstrip("/") + "/v1/traces"
    # Headers, timeout, compression and certificates: the exporter reads the standard
    # OTEL_EXPORTER_OTLP_* variables for those itself.
    return OTLPSpanExporter(endpoint=endpoint)


def _current_ids() -> tuple[str, str] | None:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


# -- context across processes ------------------------------------------------------------


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, when tracing is on and it is
    sampled (an unsampled context would only make the rest unsampled too)."""
    if not ENABLED:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def context_of(traceparent: str | None) -> Context | None:
    """The context a stored ``traceparent`` continues; None for none (or a bad one)."""
    if not traceparent:
        return None
    context = _PROPAGATOR.extract({"traceparent": traceparent})
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def span_context_of(traceparent: str | None) -> SpanContext | None:
    context = context_of(traceparent)
    return None if context is None else trace.get_current_span(context).get_span_context()


def links_to(traceparents: Iterable[str | None], limit: int = 32) -> Sequence[Link]:
    """Links to the spans of up to ``limit`` stored contexts (a batch's requests)."""
    links: list[Link] = []
    for traceparent in traceparents:
        span_context = span_context_of(traceparent)
        if span_context is not None:
            links.append(Link(span_context))
            if len(links) >= limit:
                break
    return links


def request_context(headers: Iterable[tuple[bytes, bytes]]) -> Context | None:
    """The context an HTTP request's ``traceparent``/``tracestate`` headers carry."""
    carrier: dict[str, str] = {}
    for key, value in headers:
        name = key.lower()
        if name in (b"traceparent", b"tracestate"):
            carrier[name.decode()] = value.decode("latin-1")
    if not carrier:
        return None
    return _PROPAGATOR.extract(carrier)
