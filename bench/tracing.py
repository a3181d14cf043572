"""What observability costs the append path: tracing off, on at 100% and at 1% sampling,
and (with ``--baseline REV``) the same code before request metrics and IDs existed.

    python -m bench.tracing [--baseline REV] [--shapes 1x1,16x1] [--sides off,on100,on1]
                            [--runs 6] [--seconds 3]

Starts ``serve --no-workers`` subprocesses over one isolated database, one per side:

- ``off``: this checkout, no OTEL_* variable (the no-op tracer; request metrics, request
  IDs and statement metrics are always on);
- ``on100``: this checkout exporting every span over OTLP/HTTP (``always_on``);
- ``on1``: the same at 1% (``traceidratio``, 0.01);
- ``REV`` (``--baseline``): that revision's ``ductor_streams/`` (``git archive``), e.g.
  the commit before request metrics were added: ``off`` against it is their cost.

The spans go to a sink in this process that reads each export and answers 200 without
decoding it (a collector's work is not the server's). Each run measures every side back
to back for each shape, in rotating order; the table gives each side's median appends/s
and server CPU per append, and the medians of the paired ratios against ``off`` (of
appends/s and of CPU per append). Same
load generator as bench/append.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import statistics
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.append import SHAPES, run_service
from bench.compare_revisions import ROOT, exported
from bench.environment import bench_token, isolated_database, postgres_server
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support.server import ServerProcess


class _Sink(BaseHTTPRequestHandler):
    """Takes an OTLP export and drops it."""

    exports = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        _Sink.exports += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def sink() -> Iterator[str]:
    """An OTLP/HTTP endpoint that drops what it gets; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host!s}:{port}"
    finally:
        server.shutdown()
        server.server_close()


def side_env(side: str, endpoint: str) -> dict[str, str]:
    """The OTEL_* variables of one side."""
    if side == "on100":
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_on"}
    if side == "on1":
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.01",
        }
    return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tracing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--baseline", help="git revision measured beside (e.g. main~3)")
    parser.add_argument("--shapes", default="1x1,16x1")
    parser.add_argument(
        "--sides", default="off,on100,on1", help="of off, on100, on1 (off always runs)"
    )
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    args = parser.parse_args(argv)
    shapes = [s for s in SHAPES if s.key in set(args.shapes.split(","))]
    if not shapes:
        parser.error("no known shape selected")
    chosen = {"off", *args.sides.split(",")}
    sides = [s for s in ("off", "on100", "on1") if s in chosen]
    sides += [args.baseline] if args.baseline else []
    results: dict[tuple[str, str], list[dict[str, Any]]] = {
        (s.key, side): [] for s in shapes for side in sides
    }
    with contextlib.ExitStack() as stack:
        code = stack.enter_context(exported(args.baseline)) if args.baseline else None
        server_dsn = stack.enter_context(postgres_server())
        dsn = stack.enter_context(isolated_database(server_dsn))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ds-bench-logs-")))
        endpoint = stack.enter_context(sink())
        asyncio.run(migrate(dsn))
        settings = Settings(database_url=dsn, jwt_secret=secrets.token_hex(24), region="local")
        assert settings.jwt_secret is not None
        headers = {"Authorization": f"Bearer {bench_token(settings.jwt_secret)}"}
        servers = {}
        for side in sides:
            folder = ROOT if side in ("off", "on100", "on1") else code
            assert folder is not None
            env = {**side_env(side, endpoint), "OTEL_SERVICE_NAME": f"bench-{side}"}
            servers[side] = stack.enter_context(
                ServerProcess(settings, extra_env=env, log_path=logs / f"{side}.log", cwd=folder)
            )
        for run in range(args.runs):
            for shape in shapes:
                shift = run % len(sides)
                for side in sides[shift:] + sides[:shift]:
                    results[(shape.key, side)].append(
                        run_service(servers[side], headers, shape, args.seconds, args.warmup)
                    )
                print(f"run {run + 1}/{args.runs}: {shape.title}", file=sys.stderr, flush=True)
    print_table(shapes, sides, results)
    print(f"(OTLP exports received by the sink: {_Sink.exports})")
    return 0


def print_table(
    shapes: list[Any], sides: list[str], results: dict[tuple[str, str], list[dict[str, Any]]]
) -> None:
    print(
        f"{'shape':22} {'side':>12} {'appends/s':>11} {'cpu ms':>7} | "
        f"{'vs off (min-max)':>22} {'cpu vs off':>10}"
    )
    for shape in shapes:
        off = results[(shape.key, "off")]
        for side in sides:
            runs = results[(shape.key, side)]
            ratios = [y["per_second"] / x["per_second"] for x, y in zip(off, runs, strict=True)]
            cpu = [
                y["server_cpu_ms_per_append"] / x["server_cpu_ms_per_append"]
                for x, y in zip(off, runs, strict=True)
            ]
            print(
                f"{shape.title:22} {side[:12]:>12} "
                f"{statistics.median(r['per_second'] for r in runs):>9,.0f}/s "
                f"{statistics.median(r['server_cpu_ms_per_append'] for r in runs):>7.3f} | "
                f"{statistics.median(ratios):>10.3f} ({min(ratios):.2f}-{max(ratios):.2f}) "
                f"{statistics.median(cpu):>10.3f}"
            )
    print("(medians over the runs; ratios are side / off, paired per run, appends/s and CPU)")


if __name__ == "__main__":
    sys.exit(main())
