"""Connection pool and the one place where asyncpg errors become domain errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

import asyncpg

from ductor_streams.compat.asyncpg_statements import UnnamedStatementConnection
from ductor_streams.errors import DatabaseUnavailable, InvalidInput, StreamsError
from ductor_streams.store.identity import check_identity
from ductor_streams.store.warm import warm_connection

# A new connection that takes longer than this counts as the database being unreachable
# (asyncpg's own default is 60 s: a request would hang that long in a network partition).
# The pool's connections, the hub's LISTEN connection (live/hub.py) and doctor's probes.
CONNECT_TIMEOUT_SECONDS = 10.0

log = logging.getLogger(__name__)


async def _reset(conn: asyncpg.Connection) -> None:
    # Pooled connections never LISTEN, SET or take session locks, so asyncpg's default
    # reset (UNLISTEN *, RESET ALL, ... : one extra round trip per release, 20-36% of an
    # append here) buys nothing. An abandoned transaction is still rolled back.
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def create_pool(
    dsn: str,
    *,
    min_size: int = 2,
    max_size: int = 10,
    warm: bool = False,
    pooler: str = "session",
) -> asyncpg.Pool:
    """A pool for the store. Connections are cheap to release (see ``_reset``).
    ``warm``: each new connection runs the append statements once before it serves
    (store/warm.py), as the store's own pool does, after its database identity was
    compared with the one the process saw before (store/identity.py).

    ``pooler="transaction"``: ``dsn`` goes through a transaction pooler (PgBouncer in
    ``pool_mode = transaction``) that may run each transaction on another server
    session. Named prepared statements would then be missing, or already exist, on the
    session a statement lands on (``DuplicatePreparedStatementError``), so the statement
    cache is off and every statement is unnamed, parsed again with each execution in
    the same round trip (compat/asyncpg_statements.py). Nothing else changes: pooled connections
    keep no session state (no LISTEN, SET, session lock or temporary table beyond its
    transaction).

    When the database cannot be reached at start (a managed database in maintenance, a
    failover under way, the database container still starting), the pool starts empty
    instead of failing: requests answer 503 ``database_unavailable`` and ``/readyz`` 503
    until it answers, and then connections open as requests need them.
    """
    init = _open_store_connection if warm else None
    options = _POOLER_OPTIONS[pooler]
    try:
        pool = await _open_pool(dsn, min_size, max_size, init, options)
    except Exception as exc:
        if not database_unavailable(exc) or min_size == 0:
            raise
        log.warning(
            "database unavailable at start; connecting on demand",
            extra={"error_type": type(exc).__name__},
        )
        pool = await _open_pool(dsn, 0, max_size, init, options)
    _POOLS[:] = [p for p in _POOLS if not p.is_closing()]
    _POOLS.append(pool)
    return pool


async def _open_store_connection(conn: asyncpg.Connection) -> None:
    # Which cluster and timeline a new connection reaches (a failover shows as a new
    # one: store/identity.py), then the warm-up.
    await check_identity(conn)
    await warm_connection(conn)


async def _open_pool(
    dsn: str,
    min_size: int,
    max_size: int,
    init: Callable[[asyncpg.Connection], Awaitable[None]] | None,
    options: Mapping[str, Any],
) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=init,
        reset=_reset,
        max_inactive_connection_lifetime=60.0,
        command_timeout=60.0,
        timeout=CONNECT_TIMEOUT_SECONDS,
        **options,
    )
    assert pool is not None
    return pool


# Connection options by DUCTOR_STREAMS_DATABASE_POOLER (create_pool).
_POOLER_OPTIONS: dict[str, Mapping[str, Any]] = {
    "session": {},
    "transaction": {"statement_cache_size": 0, "connection_class": UnnamedStatementConnection},
}


# The pools of this process that are not closed (see replace_pooled_connections).
_POOLS: list[asyncpg.Pool] = []
_EXPIRING: set[asyncio.Task[None]] = set()  # the loop keeps only weak references


def replace_pooled_connections() -> None:
    """Make every pool of this process replace its connections at their next acquire
    (or release, for those in use); new ones follow the DSN to the host taking writes.

    After a failover, connections a pool opened to the old primary may still be alive
    on what is now a standby: every write on them fails with 25006 for as long as they
    live, and under load none is idle long enough to be closed.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    for pool in _POOLS:
        task = loop.create_task(pool.expire_connections())
        _EXPIRING.add(task)
        task.add_done_callback(_EXPIRING.discard)


