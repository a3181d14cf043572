"""The typed outcomes (store/outcomes.py) know every outcome the SQL functions answer."""

from __future__ import annotations

import re

import pytest

from ductor_streams.store.outcomes import AppendOutcome, DsWriteOutcome
from tests.conftest import repo_root


def _function_bodies(name: str) -> str:
    """Every overload of the function, as schema.sql has them (``make schema``)."""
    schema = (repo_root() / "ductor_streams" / "schema" / "schema.sql").read_text()
    bodies = re.findall(
        rf"FUNCTION workflow_streams\.{name}\(.*?\$function\$;", schema, flags=re.DOTALL
    )
    assert bodies, name
    return "\n".join(bodies)


def test_every_outcome_ds_append_assigns_is_a_ds_write_outcome() -> None:
    assigned = set(re.findall(r"outcome := '([a-z_]+)'", _function_bodies("ds_append")))
    assert assigned == {
        "not_found",
        "duplicate",
        "already_closed",
        "stream_closed",
        "seq_gap",
        "stale_epoch",
        "epoch_seq",
        "stream_seq_conflict",
        "too_many_producers",
        "appended",
    }
    for text in assigned:
        assert DsWriteOutcome.parse(text) == text
    # What it passes on from append_requests (``outcome := r.outcome``) parses too, as the
    # same decision.
    for passed in AppendOutcome:
        assert DsWriteOutcome.parse(passed.value).as_append is passed
    assert DsWriteOutcome.SEQ_GAP.as_append is None


def test_an_unknown_ds_outcome_is_an_error_at_once() -> None:
    with pytest.raises(RuntimeError, match="ds_append answered an unknown outcome 'gone'"):
        DsWriteOutcome.parse("gone")
