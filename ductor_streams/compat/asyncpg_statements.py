"""Connections for a transaction pooler: unnamed statements, described once.

Through a pooler in transaction mode (PgBouncer before 1.21, or without
``max_prepared_statements``) a connection's transactions may each run on another server
session, so a named prepared statement would be missing, or already exist, where the
next one lands. With its statement cache off asyncpg uses the unnamed statement instead,
but it then describes every statement before running it: a Parse/Describe round trip,
then Parse/Bind/Execute in a second one. Through a pooler each round trip is two hops.

``UnnamedStatementConnection`` keeps what the description told (parameter and column
types, their codecs) per query text, and runs a known query in one round trip: Parse of
the unnamed statement, Bind and Execute together (asyncpg sends the Parse again for a
statement marked unprepared). Nothing named is ever left on a server session. A
description is used for at most ``DESCRIPTION_LIFETIME_SECONDS`` (asyncpg's own default
for its statement cache) and is dropped with asyncpg's statement cache (a schema
reload), so a statement whose types a migration changed is described again.

This overrides asyncpg's private ``Connection._get_statement`` (asyncpg 0.29-0.32;
tests/production/test_transaction_pooler.py runs it through PgBouncer).
"""

from __future__ import annotations

import time
from typing import Any

import asyncpg

DESCRIPTION_LIFETIME_SECONDS = 300.0
# Query texts are the store's named blocks, a bounded set; anything else (an operator's
# filter) must not grow the dict without end.
MAX_DESCRIPTIONS = 1000


class UnnamedStatementConnection(asyncpg.Connection):
    """An asyncpg connection (``statement_cache_size=0``) that runs every statement
    unnamed, each known one in one round trip (the module docstring)."""

    __slots__ = ("_described",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (query, record class, ignore custom codec) -> (statement state, described at)
        self._described: dict[tuple[Any, ...], tuple[Any, float]] = {}

    async def _get_statement(
        self,
        query: str,
        timeout: float | None,  # noqa: ASYNC109 - asyncpg's signature
        *,
        named: Any = False,
        use_cache: bool = True,
        ignore_custom_codec: bool = False,
        record_class: Any = None,
    ) -> Any:
        if named or not use_cache:
            # An explicit prepare() or a cursor: asyncpg's own way.
            return await super()._get_statement(
                query,
                timeout,
                named=named,
                use_cache=use_cache,
                ignore_custom_codec=ignore_custom_codec,
                record_class=record_class,
            )
        key = (query, record_class, ignore_custom_codec)
        now = time.monotonic()
        known = self._described.get(key)
        if known is not None and now - known[1] < DESCRIPTION_LIFETIME_SECONDS:
            return known[0]
        # Without a statement cache asyncpg prepares it unnamed, describes it, and marks
        # it unprepared: each execution then sends its Parse along.
        statement = await super()._get_statement(
            query,
            timeout,
            named=False,
            use_cache=False,
            ignore_custom_codec=ignore_custom_codec,
            record_class=record_class,
        )
        if statement.name or statement.prepared:
            return statement  # not an unnamed, unprepared one: never kept
        if len(self._described) >= MAX_DESCRIPTIONS:
            self._described.clear()
        self._described[key] = (statement, now)
        return statement

    def _drop_local_statement_cache(self) -> None:
        # asyncpg's answer to a changed schema (reload_schema_state, a statement whose
        # result type changed): describe everything again.
        self._described.clear()
        super()._drop_local_statement_cache()
