"""Fixtures of the Durable Streams endpoint's tests: one real server, DS URLs, tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ductor_streams.config import Settings
from tests.conftest import API, TokenFactory
from tests.support.server import ServerProcess

# Short enough that a long-poll at the tail answers 204 within a test's patience.
LONG_POLL_SECONDS = 1.0


@pytest.fixture(scope="session")
def ds_server(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server with a 1 s DS long-poll, 3 s DS SSE responses and a 0.2 s keepalive."""
    log = tmp_path_factory.mktemp("ds-server") / "server.log"
    env = {
        "DUCTOR_STREAMS_DS_LONG_POLL_SECONDS": str(LONG_POLL_SECONDS),
        "DUCTOR_STREAMS_DS_SSE_SECONDS": "3",
        "DUCTOR_STREAMS_SSE_KEEPALIVE_SECONDS": "0.2",
    }
    with ServerProcess(settings, extra_env=env, log_path=log) as proc:
        yield proc


@dataclass
class Ds:
    """One run's DS base URL and the native API beside it, on one HTTP client."""

    http: httpx.AsyncClient
    run_id: str
    headers: dict[str, str]

    def url(self, stream: str) -> str:
        return f"{API}/runs/{self.run_id}/ds/v1/stream/{stream}"

    def native(self, path: str = "") -> str:
        return f"{API}/runs/{self.run_id}{path}"


@pytest.fixture
async def ds(ds_server: Any, run_id: str, auth: TokenFactory) -> AsyncIterator[Ds]:
    async with httpx.AsyncClient(base_url=ds_server.url, timeout=60) as http:
        yield Ds(http, run_id, auth())
