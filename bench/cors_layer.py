"""What the CORS layer (ductor_streams/http/cors.py) costs per request, in process.

    python -m bench.cors_layer [--requests 200000] [--runs 5]

Drives ``StreamsApp.__call__``'s first steps, without HTTP, Postgres or a route: for each
request, the CORS step (none, when the setting is unset) and then the response start and
body that the records front sends for an append (its headers included) through the
``send`` the step returned, into a ``send`` that drops them. Printed: the median of
``--runs`` runs, in microseconds per request, for

- the bare answer (the baseline: what the records front does per answer),
- CORS unset (the app's one ``is not None`` test more),
- a list of origins, a request from a listed origin (the allow, expose and Vary headers
  added to the answer), and from an unlisted one (Vary only),
- ``*``, and an allowed preflight (answered by the layer),

each beside the baseline's time as a difference. bench/append.py's CORS shapes measure
the same over HTTP, where the machine's noise is usually larger than the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ductor_streams.http.cors import CorsPolicy
from ductor_streams.http.headers import API_HEADERS

ORIGIN = b"https://app.example.com"
_HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"content-type", b"application/json"),
    (b"authorization", b"Bearer " + b"x" * 180),
    (b"content-length", b"40"),
]
_START_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"60"), *API_HEADERS]


async def _drop(message: Any) -> None:
    return None


async def _answer(send: Any) -> None:
    # As records_front._respond: a new header list per answer.
    await send({"type": "http.response.start", "status": 201, "headers": list(_START_HEADERS)})
    await send({"type": "http.response.body", "body": b"{}"})


class _App:
    """The CORS step of ``StreamsApp.__call__`` before an answer."""

    def __init__(self, cors: CorsPolicy | None, screened: bool) -> None:
        self.cors = cors
        self.screened = screened

    async def __call__(self, scope: Any, send: Any) -> None:
        if not self.screened:  # the code before the CORS layer existed
            await _answer(send)
            return
        if self.cors is not None:
            screened = await self.cors.screen(scope, send)
            if screened is None:
                return
            send = screened
        await _answer(send)


def _scope(origin: bytes | None, method: str = "POST", preflight: bool = False) -> Any:
    headers = list(_HEADERS)
    if origin is not None:
        headers.append((b"origin", origin))
    if preflight:
        headers.append((b"access-control-request-method", b"POST"))
    return {"type": "http", "method": method, "path": "/x", "headers": headers}


CASES: list[tuple[str, Callable[[], _App], Any]] = [
    ("bare answer (baseline)", lambda: _App(None, screened=False), _scope(None)),
    ("CORS unset", lambda: _App(None, screened=True), _scope(ORIGIN)),
    ("list, listed origin", lambda: _App(CorsPolicy([ORIGIN.decode()]), True), _scope(ORIGIN)),
    (
        "list, unlisted origin",
        lambda: _App(CorsPolicy([ORIGIN.decode()]), True),
        _scope(b"https://other.example"),
    ),
    ("list, no Origin", lambda: _App(CorsPolicy([ORIGIN.decode()]), True), _scope(None)),
    ("*, an origin", lambda: _App(CorsPolicy(["*"]), True), _scope(ORIGIN)),
    (
        "list, preflight",
        lambda: _App(CorsPolicy([ORIGIN.decode()]), True),
        _scope(ORIGIN, "OPTIONS", preflight=True),
    ),
]


async def _time(app: _App, scope: Any, requests: int) -> float:
    call: Callable[[Any, Any], Coroutine[Any, Any, None]] = app.__call__
    start = time.perf_counter()
    for _ in range(requests):
        await call(scope, _drop)
    return (time.perf_counter() - start) / requests * 1e6


async def run(requests: int, runs: int) -> list[tuple[str, float]]:
    times: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    for _ in range(runs):
        # Interleaved, so that a busy moment of the machine hits every case alike.
        for name, make, scope in CASES:
            times[name].append(await _time(make(), scope, requests))
    return [(name, statistics.median(times[name])) for name, _, _ in CASES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cors_layer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.requests, args.runs))
    base = rows[0][1]
    print(f"{'case':28} {'us/request':>10} {'vs baseline':>12}")
    for name, us in rows:
        print(f"{name:28} {us:>10.3f} {us - base:>+11.3f}")
    print(f"(medians of {args.runs} runs of {args.requests:,} requests; one process, no I/O)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
