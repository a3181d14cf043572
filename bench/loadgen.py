"""A low-overhead HTTP/1.1 load generator, run as its own process.

    python -m bench.loadgen --host 127.0.0.1 --port 8000 --spec spec.json

Each connection is a raw asyncio protocol on uvloop that sends one pre-built request
(keep-alive), waits for the whole response and sends the next: closed-loop clients, as
many as there are connections. Building nothing per request keeps the client to a
small share of a core, so it does not hide the server's cost on a 2-core machine.

``spec.json``: ``{"connections": [{"path": ..., "body": ..., "headers": {...}}, ...],
"seconds": S, "warmup": W}``. Prints one JSON object: requests and latencies (ms)
counted after the warm-up, status counts, elapsed seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from array import array
from typing import Any

import uvloop


class _Conn(asyncio.Protocol):
    """One keep-alive connection sending the same request again and again."""

    def __init__(self, request: bytes, stats: _Stats) -> None:
        self.request = request
        self.stats = stats
        self.buffer = bytearray()
        self.sent_at = 0
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's own class
        self._send()

    def _send(self) -> None:
        if self.stats.stopping:
            assert self.transport is not None
            self.transport.close()
            return
        self.sent_at = time.perf_counter_ns()
        assert self.transport is not None
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            response = first_response(self.buffer)
            if response is None:
                return
            status, _, total = response
            del self.buffer[:total]
            self.stats.record(status, time.perf_counter_ns() - self.sent_at)
            self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def first_response(buffer: bytearray) -> tuple[int, int, int] | None:
    """The first complete response (with a Content-Length) in ``buffer``: its status,
    where its body starts and where it ends; None until all of it has arrived."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buffer[:end])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if len(buffer) < end + 4 + length:
        return None
    return int(head[9:12]), end + 4, end + 4 + length


class _Stats:
    def __init__(self) -> None:
        self.counting = False
        self.stopping = False
        self.latencies = array("d")
        self.statuses: dict[int, int] = {}
        self.all_ok = 0  # warm-up included: what the server did while this ran

    def record(self, status: int, elapsed_ns: int) -> None:
        if 200 <= status < 300:
            self.all_ok += 1
        if self.counting:
            self.latencies.append(elapsed_ns / 1e6)
            self.statuses[status] = self.statuses.get(status, 0) + 1


def build_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def run(host: str, port: int, spec: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    stats = _Stats()
    conns: list[_Conn] = []
    for c in spec["connections"]:
        body = json.dumps(c["body"], separators=(",", ":")).encode()
        request = build_request(host, port, c["path"], body, c.get("headers", {}))
        proto = _Conn(request, stats)
        await loop.create_connection(lambda p=proto: p, host, port)  # type: ignore[misc]
        conns.append(proto)
    await asyncio.sleep(float(spec.get("warmup", 1.0)))
    stats.counting = True
    started = time.perf_counter()
    await asyncio.sleep(float(spec["seconds"]))
    stats.counting = False
    elapsed = time.perf_counter() - started
    stats.stopping = True
    await asyncio.wait([c.closed for c in conns], timeout=10)
    latencies = list(stats.latencies)
    ok = sum(n for s, n in stats.statuses.items() if 200 <= s < 300)
    return {
        "requests": len(latencies),
        "ok": ok,
        "statuses": {str(k): v for k, v in sorted(stats.statuses.items())},
        "elapsed": elapsed,
        "per_second": ok / elapsed if elapsed > 0 else 0.0,
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "all_ok": stats.all_ok,
        "client_cpu_seconds": time.process_time(),
    }


def parse_command(
    prog: str, description: str | None, argv: list[str] | None
) -> tuple[str, int, dict[str, Any]]:
    """A load generator's command line: ``--host``, ``--port`` and ``--spec`` (this
    module's and bench.wrk_loadgen's); returns the host, the port and the loaded spec."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--spec", required=True, help="JSON file (bench.loadgen's docstring)")
    args = parser.parse_args(argv)
    with open(args.spec, encoding="utf-8") as f:
        spec: dict[str, Any] = json.load(f)
    return args.host, args.port, spec


def main(argv: list[str] | None = None) -> int:
    host, port, spec = parse_command("python -m bench.loadgen", __doc__, argv)
    json.dump(uvloop.run(run(host, port, spec)), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
