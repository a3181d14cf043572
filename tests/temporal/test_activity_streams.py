"""Streams written and read from inside activities (``ductor_streams.plugin.streaming``),
against real Postgres, a real Temporal dev server and a real ``serve`` subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from httpx_sse import aconnect_sse
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ActivityError, ApplicationError

from ductor_streams.activities import error_types
from ductor_streams.config import Settings
from ductor_streams.live.hub import NotificationHub
from ductor_streams.plugin import StreamsPlugin
from ductor_streams.plugin.streaming import HEARTBEAT_KEY, RETRY_MARKER_TYPE
from ductor_streams.store import Store, StreamRef
from tests.conftest import TokenFactory
from tests.support.server import ServerProcess, settings_env
from tests.temporal.conftest import WorkerFactory
from tests.temporal.polling import eventually
from tests.temporal.stream_activities import HOOKS, read_messages, write_tokens
from tests.temporal.stream_workflows import (
    ReadMessagesWorkflow,
    ReadResult,
    TokensInput,
    TokensResult,
    TokensWorkflow,
)
from tests.temporal.support import stream_ref

API = "/api/workflow-streams"


@pytest.fixture(autouse=True)
def _clear_hooks() -> AsyncIterator[None]:
    HOOKS.clear()
    yield
    HOOKS.clear()


async def payloads_of(store: Store, ref: StreamRef) -> list[tuple[int, Any]]:
    records: list[tuple[int, Any]] = []
    cursor = 0
    while True:
        page = await store.read(ref, cursor, 1000)
        records.extend((r.sequence, json.loads(r.payload)) for r in page.records)
        if not page.records:
            return records
        cursor = page.next_cursor


async def follow_sse(
    url: str, headers: dict[str, str], until: int, got: list[tuple[float, int, Any]]
) -> None:
    """Follow an SSE subscription from cursor 0 until sequence ``until`` arrived,
    noting (monotonic arrival time, sequence, payload) of each record."""
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(60)) as http,
        aconnect_sse(http, "GET", url, headers=headers, params={"cursor": 0}) as source,
    ):
        assert source.response.status_code == 200
        async for event in source.aiter_sse():
            if event.event != "record":
                continue
            record = json.loads(event.data)
            got.append((time.monotonic(), record["sequence"], record["payload"]))
            if record["sequence"] >= until:
                return


@pytest.mark.timeout(120)
async def test_tokens_reach_an_sse_subscriber_while_the_activity_runs(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
    server: ServerProcess,
    auth: TokenFactory,
) -> None:
    tokens = 200
    headers = auth(tenant=wf_settings.tenant, runs=[run_id])
    got: list[tuple[float, int, Any]] = []
    async with make_worker([TokensWorkflow], activities=[write_tokens]):
        handle = await wf_client.start_workflow(
            TokensWorkflow.run,
            TokensInput(tokens=tokens, delay_s=0.01),
            id=run_id,
            task_queue=task_queue,
        )
        await stream_ref(store, wf_settings.tenant, run_id, "output")
        url = f"{server.url}{API}/runs/{run_id}/streams/output/subscribe"
        follower = asyncio.create_task(follow_sse(url, headers, tokens, got))
        result = await handle.result()
        await asyncio.wait_for(follower, 30)
    finished = HOOKS["finished"]
    assert [a for a, _ in finished] == [1]
    done_at = finished[0][1]
    assert result.attempt == 1 and result.last_sequence == tokens
    assert [s for _, s, _ in got] == list(range(1, tokens + 1))
    assert [p for _, _, p in got] == [{"token": i, "attempt": 1} for i in range(tokens)]
    # 200 tokens 10 ms apart take over 2 s: the first must be out long before the end,
    # and the middle one well before it (measured at load 6-8: the middle token 1.09-1.22
    # s before the end, the longest gap between two arrivals 19-144 ms).
    assert got[0][0] < done_at - 1.5, (got[0][0], done_at)
    assert got[tokens // 2][0] < done_at - 0.5


@pytest.mark.timeout(120)
async def test_retried_attempt_appends_a_marker_and_no_token_twice_despite_killed_backends(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    pool: asyncpg.Pool,
    wf_settings: Settings,
    plugin: StreamsPlugin,
) -> None:
    tokens, fail_after = 80, 50
    killed: list[bool] = []
    lost_answers: list[int] = []

    def lose_next_answer() -> None:
        # The worker's next statement commits, then its connection "fails" before the
        # answer: the writer must send the batch again and get the original sequences.
        appender = plugin.streams_activities.store.appender
        real_call = appender._call

        async def lose_answer(*args: Any, **kwargs: Any) -> Any:
            result = await real_call(*args, **kwargs)
            del appender._call  # the class's own again
            lost_answers.append(result[0][0][2])
            raise asyncpg.exceptions.ConnectionDoesNotExistError("injected: answer lost")

        appender._call = lose_answer  # type: ignore[method-assign]

    async def kill_writer_backend(ref: StreamRef) -> None:
        # Hold the stream's row lock, so the writer's next batch waits inside its
        # statement; terminate that backend; let go.
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "SELECT 1 FROM workflow_streams.streams WHERE stream_pk = $1 FOR UPDATE",
                ref.stream_pk,
            )

            async def waiting() -> list[int]:
                rows = await pool.fetch(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND query ILIKE '%append%'"
                )
                return [r["pid"] for r in rows]

            pids = await eventually(waiting, lambda p: len(p) == 1, what="a blocked append")
            killed.append(await pool.fetchval("SELECT pg_terminate_backend($1)", pids[0]))

    tasks: list[asyncio.Task[None]] = []

    async def on_token(attempt: int, index: int) -> None:
        if attempt == 1 and index == 10:
            ref = await stream_ref(store, wf_settings.tenant, run_id, "output")
            tasks.append(asyncio.create_task(kill_writer_backend(ref)))
        if attempt == 1 and index == 30:
            lose_next_answer()

    HOOKS["on_token"] = on_token
    async with make_worker([TokensWorkflow], activities=[write_tokens]):
        result = await wf_client.execute_workflow(
            TokensWorkflow.run,
            TokensInput(tokens=tokens, delay_s=0.005, fail_after=fail_after),
            id=run_id,
            task_queue=task_queue,
        )
    await asyncio.gather(*tasks)
    assert killed == [True]
    assert len(lost_answers) == 1
    ref = await stream_ref(store, wf_settings.tenant, run_id, "output")
    records = await payloads_of(store, ref)
    first = [{"token": i, "attempt": 1} for i in range(fail_after)]
    marker = {
        "type": RETRY_MARKER_TYPE,
        "attempt": 2,
        "activity_id": "2",  # activity 1 created the stream
        "discard": [[1, fail_after]],
    }
    second = [{"token": i, "attempt": 2} for i in range(tokens)]
    assert [p for _, p in records] == [*first, marker, *second]
    assert [s for s, _ in records] == list(range(1, len(records) + 1))
    # Attempt 2 knew from attempt 1's last heartbeat details what it had written.
    assert result == TokensResult(
        attempt=2,
        last_sequence=len(records),
        earlier_records=[fail_after],
        heartbeat=[[1, [[1, fail_after]]]],
    )


@pytest.mark.timeout(120)
async def test_writer_on_a_block_stream_waits_for_acks_and_never_passes_the_ceiling(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
) -> None:
    ceiling, tokens = 5, 23
    credit = {"max_unread_items": ceiling, "on_unread_full": "block", "block_timeout_ms": 500}
    async with make_worker([TokensWorkflow], activities=[write_tokens]):
        handle = await wf_client.start_workflow(
            TokensWorkflow.run,
            TokensInput(tokens=tokens, content_class="json", consumers=["ui"], credit=credit),
            id=run_id,
            task_queue=task_queue,
        )
        ref = await stream_ref(store, wf_settings.tenant, run_id, "output")
        observed: list[tuple[int, int]] = []

        async def state() -> tuple[int, int]:
            s = await store.state(ref)
            observed.append((s.latest_sequence, s.unread_items))
            return s.latest_sequence, s.unread_items

        acked = 0
        while acked < tokens:
            target = min(acked + ceiling, tokens)
            await eventually(state, lambda s, t=target: s[0] == t, what=f"latest {target}")
            if target < tokens:
                # Out of credit: the writer waits (it does not pass the ceiling while
                # nobody acks) ...
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline:
                    assert (await state())[0] == target
                    await asyncio.sleep(0.05)
            # ... until the consumer acks.
            acked = target
            await store.ack(ref, "ui", acked)
        result = await handle.result()
    assert result.last_sequence == tokens
    assert all(unread <= ceiling for _, unread in observed), observed
    records = await payloads_of(store, ref)
    assert [p for _, p in records] == [{"token": i, "attempt": 1} for i in range(tokens)]


@pytest.mark.timeout(120)
async def test_a_writer_watches_for_acks_only_where_credit_can_refuse(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An append that credit may refuse watches its stream's wakes from before the
    # attempt (an ack then wakes the retry); a stream without consumers, or without an
    # unread ceiling, is never refused, and its appends watch nothing.
    watched: list[int] = []
    watch = NotificationHub.watch

    def spy(self: NotificationHub, stream_pk: int) -> Any:
        watched.append(stream_pk)
        return watch(self, stream_pk)

    monkeypatch.setattr(NotificationHub, "watch", spy)
    shapes = {
        "plain": TokensInput(tokens=12, delay_s=0.002),
        "consumers": TokensInput(tokens=12, delay_s=0.002, consumers=["ui"]),
        "no-ceiling": TokensInput(
            tokens=12,
            delay_s=0.002,
            consumers=["ui"],
            credit={"max_unread_items": None, "max_unread_bytes": None},
        ),
    }
    async with make_worker([TokensWorkflow], activities=[write_tokens]):
        handles = {
            name: await wf_client.start_workflow(
                TokensWorkflow.run, request, id=f"{run_id}-{name}", task_queue=task_queue
            )
            for name, request in shapes.items()
        }
        results = {name: await handle.result() for name, handle in handles.items()}
    refs = {
        name: await stream_ref(store, wf_settings.tenant, f"{run_id}-{name}", "output")
        for name in shapes
    }
    assert {name: r.last_sequence for name, r in results.items()} == dict.fromkeys(shapes, 12)
    assert refs["consumers"].stream_pk in watched
    assert refs["plain"].stream_pk not in watched
    assert refs["no-ceiling"].stream_pk not in watched
    for ref in refs.values():
        records = await payloads_of(store, ref)
        assert [p for _, p in records] == [{"token": i, "attempt": 1} for i in range(12)]


async def test_a_plugin_workers_hub_listens_on_demand(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    plugin: StreamsPlugin,
) -> None:
    # Its activities wait for wakes only now and then: it LISTENs only meanwhile
    # (live/hub.py; tests/live/test_hub.py has the behaviour, and
    # test_reader_gets_http_input_live_and_resumes_after_a_killed_worker a reader
    # woken through it in a worker process of its own).
    async with make_worker([TokensWorkflow], activities=[write_tokens]):
        result = await wf_client.execute_workflow(
            TokensWorkflow.run, TokensInput(tokens=3), id=run_id, task_queue=task_queue
        )
        assert result.last_sequence == 3
        assert plugin.streams_activities.runtime.hub.on_demand


def activity_failure(exc: WorkflowFailureError) -> ApplicationError:
    """The ApplicationError that failed the workflow's activity."""
    assert isinstance(exc.cause, ActivityError), exc.cause
    assert isinstance(exc.cause.cause, ApplicationError), exc.cause.cause
    return exc.cause.cause


