"""What a writer does on attempt n >= 2: the retry policies and the marker's shape.

A retried activity's earlier attempts may have left partial output in the stream (a
model answer cut off halfway). The writer of attempt n knows what they appended (its
append receipts, whose keys name the attempt, completed by the heartbeat details) and,
before anything else, appends what its policy returns:

- ``"marker"`` (the default for ``model_output`` streams): one record
  ``{"type": "ductor_streams.retry", "attempt": n, "activity_id": "...",
  "discard": [[first, last], ...]}``, where ``discard`` lists the sequence ranges
  (inclusive) that earlier attempts of this activity appended to this stream (markers
  excluded). A reader drops those records, e.g. a UI removes the text it rendered
  from them, and renders what follows.
- ``"none"`` (the default for every other content class): nothing.
- a callable ``policy(RetryInfo) -> list[payload]``: the payloads it returns (an empty
  list appends nothing), e.g. a marker of the author's own shape.

Records stay plain payloads: the marker is a record like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

RETRY_MARKER_TYPE = "ductor_streams.retry"


@dataclass(frozen=True)
class AttemptOutput:
    """What one earlier attempt appended to the stream: its records' sequence ranges
    (inclusive, ascending) and their count."""

    attempt: int
    ranges: list[tuple[int, int]] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(last - first + 1 for first, last in self.ranges)


@dataclass(frozen=True)
class RetryInfo:
    """What a retry policy is told: the attempt now starting and what earlier attempts
    of the same activity appended to the stream."""

    attempt: int
    activity_id: str
    activity_type: str
    run_id: str
    stream_id: str
    earlier: list[AttemptOutput]


RetryPolicy = Literal["marker", "none"] | Callable[[RetryInfo], list[Any]]


def retry_marker(info: RetryInfo) -> dict[str, Any]:
    """The ``"marker"`` policy's record (see the module docstring)."""
    return {
        "type": RETRY_MARKER_TYPE,
        "attempt": info.attempt,
        "activity_id": info.activity_id,
        "discard": [[first, last] for output in info.earlier for first, last in output.ranges],
    }


def default_policy(content_class: str) -> RetryPolicy:
    return "marker" if content_class == "model_output" else "none"


def retry_payloads(policy: RetryPolicy, info: RetryInfo) -> list[Any]:
    """The records to append before attempt ``info.attempt`` writes anything."""
    if policy == "marker":
        return [retry_marker(info)]
    if policy == "none":
        return []
    if callable(policy):
        return list(policy(info))
    raise ValueError(f"on_retry must be 'marker', 'none' or a callable, not {policy!r}")


def merge_range(ranges: list[list[int]], first: int, last: int) -> None:
    """Add ``first..last`` to ascending inclusive ranges, joining it to the last one
    when it continues it."""
    if ranges and ranges[-1][1] + 1 == first:
        ranges[-1][1] = last
    else:
        ranges.append([first, last])
