"""The outcome strings the SQL functions answer with, as types, read in one place.

``append_requests`` and ``append_stream_groups`` answer one ``outcome`` per request,
``ack_consumer`` one per ack, ``ds_append`` one per Durable Streams write (their bodies:
``schema/schema.sql``). Each is parsed here
into an enum as soon as its row arrives; an outcome this code does not know is an error
at once (a migration and the code disagree), never a string compared deep in a caller.
"""

from __future__ import annotations

from enum import StrEnum


class AppendOutcome(StrEnum):
    """What ``append_requests`` / ``append_stream_groups`` decided for one request."""

    APPENDED = "appended"  # new consecutive sequences
    REPLAYED = "replayed"  # a known idempotency key with the same body: the first answer
    KEY_REUSED = "key_reused"  # a known idempotency key with another body
    STREAM_CLOSED = "stream_closed"
    QUOTA_EXHAUSTED = "quota_exhausted"  # a total ceiling
    CREDIT_EXHAUSTED = "credit_exhausted"  # an unread ceiling
    NOT_FOUND = "not_found"  # no such stream

    @classmethod
    def parse(cls, text: str) -> AppendOutcome:
        # A dict lookup: the enum's own call (``cls(text)``) is several times slower,
        # once per append request.
        outcome = _APPEND_OUTCOMES.get(text)
        if outcome is None:
            raise RuntimeError(f"the append function answered an unknown outcome {text!r}")
        return outcome

    @property
    def stored(self) -> bool:
        """Whether the request's records are in the stream (now or from before)."""
        return self in (AppendOutcome.APPENDED, AppendOutcome.REPLAYED)


_APPEND_OUTCOMES: dict[str, AppendOutcome] = {o.value: o for o in AppendOutcome}


class AckOutcome(StrEnum):
    """What ``ack_consumer`` decided."""

    ACKED = "acked"
    UNCHANGED = "unchanged"  # the same sequence as the current ack
    ACK_REGRESSION = "ack_regression"
    ACK_IN_FUTURE = "ack_in_future"
    CONSUMER_NOT_FOUND = "consumer_not_found"
    NOT_FOUND = "not_found"

    @classmethod
    def parse(cls, text: str) -> AckOutcome:
        try:
            return cls(text)
        except ValueError:
            raise RuntimeError(f"ack_consumer answered an unknown outcome {text!r}") from None


class DsWriteOutcome(StrEnum):
    """What ``ds_append`` decided for one Durable Streams write (close, ``Stream-Seq``
    or producer headers; plain DS appends take ``append_requests`` and ``AppendOutcome``)."""

    APPENDED = "appended"  # the records are in, and the stream closed when asked
    DUPLICATE = "duplicate"  # the producer's (epoch, seq) was applied before: nothing new
    ALREADY_CLOSED = "already_closed"  # a bare close of a closed stream
    STREAM_CLOSED = "stream_closed"  # a write to a closed stream
    STALE_EPOCH = "stale_epoch"  # a newer epoch of this producer has written
    EPOCH_SEQ = "epoch_seq"  # a new epoch that does not start at seq 0
    SEQ_GAP = "seq_gap"  # the producer's seq skips one (``producer_seq`` is the expected)
    STREAM_SEQ_CONFLICT = "stream_seq_conflict"  # ``Stream-Seq`` not above the last one
    TOO_MANY_PRODUCERS = "too_many_producers"  # a new Producer-Id past the cap
    # Passed on from append_requests, which the records go through:
    REPLAYED = "replayed"
    KEY_REUSED = "key_reused"
    QUOTA_EXHAUSTED = "quota_exhausted"
    CREDIT_EXHAUSTED = "credit_exhausted"
    NOT_FOUND = "not_found"

    @classmethod
    def parse(cls, text: str) -> DsWriteOutcome:
        try:
            return cls(text)
        except ValueError:
            raise RuntimeError(f"ds_append answered an unknown outcome {text!r}") from None

    @property
    def as_append(self) -> AppendOutcome | None:
        """The same decision as ``append_requests``'s outcome, when it is one of those."""
        try:
            return AppendOutcome(self.value)
        except ValueError:
            return None
