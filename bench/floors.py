"""Benchmark: the speed floors, each measured in the same run as the figure it bounds.

    python -m bench floors                        # = python -m bench.floors
    python -m bench.floors [--runs 3] [--seconds 5] [--samples 150] [--only NAMES]
    python -m bench.floors --quick                # one short repetition of each

Five measures, each as alternating repetitions (ours, floor, ours, floor, ...) on one
Postgres (a fresh database), one Temporal dev server and one ``serve``, all started
here and stopped at the end:

- ``fanout_1000``, ``fanout_100``: append -> SSE receipt latency with 1,000 (100)
  subscribers of one stream, appends at ``--rate`` for ``--seconds``, through ``serve``
  against the bare fan-out floor (bench/fanout_floor.py), with the subscribers and the
  producer of ``bench.sse_latency`` (``one_run``);
- ``tokens_aligned``, ``tokens_spread``: token -> SSE at ``--streams`` streaming
  activities (``stream_writer``), every stream's tokens at the same instant or spread
  over the period, against the SQL floor (the product's statement and wakes between
  bare processes, tests/support/token_floor.py ``--sql``), with
  ``bench.activity_streams``' ``Bench.concurrent``; ``tokens_spread`` also counts the
  runs meeting the target (p50 <= 5 ms, p99 <= 20 ms);
- ``input_to_workflow``: an input record POSTed over HTTP -> Temporal recording its
  signal to the workflow, through ``serve`` and its dispatcher, against ``Store.append``
  of the record plus a bare signal once it committed (bench/temporal_delivery.py).

Each entry: the medians over the repetitions of both sides' p50 and p99, the ratios of
those medians (ours / floor) and ``correct``: every run of both sides delivered every
record to every subscriber, stream or workflow once and in order. The table comes first,
with every repetition; the last line is the report as one JSON object
(tests/support/floors.py). The exit code is 1 when a delivery check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bench import sse_latency, temporal_delivery
from bench.activity_streams import Bench, start_worker
from bench.activity_streams_worker import LOOP_ENV as WORKER_LOOP_ENV
from bench.environment import bench_token, host_loop_ms, isolated_database, postgres_server
from bench.temporal_workflows import CountWorkflow, SinkWorkflow
from ductor_streams import temporal_connection
from ductor_streams.config import Settings
from ductor_streams.plugin import StreamsPlugin
from ductor_streams.schema.migrate import migrate
from ductor_streams.store import Store
from ductor_streams.store.db import create_pool
from tests.support.floors import ENTRIES, Run, all_once_in_order, entry, report_line
from tests.support.server import ServerProcess


@dataclass
class Sides:
    """The repetitions of one entry, each side's in the order they ran."""

    ours: list[Run] = field(default_factory=list)
    floor: list[Run] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _run_of(p50_ms: float | None, p99_ms: float | None, correct: bool) -> Run:
    nan = float("nan")
    return Run(
        p50_ms if p50_ms is not None else nan, p99_ms if p99_ms is not None else nan, correct
    )


# -- fan-out ------------------------------------------------------------------------------


async def fanout(
    servers: dict[str, ServerProcess],
    token: str,
    monitor: asyncpg.Connection,
    subscribers: int,
    args: argparse.Namespace,
) -> Sides:
    """``bench.sse_latency``'s run at ``subscribers``, ours (``serve``) then the floor,
    ``args.runs`` times."""
    sides = Sides()
    connections = sse_latency._Connections(monitor)
    for k in range(args.runs):
        for side in ("ours", "floor"):
            row = await sse_latency.one_run(
                servers[side],
                token,
                connections,
                subscribers=subscribers,
                rate=args.rate,
                seconds=args.seconds,
            )
            # Every subscriber got every appended id once, in order: none missing, none
            # again or after a higher one, and one delivery per (subscriber, append).
            correct = (
                row["missing"] == 0
                and row["disorder"] == 0
                and row["deliveries"] == subscribers * row["appends"]
            )
            run = _run_of(row["p50_ms"], row["p99_ms"], correct)
            getattr(sides, side).append(run)
            sides.notes.append(
                f"  run {k + 1} {side:<5} p50 {run.p50_ms:7.2f}  p99 {run.p99_ms:7.2f} ms"
                f"  rate {row['achieved_rate']}/s  deliveries {row['deliveries']}"
                f"  missing {row['missing']}  disorder {row['disorder']}"
            )
            print(sides.notes[-1], flush=True)
    return sides


# -- tokens ---------------------------------------------------------------------------------


