"""``StreamsPlugin``: a thin ``SimplePlugin`` for client and worker."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from temporalio.plugin import SimplePlugin
from temporalio.worker import WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from ductor_streams.activities import StreamsActivities
from ductor_streams.config import Settings
from ductor_streams.foundation import tracing
from ductor_streams.runtime.gc_tuning import tune_garbage_collection

PLUGIN_NAME = "ductor_streams.StreamsPlugin"


def _pass_through(existing: WorkflowRunner | None) -> WorkflowRunner:
    """Let workflow code import ``ductor_streams`` (the helpers) from outside the sandbox,
    intentionally, so a strict import policy accepts it."""
    if existing is None:
        existing = SandboxedWorkflowRunner()
    if isinstance(existing, SandboxedWorkflowRunner):
        return dataclasses.replace(
            existing, restrictions=existing.restrictions.with_passthrough_modules("ductor_streams")
        )
    return existing


class StreamsPlugin(SimplePlugin):
    """Registers the stream activities, the sandbox pass-through for the helpers, and
    the activities' runtime (ductor_streams/runtime/__init__.py) for the life of the worker (or
    replayer).

    Give it to the client (``Client.connect(..., plugins=[StreamsPlugin()])``); workers
    made from that client pick it up. Configuration comes from the environment
    (``DUCTOR_STREAMS_DATABASE_URL``, ``_TENANT``, ``_REGION``, ``_OBJECT_STORE``;
    docs/configuration.md) unless given here. The helpers need no data converter beyond
    Temporal's default (their types are dataclasses), so the client's converter is kept.

    ``tune_gc``: once the first worker of the process has opened the runtime, the
    objects alive then leave garbage collection and full collections become ten times
    rarer (``ductor_streams.runtime.gc_tuning``: full collections held a worker's event loop for
    tens of milliseconds, stalling every streaming activity). Pass False to leave the process's
    collector alone.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        database_url: str | None = None,
        tenant: str | None = None,
        region: str | None = None,
        activities: StreamsActivities | None = None,
        tune_gc: bool = True,
    ) -> None:
        settings = (settings or Settings.from_env()).with_overrides(
            database_url=database_url, tenant=tenant, region=region
        )
        self.settings = settings
        # Not `self.activities`: SimplePlugin keeps its activity list under that name.
        self.streams_activities = activities or StreamsActivities(settings)
        self.tune_gc = tune_gc
        super().__init__(
            PLUGIN_NAME,
            activities=self.streams_activities.all(),
            workflow_runner=_pass_through,
            run_context=self._run_context,
            interceptors=_tracing_interceptors(settings) or None,
        )

    @contextlib.asynccontextmanager
    async def _run_context(self) -> AsyncIterator[None]:
        """The activities' runtime for the worker's life; then, once per process, the
        garbage collection tuned (``tune_gc``)."""
        async with self.streams_activities.lifetime():
            if self.tune_gc:
                tune_garbage_collection()
            yield


def _tracing_interceptors(settings: Settings) -> list[Any]:
    """Temporal's tracing interceptor (ductor_streams/foundation/temporal_tracing.py) when tracing
    is configured: through the application's own OpenTelemetry provider if it set one
    up before, else ours from the OTEL_* variables (docs/operators.md). With neither,
    none: nothing of OpenTelemetry runs in the worker's client or workflows."""
    tracer = tracing.application_tracer()
    if tracer is None and not tracing.configure_tracing(
        settings, service="ductor-streams-temporal-worker"
    ):
        return []
    # Deferred: Temporal's OpenTelemetry contrib is loaded only when tracing is on.
    from ductor_streams.foundation.temporal_tracing import interceptors

    return interceptors(tracer)
