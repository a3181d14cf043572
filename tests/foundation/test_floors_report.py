"""tests/support/floors.py: the delivery check and the JSON line of ``python -m bench
floors`` (its last line is read by whoever quotes the floors, so its shape is a contract)."""

from __future__ import annotations

import json
import math

import pytest

from tests.support.floors import (
    ENTRIES,
    Faults,
    Run,
    all_once_in_order,
    entry,
    meets_token_target,
    report_line,
    sequence_faults,
)


def test_sequences_received_once_in_order_have_no_faults() -> None:
    assert sequence_faults([1, 2, 3, 4], 4) == Faults(0, 0, 0)
    assert sequence_faults([1, 2, 3, 4], 4).none


def test_each_kind_of_fault_is_counted() -> None:
    assert sequence_faults([1, 2, 4], 4) == Faults(missing=1, repeated=0, out_of_order=0)
    assert sequence_faults([1, 2, 2, 3], 3) == Faults(missing=0, repeated=1, out_of_order=0)
    assert sequence_faults([1, 3, 2], 3) == Faults(missing=0, repeated=0, out_of_order=1)
    # Never appended: counted as repeated (nobody appended it), not as missing.
    assert sequence_faults([1, 2, 3, 4], 3) == Faults(missing=0, repeated=1, out_of_order=0)
    assert sequence_faults([0, 1], 1) == Faults(missing=0, repeated=1, out_of_order=0)
    assert sequence_faults([], 2) == Faults(missing=2, repeated=0, out_of_order=0)
    assert not sequence_faults([2, 1], 2).none


def test_every_receiver_must_get_every_sequence() -> None:
    assert all_once_in_order([[1, 2], [1, 2]], 2)
    assert not all_once_in_order([[1, 2], [1]], 2)
    assert not all_once_in_order([[1, 2], [2, 1]], 2)
    assert all_once_in_order([], 2)  # no receivers: nothing to fault (callers count them)


def test_the_token_target_is_p50_5_ms_and_p99_20_ms_inclusive() -> None:
    assert meets_token_target(5.0, 20.0)
    assert not meets_token_target(5.01, 10.0)
    assert not meets_token_target(3.0, 20.01)


def test_an_entry_holds_the_medians_of_each_side_and_their_ratios() -> None:
    ours = [Run(4.0, 12.0, True), Run(6.0, 30.0, True), Run(5.0, 18.0, True)]
    floor = [Run(2.0, 6.0, True), Run(2.5, 9.0, True), Run(1.0, 3.0, True)]
    assert entry(ours, floor) == {
        "ours_p50_ms": 5.0,
        "ours_p99_ms": 18.0,
        "floor_p50_ms": 2.0,
        "floor_p99_ms": 6.0,
        "p50_ratio": 2.5,
        "p99_ratio": 3.0,
        "correct": True,
    }
    spread = entry(ours, floor, target_runs=True)
    assert (spread["runs_met"], spread["runs"]) == (2, 3)  # 4/12 and 5/18 meet it


def test_one_faulty_run_of_either_side_makes_the_entry_incorrect() -> None:
    good, bad = Run(1.0, 2.0, True), Run(1.0, 2.0, False)
    assert entry([good, good], [good, bad])["correct"] is False
    assert entry([bad], [good])["correct"] is False


def test_a_floor_of_zero_gives_no_ratio_and_an_empty_side_is_refused() -> None:
    assert entry([Run(1.0, 2.0, True)], [Run(0.0, 2.0, True)])["p50_ratio"] is None
    with pytest.raises(ValueError):
        entry([], [Run(1.0, 2.0, True)])


def _entries() -> dict[str, dict[str, object]]:
    run = [Run(2.0, 4.0, True)]
    return {name: entry(run, run, target_runs=name == "tokens_spread") for name in ENTRIES}


def test_the_report_is_one_json_line_with_every_entry_and_key() -> None:
    line = report_line(_entries())
    assert "\n" not in line
    report = json.loads(line)
    assert list(report) == list(ENTRIES)
    keys = [
        "ours_p50_ms",
        "ours_p99_ms",
        "floor_p50_ms",
        "floor_p99_ms",
        "p50_ratio",
        "p99_ratio",
        "correct",
    ]
    for name in ENTRIES:
        expected = keys + (["runs_met", "runs"] if name == "tokens_spread" else [])
        assert list(report[name]) == expected
    assert report["tokens_spread"]["runs_met"] == 1 and report["tokens_spread"]["runs"] == 1
    assert report["fanout_1000"]["p50_ratio"] == 1.0


def test_a_report_missing_an_entry_or_a_key_is_refused() -> None:
    entries = _entries()
    del entries["fanout_100"]
    with pytest.raises(ValueError, match="fanout_100"):
        report_line(entries)
    assert list(json.loads(report_line(entries, partial=True))) == [
        n for n in ENTRIES if n != "fanout_100"
    ]
    entries = _entries()
    del entries["tokens_spread"]["runs_met"]
    with pytest.raises(ValueError, match="runs_met"):
        report_line(entries)
    with pytest.raises(ValueError, match="bogus"):
        report_line({**_entries(), "bogus": {}})


def test_a_side_without_latencies_shows_as_null() -> None:
    result = entry([Run(math.nan, math.nan, False)], [Run(1.0, 2.0, True)])
    assert (result["ours_p50_ms"], result["p50_ratio"], result["correct"]) == (None, None, False)
    entries = {**_entries(), "fanout_100": result}
    assert json.loads(report_line(entries))["fanout_100"]["ours_p99_ms"] is None
    assert "NaN" not in report_line(entries)
