"""What observing a request costs the append path, in process (CPU per request).

    python -m bench.observe_layer [--requests 20000] [--runs 5]

Drives what ``StreamsApp.__call__`` and the appender add to each append, without HTTP
or Postgres: the request ID, the request metric, the answer's headers through a
``send`` that drops them, the traceparent the appender takes for the delivery rows and
one append-statement span per request (a statement per request: the one-client case).
Modes, each timed with ``time.process_time`` (every thread of the process, so the span
processor's export thread counts), the export flushed inside the timed window:

- ``bare``: the answer alone (what the records front did before any observation);
- ``off``: with observation, tracing off (the no-op tracer; the shipped default);
- ``on1``: tracing on, 1% sampling (``traceidratio`` 0.01), OTLP/HTTP exporter;
- ``on100``: tracing on, every request sampled and exported (``always_on``);

both configured as a server configures itself from its OTEL_* variables.

Spans are exported over OTLP/HTTP to a sink in this process that drops them (its
thread's CPU counts too: a collector elsewhere would not). Printed: the median of
``--runs`` runs in microseconds per request, and each mode's difference from ``bare``.
bench/tracing.py measures the same over HTTP, where a shared machine's noise is usually
larger than these differences.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from bench.tracing import side_env, sink
from ductor_streams.config import Settings
from ductor_streams.foundation import tracing
from ductor_streams.http.codecs.headers import API_HEADERS
from ductor_streams.http.fronts.records import RECORDS_TEMPLATE
from ductor_streams.http.middleware.observe import REQUEST_ID_HEADER, Request
from ductor_streams.store.append import _statement_span

_HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"content-type", b"application/json"),
    (b"authorization", b"Bearer " + b"x" * 180),
    (b"content-length", b"40"),
]
_START = [(b"content-type", b"application/json"), (b"content-length", b"60"), *API_HEADERS]
MODES = ("bare", "off", "on1", "on100")


async def _drop(message: Any) -> None:
    return None


async def _bare(scope: dict[str, Any]) -> None:
    await _drop({"type": "http.response.start", "status": 201, "headers": list(_START)})
    await _drop({"type": "http.response.body", "body": b'{"first_sequence":1}'})


async def _observed(scope: dict[str, Any]) -> None:
    request = Request(scope)
    headers = [*_START, (REQUEST_ID_HEADER, request.request_id.encode("ascii"))]
    if tracing.ENABLED:
        # What Appender.submit and Appender._run add per request with tracing on.
        trace = tracing.current_traceparent()
        from ductor_streams.store.encoding import EncodedBatch

        batch = EncodedBatch(["1"], [1], [None], None, "h", trace)
        span = _statement_span([(1, [(batch, None)])], 1)  # type: ignore[list-item]
        if span is not None:  # none when no request of the statement is sampled
            span.end()
    await _drop({"type": "http.response.start", "status": 201, "headers": headers})
    await _drop({"type": "http.response.body", "body": b'{"first_sequence":1}'})
    request.end(RECORDS_TEMPLATE, 201)


async def _run(mode: str, requests: int, endpoint: str) -> float:
    """Microseconds of CPU per request in ``mode``."""
    provider = None
    if mode.startswith("on"):
        # As a server configures itself from its OTEL_* variables (bench/tracing.py's).
        settings = Settings(otel_environ=side_env(mode, endpoint))
        assert tracing.configure_tracing(settings, service="bench")
        provider = tracing.installed_provider()
    try:
        step = _bare if mode == "bare" else _observed

        # Each request in a task of its own, as served (its context dies with it).
        async def one() -> None:
            await step({"method": "POST", "headers": _HEADERS, "type": "http"})

        loop = asyncio.get_running_loop()
        started = time.process_time()
        for _ in range(requests):
            await loop.create_task(one())
        if provider is not None:
            provider.force_flush()
        return 1e6 * (time.process_time() - started) / requests
    finally:
        if provider is not None:
            tracing.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.observe_layer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    with sink() as endpoint:
        for run in range(args.runs):
            shift = run % len(MODES)
            for mode in MODES[shift:] + MODES[:shift]:
                times[mode].append(asyncio.run(_run(mode, args.requests, endpoint)))
            print(f"run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
    bare = statistics.median(times["bare"])
    print(f"{'mode':8} {'us/request':>10} {'vs bare':>9}  (min-max of runs)")
    for mode in MODES:
        median = statistics.median(times[mode])
        print(
            f"{mode:8} {median:>10.2f} {median - bare:>+9.2f}  "
            f"({min(times[mode]):.2f}-{max(times[mode]):.2f})"
        )
    print(f"(CPU per request, every thread; medians of {args.runs} runs of {args.requests})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
