"""Operators against rows a real dispatcher produced through a real Temporal dev server:
delivered rows of a waiting run, dead rows of a completed one, and the retry round trip
(dead -> pending -> delivered once a new run with the same ID waits for the input)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
from temporalio.client import Client

from ductor_streams.store import Store
from tests.ops.helpers import OPS
from tests.ops.test_cli import cli
from tests.ops.test_metrics import scrape, value
from tests.temporal.conftest import WorkerFactory
from tests.temporal.polling import eventually
from tests.temporal.support import append_inputs, running_dispatcher, stream_ref
from tests.temporal.workflows import CollectInput, CollectWorkflow, QuickWorkflow


async def _listed(client: Any, ops: dict[str, str], **params: str) -> list[dict[str, Any]]:
    r = await client.get(f"{OPS}/deliveries", params=params, headers=ops)
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["deliveries"]
    return rows


async def test_review_and_retry_rows_of_a_real_dispatcher_run(
    client: Any,
    auth: Any,
    wf_client: Client,
    make_worker: WorkerFactory,
    task_queue: str,
    store: Store,
    pool: asyncpg.Pool,
    wf_settings: Any,
    settings: Any,
    run_id: str,
) -> None:
    tenant = wf_settings.tenant
    gone, waiting = run_id + "-gone", run_id + "-waits"
    ops = auth(tenant=tenant, scopes=["streams:ops"], runs=[gone, waiting], sub="oncall")
    async with make_worker([QuickWorkflow, CollectWorkflow]):
        done = await wf_client.start_workflow(QuickWorkflow.run, id=gone, task_queue=task_queue)
        assert await done.result() == "done"
        collector = await wf_client.start_workflow(
            CollectWorkflow.run, CollectInput(expect=2), id=waiting, task_queue=task_queue
        )
        gone_ref = await stream_ref(store, tenant, gone, "input")
        waiting_ref = await stream_ref(store, tenant, waiting, "input")
        await append_inputs(store, gone_ref, [1, 2])
        await append_inputs(store, waiting_ref, [10, 20])

        before = await scrape(client)
        async with running_dispatcher(pool, wf_client, tenant):
            result = await asyncio.wait_for(collector.result(), 60)
            assert result.sequences == [1, 2] and result.payloads == [10, 20]
            dead = await eventually(
                lambda: _listed(client, ops, state="dead"),
                lambda rows: len(rows) == 2,
                what="two dead deliveries",
            )
            assert [(d["run_id"], d["stream_id"], d["sequence"]) for d in dead] == [
                (gone, "input", 1),
                (gone, "input", 2),
            ]
            assert {d["last_error"] for d in dead} == {f"workflow {gone!r} has completed"}
            assert [d["attempts"] for d in dead] == [1, 0]  # only the head was attempted

            delivered = await eventually(
                lambda: _listed(client, ops, state="delivered"),
                lambda rows: len(rows) == 2,
                what="two delivered",
            )
            assert [(d["run_id"], d["sequence"]) for d in delivered] == [(waiting, 1), (waiting, 2)]
            assert all(d["delivered_at"] is not None and d["attempts"] == 1 for d in delivered)

            summary = (await client.get(f"{OPS}/summary", headers=ops)).json()
            assert summary["counts"] == {"pending": 0, "retrying": 0, "delivered": 2, "dead": 2}
            assert [
                (s["run_id"], s["dead"], s["first_undelivered_sequence"])
                for s in summary["streams"]
            ] == [(gone, 2, 1)]

            shown = await cli(settings, "list", "--tenant", tenant, "--run", gone, "--json")
            assert shown.returncode == 0, shown.stderr
            assert [d["delivery_id"] for d in json.loads(shown.stdout)["deliveries"]] == [
                d["delivery_id"] for d in dead
            ]

            # The run is started again (same workflow ID) and waits for its input: the
            # operator re-queues the dead rows, one over HTTP and one with the CLI.
            again = await wf_client.start_workflow(
                CollectWorkflow.run, CollectInput(expect=2), id=gone, task_queue=task_queue
            )
            r = await client.post(f"{OPS}/deliveries/{dead[0]['delivery_id']}/retry", headers=ops)
            assert r.status_code == 200, r.text
            assert (r.json()["state"], r.json()["retried_by"]) == ("pending", "oncall")
            retried = await cli(settings, "retry", str(dead[1]["delivery_id"]), "--by", "cli-op")
            assert retried.returncode == 0, retried.stderr

            second = await asyncio.wait_for(again.result(), 60)
            assert second.sequences == [1, 2] and second.payloads == [1, 2]
            rows = await eventually(
                lambda: _listed(client, ops, run=gone),
                lambda rows: [d["state"] for d in rows] == ["delivered", "delivered"],
                what="retried rows delivered",
            )
            assert [d["retried_by"] for d in rows] == ["oncall", "cli-op"]
            assert all(d["retried_at"] is not None and d["attempts"] == 1 for d in rows)
            assert await _listed(client, ops, state="dead") == []

    # The dispatcher's metrics: 4 signals accepted (2 + the 2 retried), 1 attempt that
    # found the run gone (its stream's second row died with it, unattempted).
    after = await scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("ductor_streams_delivery_attempts_total", outcome="delivered") == 4
    assert delta("ductor_streams_delivery_attempts_total", outcome="dead") == 1
    assert delta("ductor_streams_delivery_attempts_total", outcome="retrying") == 0
    assert delta("ductor_streams_delivery_latency_seconds_count") == 4
    assert delta("ductor_streams_delivery_operator_retries_total") == 2 - 1  # CLI: other process
