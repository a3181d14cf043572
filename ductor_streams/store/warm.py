"""Warm a new pool connection for the append path before it serves a request.

The first append statement on a fresh connection pays for more than its work: asyncpg
introspects the statement's array and jsonb types and prepares it (a round trip each),
and the Postgres backend compiles the plpgsql append functions and plans every
statement inside them: the first call costs many times the next, and under load, with
many activities starting to append at once (a restarted worker's resumed activities,
say), the first statements on new connections began tens of milliseconds after they
were sent (docs/speed.md, "Warm connections").

So each connection of the store's pool runs the append statements once when it opens,
for a stream that cannot exist (``stream_pk`` -1): every lookup finds nothing, nothing
is locked, written or announced, and the transaction commits without a transaction id
(no WAL, no flush). A connection that cannot warm (the schema not migrated yet, a
read-only standby) is used as it is; only a lost connection fails its opening.
"""

from __future__ import annotations

import logging

import asyncpg

from ductor_streams.schema import QUERIES

log = logging.getLogger(__name__)

# No stream has this key: stream_pk is GENERATED ALWAYS AS IDENTITY, from 1 upwards.
NO_STREAM = -1

# One single-record request with an idempotency key, so that the key's lookup is
# planned too; the arguments as store/append.py sends them.
_REQUEST = ([1], ["warm"], ["warm"], "{}", "2", None, False, None)

# (query name, arguments): the append statements that requests wait for.
WARM_STATEMENTS: tuple[tuple[str, tuple[object, ...]], ...] = (
    ("records_append_group", (NO_STREAM, *_REQUEST)),
    ("records_append_stream_groups", ([NO_STREAM], [1], [1], *_REQUEST)),
    # An input append that leases its deliveries (owner, lease seconds, at most).
    ("records_append_group_leasing", (NO_STREAM, *_REQUEST, "warm", 1.0, 1)),
)


async def warm_connection(conn: asyncpg.Connection) -> None:
    """Prepare and run the append statements once on ``conn`` (asyncpg pool ``init``)."""
    for name, args in WARM_STATEMENTS:
        try:
            await conn.fetch(QUERIES[name], *args)
        except asyncpg.PostgresConnectionError:
            raise  # the pool discards the connection
        except asyncpg.PostgresError as exc:
            log.debug("connection not warmed", extra={"statement": name, "error": str(exc)})
            if conn.is_in_transaction():
                await conn.execute("ROLLBACK")
            return
