"""Group commit (issue 9): concurrent requests share a transaction, yet each one gets
exactly the answer it would get alone; sequences stay 1..N gap-free; nothing is
over-admitted. Checked in one process (deterministic arrival order, against a serial
model), across separate transactions, and over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from ductor_streams.errors import (
    CreditExhausted,
    IdempotencyKeyReused,
    QuotaExhausted,
    StreamClosed,
)
from ductor_streams.store import EncodedBatch, Store, StreamRef, encode_batch
from tests.conftest import TokenFactory
from tests.speed.mixed import Answer, Ceilings, Model, Request, check_answers, workload
from tests.support.credit import definition_body, make_stream, records_url

OUTCOMES: dict[type[Exception], str] = {
    CreditExhausted: "credit_exhausted",
    QuotaExhausted: "quota_exhausted",
    StreamClosed: "stream_closed",
    IdempotencyKeyReused: "key_reused",
}
CEILINGS = Ceilings(max_unread_bytes=1000, max_total_items=40)
PRE = Request([5], key="pre-existing")
# The racing runs close the stream once this many of the 80 requests were answered:
# by then both ceilings are reached (credit near request 30, quota near 45).
CLOSE_AFTER = 64


class Countdown:
    """Sets ``reached`` once ``tick`` was called ``n`` times."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.reached = asyncio.Event()

    def tick(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.reached.set()


def assert_ceilings_were_reached(answers: list[Answer]) -> None:
    # Which ceiling answers first depends on the order (quota is checked before credit),
    # so a racing run must reach at least one; the serial test covers both exactly.
    kinds = {a[0] for a in answers}
    assert {"replayed", "key_reused", "appended"} <= kinds
    assert kinds & {"credit_exhausted", "quota_exhausted"}


async def answer_of(store: Store, ref: StreamRef, request: Request) -> Answer:
    try:
        result = await store.append(
            ref, encode_batch(request.payloads, idempotency_key=request.key)
        )
    except tuple(OUTCOMES) as exc:
        return (OUTCOMES[type(exc)], None, None)
    return (
        "replayed" if result.replayed else "appended",
        result.first_sequence,
        result.last_sequence,
    )


async def stored_log(pool: asyncpg.Pool, ref: StreamRef) -> dict[int, str]:
    rows = await pool.fetch(
        "SELECT sequence, payload FROM workflow_streams.records WHERE stream_pk = $1",
        ref.stream_pk,
    )
    return {r["sequence"]: r["payload"] for r in rows}


async def mixed_stream(store: Store) -> StreamRef:
    ref = await make_stream(
        store,
        max_unread_items=None,
        max_unread_bytes=CEILINGS.max_unread_bytes,
        max_total_items=CEILINGS.max_total_items,
    )
    assert await answer_of(store, ref, PRE) == ("appended", 1, 1)
    return ref


def fresh_model() -> Model:
    model = Model(CEILINGS)
    assert model.decide(PRE) == ("appended", 1, 1)
    return model


async def test_one_process_group_answers_exactly_as_serial_requests(
    store: Store, pool: asyncpg.Pool
) -> None:
    ref = await mixed_stream(store)
    requests = workload("a")
    model = fresh_model()
    expected = [model.decide(r) for r in requests]
    # Every kind of answer is exercised.
    kinds = {e[0] for e in expected}
    assert kinds == {"appended", "replayed", "key_reused", "credit_exhausted", "quota_exhausted"}

    groups = 0
    call = store.appender._call

    async def counting(*args: Any) -> Any:
        nonlocal groups
        groups += 1
        return await call(*args)

    store.appender._call = counting  # type: ignore[method-assign]
    try:
        answers = await asyncio.gather(*(answer_of(store, ref, r) for r in requests))
    finally:
        del store.appender._call
    assert answers == expected
    assert groups <= 2, f"{len(requests)} concurrent requests took {groups} transactions"

    await store.close(ref)
    model.closed = True
    after = [
        Request(["late"]),
        Request(["a-0"], key="a-k0"),
        Request(["x"], key="a-k0"),
        Request([1, 2], key="new-after-close"),
    ]
    answers_after = await asyncio.gather(*(answer_of(store, ref, r) for r in after))
    assert answers_after == [model.decide(r) for r in after]
    assert [a[0] for a in answers_after] == [
        "stream_closed",
        "replayed",
        "key_reused",
        "stream_closed",
    ]
    stored = await stored_log(pool, ref)
    assert sorted(stored) == list(range(1, model.latest + 1))
    check_answers(requests, answers, stored, CEILINGS, {PRE.key: (PRE, 1, 1)})  # type: ignore[dict-item]


async def test_separate_transactions_racing_a_close(pool: asyncpg.Pool) -> None:
    stores = [Store(pool) for _ in range(6)]
    ref = await mixed_stream(stores[0])
    requests = workload("b")
    closed_at: list[int] = []
    answered = Countdown(CLOSE_AFTER)

    async def close_midway() -> None:
        await answered.reached.wait()  # the ceilings are reached by now; the rest race
        closed_at.append(await stores[0].close(ref))

    async def counted(i: int, request: Request) -> Answer:
        try:
            return await answer_of(stores[i % 6], ref, request)
        finally:
            answered.tick()

    results = await asyncio.gather(*(counted(i, r) for i, r in enumerate(requests)), close_midway())
    answers: list[Answer] = list(results[:-1])
    stored = await stored_log(pool, ref)
    check_answers(requests, answers, stored, CEILINGS, {PRE.key: (PRE, 1, 1)})  # type: ignore[dict-item]
    assert max(stored) == closed_at[0], "nothing is appended after the close"
    assert_ceilings_were_reached(answers)
    late = await asyncio.gather(
        *(answer_of(s, ref, Request([f"late-{i}"])) for i, s in enumerate(stores))
    )
    assert late == [("stream_closed", None, None)] * 6


async def test_one_bad_request_does_not_fail_its_group(store: Store, pool: asyncpg.Pool) -> None:
    ref = await make_stream(store)
    good = [encode_batch([i]) for i in range(9)]
    # Not producible over HTTP: an object column Postgres refuses, to force a DB error.
    bad = EncodedBatch(["{}"], [2], ["{not json"], None, "bad")
    batches = [*good[:4], bad, *good[4:]]
    results = await asyncio.gather(*(store.append(ref, b) for b in batches), return_exceptions=True)
    assert isinstance(results[4], asyncpg.PostgresError)
    firsts = [r.first_sequence for i, r in enumerate(results) if i != 4]  # type: ignore[union-attr]
    assert firsts == list(range(1, 10))
    assert sorted((await stored_log(pool, ref)).values()) == [str(i) for i in range(9)]


async def test_a_caller_that_goes_away_does_not_cancel_its_group(
    store: Store, pool: asyncpg.Pool
) -> None:
    ref = await make_stream(store)
    sent = store.appender.statements
    tasks = [asyncio.create_task(store.append(ref, encode_batch([i]))) for i in range(5)]
    await asyncio.sleep(0)  # the first is in flight, the other four queued behind it
    assert store.appender.statements == sent + 1
    tasks[0].cancel()  # its statement is in flight: it finishes, and appends
    tasks[2].cancel()  # not sent yet: dropped, never appended (docs/credit.md)
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert isinstance(done[2], asyncio.CancelledError)
    assert [r.first_sequence for i, r in enumerate(done) if i not in (0, 2)] == [2, 3, 4]  # type: ignore[union-attr]
    assert await stored_log(pool, ref) == {1: "0", 2: "1", 3: "3", 4: "4"}


@pytest.fixture
async def http(server: Any) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:
        yield client


async def test_mixed_requests_over_real_http(
    http: httpx.AsyncClient, auth: TokenFactory, run_id: str, pool: asyncpg.Pool
) -> None:
    await race_one_stream_over_http(http, auth(), run_id, pool, "h")


async def test_mixed_requests_on_many_streams_at_once_over_real_http(
    http: httpx.AsyncClient, auth: TokenFactory, run_id: str, pool: asyncpg.Pool
) -> None:
    # The server combines ready groups of several streams in one transaction: each
    # stream must still answer exactly as alone while its close races its appends.
    headers = auth()
    await asyncio.gather(
        *(race_one_stream_over_http(http, headers, run_id, pool, f"m{n}") for n in range(6))
    )


async def race_one_stream_over_http(
    http: httpx.AsyncClient, headers: dict[str, str], run_id: str, pool: asyncpg.Pool, tag: str
) -> None:
    """A new stream with the ceilings, the mixed workload over HTTP and a racing close."""
    body = definition_body(
        max_unread_items=None,
        max_unread_bytes=CEILINGS.max_unread_bytes,
        max_total_items=CEILINGS.max_total_items,
    )
    created = await http.post(
        f"/api/workflow-streams/runs/{run_id}/streams", json=body, headers=headers
    )
    assert created.status_code == 201
    url = records_url(run_id, body["stream_id"])

    async def send(request: Request) -> Answer:
        extra = {"Idempotency-Key": request.key} if request.key else {}
        response = await http.post(
            url,
            json={"records": [{"payload": p} for p in request.payloads]},
            headers={**headers, **extra},
        )
        if response.status_code in (200, 201):
            data = response.json()
            replayed = response.headers.get("idempotent-replayed") == "true"
            assert replayed == (response.status_code == 200)
            return (
                "replayed" if replayed else "appended",
                data["first_sequence"],
                data["last_sequence"],
            )
        problem = response.json()
        expected_status = {
            "credit_exhausted": 429,
            "quota_exhausted": 409,
            "stream_closed": 409,
            "idempotency_key_reused": 422,
        }
        assert expected_status[problem["code"]] == response.status_code
        if problem["code"] == "credit_exhausted":
            assert int(response.headers["retry-after"]) >= 1
        return (problem["code"].replace("idempotency_key_reused", "key_reused"), None, None)

    assert await send(PRE) == ("appended", 1, 1)
    requests = workload(tag)
    close_url = f"/api/workflow-streams/runs/{run_id}/streams/{body['stream_id']}/close"

    answered = Countdown(CLOSE_AFTER)

    async def counted(request: Request) -> Answer:
        try:
            return await send(request)
        finally:
            answered.tick()

    async def close_midway() -> int:
        await answered.reached.wait()
        response = await http.post(close_url, headers=headers)
        assert response.status_code == 200
        return int(response.json()["last_sequence"])

    results = await asyncio.gather(*(counted(r) for r in requests), close_midway())
    answers: list[Answer] = list(results[:-1])  # type: ignore[arg-type]
    row = await pool.fetchrow(
        "SELECT stream_pk FROM workflow_streams.streams WHERE run_id = $1 AND stream_id = $2",
        run_id,
        body["stream_id"],
    )
    assert row is not None
    rows = await pool.fetch(
        "SELECT sequence, payload FROM workflow_streams.records WHERE stream_pk = $1",
        row["stream_pk"],
    )
    stored = {r["sequence"]: r["payload"] for r in rows}
    check_answers(requests, answers, stored, CEILINGS, {PRE.key: (PRE, 1, 1)})  # type: ignore[dict-item]
    assert max(stored) == results[-1]
    assert_ceilings_were_reached(answers)
    assert await send(Request(["late"])) == ("stream_closed", None, None)