@pytest.mark.timeout(120)
async def test_reject_stream_writer_waits_for_an_ack_then_gives_up_at_its_deadline(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
) -> None:
    credit = {"max_unread_items": 3}  # on_unread_full: reject (the default)
    request = TokensInput(
        tokens=6, content_class="json", consumers=["ui"], credit=credit, credit_timeout=2.0
    )
    async with make_worker([TokensWorkflow], activities=[write_tokens]):
        acked = await wf_client.start_workflow(
            TokensWorkflow.run, request, id=run_id, task_queue=task_queue
        )
        ref = await stream_ref(store, wf_settings.tenant, run_id, "output")

        async def latest() -> int:
            return (await store.state(ref)).latest_sequence

        await eventually(latest, lambda n: n == 3, what="three records")
        await store.ack(ref, "ui", 3)  # within the deadline: the writer goes on
        assert (await acked.result()).last_sequence == 6

        started = time.monotonic()
        with pytest.raises(WorkflowFailureError) as failed:
            await wf_client.execute_workflow(
                TokensWorkflow.run,
                TokensInput(**{**request.__dict__, "max_attempts": 1}),
                id=f"{run_id}-noack",
                task_queue=task_queue,
            )
    error = activity_failure(failed.value)
    assert error.type == error_types.CREDIT_EXHAUSTED
    assert error.details[0]["code"] == "credit_exhausted"
    assert time.monotonic() - started >= 2.0  # it waited out its deadline first
    other = await stream_ref(store, wf_settings.tenant, f"{run_id}-noack", "output")
    assert (await store.state(other)).latest_sequence == 3


