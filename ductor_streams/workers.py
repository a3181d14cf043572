"""Background workers that run inside ``serve`` (unless ``--no-workers``) and ``workers``.

Each worker is an async context manager factory taking the app-like holder of shared
resources; they start after the store and stop before it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from ductor_streams.config import Settings

WorkerFactory = Callable[[Any], contextlib.AbstractAsyncContextManager[None]]


def worker_services(settings: Settings) -> list[WorkerFactory]:
    """The workers this deployment runs (dispatcher, maintenance), in start order."""
    services: list[WorkerFactory] = []
    return services


@contextlib.asynccontextmanager
async def nothing(_app: Any) -> AsyncIterator[None]:
    yield
