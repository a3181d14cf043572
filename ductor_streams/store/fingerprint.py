"""A record's fingerprint: what tells two commits of one sequence apart.

With asynchronous replication a failover can lose commits that a reader already saw;
the new primary then appends other records under the same sequences, and a reader that
resumes after sequence N would skip the new N without noticing. Every record's JSON
therefore carries an opaque ``fingerprint``, and a read or subscribe may send back the
fingerprint of the record at its cursor: when the stored record there differs, the
answer is ``HistoryDiverged`` (HTTP 409 ``history_diverged``) instead of records that do
not follow on from what the reader has (docs/api.md, "Fingerprints").

The text is ``<appended_at>-<hex(size)>``: the commit's ``appended_at`` (the
transaction's ``now()``: a lost commit and the one that reused its sequence never share
it) as 16 hex digits, microseconds since 2000-01-01 UTC as a 64-bit two's complement
integer (Postgres' binary form of the timestamp, which it writes without arithmetic),
then the record's size. The sequence is left out: a fingerprint is only ever compared
with the record stored at one sequence (records of one commit with equal sizes share
theirs). No payload hash: reads and fan-out write it for every record, and this costs a
fraction of a microsecond. Postgres writes
the same text where it writes a record's JSON (``workflow_streams.record_fingerprint``);
tests/live/test_fingerprints.py compares the two.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from ductor_streams.errors import HistoryDiverged, InvalidFingerprint

# Postgres' epoch: its binary timestamps count microseconds from here.
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_INT64 = (1 << 64) - 1
# What record_fingerprint writes (a timestamp and a size in hex), and no more.
FINGERPRINT_PATTERN = r"^[0-9a-f]{16}-[0-9a-f]{1,8}$"
_FINGERPRINT = re.compile(FINGERPRINT_PATTERN)

# The last time converted, and its fingerprint part: the records of one commit share
# their appended_at.
_last: tuple[datetime | None, int, str] = (None, 0, "")


def _time(at: datetime) -> tuple[int, str]:
    global _last
    last, micros, part = _last
    if last is None or last != at:
        micros = ((at - _EPOCH) // _MICROSECOND) & _INT64
        part = f"{micros:016x}-"
        _last = (at, micros, part)
    return micros, part


def stored_micros(at: datetime) -> int:
    """``at`` as Postgres stores a timestamp (microseconds since 2000-01-01 UTC), as an
    unsigned 64-bit number (its two's complement before 2000); ``at`` is aware, as
    asyncpg returns it."""
    return _time(at)[0]


def record_fingerprint(sequence: int, appended_at: datetime, size: int) -> str:
    """The fingerprint of the record committed at ``appended_at`` under ``sequence``
    (which it does not hold: see the module docstring)."""
    return f"{_time(appended_at)[1]}{size:x}"


def parse_fingerprint(raw: str | None, cursor: int) -> str | None:
    """The fingerprint to check of a ``fingerprint=`` parameter sent with ``cursor``:
    None when not sent, and with cursor 0 (a reader from the start has seen nothing that
    could have changed: a client that starts over after ``history_diverged`` may keep
    sending it); InvalidFingerprint when it is not a fingerprint at all."""
    if raw is None:
        return None
    if not _FINGERPRINT.fullmatch(raw):
        raise InvalidFingerprint(
            f"fingerprint {raw[:40]!r} is not a record's fingerprint: send back the "
            "`fingerprint` of the record at the cursor, as its JSON carried it"
        )
    return raw if cursor else None


def check_fingerprint(
    cursor: int, fingerprint: str, stored: str | None, earliest: int, latest: int
) -> None:
    """HistoryDiverged when the record the reader saw at ``cursor`` (``fingerprint``)
    is not the stream's: ``stored`` is the fingerprint of the record stored there (None:
    there is none), ``earliest`` and ``latest`` the stream's bounds at the same read.

    A cursor past ``latest`` diverged too (the reader saw a record the stream no longer
    has: the commonest shape of a lost commit); a record retention removed cannot be
    compared, and passes (a cursor whose next record retention removed is the caller's
    410, ``store.read.check_cursor``, which cannot overlap with the cases here), as does
    cursor 0 (no record is there: a reader from the start has nothing to compare)."""
    if cursor == 0 or (cursor < earliest and cursor <= latest):
        return
    if stored != fingerprint:
        raise HistoryDiverged(
            sequence=cursor,
            fingerprint=fingerprint,
            stored=stored,
            earliest=earliest,
            latest=latest,
        )
