"""The Python client's retries, against an httpx.MockTransport: 502/503/504 and
transport errors are retried with jittered backoff within the caller's budget, never
sooner than Retry-After, with the same Idempotency-Key; other problems are not."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from ductor_streams.client import ApiError, StreamsClient, api
from ductor_streams.client.retry import retry_wait

APPENDED = {"first_sequence": 1, "last_sequence": 1}
UNAVAILABLE = {"code": "database_unavailable", "status": 503, "detail": "restarting"}


class Script:
    """Answers requests from a list of (status, body, headers) or exceptions, in order,
    and remembers each request and when it came."""

    def __init__(self, answers: list[tuple[int, dict[str, object], dict[str, str]] | Exception]):
        self.answers = answers
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(time.monotonic())
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        status, body, headers = answer
        return httpx.Response(status, json=body, headers=headers)


def client_for(script: Script, **options: float | int | None) -> StreamsClient:
    http = httpx.AsyncClient(base_url="http://test", transport=httpx.MockTransport(script))
    return StreamsClient("http://test", "token", http=http, **options)  # type: ignore[arg-type]


def refused() -> httpx.ConnectError:
    return httpx.ConnectError("connection refused")


async def test_an_append_survives_an_outage_with_one_idempotency_key() -> None:
    script = Script(
        [
            (503, UNAVAILABLE, {"Retry-After": "1"}),
            refused(),
            (502, {"code": "bad_gateway"}, {}),
            (504, {"code": "gateway_timeout"}, {}),
            (201, APPENDED, {}),
        ]
    )
    async with client_for(script, retry_budget=30) as client:
        result = await client.append("run", "s", [{"x": 1}])
    assert (result.first_sequence, result.last_sequence) == (1, 1)
    keys = {r.headers["idempotency-key"] for r in script.requests}
    assert len(script.requests) == 5 and len(keys) == 1 and keys != {""}
    # Retry-After honoured: the second try came at least a second after the first.
    assert script.times[1] - script.times[0] >= 1.0


async def test_the_callers_key_is_kept() -> None:
    script = Script([(503, UNAVAILABLE, {"Retry-After": "1"}), (200, APPENDED, {})])
    async with client_for(script) as client:
        await client.append("run", "s", [1], idempotency_key="mine-1")
    assert [r.headers["idempotency-key"] for r in script.requests] == ["mine-1", "mine-1"]


@pytest.mark.parametrize("call", ["read", "ack", "create", "get", "close"])
async def test_every_call_is_retried(call: str) -> None:
    answers = {
        "read": {
            "records": [],
            "next_cursor": 0,
            "earliest_sequence": 1,
            "latest_sequence": 0,
            "closed": False,
        },
        "ack": {"acked_sequence": 3},
        "create": {"definition": {}, "state": {}},
        "get": {"definition": {}, "state": {}},
        "close": {"last_sequence": 3},
    }
    script = Script([refused(), (503, UNAVAILABLE, {}), (200, answers[call], {})])
    async with client_for(script) as client:
        if call == "read":
            await client.read("run", "s")
        elif call == "ack":
            assert await client.ack("run", "s", "c", 3) == 3
        elif call == "create":
            await client.create_stream("run", {"stream_id": "s", "direction": "output"})
        elif call == "get":
            await client.get_stream("run", "s")
        else:
            assert await client.close_stream("run", "s") == 3
    assert len(script.requests) == 3


async def test_bad_input_is_not_retried() -> None:
    script = Script([(400, {"code": "invalid_batch", "detail": "empty"}, {})])
    async with client_for(script) as client:
        with pytest.raises(ApiError) as caught:
            await client.append("run", "s", [])
    assert caught.value.code == "invalid_batch" and len(script.requests) == 1


async def test_a_500_is_not_retried() -> None:
    script = Script([(500, {"code": "internal_error"}, {})])
    async with client_for(script) as client:
        with pytest.raises(ApiError):
            await client.read("run", "s")
    assert len(script.requests) == 1


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every wait the client sleeps between attempts (client/api.py), in order."""
    waits: list[float] = []
    real = asyncio.sleep

    async def recording(delay: float, *args: Any, **kwargs: Any) -> Any:
        if delay > 0:
            waits.append(delay)
        return await real(delay, *args, **kwargs)

    # The client module's own view of asyncio, not the shared module: other tasks on
    # the session's loop (an in-process server's ticks) sleep too.
    monkeypatch.setattr(api, "asyncio", _WithSleep(recording))
    return waits


class _WithSleep:
    """asyncio, with ``sleep`` replaced."""

    def __init__(self, sleep: Any) -> None:
        self.sleep = sleep

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)


async def test_the_budget_bounds_the_retries(slept: list[float]) -> None:
    script = Script([(503, UNAVAILABLE, {"Retry-After": "1"})])
    async with client_for(script, retry_budget=0.5) as client:
        with pytest.raises(ApiError) as caught:
            await client.append("run", "s", [1])
    # The next wait (Retry-After: 1) would pass the budget: raised at once, unslept.
    assert caught.value.status == 503 and caught.value.code == "database_unavailable"
    assert (len(script.requests), slept) == (1, [])


async def test_a_per_call_budget_wins(slept: list[float]) -> None:
    script = Script([refused()])
    async with client_for(script, retry_budget=60) as client:
        with pytest.raises(httpx.ConnectError):
            await client.read("run", "s", retry_budget=1.0)
    # Retried, one wait before each retry, all of them within the call's 1 s budget
    # (the client's 60 s would have allowed more).
    assert 1 < len(script.requests) == len(slept) + 1
    assert sum(slept) <= 1.0


def test_waits_are_jittered_exponential_and_respect_retry_after() -> None:
    for backoff in (0.1, 0.4, 5.0):
        waits = [retry_wait(backoff, None) for _ in range(200)]
        assert all(backoff / 2 <= w <= backoff for w in waits)
        assert len(set(waits)) > 100  # jittered, not one instant for everyone
    assert all(1.0 <= retry_wait(0.1, 1.0) <= 1.2 for _ in range(200))
    assert all(retry_wait(5.0, 1.0) >= 2.5 for _ in range(200))
