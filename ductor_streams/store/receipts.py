"""Append receipts looked up by idempotency-key prefix (what a producer's earlier tries
appended, when its keys are derived from a known prefix)."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from ductor_streams.schema import QUERIES


@dataclass(frozen=True, slots=True)
class Receipt:
    """One committed append request: its key and its sequences."""

    idempotency_key: str
    first_sequence: int
    last_sequence: int


async def receipts_with_prefix(pool: asyncpg.Pool, stream_pk: int, prefix: str) -> list[Receipt]:
    """The stream's receipts whose key starts with ``prefix``, in sequence order."""
    rows = await pool.fetch(QUERIES["append_receipts_with_prefix"], stream_pk, prefix)
    return [Receipt(r["idempotency_key"], r["first_sequence"], r["last_sequence"]) for r in rows]
