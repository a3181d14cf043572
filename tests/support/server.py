"""A real ``ductor-streams serve`` subprocess (uvicorn) for tests that need real HTTP:
SSE, restarts, several replicas. Waits on /healthz with a deadline, never a fixed sleep."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ductor_streams.config import Settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment variables that reproduce ``settings`` in a child process."""
    import json

    env = {
        "DUCTOR_STREAMS_DATABASE_URL": settings.database_url or "",
        "DUCTOR_STREAMS_JWT_SECRET": settings.jwt_secret or "",
        "DUCTOR_STREAMS_REGION": settings.region,
        "DUCTOR_STREAMS_TENANT": settings.tenant,
    }
    if settings.temporal_namespace:
        env["DUCTOR_STREAMS_TEMPORAL_NAMESPACE"] = settings.temporal_namespace
    if settings.object_stores:
        env["DUCTOR_STREAMS_OBJECT_STORE"] = json.dumps(dict(settings.object_stores))
    if settings.temporal_address:
        env["DUCTOR_STREAMS_TEMPORAL_ADDRESS"] = settings.temporal_address
    if settings.cors_origins:
        env["DUCTOR_STREAMS_CORS_ORIGINS"] = ",".join(settings.cors_origins)
    if settings.direct_database_url:
        env["DUCTOR_STREAMS_DIRECT_DATABASE_URL"] = settings.direct_database_url
    if settings.database_pooler != "session":
        env["DUCTOR_STREAMS_DATABASE_POOLER"] = settings.database_pooler
    return env


# The test servers' pools start with one connection instead of the default two: the
# workers of a run share one Postgres server's connections (100 by default) when
# DUCTOR_STREAMS_TEST_DATABASE_URL names one, and a file's servers may idle a while.
SERVER_POOL = {"DUCTOR_STREAMS_POOL_MIN_SIZE": "1"}


@dataclass
class ServerProcess:
    """One server subprocess; ``url`` is its root (the API is under /api/workflow-streams)."""

    settings: Settings
    workers: bool = False
    extra_env: Mapping[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    # The server's file-descriptor limit (``ulimit -n``), when a test sets one.
    nofile: int | None = None
    # The working directory: ``python -m`` imports the package found there first.
    cwd: Path | None = None
    # The module run as ``python -m <module> serve ...`` (a benchmark may wrap the CLI).
    module: str = "ductor_streams.process.cli"
    # Words before the interpreter (a benchmark may run the server under valgrind).
    prefix: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        args = [
            *self.prefix,
            sys.executable,
            "-m",
            self.module,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        if not self.workers:
            args.append("--no-workers")
        env = {**os.environ, **SERVER_POOL, **settings_env(self.settings), **self.extra_env}
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            args,
            env=env,
            cwd=self.cwd,
            stdout=log,
            stderr=log,
            preexec_fn=self._limits if self.nofile else None,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError("server did not become healthy in time")

    def _limits(self) -> None:
        import resource

        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
