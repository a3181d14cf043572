"""Fixtures of the live-delivery tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ductor_streams.config import Settings
from tests.support.server import ServerProcess


@pytest.fixture(scope="session")
def live_server(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server with a 0.2 s keepalive, 50-record subscriber buffers (to overflow) and
    no safety poll."""
    log = tmp_path_factory.mktemp("live-server") / "server.log"
    env = {
        "DUCTOR_STREAMS_SSE_KEEPALIVE_SECONDS": "0.2",
        "DUCTOR_STREAMS_SSE_BUFFER_RECORDS": "50",
        # No safety poll: delivery here depends on wakes alone (the LISTEN kill test).
        "DUCTOR_STREAMS_LIVE_POLL_SECONDS": "3600",
    }
    with ServerProcess(settings, extra_env=env, log_path=log) as proc:
        yield proc