async def tokens(bench: Bench, spread: bool, args: argparse.Namespace) -> Sides:
    """``bench.activity_streams``' concurrent load, ``activity`` (ours) then
    ``sql_floor``, ``args.runs`` times."""
    sides = Sides()
    expected = int(args.token_rate * args.seconds)
    for k in range(args.runs):
        for side, mode in (("ours", "activity"), ("floor", "sql_floor")):
            row = await bench.concurrent(mode, args.streams, args.token_rate, args.seconds, spread)
            results = bench.last_results
            correct = len(results) == args.streams and all_once_in_order(
                (r["sequences"] for r in results), expected
            )
            delivery = row["delivery"]
            run = _run_of(delivery.get("p50_ms"), delivery.get("p99_ms"), correct)
            getattr(sides, side).append(run)
            sides.notes.append(
                f"  run {k + 1} {side:<5} p50 {run.p50_ms:7.2f}  p99 {run.p99_ms:7.2f} ms"
                f"  received {row['received']}/{row['expected']}"
                f"  streams in order {row['streams_in_order_without_repeats']}/{args.streams}"
                f"  host loop {row['host_loop_ms_during'][0]} ms"
            )
            print(sides.notes[-1], flush=True)
    return sides


# -- input -> workflow ------------------------------------------------------------------------


def _input_correct(run: temporal_delivery.InputRun, samples: int, done_record: bool) -> bool:
    """The workflow counted every record, and Temporal recorded one signal per appended
    sequence, once each, in order (the ``done`` record, when sent, is the last one)."""
    appended = samples + (1 if done_record else 0)
    return run.result == samples and all_once_in_order([[s for s, _ in run.signals]], appended)


async def input_to_workflow(
    client: Any, server: ServerProcess, settings: Settings, store: Store, args: argparse.Namespace
) -> Sides:
    """``bench.temporal_delivery``'s HTTP input run (ours) then the store's append plus a
    bare signal (the floor), ``args.runs`` times."""
    sides = Sides()
    for k in range(args.runs):
        for side in ("ours", "floor"):
            if side == "ours":
                run = await temporal_delivery.http_input_run(client, server, settings, args.samples)
            else:
                run = await temporal_delivery.append_then_signal_run(client, store, args.samples)
            await temporal_delivery.with_signals(run)
            figures = temporal_delivery.percentiles(run.latencies_ms())
            correct = _input_correct(run, args.samples, done_record=side == "ours")
            result = _run_of(figures["p50_ms"], figures["p99_ms"], correct)
            getattr(sides, side).append(result)
            sides.notes.append(
                f"  run {k + 1} {side:<5} p50 {result.p50_ms:7.2f}  p99 {result.p99_ms:7.2f} ms"
                f"  signals {len(run.signals)}  workflow counted {run.result}/{args.samples}"
            )
            print(sides.notes[-1], flush=True)
    return sides


# -- the run --------------------------------------------------------------------------------


def _log_says(log: Path, words: str) -> bool:
    return log.exists() and words in log.read_text(errors="replace")


async def _wait_for_worker(worker: Any, log: Path) -> None:
    deadline = time.monotonic() + 120
    while not await asyncio.to_thread(_log_says, log, "polling"):
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited: see {log}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker did not start polling: see {log}")
        await asyncio.sleep(0.1)


async def _run(
    args: argparse.Namespace, dsn: str, floor_dsn: str, workdir: Path, chosen: list[str]
) -> dict[str, Sides]:
    await migrate(dsn)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).with_name("temporal")),
        dev_server_log_level="error",
    )
    measured: dict[str, Sides] = {}
    try:
        secret = secrets.token_urlsafe(32)
        settings = Settings(
            database_url=dsn,
            jwt_secret=secret,
            region="local",
            tenant="bench",
            temporal_address=env.client.service_client.config.target_host,
        )
        token = bench_token(secret)
        streaming = [n for n in chosen if n.startswith(("fanout", "tokens"))]
        if streaming:
            worker = None
            try:
                with (
                    ServerProcess(settings, log_path=workdir / "serve.log") as server,
                    ServerProcess(
                        settings, module="bench.fanout_floor", log_path=workdir / "fanout.log"
                    ) as floor_server,
                ):
                    monitor = await asyncpg.connect(dsn)
                    try:
                        for name, count in (("fanout_1000", 1000), ("fanout_100", 100)):
                            if name in chosen:
                                print(f"{name}: {count} subscribers", flush=True)
                                servers = {"ours": server, "floor": floor_server}
                                measured[name] = await fanout(servers, token, monitor, count, args)
                    finally:
                        await monitor.close()
                    if any(n.startswith("tokens") for n in streaming):
                        # Started after the fan-out runs: an idle worker polls Temporal.
                        worker = start_worker(
                            settings, workdir / "worker.log", {WORKER_LOOP_ENV: args.worker_loop}
                        )
                        await _wait_for_worker(worker, workdir / "worker.log")
                        bench = Bench(server, token, env.client, worker.pid, None, floor_dsn)
                        bench.server_pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
                        try:
                            for name, spread in (
                                ("tokens_aligned", False),
                                ("tokens_spread", True),
                            ):
                                if name in chosen:
                                    print(
                                        f"{name}: {args.streams} activities x"
                                        f" {args.token_rate:g} tokens/s",
                                        flush=True,
                                    )
                                    measured[name] = await tokens(bench, spread, args)
                        finally:
                            await bench.server_pool.close()
                            await bench.http.aclose()
            finally:
                if worker is not None:
                    worker.kill()
                    worker.wait(10)
        if "input_to_workflow" in chosen:
            print(f"input_to_workflow: {args.samples} records a run", flush=True)
            # A tenant of its own: the dispatcher of this ``serve`` delivers its inputs only.
            input_settings = Settings(
                database_url=dsn,
                jwt_secret=secret,
                temporal_address=env.client.service_client.config.target_host,
                tenant=f"bench-{uuid.uuid4().hex[:6]}",
            )
            pool = await create_pool(dsn, min_size=2, max_size=10)
            try:
                client = await temporal_connection.connect(
                    input_settings, plugins=[StreamsPlugin(input_settings)]
                )
                async with Worker(
                    client,
                    task_queue=temporal_delivery.TASK_QUEUE,
                    workflows=[SinkWorkflow, CountWorkflow],
                ):
                    with ServerProcess(
                        input_settings, workers=True, log_path=workdir / "serve-input.log"
                    ) as server:
                        measured["input_to_workflow"] = await input_to_workflow(
                            client, server, input_settings, Store(pool), args
                        )
            finally:
                await pool.close()
    finally:
        await env.shutdown()
    return measured


