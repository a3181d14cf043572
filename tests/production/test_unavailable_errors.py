"""Which errors mean "the database is unavailable" (store.db.database_unavailable), and
what the HTTP boundary answers for them: 503 ``database_unavailable`` with
``Retry-After``, one warning line now and then instead of a traceback per request."""

from __future__ import annotations

import logging
import secrets

import asyncpg
import msgspec
import pytest

from ductor_streams.errors import DatabaseUnavailable, InvalidInput, StreamsError
from ductor_streams.http.codecs.problems import error_for, problem_parts
from ductor_streams.store import outage
from ductor_streams.store.db import create_pool, database_unavailable, translate_db_error
from tests.support.live import eventually
from tests.support.server import free_port

E = asyncpg.exceptions

UNAVAILABLE = [
    E.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    E.ConnectionFailureError("connection failure"),  # 08006
    E.PostgresConnectionError("connection exception"),  # 08000
    E.AdminShutdownError("terminating connection due to administrator command"),
    E.CrashShutdownError("terminating connection because of crash of another process"),
    E.CannotConnectNowError("the database system is starting up"),
    E.CannotConnectNowError("the database system is in recovery mode"),
    E.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
    E.TooManyConnectionsError("sorry, too many clients already"),
    asyncpg.InterfaceError("cannot perform operation: connection is closed"),
    asyncpg.InterfaceError("pool is closing"),
    # A multi-host DSN with target_session_attrs=read-write while no host takes writes.
    E.TargetServerAttributeNotMatched("None of the hosts match the target attribute"),
    # A FATAL from a killed primary that reached an idle connection: its next statement
    # (seen on this machine when a primary's postmaster was SIGKILLed under load).
    E.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
    DatabaseUnavailable(),
]

NOT_UNAVAILABLE = [
    E.QueryCanceledError("canceling statement due to statement timeout"),  # 57014
    E.UniqueViolationError("duplicate key"),
    E.UntranslatableCharacterError("NUL"),
    asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
    E.OutdatedSchemaCacheError("cached statement plan is invalid"),  # an internal error
    OSError("disk full"),  # not raised by the driver: a blob store's, say
    ConnectionRefusedError("refused by the GCS emulator"),
    ValueError("a bug"),
]


@pytest.mark.parametrize("exc", UNAVAILABLE, ids=lambda e: type(e).__name__)
def test_unavailable(exc: BaseException) -> None:
    assert database_unavailable(exc)
    translated = translate_db_error(exc)
    assert isinstance(translated, DatabaseUnavailable)
    assert translated.status == 503 and translated.code == "database_unavailable"


@pytest.mark.parametrize("exc", NOT_UNAVAILABLE, ids=lambda e: type(e).__name__)
def test_not_unavailable(exc: BaseException) -> None:
    assert not database_unavailable(exc)
    assert not isinstance(translate_db_error(exc), DatabaseUnavailable)


async def test_a_refused_connection_the_driver_raised_is_unavailability() -> None:
    # Nothing listens on a free port: the driver's own OSError (ConnectionRefusedError).
    with pytest.raises(OSError) as caught:
        await asyncpg.connect(f"postgresql://x@127.0.0.1:{free_port()}/x", timeout=5)
    assert database_unavailable(caught.value)


async def test_a_pool_whose_server_is_gone_raises_unavailability() -> None:
    pool = await asyncpg.create_pool(
        f"postgresql://x@127.0.0.1:{free_port()}/x", min_size=0, max_size=1, timeout=5
    )
    try:
        with pytest.raises(Exception) as caught:
            await pool.fetchval("SELECT 1")
        assert database_unavailable(caught.value)
    finally:
        await pool.close()


def test_the_boundary_answers_503_with_retry_after(caplog: pytest.LogCaptureFixture) -> None:
    outage._throttles.clear()
    with caplog.at_level(logging.WARNING):
        errors = [
            error_for(E.CannotConnectNowError("the database system is shutting down"), "/a")
            for _ in range(50)
        ]
    for error in errors:
        status, body, headers = problem_parts(error, "/a")
        problem = msgspec.json.decode(body)
        assert status == 503 and problem["code"] == "database_unavailable"
        assert problem["status"] == 503 and problem["instance"] == "/a"
        assert int(headers["Retry-After"]) >= 1
        assert "shutting down" not in problem["detail"]  # nothing of the driver's words
    # One warning line for the fifty, no traceback, nothing at ERROR.
    lines = [r for r in caplog.records if r.name == "ductor_streams.store.outage"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert lines[0].exc_info is None
    assert lines[0].error_type == "CannotConnectNowError"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_bad_input_keeps_its_4xx_and_bugs_stay_500() -> None:
    error = error_for(E.UntranslatableCharacterError("NUL"), "/a")
    assert isinstance(error, InvalidInput) and error.status == 400
    bug = error_for(RuntimeError("a bug"), "/a")
    assert type(bug) is StreamsError and bug.status == 500


def test_the_throttle_counts_what_it_held_back() -> None:
    throttle = outage.Throttle(interval=3600)
    assert throttle.take() == 0
    assert [throttle.take() for _ in range(3)] == [None, None, None]
    throttle._next = 0.0  # the interval has passed
    assert throttle.take() == 3


async def test_a_read_only_standby_makes_the_pools_reconnect(database_url: str) -> None:
    # A pooled connection stuck on a read-only server (the old primary, now a standby):
    # the pool's reset keeps session settings, so this one stays read-only, as such a
    # connection would, until the pool replaces it.
    pool = await create_pool(database_url, min_size=1, max_size=1)
    table = f"ro_probe_{secrets.token_hex(4)}"
    try:
        await pool.execute("SET default_transaction_read_only = on")
        with pytest.raises(E.ReadOnlySQLTransactionError) as caught:
            await pool.execute(f"CREATE TABLE {table} (x int)")
        assert isinstance(translate_db_error(caught.value), DatabaseUnavailable)

        async def writable() -> bool:
            return not await pool.fetchval("SELECT current_setting('transaction_read_only')::bool")

        await eventually(writable, timeout=10, what="a fresh connection")
        await pool.execute(f"CREATE TABLE {table} (x int)")
    finally:
        await pool.execute(f"DROP TABLE IF EXISTS {table}")
        await pool.close()


async def test_a_pool_acquire_timeout_is_unavailability(database_url: str) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire():
            with pytest.raises(TimeoutError) as caught:
                await pool.acquire(timeout=0.01)  # every connection busy
        assert database_unavailable(caught.value)
    finally:
        await pool.close()
