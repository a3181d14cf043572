"""Shared fixtures: a real Postgres database (the machine's, or an embedded one), the app
in-process, tokens, and unique run IDs so tests never see each other's streams."""

from __future__ import annotations

import os
import secrets
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from litestar.testing import AsyncTestClient

from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.config import Settings
from ductor_streams.http import create_app
from ductor_streams.live.hub import NotificationHub
from ductor_streams.runtime import Runtime, open_runtime
from ductor_streams.schema.migrate import migrate
from ductor_streams.store import Store
from ductor_streams.store.db import create_pool
from tests.deploy.engine import usable_engine
from tests.support.postgres import (
    TEMPLATE_ENV,
    TestDatabase,
    drop_database,
    make_template,
    start_test_database,
)
from tests.support.run_image import build_dir, remove_run_image, start_prebuild
from tests.support.shared_ssl import share_default_ssl_context
from tests.support.tiers import FAST, TIERS, Reader, forbid_processes

JWT_SECRET = "test-secret-" + "x" * 32
API = "/api/workflow-streams"


# temporalio's core can crash the interpreter at exit after every test has finished
# (sdk-python#300); keep pytest's real exit status.
_exit_status: dict[str, int] = {}


def pytest_configure(config: pytest.Config) -> None:
    share_default_ssl_context()  # tests/support/shared_ssl.py: a minute of CPU a run
    # CPython 3.11.0-3.11.7 can leave the AST constructor's recursion depth off after an
    # error in it (python/cpython#106905, fixed in 3.11.8): pytest's own traceback
    # formatting then raises "AST constructor recursion depth mismatch", an
    # INTERNALERROR that ends the run at the first failure report. Native tracebacks
    # parse no source; a style chosen on the command line is kept.
    if (3, 11) <= sys.version_info[:2] and sys.version_info < (3, 11, 8):
        if config.option.tbstyle == "auto":
            config.option.tbstyle = "native"
    # The controller of several workers (pytest-xdist) migrates one database for all of
    # them to copy (tests/support/postgres.py); its workers inherit the variable.
    server_dsn = os.environ.get("DUCTOR_STREAMS_TEST_DATABASE_URL")
    workers = getattr(config.option, "numprocesses", None)
    if workers and not hasattr(config, "workerinput") and not config.option.collectonly:
        # The run id the workers get (PYTEST_XDIST_TESTRUNUID), known here too, so that
        # the image they share (tests/deploy/conftest.py) is removed once all are done.
        if config.getoption("testrunuid", None) is None:
            config.option.testrunuid = uuid.uuid4().hex
    if server_dsn and workers and not hasattr(config, "workerinput"):
        if not config.option.collectonly and TEMPLATE_ENV not in os.environ:
            os.environ[TEMPLATE_ENV] = make_template(server_dsn)
            config.add_cleanup(lambda: drop_template(server_dsn))


def drop_template(server_dsn: str) -> None:
    name = os.environ.pop(TEMPLATE_ENV, None)
    if name:
        drop_database(server_dsn, name)


_reader = Reader()


def pytest_itemcollected(item: pytest.Item) -> None:
    """Give every test its tiers (tests/support/tiers.py): what it starts, or ``fast``.
    Done as each test is collected, before any plugin's pytest_collection_modifyitems
    reads the markers (`-m`, pytest-xdist's groups)."""
    found = set(item_tiers(_reader, item))
    marked = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    if item.get_closest_marker(FAST) is not None and found | marked:
        raise pytest.UsageError(
            f"{item.nodeid} is marked fast but starts processes: {sorted(found | marked)}"
        )
    for tier in sorted(found - marked):
        item.add_marker(tier)
    if not found | marked and item.get_closest_marker(FAST) is None:
        item.add_marker(FAST)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _counts["collected"] = len(items)
    if hasattr(config, "workerinput"):
        # Under pytest-xdist (`--dist loadfile --no-loadscope-reorder`: a file's tests on
        # one worker, in order, as its module fixtures need; files handed out in this
        # order) the files with private clusters, the longest chains, go first, to run
        # beside the rest instead of after it; then the others, most tests first; the
        # image tests last, when the image builder started at collection is done.
        per_file = Counter(item.path for item in items)
        first = {item.path for item in items if item.get_closest_marker(FIRST)}
        last = {item.path for item in items if item.get_closest_marker(LAST)}
        items.sort(
            key=lambda item: (
                (item.path in last) - (item.path in first),
                -per_file[item.path],
                str(item.path),
            )
        )


# How many tests were collected and how many selected (`make test-fast` prints both).
_counts: dict[str, int] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    _counts["selected"] = len(session.items)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a worker of pytest-xdist tells its controller
        workeroutput["tier_counts"] = dict(_counts)
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        if run and not session.config.option.collectonly:
            start_image_builds(run, session.items)


def start_image_builds(run: str, items: list[pytest.Item]) -> None:
    """The images this run's selected tests use, built beside the suite from now on
    (tests/support/run_image.py); the first worker here starts the builder."""
    used = {name for item in items for name in getattr(item, "fixturenames", ())}
    if "app_image" not in used:
        return
    work = build_dir(run) / "work"
    work.mkdir(parents=True, exist_ok=True)
    engine, _ = usable_engine(work)
    if engine is not None:  # otherwise the image tests skip, naming what is missing
        start_prebuild(run, engine.env, stack="stack_images" in used)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    counts = getattr(node, "workeroutput", {}).get("tier_counts")
    if counts:
        _counts.update(counts)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.option.markexpr and _counts.get("collected"):
        selected, collected = _counts["selected"], _counts["collected"]
        terminalreporter.write_line(
            f"-m {config.option.markexpr!r}: selected {selected} of {collected} tests"
            f" ({selected / collected:.0%})"
        )


