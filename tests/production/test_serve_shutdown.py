"""SIGTERM to one of two ``serve`` replicas under 16 writers and 100 SSE subscribers:
it exits by draining, not by its shutdown budget running out; every in-flight append
is answered (or retried on the other replica with its Idempotency-Key), and every
subscriber, told to reconnect, resumes on the other replica and sees each record
exactly once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from tests.conftest import JWT_SECRET
from tests.deploy.helpers import FORCED_SHUTDOWN
from tests.support.shutdown import run_scenario


@pytest.mark.timeout(240)
async def test_sigterm_drains_sse_answers_appends_and_exits_by_draining(
    settings: Settings, tenant: str, tmp_path: Path
) -> None:
    token = issue_token(
        JWT_SECRET,
        sub="shutdown-test",
        tenant=tenant,
        scopes=["streams:read", "streams:write", "streams:admin"],
        runs=["*"],
        ttl_seconds=600,
    )
    result = await run_scenario(settings, token, writers=16, subscribers=100, log_dir=tmp_path)
    print(f"serve exited {result.exit_seconds:.2f} s after SIGTERM; {result}")
    # uvicorn re-raises the signal it handled once it has shut down, as a process
    # without a handler would end: killed by SIGTERM (exit status 143 in a shell).
    assert result.exit_code == -signal.SIGTERM
    # It exited by draining: uvicorn's forced end, when requests outlive the shutdown
    # budget, is logged, and is not in A's log. (A hang fails the scenario's 30 s wait.)
    assert FORCED_SHUTDOWN not in (tmp_path / "a.log").read_text()
    # Nothing acknowledged is lost, nothing is stored twice, nothing unacknowledged
    # slipped in (each writer retried its request until one replica answered it).
    assert result.duplicates_stored == 0
    assert result.acked_missing == 0
    assert result.stored_unacked == 0
    assert result.stored == result.acked
    # No append was refused with a 5xx while A shut down: it answered or went away.
    assert {s for s in result.writer_statuses if s >= 500} == set()
    # Every subscriber got A's reconnect hint, resumed on B, and saw 1..latest once.
    assert result.subscriber_faults == []
    assert result.subscribers_complete == 100
    assert result.reconnect_events == 100
