"""The echo example end to end: HTTP in, Temporal signal, workflow, activity, SSE out.

A real `ductor-streams serve` subprocess (with its dispatcher), the real Temporal dev
server, the example's EchoWorkflow on its contract task queue, SSE read with httpx-sse.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from httpx_sse import aconnect_sse
from temporalio.client import Client
from temporalio.worker import Worker

from ductor_streams.config import Settings
from ductor_streams.store import Store, StreamKey
from examples.workflows.echo import TASK_QUEUE, EchoWorkflow
from tests.conftest import API, TokenFactory
from tests.support.server import ServerProcess
from tests.temporal.conftest import strict_runner
from tests.temporal.polling import eventually
from tests.temporal.support import deliveries


async def follow(url: str, headers: dict[str, str], out: list[tuple[str, str, Any]]) -> None:
    """Collect (event, id, data) from the SSE stream until `end`."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, read=60.0)) as http:
        async with aconnect_sse(http, "GET", url, headers=headers) as source:
            assert source.response.status_code == 200
            async for event in source.aiter_sse():
                if not event.data:
                    continue  # the leading retry/comment block
                out.append((event.event, event.id, json.loads(event.data)))
                if event.event in ("end", "error"):
                    return


@pytest.mark.timeout(120)
async def test_echo_fifty_inputs_in_batches_over_http_and_sse(
    wf_client: Client,
    wf_settings: Settings,
    auth: TokenFactory,
    run_id: str,
    store: Store,
    pool: asyncpg.Pool,
    tmp_path: Path,
) -> None:
    headers = auth(tenant=wf_settings.tenant, runs=[run_id])
    base = f"{API}/runs/{run_id}/streams"
    with ServerProcess(wf_settings, workers=True, log_path=tmp_path / "serve.log") as server:
        async with (
            Worker(
                wf_client,
                task_queue=TASK_QUEUE,
                workflows=[EchoWorkflow],
                workflow_runner=strict_runner(),
            ),
            httpx.AsyncClient(base_url=server.url, headers=headers, timeout=10) as http,
        ):
            handle = await wf_client.start_workflow(
                "EchoWorkflow", id=run_id, task_queue=TASK_QUEUE, result_type=int
            )
            # The workflow creates its own streams; wait for both.
            for stream_id in ("input", "output"):
                await eventually(
                    lambda s=stream_id: http.get(f"{base}/{s}"),
                    lambda r: r.status_code == 200,
                    what=f"{stream_id} created",
                )
            received: list[tuple[str, str, Any]] = []
            reader = asyncio.create_task(
                follow(f"{server.url}{base}/output/subscribe?cursor=0", headers, received)
            )
            sent = 0
            for size in (1, 7, 12, 5, 25):
                body = {"records": [{"payload": {"i": sent + k}} for k in range(size)]}
                answer = await http.post(f"{base}/input/records", json=body)
                assert answer.status_code == 201, answer.text
                assert answer.json() == {"first_sequence": sent + 1, "last_sequence": sent + size}
                sent += size
            done = await http.post(
                f"{base}/input/records", json={"records": [{"payload": {"done": True}}]}
            )
            assert done.json() == {"first_sequence": 51, "last_sequence": 51}
            await asyncio.wait_for(reader, 60)
            assert await handle.result() == 50
            # The first batch came to an idle stream: its append leased its delivery to
            # this server's dispatcher, which signalled it with no claim (append_requests_leasing).
            text = (await http.get("/metrics")).text
            leased = [
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("ductor_streams_delivery_append_leased_total ")
            ]
            assert leased and leased[0] >= 1, leased

    records = [(e, i, d) for e, i, d in received if e == "record"]
    assert [i for _, i, _ in records] == [str(n) for n in range(1, 51)]
    assert [d["payload"] for _, _, d in records] == [{"echo": {"i": n}} for n in range(50)]
    assert received[-1] == ("end", received[-1][1], {"last_sequence": 50})
    assert len(received) == 51
    ref = await store.get_stream(StreamKey(wf_settings.tenant, run_id, "input"))
    rows = await deliveries(pool, ref)
    assert [(r["sequence"], r["state"]) for r in rows] == [(n, "delivered") for n in range(1, 52)]
    state = await store.state(ref)
    assert [(c.consumer_id, c.acked_sequence) for c in state.consumers] == [("workflow", 51)]
