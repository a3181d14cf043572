"""Postgres CPU per append, for sizing a deployment (docs/deploy.md "Capacity").

``python -m bench.pg_cpu [--shapes 1x1,16x1,16x16] [--seconds 5]`` starts one ``serve``
over an isolated database as ``bench.append`` does, drives each shape through it with the
same load generator (wrk when installed), and reads the CPU (user + system, from
/proc/<pid>/stat) of the Postgres backends connected to that database before and after
each run. It prints appends/s, the server's and Postgres's CPU per append, Postgres
cores per 1,000 appends/s, and how many backends served the database.

Shared Postgres processes (WAL writer, checkpointer, background writer) are not counted:
on a shared machine they work for every database. Needs a Postgres on this machine
whose processes this user can read (the machine's, or the embedded one bench starts).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from bench import wrk_loadgen
from bench.append import SHAPES, run_service
from bench.environment import bench_token, isolated_database, postgres_server, service
from ductor_streams.schema.migrate import migrate

TICKS = os.sysconf("SC_CLK_TCK")


def backends_of(database: str) -> dict[int, float]:
    """CPU seconds so far of every backend connected to ``database`` (a backend's
    command line reads ``postgres: [cluster: ]user database host(port) state``)."""
    found: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().split()
            if not words or words[0] != "postgres:" or database not in words[1:4]:
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, UnicodeDecodeError):
            continue
        found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_cpu")
    parser.add_argument("--shapes", default="1x1,16x1,16x16")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args(argv)
    shapes = [s for key in args.shapes.split(",") for s in SHAPES if s.key == key]
    client = "bench.wrk_loadgen" if wrk_loadgen.available() else "bench.loadgen"
    print(
        f"{'shape':<24} {'appends/s':>10} {'server ms':>10} {'pg ms':>8} "
        f"{'pg cores per 1k/s':>18} {'backends':>9}"
    )
    with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
        database = urlsplit(dsn).path.lstrip("/")
        asyncio.run(migrate(dsn))
        with service(dsn) as (server, settings):
            headers = {"Authorization": f"Bearer {bench_token(settings.require_jwt_secret())}"}
            for shape in shapes:
                before = backends_of(database)
                result = run_service(
                    server, headers, shape, args.seconds, args.warmup, client=client
                )
                after = backends_of(database)
                cpu = sum(after[pid] - before.get(pid, 0.0) for pid in after)
                appends = max(1, result["all_ok"])
                pg_ms = 1000 * cpu / appends
                print(
                    f"{shape.title:<24} {result['per_second']:>10,.0f} "
                    f"{result['server_cpu_ms_per_append']:>10.3f} {pg_ms:>8.3f} "
                    f"{pg_ms:>18.2f} {len(after):>9}"
                )
    print(
        f"client: {client}; Postgres CPU counts the database's own backends only "
        "(warm-up included, so it slightly overstates)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
