"""Appends/s through a transaction pooler against a direct connection, in one run.

    python -m bench.pooler [--shapes 1x1,16x1,16x16] [--sides direct,transaction]
                           [--runs 5] [--seconds 3] [--pool-size 20]

Starts Debian's PgBouncer 1.18 (tests/support/pgbouncer.py: ``pool_mode =
transaction``, ``default_pool_size`` ``--pool-size``; installed when missing) in front
of the bench's Postgres, and ``serve --no-workers`` subprocesses over one isolated
database, one per side:

- ``direct``: ``DATABASE_URL`` straight to Postgres (today's default);
- ``transaction``: ``DATABASE_URL`` through PgBouncer in transaction mode with
  ``DATABASE_POOLER=transaction`` (no statement cache: each statement is parsed again),
  and LISTEN on ``DIRECT_DATABASE_URL``;
- ``session`` (only when asked for): through a second PgBouncer in session mode.

Each run measures every side back to back for each shape, in rotating order (the host's
speed moves between minutes; a paired ratio does not). The table gives each side's
median appends/s and server CPU per append, and the median of the paired ratios to
``direct``. Same load generator as bench/append.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.append import SHAPES, run_service
from bench.environment import bench_token, host_loop_ms, isolated_database, postgres_server
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support.pgbouncer import PgBouncer
from tests.support.server import ServerProcess

SIDES = ("direct", "transaction", "session")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pooler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--shapes", default="1x1,16x1,16x16")
    parser.add_argument(
        "--sides", default="direct,transaction", help="of direct, transaction, session"
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--pool-size", type=int, default=20, help="PgBouncer's default_pool_size")
    args = parser.parse_args(argv)
    shapes = [s for s in SHAPES if s.key in set(args.shapes.split(","))]
    if not shapes:
        parser.error("no known shape selected")
    chosen = {"direct", *args.sides.split(",")}
    if chosen - set(SIDES):
        parser.error(f"unknown side(s): {', '.join(sorted(chosen - set(SIDES)))}")
    sides = [s for s in SIDES if s in chosen]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {
        (s.key, side): [] for s in shapes for side in sides
    }
    loops: list[float] = []
    with contextlib.ExitStack() as stack:
        server_dsn = stack.enter_context(postgres_server())
        dsn = stack.enter_context(isolated_database(server_dsn))
        database = urlsplit(dsn).path.lstrip("/")
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ds-bench-logs-")))
        asyncio.run(migrate(dsn))
        direct = Settings(database_url=dsn, jwt_secret=secrets.token_hex(24), region="local")
        assert direct.jwt_secret is not None
        headers = {"Authorization": f"Bearer {bench_token(direct.jwt_secret)}"}
        settings = {"direct": direct}
        bouncers = {}
        for mode in ("transaction", "session"):
            if mode in sides:
                bouncer = stack.enter_context(
                    PgBouncer(server_dsn, mode=mode, pool_size=args.pool_size)
                )
                bouncers[mode] = bouncer
                settings[mode] = direct.with_overrides(
                    database_url=bouncer.dsn(database),
                    direct_database_url=dsn,
                    database_pooler=mode,
                )
        servers = {
            side: stack.enter_context(ServerProcess(settings[side], log_path=logs / f"{side}.log"))
            for side in sides
        }
        for run in range(args.runs):
            loops.append(host_loop_ms())
            for shape in shapes:
                shift = run % len(sides)
                for side in sides[shift:] + sides[:shift]:
                    results[(shape.key, side)].append(
                        run_service(servers[side], headers, shape, args.seconds, args.warmup)
                    )
                print(f"run {run + 1}/{args.runs}: {shape.title}", file=sys.stderr, flush=True)
        carried = {mode: bouncer.transactions(database) for mode, bouncer in bouncers.items()}
    print_table(shapes, sides, results)
    print(
        f"(PgBouncer 1.18, default_pool_size {args.pool_size}; transactions it carried: "
        + ", ".join(f"{mode} {count:,}" for mode, count in carried.items())
        + f"; host loop {min(loops):.0f}-{max(loops):.0f} ms)"
    )
    return 0


def print_table(
    shapes: list[Any], sides: list[str], results: dict[tuple[str, str], list[dict[str, Any]]]
) -> None:
    print(
        f"{'shape':22} {'side':>12} {'appends/s':>11} {'cpu ms':>7} | "
        f"{'vs direct (min-max)':>22} {'cpu vs direct':>13}"
    )
    for shape in shapes:
        base = results[(shape.key, "direct")]
        for side in sides:
            runs = results[(shape.key, side)]
            ratios = [y["per_second"] / x["per_second"] for x, y in zip(base, runs, strict=True)]
            cpu = [
                y["server_cpu_ms_per_append"] / x["server_cpu_ms_per_append"]
                for x, y in zip(base, runs, strict=True)
            ]
            print(
                f"{shape.title:22} {side:>12} "
                f"{statistics.median(r['per_second'] for r in runs):>9,.0f}/s "
                f"{statistics.median(r['server_cpu_ms_per_append'] for r in runs):>7.3f} | "
                f"{statistics.median(ratios):>10.3f} ({min(ratios):.2f}-{max(ratios):.2f}) "
                f"{statistics.median(cpu):>13.3f}"
            )
    print("(medians over the runs; ratios are side / direct, paired per run)")


if __name__ == "__main__":
    sys.exit(main())
