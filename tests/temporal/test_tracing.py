"""One trace from an app's POST to the workflow's signal handling (foundation/tracing.py,
foundation/temporal_tracing.py), and no OpenTelemetry work at all while tracing is off.

The chain every test checks, all in the POST's trace:
  client's traceparent -> ``POST <records route>`` (serve, server span)
    -> ``delivery signal`` (the dispatcher; child through the delivery row's stored context)
    -> ``SignalWorkflow:ductor_streams.input`` (Temporal's client interceptor)
    -> ``HandleSignal:ductor_streams.input`` (the workflow's worker)
and the ``append statement`` span under the POST, the ``delivery claim`` linked to it.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer
from temporalio.client import Client
from temporalio.worker import Worker

from ductor_streams import temporal_connection
from ductor_streams.config import Settings
from ductor_streams.foundation import tracing
from ductor_streams.foundation.signals import INPUT_SIGNAL
from ductor_streams.http import create_app
from ductor_streams.plugin import StreamsPlugin
from tests.conftest import API, TokenFactory
from tests.support.otlp import OtlpReceiver
from tests.support.server import ServerProcess, settings_env
from tests.temporal.conftest import strict_runner
from tests.temporal.polling import eventually
from tests.temporal.support import WorkersProcess, running_dispatcher
from tests.temporal.workflows import CollectInput, CollectResult, CollectWorkflow

RECORDS_ROUTE = API + "/runs/{run_id}/streams/{stream_id}/records"


@dataclass(frozen=True)
class Span:
    """What the chain needs of a span, whichever exporter it came through."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    links: tuple[tuple[str, str], ...]


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _one(spans: list[Span], name: str, trace_id: str) -> Span:
    found = [s for s in spans if s.name == name and s.trace_id == trace_id]
    assert len(found) == 1, (name, [(s.service, s.name) for s in spans])
    return found[0]


def _check_chain(spans: list[Span], trace_id: str, client_span: str) -> dict[str, Span]:
    post = _one(spans, f"POST {RECORDS_ROUTE}", trace_id)
    assert post.parent_span_id == client_span
    statement = _one(spans, "append statement", trace_id)
    assert statement.parent_span_id == post.span_id
    signal = _one(spans, "delivery signal", trace_id)
    assert signal.parent_span_id == post.span_id
    client = _one(spans, f"SignalWorkflow:{INPUT_SIGNAL}", trace_id)
    assert client.parent_span_id == signal.span_id
    handle = _one(spans, f"HandleSignal:{INPUT_SIGNAL}", trace_id)
    assert handle.parent_span_id == client.span_id
    claims = [
        s for s in spans if s.name == "delivery claim" and (trace_id, post.span_id) in s.links
    ]
    assert len(claims) == 1, [s.name for s in spans]
    return {"post": post, "signal": signal, "client": client, "handle": handle}


async def _append_traced(
    http: httpx.AsyncClient, base: str, traceparent: str, request_id: str
) -> httpx.Response:
    await eventually(
        lambda: http.get(base), lambda r: r.status_code == 200, what="the input stream"
    )

    async def post() -> httpx.Response:
        return await http.post(
            base + "/records",
            json={"records": [{"payload": {"n": 7}}]},
            headers={"traceparent": traceparent, "X-Request-ID": request_id},
        )

    # A task of its own, as a served request is: its context (the server span) ends
    # with it instead of staying current in the test's task.
    response = await asyncio.create_task(post())
    assert response.status_code == 201, response.text
    assert response.headers["x-request-id"] == request_id
    return response


# -- in memory: serve's app, the dispatcher and a worker in this process ------------------


@pytest.fixture
def memory_spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.shutdown()
    assert isinstance(tracing.tracer(), NoOpTracer)


def _from_memory(exporter: InMemorySpanExporter) -> list[Span]:
    spans = []
    for span in exporter.get_finished_spans():
        context = span.get_span_context()
        assert context is not None
        spans.append(
            Span(
                service=str(span.resource.attributes.get("service.name")),
                name=span.name,
                trace_id=f"{context.trace_id:032x}",
                span_id=f"{context.span_id:016x}",
                parent_span_id=f"{span.parent.span_id:016x}" if span.parent else "",
                links=tuple(
                    (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}")
                    for link in span.links
                ),
            )
        )
    return spans


