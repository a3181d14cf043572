"""Fixtures for the security tests: an HTTP client on the real server subprocess and
a fresh world (tenant, run, stream with marked records) per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from tests.security.world import World

# The real Temporal dev server of tests/temporal, for the workers' log test.
from tests.temporal.conftest import temporal_address, temporal_env  # noqa: F401


@pytest.fixture
async def http(server: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        yield client


MakeWorld = Callable[..., Awaitable[World]]


@pytest.fixture
def make_world(http: httpx.AsyncClient) -> MakeWorld:
    """``await make_world(records=2, **definition_overrides)`` -> a set-up World."""

    async def make(records: int = 2, **definition: Any) -> World:
        return await World(http, **definition).setup(records)

    return make


@pytest.fixture
async def world(make_world: MakeWorld) -> World:
    return await make_world()