# The tiers of the files handed out first (private Postgres clusters) and last (podman
# images, built meanwhile).
FIRST, LAST = "cluster", "image"


def item_tiers(reader: Reader, item: pytest.Item) -> set[str]:
    """The tiers read from a test's function and from every fixture it uses."""
    found: set[str] = set()
    function = getattr(item, "function", None)
    if function is not None:
        found |= reader.tiers(function)
    info = getattr(item, "_fixtureinfo", None)
    for definitions in info.name2fixturedefs.values() if info is not None else ():
        for definition in definitions:
            found |= reader.tiers(definition.func)
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    # A fast test that starts a process fails, naming the marker it needs.
    if item.get_closest_marker(FAST) is None:
        return (yield)
    with forbid_processes(item.nodeid):
        return (yield)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status["rc"] = int(exitstatus)
    # Before pytest_unconfigure's hard exit, which would skip config's cleanups.
    server_dsn = os.environ.get("DUCTOR_STREAMS_TEST_DATABASE_URL")
    if server_dsn and not hasattr(session.config, "workerinput"):
        drop_template(server_dsn)
    run = session.config.getoption("testrunuid", None)
    if run and not hasattr(session.config, "workerinput"):
        remove_run_image(run)  # every worker is done by now


def pytest_unconfigure(config: pytest.Config) -> None:
    if "rc" in _exit_status and os.environ.get("DUCTOR_STREAMS_TEST_HARD_EXIT", "1") == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status["rc"])


@pytest.fixture(scope="session")
def test_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestDatabase]:
    db = start_test_database(tmp_path_factory.mktemp("pg"))
    try:
        yield db
    finally:
        db.stop()


@pytest.fixture(scope="session")
async def database_url(test_database: TestDatabase) -> str:
    await migrate(test_database.dsn)
    return test_database.dsn


@pytest.fixture(scope="session")
def settings(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    objects = tmp_path_factory.mktemp("objects")
    return Settings(
        database_url=database_url,
        jwt_secret=JWT_SECRET,
        region="local",
        object_stores={"local": objects.as_uri()},
    )


@pytest.fixture(scope="session")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, min_size=2, max_size=10)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture(scope="session")
async def store(pool: asyncpg.Pool) -> Store:
    return Store(pool)


@pytest.fixture(scope="session")
async def hub(database_url: str) -> AsyncIterator[NotificationHub]:
    """A real NotificationHub (one LISTEN connection) for the session."""
    hub = NotificationHub(database_url)
    await hub.start()
    try:
        yield hub
    finally:
        await hub.close()


@pytest.fixture(scope="session")
async def hub_store(pool: asyncpg.Pool, hub: NotificationHub) -> Store:
    """A Store like the app's: acks wake producers blocked on credit through the hub."""
    return Store(pool, hub=hub)


@pytest.fixture(scope="session")
async def runtime(settings: Settings) -> AsyncIterator[Runtime]:
    """A process's runtime (ductor_streams/runtime/__init__.py) from the session's settings."""
    async with open_runtime(settings, name="tests", pool_min_size=1) as opened:
        yield opened


@pytest.fixture(scope="session")
async def client(settings: Settings) -> AsyncIterator[AsyncTestClient[Any]]:
    app = create_app(settings)
    async with AsyncTestClient(app=app, timeout=30) as test_client:
        yield test_client


@pytest.fixture
def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


TokenFactory = Callable[..., dict[str, str]]


@pytest.fixture
def auth(tenant: str) -> TokenFactory:
    """``auth(scopes=..., runs=..., sub=..., tenant=..., region=...)`` -> headers."""

    def make(
        *,
        scopes: list[str] | tuple[str, ...] = SCOPES,
        runs: list[str] | None = None,
        sub: str = "tester",
        tenant: str = tenant,
        region: str | None = None,
        ttl: int = 600,
        secret: str = JWT_SECRET,
    ) -> dict[str, str]:
        token = issue_token(
            secret,
            sub=sub,
            tenant=tenant,
            scopes=list(scopes),
            runs=runs if runs is not None else ["*"],
            region=region,
            ttl_seconds=ttl,
        )
        return {"Authorization": f"Bearer {token}"}

    return make


def unique(prefix: str = "s") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
async def in_process_server(settings: Settings) -> AsyncIterator[Any]:
    """The app served over real HTTP from this process (tests/support/app_server.py):
    for what the app answers, not for what the process does. Per module: its lifespan's
    tasks share the process (metrics, the loop) with the tests that follow."""
    from tests.support.app_server import app_server

    async with app_server(settings) as served:
        yield served


@pytest.fixture(scope="session")
def server(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real `ductor-streams serve --no-workers` subprocess shared by the session."""
    from tests.support.server import ServerProcess

    log = tmp_path_factory.mktemp("server") / "server.log"
    with ServerProcess(settings, log_path=log) as proc:
        yield proc
