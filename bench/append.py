"""Append throughput over real HTTP, each shape beside its raw-Postgres baseline.

    python -m bench.append [--runs 3] [--seconds 5] [--warmup 1] [--client auto|wrk|loadgen]
                           [--json out.json]

Starts an isolated database and a real ``serve --no-workers`` subprocess, then for each
shape and run: the load generator (``wrk`` through bench/wrk_loadgen.py when it is
installed, else bench/loadgen.py: its own process, closed-loop keep-alive connections)
against the service, and the raw baseline
(bench/raw_postgres.py: BEGIN / lock row / INSERT / NOTIFY / COMMIT over asyncpg) with
the same connections, streams and batch size. Runs of the shapes are interleaved so that
drift on a busy machine hits all of them alike; the table shows medians over the runs.

Server CPU per append is the server process's user+system time (/proc) over the load
generator's whole life divided by the appends it answered with 2xx.

The credit shape is "16 clients, 1 stream" on a stream with a consumer and every
ceiling set (never reached): its throughput against the plain shape is the credit
overhead (issue 4 wants it under 10%). The CORS shapes are "1 client" and "16 clients,
1 stream" against a second server with ``DUCTOR_STREAMS_CORS_ORIGINS`` set, every request
from that origin (each answer carries the CORS headers): their throughput against the
plain shape's, run back to back, is what CORS costs when it is set.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import wrk_loadgen
from bench.environment import (
    bench_token,
    isolated_database,
    postgres_server,
    process_cpu_seconds,
    service,
)
from ductor_streams.schema.migrate import migrate

API = "/api/workflow-streams"
PAYLOAD = {"n": 1, "text": "hello"}
HUGE = 10**15


@dataclass(frozen=True)
class Shape:
    key: str
    title: str
    connections: int
    streams: int
    batch: int = 1
    credit: bool = False
    # Against a second server with DUCTOR_STREAMS_CORS_ORIGINS set, each request from
    # that origin (so every answer carries the CORS headers).
    cors: bool = False
    target: str = ""

    @property
    def unit(self) -> str:
        return "records/s" if self.batch > 1 else "appends/s"


SHAPES = [
    Shape("1x1", "1 client, 1 stream", 1, 1, target=">= 1,600/s"),
    Shape("16x1", "16 clients, 1 stream", 16, 1, target=">= 8,000/s, p99 <= 10 ms"),
    Shape("16x16", "16 clients, 16 streams", 16, 16, target=">= 4,500/s"),
    Shape(
        "batch100",
        "100-record batches, 4 clients, 4 streams",
        4,
        4,
        batch=100,
        target=">= 60,000 records/s",
    ),
    Shape(
        "16x1credit",
        "16 clients, 1 stream, credit ceilings set",
        16,
        1,
        credit=True,
        target="overhead < 10%",
    ),
    Shape("1x1cors", "1 client, 1 stream, CORS origin", 1, 1, cors=True, target="overhead"),
    Shape("16x1cors", "16 clients, 1 stream, CORS origin", 16, 1, cors=True, target="overhead"),
]

# The origin of the CORS shapes' requests, and the second server's setting.
CORS_ORIGIN = "https://app.example.com"


def _definition(stream_id: str, credit: bool) -> dict[str, Any]:
    if credit:
        ceilings: dict[str, Any] = {
            "max_unread_items": HUGE,
            "max_unread_bytes": HUGE,
            "max_total_items": HUGE,
            "max_total_bytes": HUGE,
        }
        consumers = ["reader"]
    else:
        ceilings = {
            "max_unread_items": None,
            "max_unread_bytes": None,
            "max_total_items": None,
            "max_total_bytes": None,
        }
        consumers = []
    return {
        "stream_id": stream_id,
        "direction": "output",
        "consumers": consumers,
        "credit": ceilings,
    }


def _create_streams(base_url: str, headers: dict[str, str], run_id: str, shape: Shape) -> list[str]:
    ids = []
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as client:
        for _ in range(shape.streams):
            stream_id = f"b-{uuid.uuid4().hex[:10]}"
            response = client.post(
                f"{API}/runs/{run_id}/streams", json=_definition(stream_id, shape.credit)
            )
            response.raise_for_status()
            ids.append(stream_id)
    return ids


def run_service(
    server: Any,
    headers: dict[str, str],
    shape: Shape,
    seconds: float,
    warmup: float,
    client: str = "bench.loadgen",
) -> dict[str, Any]:
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    streams = _create_streams(server.url, headers, run_id, shape)
    body = {"records": [{"payload": PAYLOAD}] * shape.batch}
    spec = {
        "seconds": seconds,
        "warmup": warmup,
        "connections": [
            {
                "path": f"{API}/runs/{run_id}/streams/{streams[i % shape.streams]}/records",
                "body": body,
                "headers": headers,
            }
            for i in range(shape.connections)
        ],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        spec_path = f.name
    pid = server.process.pid
    cpu_before = process_cpu_seconds(pid)
    out = subprocess.run(
        [sys.executable, "-m", client, "--port", str(server.port), "--spec", spec_path],
        check=True,
        capture_output=True,
        text=True,
    )
    cpu = process_cpu_seconds(pid) - cpu_before
    Path(spec_path).unlink(missing_ok=True)
    result: dict[str, Any] = json.loads(out.stdout)
    result["server_cpu_ms_per_append"] = 1000 * cpu / max(1, result["all_ok"])
    if shape.batch > 1:
        result["per_second"] *= shape.batch
    return result


def run_raw(dsn: str, shape: Shape, seconds: float, warmup: float) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.raw_postgres",
            "--dsn",
            dsn,
            "--connections",
            str(shape.connections),
            "--streams",
            str(shape.streams),
            "--batch",
            str(shape.batch),
            "--seconds",
            str(seconds),
            "--warmup",
            str(warmup),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    if shape.batch > 1:
        result["per_second"] *= shape.batch
    return result


# A shape measured against another (its overhead): their service runs go back to back.
TWIN_OF = {"16x1credit": "16x1", "1x1cors": "1x1", "16x1cors": "16x1"}


def rounds(wanted: list[Shape], run: int) -> list[list[Shape]]:
    """The shapes of one run, in order, each with the shapes whose service runs go
    right beside its own: the credit shape beside plain 16 x 1, first on every other
    run (so that neither always follows the other). A machine that drifts by tens of
    percent within a minute otherwise moves between the two runs of a pair."""
    keys = {s.key for s in wanted}
    out = []
    for shape in wanted:
        if TWIN_OF.get(shape.key) in keys:
            continue  # measured beside its twin
        together = [shape] + [s for s in wanted if TWIN_OF.get(s.key) == shape.key]
        out.append(together[::-1] if run % 2 else together)
    return out


def _median(runs: list[dict[str, Any]], field: str) -> float:
    return statistics.median(r[field] for r in runs)


def summarise(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    rows = []
    for shape in SHAPES:
        if shape.key not in results:
            continue
        svc, raw = results[shape.key]["service"], results[shape.key]["raw"]
        row: dict[str, Any] = {
            "shape": shape.key,
            "title": shape.title,
            "unit": shape.unit,
            "target": shape.target,
            "runs": len(svc),
            "service_per_second": _median(svc, "per_second"),
            "service_p50_ms": _median(svc, "p50_ms"),
            "service_p99_ms": _median(svc, "p99_ms"),
            "server_cpu_ms_per_append": _median(svc, "server_cpu_ms_per_append"),
            "client_cpu_us_per_request": statistics.median(
                1e6 * r["client_cpu_seconds"] / max(1, r["all_ok"]) for r in svc
            ),
            "raw_per_second": _median(raw, "per_second"),
            "raw_p50_ms": _median(raw, "p50_ms"),
            "raw_p99_ms": _median(raw, "p99_ms"),
            "non_2xx": sum(
                sum(v for k, v in r["statuses"].items() if not k.startswith("2")) for r in svc
            ),
        }
        row["ratio"] = row["service_per_second"] / row["raw_per_second"]
        rows.append(row)
    by_key = {r["shape"]: r for r in rows}
    for key, twin in TWIN_OF.items():
        if key in by_key and twin in by_key:
            # Paired per run (back to back, see rounds), then the median of the pairs.
            pairs = [
                c["per_second"] / p["per_second"]
                for c, p in zip(results[key]["service"], results[twin]["service"], strict=True)
            ]
            by_key[key]["overhead_pct"] = 100 * (1 - statistics.median(pairs))
            by_key[key]["overhead_of"] = twin
    return rows


def print_table(rows: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    header = (
        f"{'shape':44} {'ductor-streams':>14} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'cpu ms':>7} {'cli us':>6} | {'raw Postgres':>12} {'p50 ms':>7} {'p99 ms':>7} | "
        f"{'ratio':>6}  target"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in rows:
        note = r["target"]
        if "overhead_pct" in r:
            note = f"overhead {r['overhead_pct']:.1f}% vs {r['overhead_of']}"
            if r["shape"] == "16x1credit":
                note += " (target < 10%)"
        if r["non_2xx"]:
            note += f"  [{r['non_2xx']} non-2xx answers]"
        print(
            f"{r['title']:44} {r['service_per_second']:>12,.0f}/s {r['service_p50_ms']:>7.2f} "
            f"{r['service_p99_ms']:>7.2f} {r['server_cpu_ms_per_append']:>7.3f} "
            f"{r['client_cpu_us_per_request']:>6.0f} | "
            f"{r['raw_per_second']:>10,.0f}/s {r['raw_p50_ms']:>7.2f} {r['raw_p99_ms']:>7.2f} | "
            f"{r['ratio']:>6.2f}  {note}",
            file=out,
        )
    print(
        "(per second: appends, or records for batches; cpu ms = server CPU per append "
        "request; cli us = the load generator's CPU per request; medians over the runs)",
        file=out,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.append",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument(
        "--shapes",
        default=",".join(s.key for s in SHAPES),
        help="comma-separated subset of: " + ", ".join(s.key for s in SHAPES),
    )
    parser.add_argument(
        "--client",
        choices=["auto", "wrk", "loadgen"],
        default="auto",
        help="load generator: wrk through bench/wrk_loadgen.py (C; Debian's wrk), the "
        "Python one (bench/loadgen.py), or auto: wrk when it is on the PATH",
    )
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)
    if args.client == "wrk" and not wrk_loadgen.available():
        parser.error("wrk is not on the PATH (apt-get install wrk)")
    use_wrk = args.client == "wrk" or (args.client == "auto" and wrk_loadgen.available())
    client = "bench.wrk_loadgen" if use_wrk else "bench.loadgen"
    print(f"load generator: {client}", file=sys.stderr, flush=True)
    wanted = [s for s in SHAPES if s.key in set(args.shapes.split(","))]
    if not wanted:
        parser.error("no known shape selected")

    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        s.key: {"service": [], "raw": []} for s in wanted
    }
    import asyncio

    with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
        asyncio.run(migrate(dsn))
        with contextlib.ExitStack() as stack:
            server, settings = stack.enter_context(service(dsn))
            assert settings.jwt_secret is not None
            token = bench_token(settings.jwt_secret)
            headers = {"Authorization": f"Bearer {token}"}
            cors_server = server
            if any(s.cors for s in wanted):
                cors_server, _ = stack.enter_context(
                    service(dsn, jwt_secret=settings.jwt_secret, cors_origins=CORS_ORIGIN)
                )
            cors_headers = {**headers, "Origin": CORS_ORIGIN}
            for run in range(args.runs):
                for together in rounds(wanted, run):
                    for shape in together:
                        print(
                            f"run {run + 1}/{args.runs}: {shape.title} ...",
                            file=sys.stderr,
                            flush=True,
                        )
                        results[shape.key]["service"].append(
                            run_service(
                                cors_server if shape.cors else server,
                                cors_headers if shape.cors else headers,
                                shape,
                                args.seconds,
                                args.warmup,
                                client,
                            )
                        )
                    for shape in together:
                        results[shape.key]["raw"].append(
                            run_raw(dsn, shape, args.seconds, args.warmup)
                        )
    rows = summarise(results)
    print_table(rows)
    print(f"(load generator: {client})")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"client": client, "rows": rows, "runs": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
