"""The append path of another revision beside this checkout's, in the same run.

    python -m bench.compare_revisions REV [--shapes 1x1,16x1] [--runs 8] [--seconds 3]
                                          [--env NAME=VALUE ...]

Exports ``ductor_streams/`` of git revision ``REV`` (``git archive``) into a temporary
folder, copies this checkout's into another, and starts two ``serve --no-workers``
subprocesses over one isolated database: one on each (``--env`` settings go to both). Each shape's
run is a pair, the two servers back to back, in alternating order; the table shows the
medians of appends/s and server CPU per append for each side, and the median of the
paired ratios (this checkout / REV), which drift on a busy machine hits least. Same
load generator as bench/append.py (bench/loadgen.py).

A ratio inside its own min-max spread says the difference is not measurable here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.append import SHAPES, run_service
from bench.environment import bench_token, isolated_database, postgres_server
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support.server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def exported(revision: str) -> Iterator[Path]:
    """A folder holding ``ductor_streams/`` as of ``revision``."""
    with tempfile.TemporaryDirectory(prefix="ds-bench-rev-") as folder:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", revision, "ductor_streams"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        yield Path(folder)


@contextlib.contextmanager
def copied_checkout() -> Iterator[Path]:
    """A folder holding a copy of this checkout's ``ductor_streams/`` (uncommitted changes
    included): both servers then import their code the same way, from a fresh folder
    of their own, so that where the code lies is no difference between the sides."""
    with tempfile.TemporaryDirectory(prefix="ds-bench-checkout-") as folder:
        shutil.copytree(
            ROOT / "ductor_streams",
            Path(folder) / "ductor_streams",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        yield Path(folder)


def _server(settings: Settings, code: Path, env: dict[str, str], log: Path) -> ServerProcess:
    # The child runs ``python -m`` from ``code``: its cwd comes first on sys.path, ahead
    # of the editable install, so that folder's ductor_streams is the one imported.
    return ServerProcess(settings, extra_env=env, log_path=log, cwd=code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare_revisions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("revision", help="git revision to compare with (e.g. main, HEAD~1)")
    parser.add_argument("--shapes", default="1x1,16x1")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for both")
    args = parser.parse_args(argv)
    shapes = [s for s in SHAPES if s.key in set(args.shapes.split(","))]
    if not shapes:
        parser.error("no known shape selected")
    env = dict(item.split("=", 1) for item in args.env)

    sides = (args.revision, "checkout")
    results: dict[tuple[str, str], list[dict[str, Any]]] = {
        (s.key, side): [] for s in shapes for side in sides
    }
    with (
        exported(args.revision) as code,
        copied_checkout() as checkout_code,
        postgres_server() as server_dsn,
        isolated_database(server_dsn) as dsn,
        tempfile.TemporaryDirectory(prefix="ds-bench-logs-") as logs,
    ):
        asyncio.run(migrate(dsn))
        settings = Settings(database_url=dsn, jwt_secret=secrets.token_hex(24), region="local")
        assert settings.jwt_secret is not None
        headers = {"Authorization": f"Bearer {bench_token(settings.jwt_secret)}"}
        with contextlib.ExitStack() as stack:
            servers = {
                args.revision: stack.enter_context(
                    _server(settings, code, env, Path(logs) / "revision.log")
                ),
                "checkout": stack.enter_context(
                    _server(settings, checkout_code, env, Path(logs) / "checkout.log")
                ),
            }
            for run in range(args.runs):
                for shape in shapes:
                    order = sides if run % 2 == 0 else sides[::-1]
                    for side in order:
                        results[(shape.key, side)].append(
                            run_service(servers[side], headers, shape, args.seconds, args.warmup)
                        )
                    print(f"run {run + 1}/{args.runs}: {shape.title}", file=sys.stderr, flush=True)
    print_table(shapes, sides, results)
    return 0


def print_table(
    shapes: list[Any], sides: tuple[str, str], results: dict[tuple[str, str], list[dict[str, Any]]]
) -> None:
    rev, mine = sides
    print(
        f"{'shape':24} {rev[:12]:>12} {'cpu ms':>7} | {'checkout':>10} {'cpu ms':>7} | "
        f"{'paired ratio (min-max)':>24} {'cpu ratio':>9}"
    )
    for shape in shapes:
        a, b = results[(shape.key, rev)], results[(shape.key, mine)]
        ratios = [y["per_second"] / x["per_second"] for x, y in zip(a, b, strict=True)]
        cpu = [
            y["server_cpu_ms_per_append"] / x["server_cpu_ms_per_append"]
            for x, y in zip(a, b, strict=True)
        ]
        print(
            f"{shape.title:24} {statistics.median(r['per_second'] for r in a):>10,.0f}/s "
            f"{statistics.median(r['server_cpu_ms_per_append'] for r in a):>7.3f} | "
            f"{statistics.median(r['per_second'] for r in b):>8,.0f}/s "
            f"{statistics.median(r['server_cpu_ms_per_append'] for r in b):>7.3f} | "
            f"{statistics.median(ratios):>10.3f} ({min(ratios):.2f}-{max(ratios):.2f}) "
            f"{statistics.median(cpu):>9.3f}"
        )
    print("(medians over the runs; ratios are checkout / revision, paired per run)")


if __name__ == "__main__":
    sys.exit(main())
