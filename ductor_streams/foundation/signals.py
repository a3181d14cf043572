"""The input signal: its name and its payload, defined once.

The dispatcher sends it (``delivery/temporal.py``), the workflow helpers receive it
inside Temporal's sandbox (``plugin/workflow.py``) and tracing recognises it
(``foundation/temporal_tracing.py``). The standard library only, so that it is safe in the
sandbox. The payload travels as a JSON object with these members (Temporal's default
converter), so histories recorded before it was a dataclass replay unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The Temporal signal that carries input records to a workflow (docs/temporal.md).
INPUT_SIGNAL = "ductor_streams.input"


@dataclass(frozen=True)
class InputSignal:
    """The input signal's one argument: one input record for the run that receives it."""

    # ``<stream_id>:<sequence>``: the same for every delivery of the record, so a repeat
    # (after a lease takeover or an operator's retry) is recognised.
    event_id: str
    stream_id: str
    sequence: int
    payload: Any = None  # the record's payload; null when retention pruned it first
    object: dict[str, Any] | None = None  # the record's object reference, if any
    appended_at: str | None = None  # ISO 8601, when known


def input_event_id(stream_id: str, sequence: int) -> str:
    """The deterministic id of an input record's delivery: ``<stream_id>:<sequence>``."""
    return f"{stream_id}:{sequence}"