@pytest.mark.timeout(120)
async def test_one_trace_from_the_post_to_the_signal_handler_in_memory(
    memory_spans: InMemorySpanExporter,
    wf_settings: Settings,
    temporal_address: str,
    auth: TokenFactory,
    run_id: str,
    pool: asyncpg.Pool,
    task_queue: str,
) -> None:
    plugin = StreamsPlugin(wf_settings)
    assert [type(i).__name__ for i in plugin.interceptors or []] == ["StreamsTracingInterceptor"]
    client = await Client.connect(temporal_address, plugins=[plugin])
    traceparent, trace_id, client_span = _traceparent()
    app = create_app(wf_settings)
    transport = httpx.ASGITransport(app=app)
    headers = auth(tenant=wf_settings.tenant, runs=[run_id])
    base = f"{API}/runs/{run_id}/streams/input"
    async with (
        app.lifespan(),
        httpx.AsyncClient(transport=transport, base_url="http://app", headers=headers) as http,
        Worker(
            client,
            task_queue=task_queue,
            workflows=[CollectWorkflow],
            workflow_runner=strict_runner(),
        ),
        running_dispatcher(pool, client, wf_settings.tenant),
    ):
        handle = await client.start_workflow(
            CollectWorkflow.run,
            CollectInput(expect=1),
            id=run_id,
            task_queue=task_queue,
            result_type=CollectResult,
        )
        await _append_traced(http, base, traceparent, "req-in-memory")
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.payloads == [7]

    async def spans() -> list[Span]:
        return _from_memory(memory_spans)

    found = await eventually(
        spans,
        lambda s: any(x.name == f"HandleSignal:{INPUT_SIGNAL}" for x in s),
        what="the workflow's signal span",
    )
    _check_chain(found, trace_id, client_span)


# -- OTLP/HTTP: serve, workers and a Temporal worker, each a process of its own ------------


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def _otel_env(receiver: OtlpReceiver, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": service,
        # Exported within 100 ms of ending, not the default 5 s.
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def _start_worker(env: dict[str, str], task_queue: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.temporal.traced_worker_process", task_queue],
            env={**os.environ, **env},
            stdout=out,
            stderr=out,
        )


def _worker_log(log: Path, process: subprocess.Popen[bytes]) -> str:
    if process.poll() is not None:
        raise AssertionError(f"worker exited {process.returncode}: {log.read_text()[-2000:]}")
    return log.read_text(errors="replace")


@pytest.fixture
async def traced_worker(
    wf_settings: Settings, receiver: OtlpReceiver, task_queue: str, tmp_path: Path
) -> AsyncIterator[str]:
    log = tmp_path / "worker.log"
    env = {**settings_env(wf_settings), **_otel_env(receiver, "test-temporal-worker")}
    process = _start_worker(env, task_queue, log)
    try:
        text = await eventually(
            lambda: asyncio.to_thread(_worker_log, log, process),
            lambda text: "traced worker polling" in text,
            what="the worker polls",
        )
        assert "tracing on" in text
        yield text
    finally:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 15)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.mark.timeout(180)