# What the driver raises for a statement or a connection: an ``except`` around database
# work catches these, and ``database_unavailable`` then tells an outage from a bug.
# asyncpg's InternalClientError is no InterfaceError, and a multi-host DSN raises one of
# its kinds (TargetServerAttributeNotMatched) while no host takes writes.
DRIVER_ERRORS = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)

# Errors in which Postgres says it cannot serve now, whatever the statement: shutting
# down or crashed (57P01, 57P02), starting up or in recovery (57P03), its database gone
# (57P04), the session timed out (57P05); a standby after failover refuses writes (25006);
# no connection slot left (53300). Not query_canceled (57014): a statement timeout or a
# cancel is about the statement, not the server.
_UNAVAILABLE_STATES = (
    asyncpg.exceptions.PostgresConnectionError,  # class 08, e.g. the connection was lost
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.DatabaseDroppedError,
    asyncpg.exceptions.IdleSessionTimeoutError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.TooManyConnectionsError,
)


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot serve right now (unreachable, restarting,
    in recovery, a read-only standby after failover, no host of a multi-host DSN taking
    writes, out of connections, the connection lost), so that the same request may
    succeed a few seconds later.

    An ``OSError`` (refused, reset, unreachable, a connect or pool timeout) counts only
    when the driver raised it: the same error from a blob store is not the database's.
    """
    if isinstance(exc, DatabaseUnavailable) or isinstance(exc, _UNAVAILABLE_STATES):
        return True
    if isinstance(exc, asyncpg.exceptions.TargetServerAttributeNotMatched):
        # ``target_session_attrs=read-write`` and every host listed is a standby, read-only
        # or starting: a failover is under way (pg_auto_failover, Patroni).
        return True
    if isinstance(exc, asyncpg.exceptions.InternalClientError):
        # A server's FATAL ("terminating connection due to unexpected postmaster exit",
        # a primary killed) that reached an idle connection leaves its protocol waiting
        # for an answer that never comes; the next statement on it fails so, until the
        # driver sees the socket close. Other internal errors are bugs.
        return str(exc).startswith("cannot switch to state")
    if isinstance(exc, asyncpg.InterfaceError):
        # "connection is closed", "the underlying connection is closed", "pool is
        # closing": the connection went away under the statement. Other interface errors
        # ("another operation is in progress") are bugs, not outages.
        message = str(exc)
        return "closed" in message or "closing" in message
    return isinstance(exc, OSError) and _raised_by_driver(exc.__traceback__)


def _raised_by_driver(tb: TracebackType | None) -> bool:
    # A re-raised error keeps its first traceback after the new frames (the appender
    # hands a statement's error to each waiting request through a future).
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith("asyncpg"):
            return True
        tb = tb.tb_next
    return False


def translate_db_error(exc: BaseException) -> BaseException:
    """The domain error a driver error stands for, or the error itself.

    This is the one place where asyncpg errors become domain errors (an unavailable
    database becomes ``DatabaseUnavailable``, see ``database_unavailable``); the
    original stays attached as ``__cause__``. A read-only standby (25006) also makes
    the process's pools replace their connections (``replace_pooled_connections``).
    """
    domain: StreamsError | None = None
    if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):
        replace_pooled_connections()
    if database_unavailable(exc):
        domain = DatabaseUnavailable(
            "the database is restarting, failing over or unreachable; retry after the "
            "Retry-After seconds"
        )
    elif isinstance(
        exc,
        asyncpg.exceptions.UntranslatableCharacterError
        | asyncpg.exceptions.CharacterNotInRepertoireError,
    ):
        domain = InvalidInput("the payload holds text Postgres cannot store")
    elif isinstance(exc, asyncpg.exceptions.NumericValueOutOfRangeError):
        domain = InvalidInput("a number is out of range")
    if domain is None:
        return exc
    domain.__cause__ = exc
    return domain


@contextlib.contextmanager
def translate_db_errors() -> Iterator[None]:
    """Raise the domain error that a driver error inside the block stands for."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise translate_db_error(exc) from exc
