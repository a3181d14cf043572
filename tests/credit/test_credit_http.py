"""Durable credit and acknowledgements over HTTP (issue 4).

Sequential checks use the in-process app (``client``). Anything concurrent or blocking
goes to the real server subprocess (``server``): the in-process test client runs one
request at a time, so it cannot show a race or a request waiting for another.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

from tests.conftest import TokenFactory
from tests.support.credit import ack_url, definition_body, records_url, stream_url

Client = AsyncTestClient[Any] | httpx.AsyncClient


@pytest.fixture
async def http(server: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A real HTTP client of the real server subprocess."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:
        yield client


async def create(client: Client, headers: dict[str, str], run_id: str, **kw: Any) -> str:
    body = definition_body(**kw)
    response = await client.post(
        f"/api/workflow-streams/runs/{run_id}/streams", json=body, headers=headers
    )
    assert response.status_code == 201, response.text
    return str(body["stream_id"])


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert (body["status"], body["code"]) == (status, code)
    assert body["title"] and body["detail"]
    return body


def assert_retry_after(response: Any) -> int:
    raw = response.headers["retry-after"]
    assert raw.isdigit(), raw  # whole seconds
    assert 1 <= int(raw) <= 60
    return int(raw)


async def state_of(client: Client, headers: dict[str, str], run_id: str, sid: str) -> Any:
    response = await client.get(stream_url(run_id, sid), headers=headers)
    assert response.status_code == 200
    return response.json()["state"]


async def test_32_concurrent_http_appenders_admit_exactly_10(
    http: httpx.AsyncClient, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    sid = await create(http, headers, run_id, max_unread_items=10)
    responses = await asyncio.gather(
        *(
            http.post(records_url(run_id, sid), json={"records": [{"payload": i}]}, headers=headers)
            for i in range(32)
        )
    )
    codes = sorted(r.status_code for r in responses)
    assert codes == [201] * 10 + [429] * 22
    firsts = sorted(r.json()["first_sequence"] for r in responses if r.status_code == 201)
    assert firsts == list(range(1, 11))
    for response in responses:
        if response.status_code == 429:
            assert_problem(response, 429, "credit_exhausted")
            assert_retry_after(response)
    state = await state_of(http, headers, run_id, sid)
    assert (state["latest_sequence"], state["unread_items"], state["total_items"]) == (10, 10, 10)
    assert state["consumers"] == [{"consumer_id": "c", "acked_sequence": 0}]


async def test_block_policy_over_http_completes_when_another_client_acks(
    http: httpx.AsyncClient, auth: TokenFactory, run_id: str
) -> None:
    producer = auth(scopes=["streams:write", "streams:admin", "streams:read"], sub="producer")
    consumer = auth(scopes=["streams:ack", "streams:read"], sub="consumer")
    sid = await create(
        http,
        producer,
        run_id,
        max_unread_items=1,
        on_unread_full="block",
        block_timeout_ms=20_000,
    )
    first = await http.post(
        records_url(run_id, sid), json={"records": [{"payload": 1}]}, headers=producer
    )
    assert first.status_code == 201
    waiting = asyncio.create_task(
        http.post(records_url(run_id, sid), json={"records": [{"payload": 2}]}, headers=producer)
    )
    done, _ = await asyncio.wait({waiting}, timeout=0.3)
    assert not done, "the append should wait for credit"
    ack = await http.post(ack_url(run_id, sid, "c"), json={"sequence": 1}, headers=consumer)
    assert ack.status_code == 200
    assert ack.json() == {"consumer_id": "c", "acked_sequence": 1}
    # Answered after the ack, not before; that the ack's notification (not the lost-wake
    # re-check) wakes it is pinned in tests/credit/test_credit_store.py with the
    # re-check an hour away.
    response = await asyncio.wait_for(waiting, 60)
    assert response.status_code == 201
    assert response.json() == {"first_sequence": 2, "last_sequence": 2}


async def test_block_policy_over_http_answers_429_after_the_timeout(
    http: httpx.AsyncClient, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    sid = await create(
        http, headers, run_id, max_unread_items=1, on_unread_full="block", block_timeout_ms=500
    )
    await http.post(records_url(run_id, sid), json={"records": [{"payload": 1}]}, headers=headers)
    started = time.monotonic()
    response = await http.post(
        records_url(run_id, sid), json={"records": [{"payload": 2}]}, headers=headers
    )
    # Not before its timeout (how much later depends on the machine's load).
    assert time.monotonic() - started >= 0.5
    assert_problem(response, 429, "credit_exhausted")
    assert_retry_after(response)
    assert (await state_of(http, headers, run_id, sid))["latest_sequence"] == 1


async def test_reject_policy_answers_429_at_once(
    client: Client, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    sid = await create(client, headers, run_id, max_unread_items=2, max_unread_bytes=None)
    ok = await client.post(
        records_url(run_id, sid),
        json={"records": [{"payload": 1}, {"payload": 2}]},
        headers=headers,
    )
    assert ok.status_code == 201
    response = await client.post(
        records_url(run_id, sid), json={"records": [{"payload": 3}]}, headers=headers
    )
    assert_problem(response, 429, "credit_exhausted")
    assert_retry_after(response)


async def test_quota_and_byte_ceilings_over_http(
    client: Client, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    sid = await create(client, headers, run_id, max_total_items=2, max_unread_bytes=4)
    url = records_url(run_id, sid)
    assert (
        await client.post(url, json={"records": [{"payload": "ab"}]}, headers=headers)
    ).status_code == 201  # 4 bytes: reached
    refused = await client.post(url, json={"records": [{"payload": 1}]}, headers=headers)
    assert_problem(refused, 429, "credit_exhausted")
    ack = await client.post(ack_url(run_id, sid, "c"), json={"sequence": 1}, headers=headers)
    assert ack.status_code == 200
    assert (
        await client.post(url, json={"records": [{"payload": 1}]}, headers=headers)
    ).status_code == 201
    await client.post(ack_url(run_id, sid, "c"), json={"sequence": 2}, headers=headers)
    quota = await client.post(url, json={"records": [{"payload": 1}]}, headers=headers)
    body = assert_problem(quota, 409, "quota_exhausted")
    assert "retry-after" not in quota.headers
    assert body["status"] == 409
    state = await state_of(client, headers, run_id, sid)
    assert {
        k: state[k] for k in ("total_items", "total_bytes", "unread_items", "unread_bytes")
    } == {"total_items": 2, "total_bytes": 5, "unread_items": 0, "unread_bytes": 0}


async def test_a_batch_that_does_not_fit_is_refused_whole_over_http(
    client: Client, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    sid = await create(client, headers, run_id, max_unread_items=3)
    url = records_url(run_id, sid)
    assert (
        await client.post(url, json={"records": [{"payload": 0}]}, headers=headers)
    ).status_code == 201
    response = await client.post(
        url, json={"records": [{"payload": i} for i in range(3)]}, headers=headers
    )
    assert_problem(response, 429, "credit_exhausted")
    page = await client.get(url, headers=headers)
    assert [r["payload"] for r in page.json()["records"]] == [0]


async def test_ack_errors_change_nothing(
    client: Client, auth: TokenFactory, run_id: str, tenant: str
) -> None:
    headers = auth()
    sid = await create(client, headers, run_id, consumers=["c", "d"])
    other_sid = await create(client, headers, run_id, consumers=["on-other-stream"])
    other_run = f"{run_id}-b"
    await create(client, headers, other_run, stream_id=sid, consumers=["on-other-run"])
    other_tenant = auth(tenant=f"{tenant}-other")
    await create(client, other_tenant, run_id, stream_id=sid, consumers=["on-other-tenant"])
    await client.post(
        records_url(run_id, sid),
        json={"records": [{"payload": i} for i in range(5)]},
        headers=headers,
    )
    url = ack_url(run_id, sid, "c")

    ok = await client.post(url, json={"sequence": 3}, headers=headers)
    assert (ok.status_code, ok.json()) == (200, {"consumer_id": "c", "acked_sequence": 3})
    same = await client.post(url, json={"sequence": 3}, headers=headers)
    assert (same.status_code, same.json()) == (200, {"consumer_id": "c", "acked_sequence": 3})
    assert_problem(
        await client.post(url, json={"sequence": 2}, headers=headers), 409, "ack_regression"
    )
    assert_problem(
        await client.post(url, json={"sequence": 6}, headers=headers), 400, "ack_in_future"
    )
    for foreign in ("nobody", "on-other-stream", "on-other-run", "on-other-tenant"):
        assert_problem(
            await client.post(ack_url(run_id, sid, foreign), json={"sequence": 1}, headers=headers),
            404,
            "consumer_not_found",
        )
    for bad in (
        {"sequence": -1},
        {"sequence": "3"},
        {"sequence": 1.5},
        {},
        [],
        {"sequence": 4, "extra": 1},
    ):
        response = await client.post(url, json=bad, headers=headers)
        assert 400 <= response.status_code < 500, (bad, response.status_code)
        assert response.headers["content-type"].startswith("application/problem+json")
    assert_problem(
        await client.post(url, content=b"{not json", headers=headers), 400, "invalid_body"
    )
    no_scope = auth(scopes=["streams:read"])
    assert_problem(await client.post(url, json={"sequence": 4}, headers=no_scope), 403, "forbidden")

    state = await state_of(client, headers, run_id, sid)
    assert state["consumers"] == [
        {"consumer_id": "c", "acked_sequence": 3},
        {"consumer_id": "d", "acked_sequence": 0},
    ]
    assert state["unread_items"] == 5
    other_state = await state_of(client, headers, run_id, other_sid)
    assert other_state["consumers"] == [{"consumer_id": "on-other-stream", "acked_sequence": 0}]


async def test_concurrent_http_acks_never_regress(
    http: httpx.AsyncClient, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    sid = await create(http, headers, run_id)
    await http.post(
        records_url(run_id, sid),
        json={"records": [{"payload": i} for i in range(60)]},
        headers=headers,
    )
    sequences = [((i * 37) % 60) + 1 for i in range(60)]  # a permutation of 1..60
    responses = await asyncio.gather(
        *(
            http.post(ack_url(run_id, sid, "c"), json={"sequence": s}, headers=headers)
            for s in sequences
        )
    )
    for sequence, response in zip(sequences, responses, strict=True):
        if response.status_code == 200:
            assert response.json()["acked_sequence"] == sequence
        else:
            assert_problem(response, 409, "ack_regression")
    assert any(r.status_code == 200 for r in responses)
    state = await state_of(http, headers, run_id, sid)
    assert state["consumers"] == [{"consumer_id": "c", "acked_sequence": 60}]
    assert state["unread_items"] == 0


@pytest.fixture
async def second_http(settings: Any, tmp_path: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A second, independent server process over the same database (another replica)."""
    from tests.support.server import ServerProcess

    with ServerProcess(settings, log_path=tmp_path / "second.log") as other:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=other.url, timeout=30, limits=limits) as client:
            yield client


