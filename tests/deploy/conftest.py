"""Fixtures of the deploy tests: the engine and the images, built once per session from
this tree (the app image under a tag of its own, removed afterwards)."""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Iterator

import pytest

from tests.deploy.engine import Engine, find_engine
from tests.support.run_image import (
    APP,
    POSTGRES_IMAGE,
    STACK,
    TEMPORAL_IMAGE,
    run_image,
    run_lock,
    wait_built,
)


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return find_engine(tmp_path_factory.mktemp("deploy-build"))


@pytest.fixture(scope="session")
def app_image(engine: Engine) -> Iterator[str]:
    """`make image` (deploy/build-image.sh) under a tag of this test run.

    Under pytest-xdist the workers of one run share it: built by the run's image
    builder, started at collection (tests/support/run_image.py), or else by the first
    worker to need it (the others wait on a lock file, then find it); the controller
    removes it once every worker is done (tests/conftest.py, ``remove_run_image``)."""
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
    if wait_built(run, APP):
        yield image
        return
    with run_lock(run).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if engine.run("image", "inspect", image, check=False).returncode != 0:
            engine.script("build-image.sh", {"IMAGE": image})
    yield image


@pytest.fixture(scope="session")
def stack_images(engine: Engine, app_image: str) -> dict[str, str]:
    """The compose file's images: the app image above plus Postgres and Temporal."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None or not wait_built(run, STACK):
        engine.script(
            "build-stack.sh",
            {"SKIP_APP": "1", "POSTGRES_IMAGE": POSTGRES_IMAGE, "TEMPORAL_IMAGE": TEMPORAL_IMAGE},
        )
    return {"IMAGE": app_image, "POSTGRES_IMAGE": POSTGRES_IMAGE, "TEMPORAL_IMAGE": TEMPORAL_IMAGE}
