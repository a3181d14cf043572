"""Fixtures of the deploy tests: the engine and the images, built once per session from
this tree (the app image under a tag of its own, removed afterwards)."""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Iterator

import pytest

from tests.deploy.engine import Engine, find_engine
from tests.support.run_image import run_image, run_lock

# The compose file's Postgres and Temporal images: content fixed by deploy/ and uv.lock,
# so one tag per machine (rebuilt from the layer cache in seconds).
POSTGRES_IMAGE = "localhost/ductor-streams-postgres:latest"
TEMPORAL_IMAGE = "localhost/ductor-streams-temporal:latest"


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return find_engine(tmp_path_factory.mktemp("deploy-build"))


@pytest.fixture(scope="session")
def app_image(engine: Engine) -> Iterator[str]:
    """`make image` (deploy/build-image.sh) under a tag of this test run.

    Under pytest-xdist the workers of one run share it: the first to need it builds it
    (the others wait on a lock file, then find it); the controller removes it once
    every worker is done (tests/conftest.py, ``remove_run_image``)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        image = f"localhost/ductor-streams:test-{secrets.token_hex(4)}"
        engine.script("build-image.sh", {"IMAGE": image})
        try:
            yield image
        finally:
            engine.run("rmi", "-f", image, check=False)
        return
    image = run_image(run)
    with run_lock(run).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if engine.run("image", "inspect", image, check=False).returncode != 0:
            engine.script("build-image.sh", {"IMAGE": image})
    yield image


@pytest.fixture(scope="session")
def stack_images(engine: Engine, app_image: str) -> dict[str, str]:
    """The compose file's images: the app image above plus Postgres and Temporal."""
    engine.script(
        "build-stack.sh",
        {"SKIP_APP": "1", "POSTGRES_IMAGE": POSTGRES_IMAGE, "TEMPORAL_IMAGE": TEMPORAL_IMAGE},
    )
    return {"IMAGE": app_image, "POSTGRES_IMAGE": POSTGRES_IMAGE, "TEMPORAL_IMAGE": TEMPORAL_IMAGE}
