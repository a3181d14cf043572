"""What ``doctor`` concludes from what it saw: pure functions of given values, so that
each rule is tested on the values a server may report (tests/production/test_doctor.py).

Each returns ``(status, detail)``; the checks in ``checks.py`` gather the values.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ductor_streams.process.doctor.report import FAIL, OK, WARN

# The Postgres releases the project is built and tested on (docs/deploy.md, "Postgres").
MIN_SERVER_MAJOR = 15

# Clock skew between this host and Postgres. Leases, retention and ages are decided in
# Postgres' time, but this host's clock checks token expiry, times delivery and follower
# lag metrics, and tells a young input delivery (a run that may still be starting, 30 s
# of grace) from an old one: at half that grace a skew changes what is delivered.
SKEW_WARN_SECONDS = 1.0
SKEW_FAIL_SECONDS = 15.0

# Managed services whose storage itself is replicated synchronously across zones before
# a commit is acknowledged, whatever synchronous_standby_names says.
STORAGE_REPLICATED = {
    "aurora": "Amazon Aurora (6 copies across 3 zones, 4 acknowledge each commit)",
    "alloydb": "AlloyDB (regional storage)",
    "neon": "Neon (safekeepers: a quorum acknowledges each commit)",
}
# Managed services whose high-availability option replicates synchronously but cannot be
# seen from SQL (it is a property of the instance, not of Postgres' settings).
HA_NOT_VISIBLE = {
    "rds": "Amazon RDS (Multi-AZ)",
    "cloudsql": "Cloud SQL (high availability, regional disk)",
    "azure": "Azure Database for PostgreSQL (zone-redundant high availability)",
}


@dataclass(frozen=True)
class Standby:
    """One row of ``pg_stat_replication`` (``state`` and ``sync_state`` are None for a
    role without ``pg_read_all_stats``)."""

    name: str
    state: str | None
    sync_state: str | None


@dataclass(frozen=True)
class Durability:
    """What the server says about acknowledging commits."""

    synchronous_standby_names: str
    synchronous_commit: str
    standbys: Sequence[Standby] = ()
    in_recovery: bool = False
    # The managed service its settings or functions give away (a key of
    # STORAGE_REPLICATED or HA_NOT_VISIBLE), if any.
    managed: str | None = None


def required_standbys(names: str) -> tuple[str, int]:
    """The method and the number of synchronous standbys ``synchronous_standby_names``
    asks for: ``FIRST n (...)``, ``ANY n (...)``, ``n (...)`` (FIRST) or a plain list
    (FIRST 1). ``("", 0)`` when it is empty."""
    text = names.strip()
    if not text:
        return "", 0
    match = re.match(r"^(?:(FIRST|ANY)\s+)?(\d+)\s*\(", text, re.IGNORECASE)
    if match:
        return (match.group(1) or "FIRST").upper(), int(match.group(2))
    return "FIRST", 1


def durability(facts: Durability) -> tuple[str, str]:
    """Whether a commit acknowledged now survives the loss of this primary."""
    if facts.in_recovery:
        return FAIL, "connected to a standby (in recovery): it refuses every write"
    commit = facts.synchronous_commit.lower()
    if commit == "off":
        return FAIL, (
            "synchronous_commit is off: a commit is acknowledged before its WAL is flushed, "
            "so even a crash of this server loses acknowledged appends"
        )
    method, wanted = required_standbys(facts.synchronous_standby_names)
    asynchronous = [s for s in facts.standbys if s.state == "streaming"]
    if wanted == 0:
        if facts.managed in STORAGE_REPLICATED:
            return OK, (
                f"no synchronous standby, but {STORAGE_REPLICATED[facts.managed]} "
                "replicates storage synchronously before a commit is acknowledged"
            )
        if facts.managed in HA_NOT_VISIBLE:
            return WARN, (
                f"no synchronous standby in Postgres' settings; {HA_NOT_VISIBLE[facts.managed]} "
                "replicates synchronously when enabled, which SQL cannot see: check the "
                "instance's high-availability setting"
            )
        seen = f" ({len(asynchronous)} asynchronous standby streaming)" if asynchronous else ""
        return WARN, (
            "no synchronous standby (synchronous_standby_names is empty)"
            f"{seen}: a commit acknowledged now is lost if the primary fails over"
        )
    if commit == "local":
        return WARN, (
            "synchronous_commit is local: commits do not wait for the synchronous standbys "
            f"({facts.synchronous_standby_names!r}), so a failover can lose acknowledged ones"
        )
    if facts.standbys and all(s.sync_state is None for s in facts.standbys):
        return WARN, (
            f"synchronous_standby_names is {facts.synchronous_standby_names!r} but this role "
            "cannot read pg_stat_replication's sync_state (grant it pg_monitor)"
        )
    synchronous = [s for s in asynchronous if (s.sync_state or "").lower() in ("sync", "quorum")]
    if len(synchronous) < wanted:
        return FAIL, (
            f"synchronous_standby_names asks for {method} {wanted} "
            f"({facts.synchronous_standby_names!r}) but {len(synchronous)} synchronous "
            "standby is streaming: commits wait until one is back (writes hang)"
        )
    names = ", ".join(f"{s.name} ({s.sync_state})" for s in synchronous)
    return OK, (
        f"{len(synchronous)} synchronous standby streaming ({names}), {method} {wanted} "
        f"required, synchronous_commit {commit}: an acknowledged commit is on a standby too"
    )


@dataclass(frozen=True)
class Sessions:
    """What two client connections to one DSN saw of their server sessions."""

    # A client connection's backend pid changed between its transactions.
    moved: bool
    # Two open client connections reported the same backend pid.
    shared: bool
    # A client connection waited for another one's open transaction (a pooler with one
    # server connection for both).
    waited: bool = False

    @property
    def transaction_pooled(self) -> bool:
        return self.moved or self.shared or self.waited

    def evidence(self) -> str:
        seen = []
        if self.moved:
            seen.append("a client connection's backend changed between transactions")
        if self.shared:
            seen.append("two client connections shared one backend")
        if self.waited:
            seen.append("a client connection waited for another's transaction")
        return "; ".join(seen) or "each client connection kept its own backend"


def pooler(setting: str, seen: Sessions) -> tuple[str, str]:
    """``DATABASE_URL``'s pooling as seen, against ``DUCTOR_STREAMS_DATABASE_POOLER``.

    A transaction pooler behind ``session`` fails: named prepared statements break (the
    pools do not start, or statements fail). ``transaction`` over a direct connection or a
    session pooler only warns: everything works, each statement is parsed again.
    """
    if seen.transaction_pooled:
        if setting == "transaction":
            return OK, f"transaction pooler ({seen.evidence()}); DATABASE_POOLER=transaction"
        return FAIL, (
            f"DATABASE_URL goes through a transaction pooler ({seen.evidence()}) but "
            "DUCTOR_STREAMS_DATABASE_POOLER is session: prepared statements fail; set it to "
            "transaction and set DUCTOR_STREAMS_DIRECT_DATABASE_URL"
        )
    if setting == "transaction":
        return WARN, (
            f"no transaction pooling seen ({seen.evidence()}) but DATABASE_POOLER=transaction: "
            "it works, at the cost of parsing each statement again; set session for a direct "
            "connection or a session pooler"
        )
    return OK, f"direct connection or session pooler ({seen.evidence()})"


def listen_connection(seen: Sessions, arrived_ms: float | None, dsn_name: str) -> tuple[str, str]:
    """Whether LISTEN works on the connection that carries it (``dsn_name``)."""
    if seen.transaction_pooled:
        return FAIL, (
            f"{dsn_name} goes through a transaction pooler ({seen.evidence()}): LISTEN and "
            "the migration lock need a direct or session-mode connection"
        )
    if arrived_ms is None:
        return FAIL, f"a NOTIFY sent through DATABASE_URL did not reach a LISTEN on {dsn_name}"
    return OK, (
        f"LISTEN on {dsn_name}: a NOTIFY sent through DATABASE_URL arrived in {arrived_ms:.0f} ms"
    )


def clock(skew_seconds: float, uncertainty_seconds: float) -> tuple[str, str]:
    """This host's clock against Postgres' (``skew`` = Postgres - here)."""
    least = max(0.0, abs(skew_seconds) - uncertainty_seconds)
    side = "ahead of" if skew_seconds > 0 else "behind"
    detail = (
        f"Postgres' clock is {abs(skew_seconds) * 1000:.1f} ms {side} this host's "
        f"(± {uncertainty_seconds * 1000:.1f} ms)"
    )
    if least >= SKEW_FAIL_SECONDS:
        return FAIL, detail + f": {SKEW_FAIL_SECONDS:.0f} s or more; synchronise both (NTP)"
    if least >= SKEW_WARN_SECONDS:
        return WARN, detail + ": token expiry and lag metrics are off by as much"
    return OK, detail


def migrations(
    available: Sequence[int], applied: Sequence[int], names: dict[int, str]
) -> tuple[str, str]:
    """The database's migration level against this code's."""
    if not applied:
        return FAIL, "no migration applied: run `ductor-streams migrate`"
    pending = [v for v in available if v not in set(applied)]
    if pending:
        first = f"{pending[0]:04d}_{names.get(pending[0], '?')}"
        return FAIL, (
            f"{len(pending)} of {len(available)} migrations pending (first {first}): run "
            "`ductor-streams migrate`; /readyz answers 503 meanwhile"
        )
    newer = [v for v in applied if v not in set(available)]
    latest = f"{available[-1]:04d}_{names.get(available[-1], '?')}"
    if newer:
        return WARN, (
            f"all {len(available)} applied (latest {latest}), and {len(newer)} this code does "
            f"not know ({', '.join(f'{v:04d}' for v in newer)}): a newer release migrated "
            "it; fine during a rolling upgrade"
        )
    return OK, f"all {len(available)} applied (latest {latest})"


def server_version(major: int, text: str, in_recovery: bool) -> tuple[str, str]:
    """The server's version, and whether it takes writes."""
    if in_recovery:
        return FAIL, f"PostgreSQL {text} is a standby (in recovery): it refuses every write"
    if major < MIN_SERVER_MAJOR:
        return WARN, (
            f"PostgreSQL {text}: the project is built and tested on {MIN_SERVER_MAJOR} and later"
        )
    return OK, f"PostgreSQL {text}"
