"""Databases migrated before the baseline: how their ``schema_migrations`` rows are read.

Until ``0001_baseline`` the schema was built by a numbered chain of 28 migrations, from
``0001_streams`` to ``0041_record_fingerprint``. The baseline is exactly what that whole
chain made, so a database that ran all of it is already at the baseline: the runner
replaces the chain's rows with the baseline's (nothing runs again). A database that ran
only part of the chain is at none of this code's versions, and the runner refuses it
(``LegacyChainIncomplete``) rather than guess which objects it lacks.

Rows are told apart by version and name together: the chain's ``(1, 'streams')`` is
not the baseline's ``(1, 'baseline')``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

# Every migration of the pre-baseline chain, in order: (version, name).
LEGACY_CHAIN: tuple[tuple[int, str], ...] = (
    (1, "streams"),
    (2, "append_and_ack"),
    (3, "delivery_lanes"),
    (4, "objects_upkeep"),
    (5, "credit_and_wakes"),
    (6, "ops_indexes"),
    (7, "open_delivery_heads"),
    (8, "append_one_insert"),
    (9, "append_stream_groups"),
    (10, "append_loop_sums"),
    (11, "notify_when_watched"),
    (12, "wake_carries_latest"),
    (13, "records_without_row_checks"),
    (14, "stream_groups_in_one_pass"),
    (15, "definition_bounds"),
    (16, "durable_streams"),
    (20, "delivery_trace_context"),
    (21, "ds_trace_context"),
    (24, "ds_producer_cap"),
    (33, "keyed_groups_in_one_pass"),
    (34, "receipts_without_row_checks"),
    (35, "commit_wakes_carry_records"),
    (36, "append_takes_leases"),
    (37, "stream_groups_set_based"),
    (38, "stream_groups_generic_plans"),
    (39, "single_request_groups_key_probe"),
    (40, "tenant_quota"),
    (41, "record_fingerprint"),
)
_LEGACY = frozenset(LEGACY_CHAIN)

# The migration that stands for the whole chain.
BASELINE = (1, "baseline")


class LegacyState(Enum):
    """Where a database stands against the pre-baseline chain."""

    NONE = "none"  # no row of the chain: a fresh database, or one made from the baseline
    COMPLETE = "complete"  # the whole chain: the same schema as the baseline
    PARTIAL = "partial"  # part of the chain: refused


class LegacyChainIncomplete(RuntimeError):
    """The database ran only part of the pre-baseline chain; ``migrate`` cannot bring it
    to the baseline. ``code`` is stable for scripts; the message says what to do."""

    code = "legacy-chain-incomplete"

    def __init__(self, applied: Iterable[tuple[int, str]]) -> None:
        done = sorted(row for row in applied if row in _LEGACY)
        present = set(done)
        missing = [row for row in LEGACY_CHAIN if row not in present]
        self.last = done[-1] if done else None
        self.missing = missing
        last = _label(done[-1]) if done else "?"
        super().__init__(
            f"{self.code}: the database was migrated by the numbered chain that came "
            f"before the baseline and stopped at {last} ({len(done)} of its "
            f"{len(LEGACY_CHAIN)} migrations; first missing {_label(missing[0])}). This "
            f"release recognises only a database that ran the whole chain, through "
            f"{_label(LEGACY_CHAIN[-1])}. Run `ductor-streams migrate` of a build from "
            "before the baseline against it first, then this one again; or recreate the "
            "database empty (its streams are lost) and migrate it."
        )


def _label(row: tuple[int, str]) -> str:
    return f"{row[0]:04d}_{row[1]}"


def legacy_state(applied: Iterable[tuple[int, str]]) -> LegacyState:
    """Classify a database by its ``(version, name)`` rows of ``schema_migrations``."""
    present = _LEGACY.intersection(applied)
    if not present:
        return LegacyState.NONE
    if present == _LEGACY:
        return LegacyState.COMPLETE
    return LegacyState.PARTIAL


def is_legacy_row(row: tuple[int, str]) -> bool:
    """True for a row the pre-baseline chain wrote."""
    return row in _LEGACY
