"""Connection pool and the one place where asyncpg errors become domain errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import asyncpg

from ductor_streams.errors import InvalidInput, StreamsError


async def _reset(conn: asyncpg.Connection) -> None:
    # Pooled connections never LISTEN, SET or take session locks, so asyncpg's default
    # reset (UNLISTEN *, RESET ALL, ... : one extra round trip per release, 20-36% of an
    # append here) buys nothing. An abandoned transaction is still rolled back.
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def create_pool(dsn: str, *, min_size: int = 2, max_size: int = 10) -> asyncpg.Pool:
    """A pool for the store. Connections are cheap to release (see ``_reset``)."""
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        reset=_reset,
        max_inactive_connection_lifetime=60.0,
        command_timeout=60.0,
    )
    assert pool is not None
    return pool


def translate_db_error(exc: BaseException) -> BaseException:
    """The domain error a driver error stands for, or the error itself.

    This is the one place where asyncpg errors become domain errors; the
    original stays attached as ``__cause__``.
    """
    domain: StreamsError | None = None
    if isinstance(
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
    except asyncpg.PostgresError as exc:
        raise translate_db_error(exc) from exc
