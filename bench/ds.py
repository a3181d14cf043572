"""The Durable Streams endpoint beside the native one, in the same run.

    python -m bench.ds [--runs 3] [--seconds 5] [--warmup 1] [--records 100000]
                       [--json out.json]

One isolated database and one real ``serve --no-workers``. Each run measures, back to
back (which goes first alternates by run, so that a drifting machine hits both alike):

- appends/s with 1 client and with 16 clients on one stream: the native ``POST
  .../records`` (one record) against a DS ``POST .../ds/v1/stream/{s}`` of the same JSON
  value, both closed-loop keep-alive clients of bench/loadgen.py (or wrk through
  bench/wrk_loadgen.py when it is installed); a plain DS append takes the native
  group-commit path, so the two should be close;
- records/s reading ``--records`` records (appended natively, 1,000 a batch) from the
  start to the end, one client following the cursor: native pages of 1,000
  (``?cursor=&limit=1000``) against DS catch-up reads (``?offset=``, pages of up to 1,000).

The ratio is DS / native, paired per run, median over the runs (target: DS within 15%),
for throughput and for the server's CPU per append (or per record read): on a shared
machine the second is the steadier.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
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
UNLIMITED = {
    "max_unread_items": None,
    "max_unread_bytes": None,
    "max_total_items": None,
    "max_total_bytes": None,
}


def _create(client: httpx.Client, run_id: str) -> str:
    stream_id = f"b-{uuid.uuid4().hex[:10]}"
    response = client.post(
        f"{API}/runs/{run_id}/streams",
        json={"stream_id": stream_id, "direction": "output", "credit": UNLIMITED},
    )
    response.raise_for_status()
    return stream_id


def appends(
    server: Any, headers: dict[str, str], kind: str, clients: int, args: argparse.Namespace
) -> tuple[float, float]:
    """Appends/s of ``clients`` closed-loop clients on one fresh stream, and the server's
    CPU microseconds per append."""
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        stream_id = _create(client, run_id)
    if kind == "native":
        path = f"{API}/runs/{run_id}/streams/{stream_id}/records"
        body: Any = {"records": [{"payload": PAYLOAD}]}
    else:
        path = f"{API}/runs/{run_id}/ds/v1/stream/{stream_id}"
        body = PAYLOAD
    spec = {
        "seconds": args.seconds,
        "warmup": args.warmup,
        "connections": [{"path": path, "body": body, "headers": headers}] * clients,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        spec_path = f.name
    cpu_before = process_cpu_seconds(server.process.pid)
    out = subprocess.run(
        [sys.executable, "-m", args.client, "--port", str(server.port), "--spec", spec_path],
        check=True,
        capture_output=True,
        text=True,
    )
    cpu = process_cpu_seconds(server.process.pid) - cpu_before
    Path(spec_path).unlink(missing_ok=True)
    result = json.loads(out.stdout)
    bad = {k: v for k, v in result["statuses"].items() if not k.startswith("2")}
    if bad:
        raise RuntimeError(f"{kind} appends answered {bad}")
    return float(result["per_second"]), 1e6 * cpu / max(1, result["all_ok"])


def filled_stream(server: Any, headers: dict[str, str], records: int) -> tuple[str, str]:
    """A stream holding ``records`` records (1,000-record native batches)."""
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        stream_id = _create(client, run_id)
        body = {"records": [{"payload": PAYLOAD}] * 1000}
        for _ in range(-(-records // 1000)):
            client.post(f"{API}/runs/{run_id}/streams/{stream_id}/records", json=body)
    return run_id, stream_id


def read_all(
    server: Any, headers: dict[str, str], kind: str, run_id: str, stream: str
) -> tuple[float, float]:
    """Records/s reading the whole stream from the start with one keep-alive client, and
    the server's CPU microseconds per record."""
    count = 0
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        cpu_before = process_cpu_seconds(server.process.pid)
        started = time.perf_counter()
        if kind == "native":
            cursor = 0
            while True:
                page = client.get(
                    f"{API}/runs/{run_id}/streams/{stream}/records",
                    params={"cursor": cursor, "limit": 1000},
                )
                page.raise_for_status()
                data = page.json()
                count += len(data["records"])
                if data["next_cursor"] >= data["latest_sequence"]:
                    break
                cursor = data["next_cursor"]
        else:
            offset = "-1"
            while True:
                page = client.get(
                    f"{API}/runs/{run_id}/ds/v1/stream/{stream}", params={"offset": offset}
                )
                page.raise_for_status()
                count += len(page.json())
                offset = page.headers["stream-next-offset"]
                if page.headers.get("stream-up-to-date") == "true":
                    break
        elapsed = time.perf_counter() - started
        cpu = process_cpu_seconds(server.process.pid) - cpu_before
    return count / elapsed, 1e6 * cpu / max(1, count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--records", type=int, default=100_000, help="records read per run")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args(argv)
    args.client = "bench.wrk_loadgen" if wrk_loadgen.available() else "bench.loadgen"
    print(f"load generator: {args.client}", file=sys.stderr, flush=True)

    results: dict[str, dict[str, list[tuple[float, float]]]] = {}
    measures = [
        ("appends/s, 1 client", lambda s, h, k: appends(s, h, k, 1, args)),
        ("appends/s, 16 clients, 1 stream", lambda s, h, k: appends(s, h, k, 16, args)),
    ]
    with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
        asyncio.run(migrate(dsn))
        with service(dsn) as (server, settings):
            assert settings.jwt_secret is not None
            headers = {"Authorization": f"Bearer {bench_token(settings.jwt_secret)}"}
            for run in range(args.runs):
                order = ["native", "ds"] if run % 2 == 0 else ["ds", "native"]
                for name, measure in measures:
                    for kind in order:
                        print(f"run {run + 1}/{args.runs}: {name}, {kind} ...", file=sys.stderr)
                        value = measure(server, headers, kind)
                        results.setdefault(name, {}).setdefault(kind, []).append(value)
                run_id, stream = filled_stream(server, headers, args.records)
                name = f"records/s reading {args.records:,} records"
                for kind in order:
                    print(f"run {run + 1}/{args.runs}: {name}, {kind} ...", file=sys.stderr)
                    value = read_all(server, headers, kind, run_id, stream)
                    results.setdefault(name, {}).setdefault(kind, []).append(value)
    rows: list[dict[str, Any]] = []
    for name, by_kind in results.items():
        native, ds = by_kind["native"], by_kind["ds"]
        rows.append(
            {
                "measure": name,
                "native": statistics.median(n for n, _ in native),
                "ds": statistics.median(d for d, _ in ds),
                "ratio": statistics.median(d[0] / n[0] for d, n in zip(ds, native, strict=True)),
                "native_cpu_us": statistics.median(c for _, c in native),
                "ds_cpu_us": statistics.median(c for _, c in ds),
                "cpu_ratio": statistics.median(
                    d[1] / n[1] for d, n in zip(ds, native, strict=True)
                ),
                "runs": len(native),
            }
        )
    header = (
        f"{'measure':40} {'native':>9} {'DS':>9} {'DS/nat':>7} | "
        f"{'cpu us nat':>10} {'cpu us DS':>9} {'DS/nat':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        verdict = "within 15%" if r["ratio"] >= 0.85 else "MORE than 15% slower"
        print(
            f"{r['measure']:40} {r['native']:>9,.0f} {r['ds']:>9,.0f} {r['ratio']:>7.2f} | "
            f"{r['native_cpu_us']:>10.0f} {r['ds_cpu_us']:>9.0f} {r['cpu_ratio']:>7.2f}"
            f"  {verdict}"
        )
    print(
        f"(medians over {args.runs} runs; DS/nat: DS / native paired per run, median; cpu us:"
        " the server's CPU per append, or per record read)"
    )
    print(f"(load generator: {args.client})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
