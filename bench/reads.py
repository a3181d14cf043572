"""Catch-up reads over HTTP beside raw asyncpg pages, in the same run.

    python -m bench.reads [--runs 3] [--records 100000] [--limit 1000] [--json out.json]
                          [--profile PREFIX]

One isolated database and one real ``serve --no-workers``; one stream of ``--records``
small records (``{"n": 1, "text": "hello"}``, appended natively 1,000 a batch). Each run
reads the whole stream from cursor 0, three ways back to back (the order rotates by run,
so that a drifting machine hits all alike):

- **raw**: the baseline, raw asyncpg pages of ``--limit`` records
  (``SELECT sequence, payload, size, appended_at, object ... WHERE sequence > $2 ORDER BY
  sequence LIMIT $3``) on one connection, each following the last page's cursor;
- **paged**: ``GET .../records?cursor=&limit=`` on one raw keep-alive socket following
  ``next_cursor`` (requests written from bytes, answers read by Content-Length, each
  page decoded with msgspec: no HTTP client library in the figure, as the baseline has
  no layer above asyncpg);
- **paged through httpx**: the same with an ``httpx.Client`` (what a Python consumer
  with a common client library sees; no target);
- **sse**: ``GET .../subscribe?cursor=0`` (the native SSE backfill), read until the
  event of the last record arrived.

Printed: records/s (median over the runs), the ratio to raw paired per run (median),
and the server's CPU per record read. The targets (issue 23): paged >= 500,000
records/s and >= 0.4 of raw; SSE backfill >= 300,000 records/s.

``--profile PREFIX``: after the measured runs, py-spy (the profile extra) samples the
server while ``--runs`` more paged reads, then SSE backfills, run; raw stacks to
``PREFIX-paged.txt`` and ``PREFIX-sse.txt``, summarised as ``bench.profile`` does. The
server CPU per record is in the measure only; the CPU resolution is a clock tick per
run (0.1 us a record at 100,000 records: ``--records 1000000`` resolves 0.01 us).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import msgspec

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
RAW_PAGE = (
    "SELECT sequence, payload, size, appended_at, object FROM workflow_streams.records"
    " WHERE stream_pk = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
)
_RECORD_EVENT = b"event: record\n"


class _Page(msgspec.Struct):
    records: list[msgspec.Raw]
    next_cursor: int
    latest_sequence: int


def fill(server: Any, headers: dict[str, str], records: int) -> tuple[str, str]:
    """A stream holding ``records`` records (1,000-record native batches)."""
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    stream_id = f"r-{uuid.uuid4().hex[:10]}"
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        client.post(
            f"{API}/runs/{run_id}/streams",
            json={"stream_id": stream_id, "direction": "output", "credit": UNLIMITED},
        ).raise_for_status()
        body = {"records": [{"payload": PAYLOAD}] * 1000}
        left = records
        while left > 0:
            n = min(1000, left)
            client.post(
                f"{API}/runs/{run_id}/streams/{stream_id}/records",
                json={"records": body["records"][:n]},
            ).raise_for_status()
            left -= n
    return run_id, stream_id


async def raw_read(dsn: str, run_id: str, stream_id: str, limit: int) -> float:
    """Records/s of raw asyncpg pages of ``limit`` over the whole stream."""
    conn = await asyncpg.connect(dsn)
    try:
        pk = await conn.fetchval(
            "SELECT stream_pk FROM workflow_streams.streams WHERE run_id = $1 AND stream_id = $2",
            run_id,
            stream_id,
        )
        statement = await conn.prepare(RAW_PAGE)
        count, cursor = 0, 0
        started = time.perf_counter()
        while True:
            rows = await statement.fetch(pk, cursor, limit)
            if not rows:
                break
            count += len(rows)
            cursor = rows[-1]["sequence"]
        return count / (time.perf_counter() - started)
    finally:
        await conn.close()


_DECODER = msgspec.json.Decoder(_Page)


def _follow_pages(server: Any, page_at: Callable[[int], bytes]) -> tuple[float, float, int]:
    """Read pages from cursor 0 (``page_at(cursor)`` answers one page's body), each
    following the last's ``next_cursor``: records/s, server CPU us per record, records."""
    count, cursor = 0, 0
    cpu_before = process_cpu_seconds(server.process.pid)
    started = time.perf_counter()
    while True:
        page = _DECODER.decode(page_at(cursor))
        count += len(page.records)
        cursor = page.next_cursor
        if cursor >= page.latest_sequence:
            break
    elapsed = time.perf_counter() - started
    cpu = process_cpu_seconds(server.process.pid) - cpu_before
    return count / elapsed, 1e6 * cpu / max(1, count), count


def paged_read(
    server: Any, headers: dict[str, str], run_id: str, stream_id: str, limit: int
) -> tuple[float, float, int]:
    """Every page over HTTP through one ``httpx.Client`` (``_follow_pages``' figures)."""
    path = f"{API}/runs/{run_id}/streams/{stream_id}/records"
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        client.get(path, params={"cursor": 0, "limit": 1}).raise_for_status()  # connect

        def page_at(cursor: int) -> bytes:
            response = client.get(path, params={"cursor": cursor, "limit": limit})
            response.raise_for_status()
            return response.content

        return _follow_pages(server, page_at)


def raw_http_paged_read(
    server: Any, headers: dict[str, str], run_id: str, stream_id: str, limit: int
) -> tuple[float, float, int]:
    """``paged_read`` over one raw keep-alive socket: each request written from bytes,
    each answer read by its Content-Length (no HTTP client library's own CPU in the
    figure, as the raw asyncpg baseline has no driver layer above it either)."""
    path = f"{API}/runs/{run_id}/streams/{stream_id}/records"
    host, port = "127.0.0.1", server.port
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    template = f"GET {path}?cursor=%d&limit={limit} HTTP/1.1\r\nHost: {host}\r\n{head}\r\n"
    request = template.encode()
    with socket.create_connection((host, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = sock.makefile("rb")

        def page_at(cursor: int) -> bytes:
            sock.sendall(request % cursor)
            status = reader.readline()
            if not status.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"page answered {status!r}")
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            return reader.read(length)

        return _follow_pages(server, page_at)


def sse_read(
    server: Any, headers: dict[str, str], run_id: str, stream_id: str, records: int
) -> tuple[float, float, int]:
    """Records/s of the SSE backfill from cursor 0 until the last record's event arrived,
    server CPU us per record, records received."""
    path = f"{API}/runs/{run_id}/streams/{stream_id}/subscribe"
    count = 0
    carry = b""
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        cpu_before = process_cpu_seconds(server.process.pid)
        started = time.perf_counter()
        with client.stream("GET", path, params={"cursor": 0}) as response:
            response.raise_for_status()
            for chunk in response.iter_raw():
                data = carry + chunk
                count += data.count(_RECORD_EVENT)
                # An event line split across chunks is counted once, in the next chunk.
                cut = data.rfind(b"\n")
                carry = data[cut + 1 :] if cut >= 0 else data
                if count >= records:
                    break
        elapsed = time.perf_counter() - started
        cpu = process_cpu_seconds(server.process.pid) - cpu_before
    return count / elapsed, 1e6 * cpu / max(1, count), count


def profiled(
    server: Any, out: Path, reads: int, read: Callable[[], tuple[float, float, int]]
) -> None:
    """``read()`` ``reads`` times with py-spy sampling the server (raw stacks to ``out``)."""
    beside = Path(sys.executable).with_name("py-spy")  # the virtualenv's, when there
    spy = subprocess.Popen(
        [
            str(beside) if beside.exists() else "py-spy",
            "record",
            "--pid",
            str(server.process.pid),
            "--rate",
            "500",
            "--format",
            "raw",
            "--nonblocking",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached
    for _ in range(reads):
        read()
    spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
    spy.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reads",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--limit", type=int, default=1000, help="records per page (raw, paged)")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--profile", help="then profile the server: PREFIX-paged.txt, -sse.txt")
    args = parser.parse_args(argv)

    kinds = ["raw", "paged", "paged_httpx", "sse"]
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    loads: list[float] = []
    with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
        asyncio.run(migrate(dsn))
        with service(dsn) as (server, settings):
            assert settings.jwt_secret is not None
            headers = {"Authorization": f"Bearer {bench_token(settings.jwt_secret)}"}
            run_id, stream_id = fill(server, headers, args.records)
            for run in range(args.runs):
                loads.append(os.getloadavg()[0])
                order = kinds[run % len(kinds) :] + kinds[: run % len(kinds)]
                for kind in order:
                    print(f"run {run + 1}/{args.runs}: {kind} ...", file=sys.stderr, flush=True)
                    if kind == "raw":
                        value = (asyncio.run(raw_read(dsn, run_id, stream_id, args.limit)), 0.0)
                    elif kind in ("paged", "paged_httpx"):
                        reader = raw_http_paged_read if kind == "paged" else paged_read
                        rate, cpu, n = reader(server, headers, run_id, stream_id, args.limit)
                        if n != args.records:
                            raise RuntimeError(f"paged read returned {n} records")
                        value = (rate, cpu)
                    else:
                        rate, cpu, n = sse_read(server, headers, run_id, stream_id, args.records)
                        if n != args.records:
                            raise RuntimeError(f"SSE backfill delivered {n} records")
                        value = (rate, cpu)
                    results[kind].append(value)
            if args.profile:
                profiled(
                    server,
                    Path(f"{args.profile}-paged.txt"),
                    args.runs,
                    lambda: raw_http_paged_read(server, headers, run_id, stream_id, args.limit),
                )
                profiled(
                    server,
                    Path(f"{args.profile}-sse.txt"),
                    args.runs,
                    lambda: sse_read(server, headers, run_id, stream_id, args.records),
                )
    raw = [r for r, _ in results["raw"]]
    rows: list[dict[str, Any]] = []
    for kind, target in (
        ("raw", None),
        ("paged", 500_000),
        ("paged_httpx", None),
        ("sse", 300_000),
    ):
        rates = [r for r, _ in results[kind]]
        row = {
            "kind": kind,
            "records_per_s": statistics.median(rates),
            "ratio_to_raw": statistics.median(r / b for r, b in zip(rates, raw, strict=True)),
            "server_cpu_us_per_record": statistics.median(c for _, c in results[kind]),
            "target": target,
        }
        rows.append(row)
    print(f"reading {args.records:,} records from cursor 0, pages of {args.limit}")
    header = f"{'read':28} {'records/s':>11} {'/ raw':>7} {'cpu us/rec':>10}  target"
    print(header)
    print("-" * len(header))
    names = {
        "raw": "raw asyncpg pages",
        "paged": "GET records?limit=",
        "paged_httpx": "  the same through httpx",
        "sse": "SSE backfill (subscribe)",
    }
    for r in rows:
        verdict = ""
        if r["target"] is not None:
            met = r["records_per_s"] >= r["target"]
            if r["kind"] == "paged":
                met = met and r["ratio_to_raw"] >= 0.4
                verdict = f">= {r['target']:,}/s and >= 0.4: " + ("met" if met else "NOT met")
            else:
                verdict = f">= {r['target']:,}/s: " + ("met" if met else "NOT met")
        cpu_text = f"{r['server_cpu_us_per_record']:>10.2f}" if r["kind"] != "raw" else f"{'-':>10}"
        print(
            f"{names[r['kind']]:28} {r['records_per_s']:>11,.0f} {r['ratio_to_raw']:>7.2f}"
            f" {cpu_text}  {verdict}"
        )
    print(
        f"(medians over {args.runs} runs; / raw: paired per run, median; cpu: the server's CPU"
        f" per record; 1-minute load average at each run's start: "
        + ", ".join(f"{x:.1f}" for x in loads)
        + ")"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "runs": results}, indent=2))
    if args.profile:
        from bench.profile import summarise

        for kind in ("paged", "sse"):
            print(f"\n{args.profile}-{kind}.txt (py-spy over {args.runs} more {kind} reads):")
            summarise(Path(f"{args.profile}-{kind}.txt"), 25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
