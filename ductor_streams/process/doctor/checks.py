"""One function per guarantee ``doctor`` checks: each gathers what the deployment shows
and hands it to ``decisions.py``, returning ``(status, detail)``.

Every connection here runs without named prepared statements (asyncpg's statement cache
off): the pooler check must work whatever ``DUCTOR_STREAMS_DATABASE_POOLER`` says, and
a named statement through a transaction pooler would fail before anything was seen.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg

from ductor_streams import temporal_connection
from ductor_streams.config import Settings
from ductor_streams.objects.local import path_from_url
from ductor_streams.objects.stores import open_store
from ductor_streams.process.doctor import decisions
from ductor_streams.process.doctor.decisions import Durability, Sessions, Standby
from ductor_streams.process.doctor.report import FAIL, OK, STATUSES, WARN
from ductor_streams.schema import QUERIES
from ductor_streams.schema.legacy import LegacyChainIncomplete, LegacyState, legacy_state
from ductor_streams.schema.migrate import applied_rows, applied_versions, available_migrations
from ductor_streams.store.db import CONNECT_TIMEOUT_SECONDS

# How long one client connection may wait for another's open transaction before that
# counts as the two sharing one server connection.
SHARED_WAIT_SECONDS = 2.0
# How long a NOTIFY may take to reach the LISTEN connection.
NOTIFY_WAIT_SECONDS = 5.0
CLOCK_SAMPLES = 5
# See check_temporal.
TEMPORAL_SETTLE_SECONDS = 0.2

Outcome = tuple[str, str]


@dataclass
class Context:
    """What the checks share: the settings, and why the database could not be reached
    (the checks that need it then report that instead of waiting again)."""

    settings: Settings
    database_error: str | None = None

    @property
    def database_url(self) -> str:
        return self.settings.require_database()


async def connect(dsn: str) -> asyncpg.Connection:
    """A connection without named prepared statements (the module docstring)."""
    return await asyncpg.connect(dsn, statement_cache_size=0, timeout=CONNECT_TIMEOUT_SECONDS)


def where(dsn: str) -> str:
    """``host:port/database`` of a DSN, without its user or password; every host of a
    multi-host DSN (``h1:p1,h2:p2``, as ``pg_autoctl show uri`` prints), comma-separated.
    (``urlsplit``'s ``port`` refuses a multi-host address, so the hosts are split here.)"""
    parts = urlsplit(dsn)
    hosts = []
    for entry in parts.netloc.rpartition("@")[2].split(","):
        host, colon, port = entry.rpartition(":") if not entry.endswith("]") else ("", "", "")
        if not colon or not port.isdigit():
            host, port = entry, "5432"
        hosts.append(f"{host or 'localhost'}:{port}")
    return f"{','.join(hosts)}{parts.path or '/'}"


def short_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- Postgres ------------------------------------------------------------------------


async def check_database(ctx: Context) -> Outcome:
    """Reachability, version, and whether the server takes writes."""
    started = time.monotonic()
    try:
        conn = await connect(ctx.database_url)
    except Exception as exc:
        ctx.database_error = short_error(exc)
        return FAIL, f"cannot connect to {where(ctx.database_url)}: {ctx.database_error}"
    try:
        row = await conn.fetchrow(
            "SELECT current_setting('server_version_num')::int / 10000 AS major,"
            " current_setting('server_version') AS version, pg_is_in_recovery() AS recovery,"
            " current_database() AS database, current_user AS role"
        )
    finally:
        await conn.close()
    assert row is not None
    status, detail = decisions.server_version(row["major"], row["version"], row["recovery"])
    elapsed = (time.monotonic() - started) * 1000
    return status, (
        f"{detail}; database {row['database']} on {where(ctx.database_url)} as "
        f"{row['role']}, answered in {elapsed:.0f} ms"
    )


async def check_migrations(ctx: Context) -> Outcome:
    """The database's migration level against this code's."""
    conn = await connect(ctx.database_url)
    try:
        rows = await applied_rows(conn)
        applied = await applied_versions(conn)
    finally:
        await conn.close()
    if legacy_state(rows) is LegacyState.PARTIAL:
        # `migrate` refuses this database; say why rather than "run migrate".
        return FAIL, str(LegacyChainIncomplete(rows))
    available = available_migrations()
    names = {m.version: m.name for m in available}
    return decisions.migrations([m.version for m in available], applied, names)


# Settings prefixes and functions that give a managed service away.
_MANAGED_SQL = """
SELECT to_regproc('aurora_version') IS NOT NULL AS aurora,
       ARRAY(SELECT DISTINCT split_part(name, '.', 1) FROM pg_settings
              WHERE name ~ '^(alloydb|neon|rds|cloudsql|azure)\\.') AS prefixes
"""


async def check_durability(ctx: Context) -> Outcome:
    """Whether a commit acknowledged now survives a failover: synchronous standbys
    (``synchronous_standby_names``, ``pg_stat_replication``) or a managed service's
    synchronously replicated storage."""
    conn = await connect(ctx.database_url)
    try:
        settings = await conn.fetchrow(
            "SELECT current_setting('synchronous_standby_names') AS names,"
            " current_setting('synchronous_commit') AS commit, pg_is_in_recovery() AS recovery"
        )
        rows = await conn.fetch(
            "SELECT application_name, state, sync_state FROM pg_stat_replication ORDER BY 1"
        )
        managed = await conn.fetchrow(_MANAGED_SQL)
    finally:
        await conn.close()
    assert settings is not None and managed is not None
    service = "aurora" if managed["aurora"] else None
    for prefix in ("alloydb", "neon", "rds", "cloudsql", "azure"):
        if service is None and prefix in managed["prefixes"]:
            service = prefix
    return decisions.durability(
        Durability(
            synchronous_standby_names=settings["names"],
            synchronous_commit=settings["commit"],
            standbys=[Standby(r["application_name"], r["state"], r["sync_state"]) for r in rows],
            in_recovery=settings["recovery"],
            managed=service,
        )
    )


async def observe_sessions(dsn: str) -> Sessions:
    """Two client connections to ``dsn``, and the backend pids each reports across its
    transactions, one of them while the other holds a transaction open. Directly or
    through a session pooler each keeps its own backend; a transaction pooler hands the
    released one to the other client, or moves a client to another."""
    query = "SELECT pg_backend_pid()"
    a = await connect(dsn)
    b = await connect(dsn)
    try:
        seen_a = {await a.fetchval(query)}
        seen_b = {await b.fetchval(query)}
        async with b.transaction():
            seen_b.add(await b.fetchval(query))
            try:
                seen_a.add(await a.fetchval(query, timeout=SHARED_WAIT_SECONDS))
            except TimeoutError:
                # Only one server connection for both: a waits for b's transaction.
                return Sessions(moved=False, shared=False, waited=True)
        seen_a.add(await a.fetchval(query))
        return Sessions(moved=len(seen_a) > 1 or len(seen_b) > 1, shared=bool(seen_a & seen_b))
    finally:
        a.terminate()
        b.terminate()


async def check_pooler(ctx: Context) -> Outcome:
    """A transaction pooler in front of ``DATABASE_URL`` or not, against
    ``DUCTOR_STREAMS_DATABASE_POOLER``."""
    seen = await observe_sessions(ctx.database_url)
    return decisions.pooler(ctx.settings.database_pooler, seen)


async def check_listen(ctx: Context) -> Outcome:
    """LISTEN on the connection that carries it (``DIRECT_DATABASE_URL``, else
    ``DATABASE_URL``), woken by a NOTIFY sent through ``DATABASE_URL``."""
    settings = ctx.settings
    if settings.direct_database_url:
        name, dsn = "DIRECT_DATABASE_URL", settings.direct_database_url
    elif settings.transaction_pooled:
        return FAIL, (
            "DUCTOR_STREAMS_DIRECT_DATABASE_URL is not set: with a transaction pooler, LISTEN "
            "and the migration lock have no connection (serve and workers refuse to start)"
        )
    else:
        name, dsn = "DATABASE_URL", ctx.database_url
    seen = await observe_sessions(dsn)
    if seen.transaction_pooled:
        return decisions.listen_connection(seen, None, name)
    channel = f"ductor_streams_doctor_{secrets.token_hex(6)}"
    arrived = asyncio.Event()
    listener = await connect(dsn)
    sender = await connect(ctx.database_url)
    try:
        await listener.add_listener(channel, lambda *_: arrived.set())
        started = time.monotonic()
        await sender.execute(QUERIES["doctor_notify"], channel)
        try:
            await asyncio.wait_for(arrived.wait(), NOTIFY_WAIT_SECONDS)
            elapsed: float | None = (time.monotonic() - started) * 1000
        except TimeoutError:
            elapsed = None
    finally:
        listener.terminate()
        await sender.close()
    return decisions.listen_connection(seen, elapsed, name)


async def check_clock(ctx: Context) -> Outcome:
    """This host's clock against Postgres', from the sample with the shortest round
    trip (its half is the uncertainty)."""
    conn = await connect(ctx.database_url)
    try:
        # Unnamed, but described once: each run is one round trip.
        statement = await conn.prepare("SELECT extract(epoch FROM clock_timestamp())::float8")
        samples = []
        for _ in range(CLOCK_SAMPLES):
            before = time.time()
            theirs = float(await statement.fetchval())
            after = time.time()
            samples.append((after - before, theirs - (before + after) / 2))
    finally:
        await conn.close()
    round_trip, skew = min(samples)
    return decisions.clock(skew, round_trip / 2)


# -- Temporal and the object store ----------------------------------------------------


async def check_temporal(ctx: Context) -> Outcome:
    """The Temporal frontend answers and the namespace exists (``workers`` and ``serve``
    without ``--no-workers`` deliver input records through it)."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest

    address = temporal_connection.configured_address(ctx.settings)
    if address is None:
        return WARN, (
            "not configured (DUCTOR_STREAMS_TEMPORAL_ADDRESS, TEMPORAL_ADDRESS): `workers` "
            "need it to deliver input records"
        )
    try:
        client = await temporal_connection.connect(ctx.settings)
    except BaseException:  # a failure, or the check's timeout cancelling it
        # After a failed connect temporalio's core still finishes work of its own; a
        # process that exits meanwhile can abort in the interpreter's finalisation
        # (seen here in 6 of 30 runs; none of 60 with this pause).
        await asyncio.sleep(TEMPORAL_SETTLE_SECONDS)
        raise
    await client.workflow_service.describe_namespace(
        DescribeNamespaceRequest(namespace=client.namespace)
    )
    return OK, f"{address} answered; namespace {client.namespace} exists"


async def check_object_store(ctx: Context) -> Outcome:
    """Each region's object store can be reached (large objects are stored there)."""
    stores = ctx.settings.object_stores
    if not stores:
        return (
            WARN,
            "none configured (DUCTOR_STREAMS_OBJECT_STORE): large-object uploads are refused",
        )
    results = [
        await _one_store(region, url, ctx.settings) for region, url in sorted(stores.items())
    ]
    status = max((s for s, _ in results), key=STATUSES.index)
    return status, "; ".join(detail for _, detail in results)


async def _one_store(region: str, url: str, settings: Settings) -> Outcome:
    if url.startswith("file://"):
        root = path_from_url(url)
        existing = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            return FAIL, f"{region}: {url} is not a folder this process may write to"
        made = "" if existing == root else " (made at the first upload)"
        return OK, f"{region}: {url} is writable{made}"
    try:
        await open_store(url, credentials_file=settings.google_application_credentials).list_blobs(
            "ductor-streams/doctor-probe/"
        )
    except Exception as exc:
        return FAIL, f"{region}: {url} cannot be listed: {short_error(exc)}"
    return OK, f"{region}: {url} answered"


# (name, check, needs the database): the order of the report.
CHECKS: tuple[tuple[str, Callable[[Context], Awaitable[Outcome]], bool], ...] = (
    ("database", check_database, False),
    ("migrations", check_migrations, True),
    ("synchronous_standby", check_durability, True),
    ("pooler", check_pooler, True),
    ("listen", check_listen, True),
    ("clock", check_clock, True),
    ("temporal", check_temporal, False),
    ("object_store", check_object_store, False),
)
