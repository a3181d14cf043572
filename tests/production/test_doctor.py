"""``ductor-streams doctor``: its rules on given values, then the command itself against
the real Postgres, directly and through PgBouncer 1.18 in transaction mode, with real
Temporal, a database that is not migrated and one that cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from ductor_streams.config import Settings
from ductor_streams.process.doctor import decisions
from ductor_streams.process.doctor.checks import where
from ductor_streams.process.doctor.decisions import Durability, Sessions, Standby
from ductor_streams.process.doctor.report import Check, as_json, as_table, exit_code
from tests.deploy.helpers import reachable_from_a_container
from tests.support.pgbouncer import PgBouncer
from tests.support.postgres import TestDatabase
from tests.support.server import free_port
from tests.temporal.conftest import temporal_address, temporal_env  # noqa: F401 - fixtures

NAMES = [
    "database",
    "migrations",
    "synchronous_standby",
    "pooler",
    "listen",
    "clock",
    "temporal",
    "object_store",
]

# -- the rules, on given values -------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "wanted"),
    [
        ("", ("", 0)),
        ("  ", ("", 0)),
        ("standby_a", ("FIRST", 1)),
        ("a, b", ("FIRST", 1)),
        ("*", ("FIRST", 1)),
        ("2 (a, b, c)", ("FIRST", 2)),
        ("FIRST 2 (a, b, c)", ("FIRST", 2)),
        ("any 1 (pgautofailover_standby_2)", ("ANY", 1)),
        ('ANY 2 ("s 1", s2, s3)', ("ANY", 2)),
    ],
)
def test_synchronous_standby_names_are_parsed(names: str, wanted: tuple[str, int]) -> None:
    assert decisions.required_standbys(names) == wanted


def _durability(names: str = "", commit: str = "on", *standbys: Standby, **kw: Any) -> str:
    return decisions.durability(Durability(names, commit, standbys, **kw))[0]


STREAMING_QUORUM = Standby("pgautofailover_standby_2", "streaming", "quorum")
STREAMING_SYNC = Standby("b", "streaming", "sync")
STREAMING_ASYNC = Standby("c", "streaming", "async")


@pytest.mark.parametrize(
    ("facts", "status"),
    [
        # No synchronous standby: a failover may lose what was acknowledged.
        (Durability("", "on"), "warn"),
        (Durability("", "on", [STREAMING_ASYNC]), "warn"),
        # pg_auto_failover with a healthy secondary.
        (Durability("ANY 1 (pgautofailover_standby_2)", "on", [STREAMING_QUORUM]), "ok"),
        (Durability("FIRST 1 (b, c)", "remote_apply", [STREAMING_SYNC, STREAMING_ASYNC]), "ok"),
        (Durability("b", "remote_write", [STREAMING_SYNC]), "ok"),
        # Asked for, but not there: commits wait for ever.
        (Durability("b", "on"), "fail"),
        (Durability("b, c", "on", [STREAMING_ASYNC]), "fail"),
        (Durability("ANY 2 (a, b)", "on", [STREAMING_QUORUM]), "fail"),
        (Durability("b", "on", [Standby("b", "catchup", "sync")]), "fail"),
        # Commits that do not wait.
        (Durability("b", "local", [STREAMING_SYNC]), "warn"),
        (Durability("", "off"), "fail"),
        (Durability("b", "off", [STREAMING_SYNC]), "fail"),
        # A standby; a role that cannot see sync_state.
        (Durability("", "on", in_recovery=True), "fail"),
        (Durability("b", "on", [Standby("b", None, None)]), "warn"),
        # Managed services.
        (Durability("", "on", managed="aurora"), "ok"),
        (Durability("", "on", managed="neon"), "ok"),
        (Durability("", "on", managed="rds"), "warn"),
        (Durability("", "on", managed="cloudsql"), "warn"),
    ],
)
def test_whether_an_acknowledged_commit_survives_a_failover(facts: Durability, status: str) -> None:
    got, detail = decisions.durability(facts)
    assert got == status, detail
    assert detail


def test_the_durability_detail_names_the_standbys_and_what_is_missing() -> None:
    ok = decisions.durability(
        Durability("ANY 1 (pgautofailover_standby_2)", "on", [STREAMING_QUORUM])
    )[1]
    assert "pgautofailover_standby_2 (quorum)" in ok and "ANY 1" in ok
    missing = decisions.durability(Durability("ANY 2 (a, b)", "on", [STREAMING_QUORUM]))[1]
    assert "ANY 2" in missing and "1 synchronous standby" in missing


@pytest.mark.parametrize(
    ("setting", "seen", "status"),
    [
        ("session", Sessions(moved=False, shared=False), "ok"),
        ("transaction", Sessions(moved=True, shared=True), "ok"),
        ("transaction", Sessions(moved=False, shared=False, waited=True), "ok"),
        # A transaction pooler the settings do not know of: prepared statements fail.
        ("session", Sessions(moved=True, shared=False), "fail"),
        ("session", Sessions(moved=False, shared=True), "fail"),
        ("session", Sessions(moved=False, shared=False, waited=True), "fail"),
        # Set for a pooler that is not there: works, parses every statement again.
        ("transaction", Sessions(moved=False, shared=False), "warn"),
    ],
)
def test_the_pooler_seen_against_the_setting(setting: str, seen: Sessions, status: str) -> None:
    assert decisions.pooler(setting, seen)[0] == status


def test_listen_needs_a_connection_that_keeps_its_session() -> None:
    direct = Sessions(moved=False, shared=False)
    assert decisions.listen_connection(direct, 3.0, "DIRECT_DATABASE_URL")[0] == "ok"
    assert decisions.listen_connection(direct, None, "DIRECT_DATABASE_URL")[0] == "fail"
    pooled = Sessions(moved=True, shared=False)
    assert decisions.listen_connection(pooled, 3.0, "DIRECT_DATABASE_URL")[0] == "fail"


@pytest.mark.parametrize(
    ("skew", "uncertainty", "status"),
    [
        (0.0002, 0.0001, "ok"),
        (-0.9, 0.01, "ok"),
        (1.3, 0.5, "ok"),  # it may be 0.8 s
        (1.3, 0.1, "warn"),
        (-2.0, 0.01, "warn"),
        (14.0, 0.01, "warn"),
        (-15.5, 0.01, "fail"),
        (60.0, 0.01, "fail"),
    ],
)
def test_clock_skew(skew: float, uncertainty: float, status: str) -> None:
    assert decisions.clock(skew, uncertainty)[0] == status


def test_the_migration_level() -> None:
    names = {1: "a", 2: "b", 5: "c"}
    assert decisions.migrations([1, 2, 5], [], names)[0] == "fail"
    pending = decisions.migrations([1, 2, 5], [1, 2], names)
    assert pending[0] == "fail" and "1 of 3" in pending[1] and "0005_c" in pending[1]
    assert decisions.migrations([1, 2, 5], [1, 2, 5], names) == (
        "ok",
        "all 3 applied (latest 0005_c)",
    )
    newer = decisions.migrations([1, 2, 5], [1, 2, 5, 6], names)
    assert newer[0] == "warn" and "0006" in newer[1]


def test_the_server_version() -> None:
    assert decisions.server_version(15, "15.20", False)[0] == "ok"
    assert decisions.server_version(18, "18.0", False)[0] == "ok"
    assert decisions.server_version(14, "14.11", False)[0] == "warn"
    assert decisions.server_version(15, "15.20", True)[0] == "fail"


def test_exit_codes_and_the_json_shape() -> None:
    ok = [Check("a", "ok", "fine")]
    warned = [*ok, Check("b", "warn", "hm")]
    failed = [*warned, Check("c", "fail", "no")]
    assert [exit_code(c, strict=False) for c in (ok, warned, failed)] == [0, 0, 1]
    assert [exit_code(c, strict=True) for c in (ok, warned, failed)] == [0, 1, 1]
    assert json.loads(as_json(failed)) == {
        "status": "fail",
        "checks": [
            {"name": "a", "status": "ok", "detail": "fine"},
            {"name": "b", "status": "warn", "detail": "hm"},
            {"name": "c", "status": "fail", "detail": "no"},
        ],
    }
    table = as_table(failed).splitlines()
    assert table[0].split() == ["check", "status", "detail"]
    assert table[1].split(maxsplit=2) == ["a", "ok", "fine"]
    assert table[-1] == "fail: 1 ok, 1 warn, 1 fail"
    with pytest.raises(ValueError, match="unknown status"):
        Check("d", "bad", "x")


# -- the command ----------------------------------------------------------------------


def doctor(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any], str]:
    """Run ``ductor-streams doctor --json`` with only ``env``'s settings; the exit code,
    the checks by name (in order) and stderr."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("DUCTOR_STREAMS_", "TEMPORAL_"))
    }
    done = subprocess.run(
        [sys.executable, "-m", "ductor_streams.process.cli", "doctor", "--json", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode == 2:
        return 2, {}, done.stderr
    report = json.loads(done.stdout)
    checks = report["checks"]
    assert [c["name"] for c in checks] == NAMES
    for check in checks:
        assert set(check) == {"name", "status", "detail"}
        assert check["status"] in ("ok", "warn", "fail") and check["detail"]
    worst = max((c["status"] for c in checks), key=["ok", "warn", "fail"].index)
    assert report["status"] == worst
    return done.returncode, {c["name"]: c for c in checks}, done.stderr


def statuses(checks: dict[str, Any]) -> dict[str, str]:
    return {name: c["status"] for name, c in checks.items()}


@pytest.fixture(scope="module")
def bouncer(test_database: TestDatabase) -> Iterator[PgBouncer]:
    with PgBouncer(test_database.server_dsn, mode="transaction", pool_size=4) as b:
        yield b


def _through(bouncer: PgBouncer, dsn: str) -> str:
    return bouncer.dsn(urlsplit(dsn).path.lstrip("/"))


async def _durability_expected(database_url: str) -> str:
    """What the rule says for this test server's own settings (no standby here, as a
    rule, but the machine's server is not ours to assume)."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        names = await conn.fetchval("SELECT current_setting('synchronous_standby_names')")
        commit = await conn.fetchval("SELECT current_setting('synchronous_commit')")
        rows = await conn.fetch(
            "SELECT application_name, state, sync_state FROM pg_stat_replication"
        )
    finally:
        await conn.close()
    standbys = [Standby(r[0], r[1], r[2]) for r in rows]
    return decisions.durability(Durability(names, commit, standbys))[0]


async def test_a_direct_connection(settings: Settings, database_url: str, tmp_path: Path) -> None:
    env = {
        "DUCTOR_STREAMS_DATABASE_URL": database_url,
        "DUCTOR_STREAMS_OBJECT_STORE": json.dumps({"local": (tmp_path / "objects").as_uri()}),
    }
    code, checks, _ = doctor(env)
    durability = await _durability_expected(database_url)
    assert statuses(checks) == {
        "database": "ok",
        "migrations": "ok",
        "synchronous_standby": durability,
        "pooler": "ok",
        "listen": "ok",
        "clock": "ok",
        "temporal": "warn",  # not configured
        "object_store": "ok",
    }
    assert checks["database"]["detail"].startswith("PostgreSQL ")
    assert "direct connection or session pooler" in checks["pooler"]["detail"]
    assert checks["listen"]["detail"].startswith("LISTEN on DATABASE_URL")
    assert "(made at the first upload)" in checks["object_store"]["detail"]
    assert code == (1 if durability == "fail" else 0)
    strict, _, _ = doctor(env, "--strict")
    assert strict == 1  # Temporal is not configured: a warning

    # Set for a transaction pooler that is not there: a warning, not a failure.
    code, checks, _ = doctor(
        {
            **env,
            "DUCTOR_STREAMS_DATABASE_POOLER": "transaction",
            "DUCTOR_STREAMS_DIRECT_DATABASE_URL": database_url,
        }
    )
    assert checks["pooler"]["status"] == "warn"
    assert checks["listen"]["status"] == "ok"


async def test_through_a_transaction_pooler(
    bouncer: PgBouncer,
    database_url: str,
    temporal_address: str,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    pooled = _through(bouncer, database_url)
    base = {
        "DUCTOR_STREAMS_DATABASE_URL": pooled,
        "DUCTOR_STREAMS_TEMPORAL_ADDRESS": temporal_address,
        "DUCTOR_STREAMS_OBJECT_STORE": json.dumps({"local": tmp_path.as_uri()}),
    }
    # The settings say session: the pooler is seen, and that is a failure.
    code, checks, _ = doctor(base)
    assert code == 1
    assert checks["pooler"]["status"] == "fail"
    assert "DUCTOR_STREAMS_DATABASE_POOLER is session" in checks["pooler"]["detail"]
    assert checks["listen"]["status"] == "fail"  # DATABASE_URL carries LISTEN, pooled
    assert checks["database"]["status"] == checks["migrations"]["status"] == "ok"
    assert checks["temporal"]["status"] == "ok"

    # transaction, but no direct URL: LISTEN has no connection.
    code, checks, _ = doctor({**base, "DUCTOR_STREAMS_DATABASE_POOLER": "transaction"})
    assert code == 1
    assert checks["pooler"]["status"] == "ok"
    assert checks["listen"]["status"] == "fail"
    assert "DUCTOR_STREAMS_DIRECT_DATABASE_URL is not set" in checks["listen"]["detail"]

    # The direct URL through the same pooler: LISTEN would miss notifications.
    code, checks, _ = doctor(
        {
            **base,
            "DUCTOR_STREAMS_DATABASE_POOLER": "transaction",
            "DUCTOR_STREAMS_DIRECT_DATABASE_URL": pooled,
        }
    )
    assert code == 1 and checks["listen"]["status"] == "fail"
    assert checks["listen"]["detail"].startswith("DIRECT_DATABASE_URL goes through a transaction")

    # As it should be.
    right = {
        **base,
        "DUCTOR_STREAMS_DATABASE_POOLER": "transaction",
        "DUCTOR_STREAMS_DIRECT_DATABASE_URL": database_url,
    }
    code, checks, _ = doctor(right)
    durability = await _durability_expected(database_url)
    assert statuses(checks) == {
        "database": "ok",
        "migrations": "ok",
        "synchronous_standby": durability,
        "pooler": "ok",
        "listen": "ok",
        "clock": "ok",
        "temporal": "ok",
        "object_store": "ok",
    }
    assert checks["pooler"]["detail"].startswith("transaction pooler (")
    assert checks["listen"]["detail"].startswith("LISTEN on DIRECT_DATABASE_URL")
    assert code == (0 if durability in ("ok", "warn") else 1)
    assert doctor(right, "--strict")[0] == (0 if durability == "ok" else 1)


def test_a_pooler_with_one_server_connection_is_seen_too(
    test_database: TestDatabase, database_url: str
) -> None:
    with PgBouncer(test_database.server_dsn, mode="transaction", pool_size=1) as single:
        _, checks, _ = doctor({"DUCTOR_STREAMS_DATABASE_URL": _through(single, database_url)})
    assert checks["pooler"]["status"] == "fail"
    assert "transaction pooler" in checks["pooler"]["detail"]


def test_a_session_pooler_keeps_the_guarantees(
    test_database: TestDatabase, database_url: str
) -> None:
    with PgBouncer(test_database.server_dsn, mode="session", pool_size=4) as session:
        _, checks, _ = doctor({"DUCTOR_STREAMS_DATABASE_URL": _through(session, database_url)})
    assert checks["pooler"]["status"] == "ok"
    assert checks["listen"]["status"] == "ok"


def test_a_database_that_is_not_migrated(test_database: TestDatabase) -> None:
    dsn, drop = test_database.fresh()
    try:
        code, checks, _ = doctor({"DUCTOR_STREAMS_DATABASE_URL": dsn})
    finally:
        drop()
    assert code == 1
    assert checks["migrations"]["status"] == "fail"
    assert "run `ductor-streams migrate`" in checks["migrations"]["detail"]


def test_unreachable_services_fail_within_the_timeout() -> None:
    port = free_port()  # nothing listens there
    code, checks, _ = doctor(
        {
            "DUCTOR_STREAMS_DATABASE_URL": f"postgresql://nobody@127.0.0.1:{port}/x",
            "DUCTOR_STREAMS_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        },
        "--timeout",
        "3",
    )
    assert code == 1
    assert checks["database"]["status"] == "fail"
    assert checks["database"]["detail"].startswith(f"cannot connect to 127.0.0.1:{port}/x")
    for name in ("migrations", "synchronous_standby", "pooler", "listen", "clock"):
        assert checks[name] == {
            "name": name,
            "status": "fail",
            "detail": "not checked: the database cannot be reached",
        }
    assert checks["temporal"]["status"] == "fail"


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        (
            "postgresql://u:secret@h1:5433,h2:5434/db?target_session_attrs=read-write",
            "h1:5433,h2:5434/db",
        ),
        ("postgresql://root@127.0.0.1:5432/test", "127.0.0.1:5432/test"),
        ("postgresql://root@/test?host=/run/postgresql", "localhost:5432/test"),
        ("postgresql://[::1]:6000/db", "[::1]:6000/db"),
        ("postgresql://a,b:7/db", "a:5432,b:7/db"),
    ],
)
def test_where_names_every_host_and_no_secret(dsn: str, shown: str) -> None:
    assert where(dsn) == shown


def _multi_host(dsn: str, first_port: int) -> str:
    """``dsn`` (made TCP) behind a first host where nothing listens, in the form
    ``pg_autoctl show uri`` prints: ``h1:p1,h2:p2/db?target_session_attrs=read-write``."""
    parts = urlsplit(reachable_from_a_container(dsn))
    user = parts.netloc.rpartition("@")[0]
    hosts = f"127.0.0.1:{first_port},{parts.hostname}:{parts.port or 5432}"
    query = "&".join(q for q in (parts.query, "target_session_attrs=read-write") if q)
    return urlunsplit((parts.scheme, f"{user}@{hosts}", parts.path, query, ""))


def test_a_multi_host_url_as_pg_autoctl_prints_it(database_url: str, tmp_path: Path) -> None:
    dead = free_port()
    multi = _multi_host(database_url, dead)
    env = {
        "DUCTOR_STREAMS_DATABASE_URL": multi,
        "DUCTOR_STREAMS_OBJECT_STORE": json.dumps({"local": (tmp_path / "objects").as_uri()}),
    }
    _, checks, _ = doctor(env)
    for name in ("database", "migrations", "pooler", "listen", "clock", "object_store"):
        assert checks[name]["status"] == "ok", checks[name]
    assert f"on {where(multi)} as " in checks["database"]["detail"]
    assert where(multi).startswith(f"127.0.0.1:{dead},")

    # Neither host answers: the failure names both.
    other = free_port()
    code, checks, _ = doctor(
        {
            "DUCTOR_STREAMS_DATABASE_URL": f"postgresql://nobody@127.0.0.1:{dead},127.0.0.1:{other}/x"
        },
        "--timeout",
        "3",
    )
    assert code == 1
    assert checks["database"]["status"] == "fail"
    assert checks["database"]["detail"].startswith(
        f"cannot connect to 127.0.0.1:{dead},127.0.0.1:{other}/x: "
    ), checks["database"]["detail"]


def test_the_table_and_bad_usage(database_url: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_STREAMS_")}
    done = subprocess.run(
        [sys.executable, "-m", "ductor_streams.process.cli", "doctor"],
        env={**clean, "DUCTOR_STREAMS_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["check", "status", "detail"]
    assert [line.split()[0] for line in lines[1:9]] == NAMES
    assert lines[-1].startswith(("ok: ", "warn: ", "fail: "))
    code, _, err = doctor({})
    assert code == 2 and err.strip() == "ductor-streams: DUCTOR_STREAMS_DATABASE_URL is not set"
    code, _, err = doctor({"DUCTOR_STREAMS_DATABASE_URL": database_url}, "--timeout", "0")
    assert code == 2 and "--timeout" in err


async def _replication(dsn: str) -> list[tuple[str, str, str]]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT application_name, state, sync_state FROM pg_stat_replication"
        )
        return [(r[0], r[1], r[2]) for r in rows]
    finally:
        await conn.close()


async def _set_synchronous_standby_names(dsn: str, value: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{value}'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


def _make_standby(standby: Any, primary_port: int) -> None:
    """``standby`` (a PrivateCluster not initialised) as a streaming copy of the primary
    on ``primary_port``, named standby1."""
    import pwd

    if standby.user is not None:
        entry = pwd.getpwnam(standby.user)
        os.chown(standby.root, entry.pw_uid, entry.pw_gid)
    standby._run(
        "pg_basebackup",
        "-D",
        str(standby.data),
        "-R",
        "-h",
        "127.0.0.1",
        "-p",
        str(primary_port),
        "-U",
        "postgres",
        "--checkpoint=fast",
    )
    with open(standby.data / "postgresql.conf", "a") as conf:
        # cluster_name is the walreceiver's application_name.
        conf.write(
            f"port = {standby.port}\nunix_socket_directories = '{standby.root}'\n"
            "cluster_name = 'standby1'\n"
        )


@pytest.mark.timeout(240)
async def test_the_synchronous_standby_check_on_a_real_primary_and_standby() -> None:
    """A private primary, then a streaming standby made with pg_basebackup: no standby
    (warn), an asynchronous one (warn), a synchronous one (ok), more asked for than
    there are (fail), the synchronous one gone (fail: commits would wait)."""
    from tests.support.cluster import PrivateCluster
    from tests.temporal.polling import eventually

    primary = PrivateCluster().init()
    standby = PrivateCluster()
    try:
        primary.start()
        dsn = primary.dsn("postgres")
        env = {"DUCTOR_STREAMS_DATABASE_URL": dsn}

        def durability() -> dict[str, str]:
            return doctor(env)[1]["synchronous_standby"]

        alone = durability()
        assert alone["status"] == "warn"
        assert "synchronous_standby_names is empty" in alone["detail"]

        _make_standby(standby, primary.port)
        standby.start()
        await eventually(
            lambda: _replication(dsn),
            lambda rows: rows == [("standby1", "streaming", "async")],
            what="the standby streaming",
        )
        asynchronous = durability()
        assert asynchronous["status"] == "warn"
        assert "1 asynchronous standby streaming" in asynchronous["detail"]

        await _set_synchronous_standby_names(dsn, "FIRST 1 (standby1)")
        await eventually(
            lambda: _replication(dsn),
            lambda rows: rows == [("standby1", "streaming", "sync")],
            what="the standby synchronous",
        )
        synchronous = durability()
        assert synchronous["status"] == "ok", synchronous
        assert "standby1 (sync)" in synchronous["detail"]

        await _set_synchronous_standby_names(dsn, "ANY 2 (standby1, ghost)")
        await eventually(
            lambda: _replication(dsn),
            lambda rows: rows == [("standby1", "streaming", "quorum")],
            what="quorum",
        )
        short = durability()
        assert short["status"] == "fail" and "ANY 2" in short["detail"]

        await _set_synchronous_standby_names(dsn, "standby1")
        standby.stop()
        await eventually(lambda: _replication(dsn), lambda rows: rows == [], what="standby gone")
        gone = durability()
        assert gone["status"] == "fail" and "writes hang" in gone["detail"]
    finally:
        standby.destroy()
        primary.destroy()
