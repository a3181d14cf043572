"""Which Postgres cluster and timeline this process runs against, and when that changes.

A failover promotes a standby: the database a process reaches is then on a new timeline,
and with asynchronous replication commits the old primary acknowledged may be missing
from it (docs/deploy.md, "Failover and lost commits"). A restore into a new cluster
changes the system identifier as well. Either is worth a loud line in the log and a
count in the metrics (``ductor_streams_database_identity_changes_total``), beside what
readers are told record by record (store/fingerprint.py).

The process remembers the first identity it sees and compares every later one: on each
new connection of the store's pool (store/db.py) and at each ``/metrics`` scrape (a
pooler in front of Postgres may keep the pool's connections through a failover). Where
the identity cannot be read (a managed Postgres that refuses the control functions),
the watch says so once and stops asking.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from ductor_streams.foundation import metrics
from ductor_streams.schema import QUERIES

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DatabaseIdentity:
    """A cluster (``system_identifier``) and the timeline it is on."""

    system_identifier: int
    timeline: int


class IdentityWatch:
    """The identity this process has seen (``known``), compared with each new one."""

    def __init__(self, query: str | None = None) -> None:
        # The statement that reads the identity (``database_identity``; tests give it
        # another to stand for a database that refuses it).
        self.query = query or QUERIES["database_identity"]
        self.known: DatabaseIdentity | None = None
        self.readable = True
        self.changes = 0

    async def check(self, conn: asyncpg.Connection | asyncpg.Pool) -> DatabaseIdentity | None:
        """Read the identity over ``conn`` and compare it (``observe``); None when it
        cannot be read. A lost connection raises (the caller's to handle, as for any
        statement); a refusal turns the watch off, with one warning."""
        if not self.readable:
            return None
        try:
            row = await conn.fetchrow(self.query)
        except asyncpg.PostgresConnectionError:
            raise
        except asyncpg.PostgresError as exc:
            # 42501 (no privilege), 42883 (no such function), 0A000 (not supported): a
            # managed or Postgres-compatible database. Nothing else depends on it.
            self.readable = False
            log.warning(
                "database identity not readable: failovers are not detected by timeline",
                extra={"sqlstate": exc.sqlstate, "error": str(exc)},
            )
            return None
        assert row is not None
        identity = DatabaseIdentity(int(row["system_identifier"]), int(row["timeline"]))
        self.observe(identity)
        return identity

    def observe(self, identity: DatabaseIdentity) -> bool:
        """Remember ``identity``; True (logged and counted) when it differs from the one
        seen before."""
        known = self.known
        if known == identity:
            return False
        self.known = identity
        if known is None:
            log.info(
                "database identity",
                extra={
                    "system_identifier": str(identity.system_identifier),
                    "timeline": identity.timeline,
                },
            )
            return False
        self.changes += 1
        metrics.DATABASE_IDENTITY_CHANGES.inc()
        other_cluster = known.system_identifier != identity.system_identifier
        # A new timeline of the same cluster is a failover or a promotion; another
        # system identifier is another cluster altogether (a restore, a wrong DSN).
        log.log(
            logging.ERROR if other_cluster else logging.WARNING,
            f"database identity changed: system identifier {known.system_identifier} -> "
            f"{identity.system_identifier}, timeline {known.timeline} -> {identity.timeline}"
            + (" (another cluster)" if other_cluster else " (a failover or promotion)")
            + "; commits acknowledged before it may be lost unless replication was "
            "synchronous, and readers resuming with a fingerprint are told "
            "(history_diverged)",
            extra={
                "old_system_identifier": str(known.system_identifier),
                "new_system_identifier": str(identity.system_identifier),
                "old_timeline": known.timeline,
                "new_timeline": identity.timeline,
            },
        )
        return True


# The process's one watch: every pool of the process reaches the same database.
WATCH = IdentityWatch()


async def check_identity(conn: asyncpg.Connection | asyncpg.Pool) -> None:
    """``WATCH.check`` (a new connection of the store's pool; a scrape)."""
    await WATCH.check(conn)
