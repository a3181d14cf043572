"""Instructions the server executes per append, for revisions side by side.

    python -m bench.instructions [REV ...] [--requests 400] [--clients 1,16]

Runs ``serve --no-workers`` under valgrind's callgrind with instrumentation off, warms it
with 100 appends, then counts the instructions (callgrind's ``Ir``) the server process
executes while ``--requests`` single-record appends are answered, by 1 client in turn or
by N concurrent ones, and prints instructions per append. This checkout is always
measured (from a copy of its ``ductor_streams/``, as bench.compare_revisions does), and
so is each ``REV`` (its ``ductor_streams/`` exported from git), against one database
migrated by this checkout.

Why: the machines here have 2 noisy cores, and a CPU-time comparison of two revisions
moves by 5-10% between runs (bench/README.md, "How far bench.compare_revisions can be
trusted"). An instruction count is the same to well under 1% from run to run whatever
else the machine does, so a change of a few percent in the server's own work shows. It
is not the whole cost: it leaves out the kernel (socket writes and reads), cache misses
and Postgres; read it beside bench.compare_revisions, not instead of it. With 16 clients
the valgrind-slowed server sees full groups (16 appends a statement), larger than a
real server's at that load.

Needs valgrind (Debian's package). Not part of ``python -m bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.compare_revisions import copied_checkout, exported
from bench.environment import bench_token, isolated_database, postgres_server
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support.server import ServerProcess

WARMUP = 100
BODY = {"records": [{"payload": {"text": "hello", "n": 1}}]}


def _toggle(pid: int, on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(pid)],
        check=True,
        capture_output=True,
    )


def _appends(url: str, headers: dict[str, str], count: int, clients: int) -> None:
    if clients == 1:
        with httpx.Client(timeout=120) as client:
            for _ in range(count):
                answer = client.post(url, json=BODY, headers=headers)
                assert answer.status_code == 201, answer.text

        return

    async def one_client() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            for _ in range(count // clients):
                answer = await client.post(url, json=BODY, headers=headers)
                assert answer.status_code == 201, answer.text

    async def all_clients() -> None:
        await asyncio.gather(*(one_client() for _ in range(clients)))

    asyncio.run(all_clients())


def _instructions(out_prefix: str) -> int:
    total = 0
    for path in glob.glob(out_prefix + "*"):
        for line in Path(path).read_text().splitlines():
            if line.startswith("summary:") or line.startswith("totals:"):
                total = max(total, int(line.split()[1]))
    return total


def measure(
    code: Path,
    settings: Settings,
    headers: dict[str, str],
    requests: int,
    clients: int,
    scratch: Path,
) -> float:
    """Instructions per append of the server whose code is in ``code``."""
    out = str(scratch / f"callgrind.{secrets.token_hex(4)}.out")
    server = ServerProcess(
        settings,
        cwd=code,
        prefix=(
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
        ),
        # The same string hashes in every run: dict and set layouts do not vary.
        extra_env={"PYTHONHASHSEED": "0"},
        log_path=scratch / "serve.log",
    )
    server.start(timeout=300)
    try:
        run_id = f"instructions-{secrets.token_hex(4)}"
        streams = f"{server.url}/api/workflow-streams/runs/{run_id}/streams"
        created = httpx.post(
            streams, json={"stream_id": "s", "direction": "output"}, headers=headers, timeout=60
        )
        assert created.status_code == 201, created.text
        records = f"{streams}/s/records"
        _appends(records, headers, WARMUP, 1)
        assert server.process is not None
        _toggle(server.process.pid, True)
        _appends(records, headers, requests, clients)
        _toggle(server.process.pid, False)
    finally:
        server.stop(timeout=120)
    return _instructions(out) / (requests // clients * clients)


@contextlib.contextmanager
def _code(revision: str) -> Iterator[Path]:
    with copied_checkout() if revision == "checkout" else exported(revision) as code:
        yield code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instructions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("revisions", nargs="*", help="git revisions to measure beside this one")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", default="1,16")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("needs valgrind and callgrind_control (apt-get install valgrind)")
    clients = [int(c) for c in args.clients.split(",")]
    sides = [*args.revisions, "checkout"]
    figures: dict[tuple[str, int], float] = {}
    with (
        postgres_server() as server_dsn,
        isolated_database(server_dsn) as dsn,
        tempfile.TemporaryDirectory(prefix="ds-bench-instructions-") as scratch,
    ):
        asyncio.run(migrate(dsn))
        settings = Settings(database_url=dsn, jwt_secret=secrets.token_hex(24), region="local")
        assert settings.jwt_secret is not None
        headers = {"Authorization": f"Bearer {bench_token(settings.jwt_secret)}"}
        for side in sides:
            with _code(side) as code:
                for n in clients:
                    figures[(side, n)] = measure(
                        code, settings, headers, args.requests, n, Path(scratch)
                    )
                    print(f"{side} x {n}: {figures[(side, n)]:,.0f}", file=sys.stderr, flush=True)
    print(f"{'revision':14} {'clients':>7} {'instructions/append':>20} {'checkout / it':>14}")
    for side in sides:
        for n in clients:
            ratio = figures[("checkout", n)] / figures[(side, n)]
            print(f"{side[:14]:14} {n:>7} {figures[(side, n)]:>20,.0f} {ratio:>14.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