async def test_one_trace_across_serve_workers_and_the_temporal_worker_over_otlp(
    receiver: OtlpReceiver,
    traced_worker: str,
    wf_settings: Settings,
    auth: TokenFactory,
    run_id: str,
    task_queue: str,
    temporal_address: str,
    tmp_path: Path,
) -> None:
    traceparent, trace_id, client_span = _traceparent()
    workers = WorkersProcess(
        {**settings_env(wf_settings), **_otel_env(receiver, "test-workers")},
        tmp_path / "workers.log",
    ).start()
    try:
        await workers.started()
        # Started by a client without tracing: the workflow has no trace of its own.
        client = await temporal_connection.connect(wf_settings)
        handle = await client.start_workflow(
            CollectWorkflow.run,
            CollectInput(expect=1),
            id=run_id,
            task_queue=task_queue,
            result_type=CollectResult,
        )
        serve_env = {**_otel_env(receiver, "test-serve"), "DUCTOR_STREAMS_ACCESS_LOG": "true"}
        serve_log = tmp_path / "s.log"
        with ServerProcess(wf_settings, extra_env=serve_env, log_path=serve_log) as srv:
            headers = auth(tenant=wf_settings.tenant, runs=[run_id])
            async with httpx.AsyncClient(base_url=srv.url, headers=headers, timeout=10) as http:
                await _append_traced(
                    http, f"{API}/runs/{run_id}/streams/input", traceparent, "req-otlp"
                )
                result = await asyncio.wait_for(handle.result(), 60)
                assert result.payloads == [7]

        async def spans() -> list[Span]:
            return [
                Span(s.service, s.name, s.trace_id, s.span_id, s.parent_span_id, s.links)
                for s in receiver.snapshot()
            ]

        found = await eventually(
            spans,
            lambda s: (
                any(x.name == f"HandleSignal:{INPUT_SIGNAL}" for x in s)
                and any(x.name == "delivery claim" for x in s)
            ),
            what="spans of the three processes",
        )
        chain = _check_chain(found, trace_id, client_span)
        # The POST's access line carries its request ID and its server span's IDs.
        lines = [
            json.loads(line) for line in (await asyncio.to_thread(serve_log.read_text)).splitlines()
        ]
        (access,) = [line for line in lines if line.get("request_id") == "req-otlp"]
        assert access["logger"] == "uvicorn.access"
        assert (access["trace_id"], access["span_id"]) == (trace_id, chain["post"].span_id)
        assert chain["post"].service == "test-serve"
        assert chain["signal"].service == chain["client"].service == "test-workers"
        assert chain["handle"].service == "test-temporal-worker"
    finally:
        workers.stop()


# -- tracing off ----------------------------------------------------------------------------


class _Refusing(NoOpTracer):
    """A tracer that fails any test that reaches it."""

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a span was started while tracing is off")

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a span was started while tracing is off")


@pytest.mark.timeout(120)
async def test_tracing_off_means_the_no_op_tracer_and_no_opentelemetry_work(
    wf_settings: Settings,
    temporal_address: str,
    auth: TokenFactory,
    run_id: str,
    pool: asyncpg.Pool,
    task_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not tracing.configure_tracing(wf_settings, service="test")
    assert not tracing.ENABLED
    assert isinstance(tracing.tracer(), NoOpTracer)
    assert not wf_settings.trace_exporters
    plugin = StreamsPlugin(wf_settings)
    assert not plugin.interceptors  # the plugin keeps Temporal's interceptor out
    from ductor_streams.foundation.temporal_tracing import interceptors

    assert interceptors() == []

    # The hot path, SSE, the dispatcher and a workflow: nothing may reach OpenTelemetry.
    attaches: list[object] = []
    import opentelemetry.context

    real_attach = opentelemetry.context.attach

    def counting_attach(context: Any) -> Any:
        attaches.append(context)
        return real_attach(context)

    monkeypatch.setattr(tracing, "_tracer", _Refusing())
    monkeypatch.setattr(opentelemetry.context, "attach", counting_attach)
    client = await Client.connect(temporal_address, plugins=[plugin])
    app = create_app(wf_settings)
    headers = auth(tenant=wf_settings.tenant, runs=[run_id])
    base = f"{API}/runs/{run_id}/streams/input"
    async with (
        app.lifespan(),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://app", headers=headers
        ) as http,
        Worker(
            client,
            task_queue=task_queue,
            workflows=[CollectWorkflow],
            workflow_runner=strict_runner(),
        ),
        running_dispatcher(pool, client, wf_settings.tenant),
    ):
        handle = await client.start_workflow(
            CollectWorkflow.run,
            CollectInput(expect=1),
            id=run_id,
            task_queue=task_queue,
            result_type=CollectResult,
        )
        traceparent, _, _ = _traceparent()
        await _append_traced(http, base, traceparent, "req-off")
        read = await http.get(base + "/records")
        assert read.status_code == 200 and read.json()["records"][0]["sequence"] == 1
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.payloads == [7]
        row = await pool.fetchrow(
            "SELECT d.trace_context FROM workflow_streams.input_deliveries d"
            " JOIN workflow_streams.streams s USING (stream_pk) WHERE s.run_id = $1",
            run_id,
        )
        assert row is not None and row["trace_context"] is None
    assert attaches == []