async def test_two_replicas_admit_exactly_10_of_32(
    http: httpx.AsyncClient, second_http: httpx.AsyncClient, auth: TokenFactory, run_id: str
) -> None:
    # Each process groups its own requests; the two groups race on the row lock.
    headers = auth()
    sid = await create(http, headers, run_id, max_unread_items=10)
    responses = await asyncio.gather(
        *(
            (http if i % 2 else second_http).post(
                records_url(run_id, sid), json={"records": [{"payload": i}]}, headers=headers
            )
            for i in range(32)
        )
    )
    assert sorted(r.status_code for r in responses) == [201] * 10 + [429] * 22
    firsts = sorted(r.json()["first_sequence"] for r in responses if r.status_code == 201)
    assert firsts == list(range(1, 11))


async def test_an_ack_on_one_replica_wakes_a_producer_blocked_on_another(
    http: httpx.AsyncClient, second_http: httpx.AsyncClient, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    sid = await create(
        http,
        headers,
        run_id,
        max_unread_items=1,
        on_unread_full="block",
        block_timeout_ms=20_000,
    )
    url = records_url(run_id, sid)
    assert (
        await http.post(url, json={"records": [{"payload": 1}]}, headers=headers)
    ).status_code == 201
    waiting = asyncio.create_task(
        http.post(url, json={"records": [{"payload": 2}]}, headers=headers)
    )
    done, _ = await asyncio.wait({waiting}, timeout=0.3)
    assert not done
    ack = await second_http.post(ack_url(run_id, sid, "c"), json={"sequence": 1}, headers=headers)
    assert ack.status_code == 200
    # Answered after another process took the ack: the wake crossed through Postgres.
    response = await asyncio.wait_for(waiting, 60)
    assert (response.status_code, response.json()["first_sequence"]) == (201, 2)