def print_table(entries: dict[str, dict[str, Any]], measured: dict[str, Sides]) -> None:
    print(
        f"\n{'measure':<18}{'ours p50':>9}{'p99':>8}{'floor p50':>10}{'p99':>8}"
        f"{'p50 x':>7}{'p99 x':>7}  correct"
    )
    for name, row in entries.items():
        extra = (
            f"  runs meeting the target {row['runs_met']}/{row['runs']}" if "runs" in row else ""
        )
        print(
            f"{name:<18}{row['ours_p50_ms']!s:>9}{row['ours_p99_ms']!s:>8}{row['floor_p50_ms']!s:>10}"
            f"{row['floor_p99_ms']!s:>8}{row['p50_ratio']!s:>7}{row['p99_ratio']!s:>7}"
            f"  {row['correct']}{extra}"
        )
    print(
        "(ms; medians of the repetitions; x = ours / floor. Floors: fanout, bench/fanout_floor.py;"
        " tokens, the SQL floor; input, Store.append + a bare signal. docs/speed.md, Floors.)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.floors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=3, help="repetitions of each side")
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="load of one fan-out or tokens run"
    )
    parser.add_argument("--rate", type=float, default=200.0, help="fan-out appends/s")
    parser.add_argument("--streams", type=int, default=100, help="streaming activities")
    parser.add_argument("--token-rate", type=float, default=50.0, help="tokens/s per activity")
    parser.add_argument(
        "--samples", type=int, default=150, help="input records of one input_to_workflow run"
    )
    parser.add_argument(
        "--only", help="comma-separated measures (default all): " + ", ".join(ENTRIES)
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one repetition of 1 s loads and 30 input records: to check the bench runs",
    )
    parser.add_argument("--worker-loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--json", type=Path, help="also write the report and every run here")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.seconds, args.samples = 1, 1.0, 30
    chosen = [n.strip() for n in (args.only or ",".join(ENTRIES)).split(",") if n.strip()]
    unknown = [n for n in chosen if n not in ENTRIES]
    if unknown:
        parser.error(f"unknown measure(s) {unknown}; choose from {', '.join(ENTRIES)}")
    args.runs = max(1, args.runs)

    started = time.monotonic()
    print(f"host loop before: {host_loop_ms()} ms; load average {os.getloadavg()}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-floors-"))
    with (
        postgres_server() as server_dsn,
        isolated_database(server_dsn) as dsn,
        isolated_database(server_dsn) as floor_dsn,
    ):
        measured = asyncio.run(_run(args, dsn, floor_dsn, workdir, chosen))
    entries = {
        name: entry(measured[name].ours, measured[name].floor, target_runs=name == "tokens_spread")
        for name in ENTRIES
        if name in measured
    }
    print_table(entries, measured)
    print(
        f"took {time.monotonic() - started:.0f} s; host loop after: {host_loop_ms()} ms;"
        f" load average {os.getloadavg()}; logs in {workdir}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "entries": entries,
                    "runs": {
                        name: {
                            "ours": [vars(r) for r in s.ours],
                            "floor": [vars(r) for r in s.floor],
                        }
                        for name, s in measured.items()
                    },
                },
                indent=2,
            )
        )
    print(report_line(entries, partial=args.only is not None), flush=True)
    rc = 0 if all(row["correct"] for row in entries.values()) else 1
    sys.stdout.flush()
    # temporalio's core may crash the interpreter at exit (sdk-python#300): keep the code.
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
