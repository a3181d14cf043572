"""The benchmark suite: ``python -m bench`` (or ``make bench``) runs every part in one go.

    python -m bench [--only append,sse,temporal,objects,tracing,ds,reads,fairness,failover,
                            pooler,floors] [--runs 3] [--seconds 5]
    python -m bench floors                      # parts named without --only

Parts (each a module with ``main(argv) -> int``, run in its own process so that one
part's event loop, threads or crash cannot disturb the next):

- ``append``: appends/s and p50/p99 over real HTTP beside the raw-Postgres baseline,
  credit overhead, server CPU per append (bench/append.py)
- ``sse``: append -> SSE latency at 1, 100, 1,000 and 2,000 subscribers, beside raw
  ``pg_notify`` -> listener and the fan-out floor (bench/sse_latency.py, bench/fanout_floor.py)
- ``temporal``: HTTP input -> workflow delivery (bench/temporal_delivery.py)
- ``objects``: large-object upload and commit (bench/objects.py)
- ``tracing``: appends/s at 1 and 16 clients with tracing off, on at 100% and at 1%
  sampling, in one run (bench/tracing.py)
- ``ds``: the Durable Streams endpoint beside the native one: appends/s with 1 and 16
  clients, records/s reading 100,000 records (bench/ds.py)
- ``reads``: catch-up of 100,000 records from cursor 0, paged (``GET records?limit=1000``)
  and as the SSE backfill, beside raw asyncpg pages of 1,000 (bench/reads.py)
- ``fairness``: one tenant's one-record append p50/p99 while another tenant runs 120
  concurrent 8 MB catch-up loops, beside a quiet run in the same window (bench/fairness.py)
- ``failover``: a pg_auto_failover cluster (its own, not the server below) under appends
  and SSE followers: the write outage of a switchover and of a killed primary, and how
  soon after the new primary takes writes appends are answered 2xx (bench/failover.py)
- ``pooler``: appends/s at 1 and 16 clients through PgBouncer in transaction mode
  (started here) beside a direct connection, paired per run (bench/pooler.py)
- ``floors``: the speed floors in one command: fan-out at 1,000 and 100 subscribers,
  token -> SSE at 100 activities (aligned and spread), input -> workflow, each against
  its floor in alternating repetitions; its last line is one JSON object (bench/floors.py)

A part whose module is absent is reported and skipped. Every part gets the same
Postgres server ($DUCTOR_STREAMS_BENCH_DATABASE_URL, else $DUCTOR_STREAMS_TEST_DATABASE_URL,
else an embedded one started here) and makes its own database on it. How to run the parts
and read their output: bench/README.md; the current figures: docs/speed.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time

from bench.environment import postgres_server

PARTS = {
    "append": "bench.append",
    "sse": "bench.sse_latency",
    "temporal": "bench.temporal_delivery",
    "objects": "bench.objects",
    "tracing": "bench.tracing",
    "ds": "bench.ds",
    "reads": "bench.reads",
    "fairness": "bench.fairness",
    "failover": "bench.failover",
    "pooler": "bench.pooler",
    "floors": "bench.floors",
}


def _run_part(name: str, module: str, argv: list[str], env: dict[str, str]) -> int:
    print(f"\n=== {name} ({module}) " + "=" * max(0, 60 - len(name) - len(module)), flush=True)
    if importlib.util.find_spec(module) is None:
        print(f"{module} is not present: skipped", flush=True)
        return 0
    started = time.monotonic()
    code = (
        f"import sys, importlib; sys.exit(importlib.import_module({module!r}).main({argv!r}) or 0)"
    )
    rc = subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode
    print(f"--- {name}: exit {rc}, {time.monotonic() - started:.0f} s", flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "parts", nargs="*", help="parts to run, as --only (e.g. `python -m bench floors`)"
    )
    parser.add_argument(
        "--only",
        help="comma-separated parts to run (default: all): " + ", ".join(PARTS),
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=3,
        help="append, ds, reads, pooler: runs per shape (median); floors: repetitions",
    )
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="append, ds, floors: seconds per run"
    )
    args = parser.parse_args(argv)
    named = [*args.parts, *(args.only.split(",") if args.only else [])]
    chosen = [p.strip() for p in named if p.strip()] or list(PARTS)
    unknown = [p for p in chosen if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")

    failures = 0
    with postgres_server() as server_dsn:
        # Every part makes its database on the same server, whichever variable it reads.
        env = {
            **os.environ,
            "DUCTOR_STREAMS_BENCH_DATABASE_URL": server_dsn,
            "DUCTOR_STREAMS_TEST_DATABASE_URL": server_dsn,
            "DUCTOR_STREAMS_DATABASE_URL": server_dsn,
        }
        for name in chosen:
            part_argv = (
                ["--runs", str(args.runs), "--seconds", str(args.seconds)]
                if name in ("append", "ds", "floors")
                else ["--runs", str(args.runs)]
                if name in ("reads", "pooler")
                else []
            )
            if _run_part(name, PARTS[name], part_argv, env) != 0:
                failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