@pytest.mark.timeout(120)
async def test_a_server_with_tracing_off_sends_no_spans(
    receiver: OtlpReceiver, settings: Settings, auth: TokenFactory, run_id: str, tmp_path: Path
) -> None:
    # An endpoint alone would turn tracing on; `none` keeps it off.
    env = {**_otel_env(receiver, "test-off"), "OTEL_TRACES_EXPORTER": "none"}
    log = tmp_path / "serve.log"
    stream = f"s-{uuid.uuid4().hex[:6]}"
    with ServerProcess(settings, extra_env=env, log_path=log) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=auth(), timeout=10) as http:
            created = await http.post(
                f"{API}/runs/{run_id}/streams", json={"stream_id": stream, "direction": "output"}
            )
            assert created.status_code == 201
            traceparent, _, _ = _traceparent()
            for _ in range(20):
                r = await http.post(
                    f"{API}/runs/{run_id}/streams/{stream}/records",
                    json={"records": [{"payload": 1}]},
                    headers={"traceparent": traceparent},
                )
                assert r.status_code == 201
    # The server has exited (its exporter, had there been one, flushes at exit).
    assert receiver.requests == 0
    text = await asyncio.to_thread(log.read_text)
    assert "tracing is on" not in text and "trace_id" not in text


async def test_durable_streams_writes_to_an_input_stream_keep_the_trace_context(
    memory_spans: InMemorySpanExporter,
    settings: Settings,
    auth: TokenFactory,
    run_id: str,
    pool: asyncpg.Pool,
) -> None:
    app = create_app(settings)
    headers = auth(runs=[run_id])
    traces = [_traceparent() for _ in range(3)]
    async with (
        app.lifespan(),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://app", headers=headers
        ) as http,
    ):
        created = await http.post(
            f"{API}/runs/{run_id}/streams", json={"stream_id": "inbox", "direction": "input"}
        )
        assert created.status_code == 201
        url = f"{API}/runs/{run_id}/ds/v1/stream/inbox"
        producer = {"Producer-Id": "ui", "Producer-Epoch": "0", "Producer-Seq": "0"}
        writes = [
            ({}, b'{"q":1}', 204),  # a plain write: the native group-commit path
            (producer, b'{"q":2}', 200),  # a producer's write: ds_append (p_trace)
            ({}, b'{"q":3}', 204),
        ]
        for (traceparent, _, _), (extra, body, status) in zip(traces, writes, strict=True):

            async def post(
                extra: dict[str, str] = extra, body: bytes = body, traceparent: str = traceparent
            ) -> httpx.Response:
                return await http.post(
                    url,
                    content=body,
                    headers={
                        "Content-Type": "application/json",
                        "traceparent": traceparent,
                        **extra,
                    },
                )

            r = await asyncio.create_task(post())
            assert r.status_code == status, r.text
            assert "x-request-id" in r.headers
    rows = await pool.fetch(
        "SELECT d.sequence, d.trace_context FROM workflow_streams.input_deliveries d"
        " JOIN workflow_streams.streams s USING (stream_pk)"
        " WHERE s.run_id = $1 ORDER BY d.sequence",
        run_id,
    )
    servers = {
        span.trace_id: span.span_id
        for span in _from_memory(memory_spans)
        if span.name == "POST " + API + "/runs/{run_id}/ds/v1/stream/{stream_id}"
    }
    assert [row["sequence"] for row in rows] == [1, 2, 3]
    for row, (_, trace_id, _) in zip(rows, traces, strict=True):
        assert row["trace_context"] == f"00-{trace_id}-{servers[trace_id]}-01"
