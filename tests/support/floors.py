"""The pure part of ``python -m bench floors``: the delivery check and the report.

``bench/floors.py`` measures each figure beside its floor in alternating repetitions;
this module turns the repetitions into what it prints last: one JSON object whose
entries each hold the medians of both sides, their ratios and whether every record
arrived once and in order. It lives with the tests' support code so that
tests/foundation/test_floors_report.py can check the contract without running a load
(tests import nothing from ``bench``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The entries of the JSON line, in the order they are measured and printed.
ENTRIES = ("fanout_1000", "fanout_100", "tokens_aligned", "tokens_spread", "input_to_workflow")
# The keys every entry has (``tokens_spread`` also ``runs_met`` and ``runs``).
KEYS = (
    "ours_p50_ms",
    "ours_p99_ms",
    "floor_p50_ms",
    "floor_p99_ms",
    "p50_ratio",
    "p99_ratio",
    "correct",
)
# The token target a ``tokens_spread`` run meets or not (docs/speed.md).
TOKEN_P50_MS = 5.0
TOKEN_P99_MS = 20.0


@dataclass(frozen=True)
class Faults:
    """What a receiver's sequences lack against ``1 .. appended``: sequences never
    received, received more than once, and received after a higher one."""

    missing: int
    repeated: int
    out_of_order: int

    @property
    def none(self) -> bool:
        return self.missing == self.repeated == self.out_of_order == 0


def sequence_faults(received: Iterable[int], appended: int) -> Faults:
    """Check the sequences one receiver got, in arrival order, against ``1 .. appended``
    (a sequence outside that range counts as repeated: nobody appended it)."""
    seen: set[int] = set()
    repeated = out_of_order = 0
    highest = 0
    for sequence in received:
        if sequence in seen or not 1 <= sequence <= appended:
            repeated += 1
            continue
        seen.add(sequence)
        if sequence < highest:
            out_of_order += 1
        highest = max(highest, sequence)
    return Faults(appended - len(seen), repeated, out_of_order)


def all_once_in_order(receivers: Iterable[Iterable[int]], appended: int) -> bool:
    """Whether every receiver got exactly ``1 .. appended``, each once, in order."""
    return all(sequence_faults(r, appended).none for r in receivers)


def meets_token_target(p50_ms: float, p99_ms: float) -> bool:
    """Whether one run meets the token -> SSE target (p50 <= 5 ms and p99 <= 20 ms)."""
    return p50_ms <= TOKEN_P50_MS and p99_ms <= TOKEN_P99_MS


@dataclass(frozen=True)
class Run:
    """One repetition of one side: its latency percentiles (NaN when nothing arrived)
    and its delivery check."""

    p50_ms: float
    p99_ms: float
    correct: bool


def _figure(value: float) -> float | None:
    """A median in ms, or None when a side had no latency (NaN has no JSON form)."""
    return None if math.isnan(value) else round(value, 2)


def _ratio(ours: float, floor: float) -> float | None:
    if math.isnan(ours) or math.isnan(floor) or floor <= 0:
        return None
    return round(ours / floor, 2)


def entry(
    ours: Sequence[Run], floor: Sequence[Run], *, target_runs: bool = False
) -> dict[str, Any]:
    """One entry of the report: the medians over the repetitions of each side, the
    ratios of those medians (ours / floor; None without a figure), and ``correct`` when
    every run of both sides delivered every record once and in order. ``target_runs``:
    also ``runs_met`` (our runs meeting the token target) and ``runs``."""
    if not ours or not floor:
        raise ValueError("an entry needs at least one run of each side")
    ours_p50 = statistics.median(r.p50_ms for r in ours)
    ours_p99 = statistics.median(r.p99_ms for r in ours)
    floor_p50 = statistics.median(r.p50_ms for r in floor)
    floor_p99 = statistics.median(r.p99_ms for r in floor)
    result: dict[str, Any] = {
        "ours_p50_ms": _figure(ours_p50),
        "ours_p99_ms": _figure(ours_p99),
        "floor_p50_ms": _figure(floor_p50),
        "floor_p99_ms": _figure(floor_p99),
        "p50_ratio": _ratio(ours_p50, floor_p50),
        "p99_ratio": _ratio(ours_p99, floor_p99),
        "correct": all(r.correct for r in (*ours, *floor)),
    }
    if target_runs:
        result["runs_met"] = sum(meets_token_target(r.p50_ms, r.p99_ms) for r in ours)
        result["runs"] = len(ours)
    return result


def report_line(entries: Mapping[str, Mapping[str, Any]], *, partial: bool = False) -> str:
    """The last line of ``python -m bench floors``: every entry, in ``ENTRIES`` order, as
    one JSON object. Refuses a report missing an entry (unless ``partial``: a run of some
    measures) or a key."""
    unknown = [name for name in entries if name not in ENTRIES]
    missing = [name for name in ENTRIES if name not in entries]
    if unknown or (missing and not partial):
        raise ValueError(f"entries unknown: {unknown}, missing: {missing}")
    for name in (n for n in ENTRIES if n in entries):
        keys = KEYS + (("runs_met", "runs") if name == "tokens_spread" else ())
        absent = [k for k in keys if k not in entries[name]]
        if absent:
            raise ValueError(f"{name} lacks {absent}")
    return json.dumps(
        {name: dict(entries[name]) for name in ENTRIES if name in entries}, separators=(",", ":")
    )
