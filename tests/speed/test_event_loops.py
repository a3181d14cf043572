"""`ductor-streams workers` runs its services on uvloop, as `serve` runs under uvicorn:
asyncio's own loop cost a worker ~15% more CPU per streamed record (docs/temporal.md,
"Run the worker on uvloop")."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from ductor_streams.config import Settings
from ductor_streams.process import workers as worker_process


def test_workers_run_their_services_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    loops: list[type] = []

    async def services(settings: Settings, stop: asyncio.Event) -> None:
        loops.append(type(asyncio.get_running_loop()))

    monkeypatch.setattr(worker_process, "run_worker_services", services)
    # The process-wide logging and tracing set-up is not what this test is about.
    monkeypatch.setattr(worker_process, "configure_logging", lambda level: None)
    monkeypatch.setattr(worker_process, "configure_tracing", lambda settings, service: None)

    assert worker_process.run_workers(Settings(database_url="postgresql://unused")) == 0
    assert loops == [uvloop.Loop]
