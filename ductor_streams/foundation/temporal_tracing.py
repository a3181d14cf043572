"""Temporal's OpenTelemetry interceptor, for the dispatcher's client and the plugin.

``temporalio.contrib.opentelemetry.TracingInterceptor`` puts a ``SignalWorkflow`` span
under the dispatcher's signal span (in the client) and a ``HandleSignal`` span in the
workflow (in the worker). Its workflow side makes the ``HandleSignal`` span part of the
*workflow's* trace, with only a link to the signal's; for the input signal that would
leave the app's POST and the workflow's handling in two traces. So here the input
signal's ``HandleSignal`` span is a child of the signal's context (the same trace as
the POST that appended the record), linked to the workflow's own span when it has one.
Every other span is the stock interceptor's.

Only ever built while tracing is on (``interceptors``): with tracing off neither the
client nor the worker carries it.
"""

from __future__ import annotations

from typing import Any

import opentelemetry.context
import opentelemetry.trace
import temporalio.worker
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor

from ductor_streams.foundation import tracing
from ductor_streams.foundation.signals import INPUT_SIGNAL


class _InputSignalTracing(TracingWorkflowInboundInterceptor):
    """The stock workflow interceptor, but the input signal continues its sender's trace."""

    async def handle_signal(self, input: temporalio.worker.HandleSignalInput) -> None:
        header = input.headers.get(self.header_key)
        if input.signal != INPUT_SIGNAL or not header:
            await super().handle_signal(input)
            return
        carrier = self.payload_converter.from_payloads([header])[0]
        context = self._set_on_context(self.text_map_propagator.extract(carrier))
        token = opentelemetry.context.attach(context)
        try:
            self._completed_span(
                f"HandleSignal:{input.signal}",
                link_context_carrier=self._load_workflow_context_carrier(),
                kind=opentelemetry.trace.SpanKind.SERVER,
            )
            # The handler itself, without the stock span (it would be a second one).
            await temporalio.worker.WorkflowInboundInterceptor.handle_signal(self, input)
        finally:
            opentelemetry.context.detach(token)


class StreamsTracingInterceptor(TracingInterceptor):
    """``TracingInterceptor`` whose workflow side is ``_InputSignalTracing``."""

    def workflow_interceptor_class(
        self, input: temporalio.worker.WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)
        return _InputSignalTracing


def interceptors(tracer: opentelemetry.trace.Tracer | None = None) -> list[Any]:
    """The interceptors a Temporal client of this process gets: the tracing one while
    tracing is on (through ``tracer``, else this process's), none otherwise."""
    if tracer is None and not tracing.ENABLED:
        return []
    return [StreamsTracingInterceptor(tracer or tracing.tracer())]
