"""Consumer acknowledgements: they only advance, and they free producer credit."""

from __future__ import annotations

import asyncpg

from ductor_streams.errors import AckInFuture, AckRegression, ConsumerNotFound, NotFound
from ductor_streams.schema import QUERIES
from ductor_streams.store.outcomes import AckOutcome


async def ack(pool: asyncpg.Pool, stream_pk: int, consumer_id: str, sequence: int) -> int:
    """Acknowledge everything up to ``sequence`` for one consumer; return its ack.

    Equal to the current ack is a no-op; lower is AckRegression; above the latest
    sequence is AckInFuture; a consumer not declared on this stream is ConsumerNotFound.
    """
    row = await pool.fetchrow(QUERIES["consumer_ack"], stream_pk, consumer_id, sequence)
    assert row is not None
    outcome = AckOutcome.parse(row["outcome"])
    if outcome in (AckOutcome.ACKED, AckOutcome.UNCHANGED):
        return int(row["acked_sequence"])
    if outcome == AckOutcome.ACK_REGRESSION:
        raise AckRegression(
            f"consumer {consumer_id!r} has acknowledged {row['acked_sequence']}; acks only advance"
        )
    if outcome == AckOutcome.ACK_IN_FUTURE:
        raise AckInFuture(f"sequence {sequence} is beyond the latest sequence")
    if outcome == AckOutcome.CONSUMER_NOT_FOUND:
        raise ConsumerNotFound(f"no consumer {consumer_id!r} on this stream")
    raise NotFound("stream does not exist")