@pytest.mark.timeout(60)
async def test_a_payload_over_the_inline_limit_fails_as_http_does(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
) -> None:
    async with make_worker([TokensWorkflow], activities=[write_tokens]):
        with pytest.raises(WorkflowFailureError) as failed:
            await wf_client.execute_workflow(
                TokensWorkflow.run,
                TokensInput(tokens=1, oversize_first=True),
                id=run_id,
                task_queue=task_queue,
            )
    error = activity_failure(failed.value)
    assert error.details[0]["code"] == "record_too_large"  # HTTP: 413 record_too_large
    assert error.non_retryable
    ref = await stream_ref(store, wf_settings.tenant, run_id, "output")
    assert (await store.state(ref)).latest_sequence == 0


@pytest.mark.timeout(180)
async def test_reader_gets_http_input_live_and_resumes_after_a_killed_worker(
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    run_id: str,
    store: Store,
    wf_settings: Settings,
    server: ServerProcess,
    auth: TokenFactory,
    tmp_path: Path,
) -> None:
    headers = auth(tenant=wf_settings.tenant, runs=[run_id])
    url = f"{server.url}{API}/runs/{run_id}/streams/messages/records"

    async def post(http: httpx.AsyncClient, payloads: list[Any]) -> None:
        answer = await http.post(url, json={"records": [{"payload": p} for p in payloads]})
        assert answer.status_code == 201, answer.text

    doomed = start_activity_worker(wf_settings, task_queue, tmp_path / "activity-worker.log")
    try:
        # Workflows only here: every activity goes to the doomed process.
        async with (
            make_worker([ReadMessagesWorkflow], no_remote_activities=True),
            httpx.AsyncClient(headers=headers, timeout=30) as http,
        ):
            handle = await wf_client.start_workflow(
                ReadMessagesWorkflow.run, 2.0, id=run_id, task_queue=task_queue
            )
            await stream_ref(store, wf_settings.tenant, run_id, "messages")
            for n in range(1, 6):  # one at a time, while the activity waits live
                await post(http, [{"n": n}])
                await eventually(
                    lambda: reader_cursor(handle, run_id), lambda c, n=n: c == n, what=f"{n}"
                )
            doomed.kill()
            doomed.wait(10)
            await post(http, [{"n": 6}, {"n": 7}])
        async with make_worker([ReadMessagesWorkflow], activities=[read_messages]):
            async with httpx.AsyncClient(headers=headers, timeout=30) as http:
                await post(http, [{"done": True}])
            result = await handle.result()
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(10)
    assert result == ReadResult(
        attempt=2, sequences=[6, 7, 8], payloads=[{"n": 6}, {"n": 7}, {"done": True}]
    )


def start_activity_worker(
    settings: Settings, task_queue: str, log_path: Path
) -> subprocess.Popen[bytes]:
    """The test activities in a worker process of their own (to be killed)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.temporal.activity_worker_process", task_queue],
            env={**os.environ, **settings_env(settings)},
            stdout=log,
            stderr=log,
        )


async def reader_cursor(handle: WorkflowHandle[Any, Any], run_id: str) -> int:
    """The reader's cursor in the running activity's last heartbeat Temporal recorded."""
    description = await handle.describe()
    for pending in description.raw_description.pending_activities:
        for payload in pending.heartbeat_details.payloads:
            details = json.loads(payload.data)
            if isinstance(details, dict) and HEARTBEAT_KEY in details:
                return int(details[HEARTBEAT_KEY]["readers"].get(f"{run_id}/messages", 0))
    return 0
